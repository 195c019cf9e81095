"""`tff-train` as a script (its code and help: tff_clustered/cli/train.py)."""

from tff_clustered.cli import launch

if __name__ == "__main__":
    launch.train()
