"""`tff-docs-tables` as a script (its code and help: tff_clustered/cli/docs_tables.py)."""

from tff_clustered.cli import launch

if __name__ == "__main__":
    launch.docs_tables()
