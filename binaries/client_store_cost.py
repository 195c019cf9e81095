"""`tff-client-store-cost` as a script (code and help: tff_clustered/cli/client_store_cost.py)."""

from tff_clustered.cli import launch

if __name__ == "__main__":
    launch.client_store_cost()
