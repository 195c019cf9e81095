"""`tff-model-matrix` as a script (its code and help: tff_clustered/cli/model_matrix.py)."""

from tff_clustered.cli import launch

if __name__ == "__main__":
    launch.model_matrix()
