"""`tff-worker` as a script (its code and help: tff_clustered/cli/worker.py)."""

from tff_clustered.cli import launch

if __name__ == "__main__":
    launch.worker()
