"""`tff-check-results` as a script (its code and help: tff_clustered/cli/check_results.py)."""

from tff_clustered.cli import launch

if __name__ == "__main__":
    launch.check_results()
