"""`tff-gpu-check` as a script (its code and help: tff_clustered/cli/gpu_check.py)."""

from tff_clustered.cli import launch

if __name__ == "__main__":
    launch.gpu_check()
