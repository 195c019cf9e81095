"""`tff-benchmark` as a script (its code and help: tff_clustered/cli/benchmark.py)."""

from tff_clustered.cli import launch

if __name__ == "__main__":
    launch.benchmark()
