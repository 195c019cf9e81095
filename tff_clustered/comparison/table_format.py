"""The form of a comparison table's files that its writer and its checker share.

The .csv's columns, the .md's seeds line, captions and summary column titles."""

from __future__ import annotations

import re

# comparison.csv's generic columns, in order (every algorithm figure some row has follows).
RUN_COLUMNS = (
    "setting",
    "algorithm",
    "method",
    "seed",
    "max_accuracy",
    "max_accuracy_round",
    "final_accuracy",
    "final_client_mean_accuracy",
    "rounds_to_target",
    "mean_discrepancy",
    "floats_per_round",
    "train_seconds",
    "server_seconds",
    "eval_seconds",
    "checkpoint_seconds",
    "clusters",
    "cluster_sizes",
)
# The .md header's seeds line, and how the checker reads it back.
SEEDS_LINE = "- seeds: {seeds} (cells: mean ± sample std over seeds)"
SEEDS = re.compile(r"^- seeds: ([0-9, ]+?)\s*(\(|$)", re.MULTILINE)
# The caption of a table with a row per setting: its cells are the final accuracy pooled over
# clients, or the unweighted mean over clients (`final_client_mean_accuracy`).
SETTING_CAPTION = "Final test accuracy (%), each client with the model it uses, {mean}."
POOLED = "pooled over clients"
CLIENT_MEAN = "unweighted mean over clients"
# The summary columns of the table with a row per algorithm (FedGroup's Table III shape, one
# decimal), each with the .csv column it shows in %.
SUMMARY_COLUMNS = {
    "max accuracy (%)": "max_accuracy",
    "final accuracy (%)": "final_accuracy",
    "client mean (%)": "final_client_mean_accuracy",
}
