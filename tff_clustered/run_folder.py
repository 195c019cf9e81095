"""The names of the files in a run's output folder and in a comparison table's folder.

A run folder (`binaries/train.py --output_dir`, one cell of a comparison) holds the run's
per-round and per-client CSVs, its summary, its pictures, its checkpoint, its lock and its
TensorBoard event files; a comparison folder holds the table (markdown, long-form CSV, curves)
and one run folder per seed, setting and algorithm. Committed results and the docs name these
files, so their names are fixed here once and every reader and writer takes them from here.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional

METRICS_CSV = "metrics.csv"
SUMMARY_JSON = "summary.json"
CLIENTS_CSV = "clients.csv"
CURVES_PNG = "curves.png"
MEMBERSHIP_PNG = "membership.png"
CLUSTER_ACCURACY_PNG = "cluster_accuracy.png"
LABELS_PNG = "labels.png"
SIMILARITY_PNG = "similarity.png"
HOPKINS_PNG = "hopkins.png"
CHECKPOINT_NAME = "checkpoint.npz"
CLIENT_STORE_NAME = "client_store.bin"  # the disk client store's rows, named by the checkpoint
LEGACY_CHECKPOINT_NAMES = ("checkpoint.pkl",)  # pickles of older versions: refused, never read
LOCK_NAME = ".lock"
EVENT_FILE_PREFIX = "events.out.tfevents."  # TensorBoard's event files
# The files that show a folder holds a run: a run never writes over them unless told to
# (`--resume` continues it, `--overwrite` replaces it).
RUN_OUTPUTS = (
    CHECKPOINT_NAME,
    *LEGACY_CHECKPOINT_NAMES,
    SUMMARY_JSON,
    METRICS_CSV,
    CLIENTS_CSV,
    CLIENT_STORE_NAME,
)
# The pictures a run can leave, in the order a finished run lists them.
PICTURES = (
    MEMBERSHIP_PNG,
    SIMILARITY_PNG,
    CLUSTER_ACCURACY_PNG,
    HOPKINS_PNG,
    CURVES_PNG,
    LABELS_PNG,
)

COMPARISON_MD = "comparison.md"
COMPARISON_CSV = "comparison.csv"
COMPARISON_PNG = "comparison.png"


@dataclasses.dataclass(frozen=True)
class RunFolder:
    """One run's output folder (`path`) and the paths of the files the run writes in it."""

    path: str

    def file(self, name: str) -> str:
        """The path of the file `name` in this folder."""
        return os.path.join(self.path, name)

    @property
    def metrics_csv(self) -> str:
        """One row per round: training, evaluation and the algorithm's own columns."""
        return self.file(METRICS_CSV)

    @property
    def summary_json(self) -> str:
        """The run's settings, final and best accuracies, clusters and phases."""
        return self.file(SUMMARY_JSON)

    @property
    def clients_csv(self) -> str:
        """One row per evaluated client and round."""
        return self.file(CLIENTS_CSV)

    @property
    def curves_png(self) -> str:
        """Test accuracy and test/train loss against rounds."""
        return self.file(CURVES_PNG)

    @property
    def membership_png(self) -> str:
        """Each client's cluster per evaluated round."""
        return self.file(MEMBERSHIP_PNG)

    @property
    def cluster_accuracy_png(self) -> str:
        """Each cluster's test accuracy against rounds."""
        return self.file(CLUSTER_ACCURACY_PNG)

    @property
    def labels_png(self) -> str:
        """Training examples per class at each client (the partition)."""
        return self.file(LABELS_PNG)

    @property
    def similarity_png(self) -> str:
        """The matrix the last clustering step used, ordered by cluster."""
        return self.file(SIMILARITY_PNG)

    @property
    def hopkins_png(self) -> str:
        """FedTSDP's re-clustering trigger per round."""
        return self.file(HOPKINS_PNG)

    @property
    def checkpoint(self) -> str:
        """The run's state after its last checkpointed round (`tff_clustered.runs.checkpoint`)."""
        return self.file(CHECKPOINT_NAME)

    @property
    def client_store(self) -> str:
        """The clients' own models with `--client_store=disk` (`loop/client_store.py`)."""
        return self.file(CLIENT_STORE_NAME)

    @property
    def legacy_checkpoints(self) -> tuple[str, ...]:
        """Where older versions wrote their pickle checkpoints."""
        return tuple(self.file(name) for name in LEGACY_CHECKPOINT_NAMES)

    @property
    def lock(self) -> str:
        """The file a run holds an exclusive lock on while it writes in this folder."""
        return self.file(LOCK_NAME)

    def pictures_written(self) -> list[str]:
        """The names of the `PICTURES` this folder holds."""
        return [name for name in PICTURES if os.path.exists(self.file(name))]

    def run_outputs(self) -> list[str]:
        """The names of the `RUN_OUTPUTS` this folder holds (none: it holds no run)."""
        return [name for name in RUN_OUTPUTS if os.path.exists(self.file(name))]

    def event_files(self) -> list[str]:
        """The paths of the TensorBoard event files in this folder, by name."""
        if not os.path.isdir(self.path):
            return []
        names = sorted(n for n in os.listdir(self.path) if n.startswith(EVENT_FILE_PREFIX))
        return [self.file(n) for n in names]

    def remove_run(self) -> None:
        """Deletes the files a run writes here (`RUN_OUTPUTS`, the pictures, the TensorBoard
        events): what `--overwrite` does before its new run. Other files, the lock and
        subfolders (a `--baseline` run's) are left alone."""
        names = [*RUN_OUTPUTS, *PICTURES]
        for path in [self.file(n) for n in names] + self.event_files():
            if os.path.isfile(path):
                os.unlink(path)

    def baseline(self, algorithm: str) -> RunFolder:
        """The folder of `algorithm`'s run on the same clients (`train.py --baseline`)."""
        return RunFolder(self.file(f"baseline-{algorithm}"))


@dataclasses.dataclass(frozen=True)
class ComparisonFolder:
    """A comparison table's folder (`binaries/compare.py --output_dir`): the table's files and
    one run folder per run, at `[sSEED/][SETTING/]ALGORITHM/`."""

    path: str

    @property
    def comparison_md(self) -> str:
        """The table, each cell's diagnostics per seed, the command and its date."""
        return os.path.join(self.path, COMPARISON_MD)

    @property
    def comparison_csv(self) -> str:
        """Every run's figures in long form."""
        return os.path.join(self.path, COMPARISON_CSV)

    @property
    def comparison_png(self) -> str:
        """Test accuracy against rounds, one panel per setting, one curve per algorithm."""
        return os.path.join(self.path, COMPARISON_PNG)

    def run(self, seed: Optional[int], setting: Optional[str], algorithm: str) -> RunFolder:
        """The folder of one run: under `sSEED/` when the table has several seeds (`seed`
        given), under the setting's folder when the table has settings."""
        parts = [f"s{seed}"] if seed is not None else []
        return RunFolder(os.path.join(self.path, *parts, setting_directory(setting), algorithm))


def setting_directory(setting: Optional[str]) -> str:
    """A setting's folder name (`dirichlet:0.5` -> `dirichlet-0.5`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", setting) if setting else ""
