"""The pictures of a run and of a comparison table (matplotlib, written as PNG files).

A run's: accuracy and loss curves, each client's cluster per round, each cluster's accuracy,
FedTSDP's re-clustering trigger, the similarity matrix a clustering step used, and the
partition's labels per client. A comparison's: each algorithm's accuracy curve per setting.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered.algorithms.base import Similarity
from tff_clustered.atomic_files import atomic_write_bytes

# At most this many clients are drawn in a per-client picture (the first ones).
MAX_CLIENTS_SHOWN = 200


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (imported on first use: it is slow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str) -> None:
    """A matplotlib figure as a PNG, written atomically, then closed."""
    plt = pyplot()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def write_curves_png(path: str, history: Sequence[dict[str, Any]], title: str) -> None:
    """Test accuracy and test/train loss against rounds."""
    plt = pyplot()
    evaluated = [r for r in history if "accuracy" in r]
    trained = [r for r in history if "train_loss" in r]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    ax_acc.plot([r["round"] for r in evaluated], [r["accuracy"] for r in evaluated], marker=".")
    ax_acc.set(xlabel="round", ylabel="test accuracy", title="accuracy", ylim=(0, 1))
    ax_loss.plot([r["round"] for r in evaluated], [r["loss"] for r in evaluated], label="test")
    ax_loss.plot([r["round"] for r in trained], [r["train_loss"] for r in trained], label="train")
    ax_loss.set(xlabel="round", ylabel="loss", title="loss")
    ax_loss.legend()
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    save_figure(fig, path)


def write_membership_png(
    path: str, clients_csv: str, title: str, planted: Optional[Mapping[str, int]] = None
) -> None:
    """Clients (rows) by evaluated rounds (columns), coloured by the cluster each client was
    scored with; white where it had no assignment yet. With the data's `planted` groups, a
    strip on the left shows each client's group (in greys), so recovered groups show as bands
    that match the strip. No rows (no clients.csv: a resumed run's file was lost and no round
    was evaluated since): no picture, and none left from before."""
    rows = []
    if os.path.exists(clients_csv):
        with open(clients_csv, newline="") as f:
            rows = list(csv.DictReader(f))
    if not rows:
        if os.path.exists(path):
            os.unlink(path)
        return
    plt = pyplot()
    clients = list(dict.fromkeys(r["client"] for r in rows))[:MAX_CLIENTS_SHOWN]
    rounds = sorted({int(r["round"]) for r in rows})
    index = {c: i for i, c in enumerate(clients)}
    column = {t: j for j, t in enumerate(rounds)}
    grid = np.full((len(clients), len(rounds)), np.nan)
    for r in rows:
        if r["client"] in index and r.get("assigned", "1") == "1":
            grid[index[r["client"]], column[int(r["round"])]] = int(r["cluster"])
    num_clusters = int(np.nanmax(grid)) + 1 if np.isfinite(grid).any() else 1
    # clients ordered by their final cluster, so groups show as bands
    order = np.lexsort((np.arange(len(clients)), np.nan_to_num(grid[:, -1], nan=num_clusters)))
    height = max(3.0, min(12.0, 0.08 * len(clients) + 2))
    if planted:
        fig, (strip, ax) = plt.subplots(
            1, 2, figsize=(8.6, height), sharey=True, gridspec_kw={"width_ratios": [1, 24]}
        )
        groups = np.array([planted.get(c, -1) for c in clients], np.float64)[order]
        strip.imshow(
            groups[:, None], aspect="auto", interpolation="nearest", cmap="Greys",
            vmin=-1, vmax=max(groups.max(), 0) + 0.5,
            extent=(-0.5, 0.5, len(clients) - 0.5, -0.5),
        )  # fmt: skip
        strip.set(xticks=[], xlabel="planted\ngroup", ylabel="client (ordered by final cluster)")
    else:
        fig, ax = plt.subplots(figsize=(8, height))
    cmap = plt.get_cmap("tab20", max(num_clusters, 1))
    image = ax.imshow(
        grid[order], aspect="auto", interpolation="nearest", cmap=cmap,
        vmin=-0.5, vmax=num_clusters - 0.5,
        extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(clients) - 0.5, -0.5),
    )  # fmt: skip
    ax.set(xlabel="round", title=title)
    if not planted:
        ax.set_ylabel("client (ordered by final cluster)")
    if num_clusters <= 20:
        fig.colorbar(image, ax=ax, ticks=range(num_clusters), label="cluster")
    save_figure(fig, path)


def write_cluster_accuracy_png(path: str, history: Sequence[dict[str, Any]], title: str) -> None:
    """Pooled test accuracy of each cluster's clients against rounds."""
    plt = pyplot()
    columns = sorted(
        {k for r in history for k in r if k.startswith("cluster_accuracy_")},
        key=lambda k: int(k.rsplit("_", 1)[1]),
    )
    fig, ax = plt.subplots(figsize=(8, 4))
    for column in columns:
        points = [(r["round"], r[column]) for r in history if column in r]
        ax.plot(*zip(*points), marker=".", label=f"cluster {column.rsplit('_', 1)[1]}")
    ax.set(xlabel="round", ylabel="test accuracy of its clients", title=title, ylim=(0, 1))
    ax.grid(alpha=0.3)
    if 0 < len(columns) <= 20:
        ax.legend(fontsize="small", ncol=2)
    save_figure(fig, path)


def write_hopkins_png(path: str, history: Sequence[dict[str, Any]], title: str) -> bool:
    """FedTSDP's re-clustering trigger per round: the Hopkins statistic H of the clients'
    outputs, the level it had to exceed (`hopkins_threshold`: h_th, or the reference's mean
    plus z standard deviations), the reference's mean with a band of one standard deviation
    when the trigger is calibrated, and the rounds that re-clustered marked, so a run shows why
    FedTSDP did or did not act. Nothing is written (False) when no round has an H."""
    rows = [r for r in history if "hopkins" in r]
    if not rows:
        return False
    plt = pyplot()
    rounds = np.array([r["round"] for r in rows])

    def column(name: str) -> np.ndarray:
        return np.array([r.get(name, np.nan) for r in rows], np.float64)

    fig, ax = plt.subplots(figsize=(8, 4))
    reference, spread = column("hopkins_reference"), column("hopkins_reference_std")
    if np.isfinite(reference).any():
        ax.fill_between(
            rounds, reference - spread, reference + spread, color="tab:gray", alpha=0.3,
            label="reference H, mean ± std",
        )  # fmt: skip
        ax.plot(rounds, reference, color="tab:gray", linewidth=1)
    ax.plot(rounds, column("hopkins_threshold"), "--", color="tab:red", label="trigger level")
    ax.plot(rounds, column("hopkins"), marker=".", color="tab:blue", label="H of the outputs")
    fired = column("clustered") > 0
    if fired.any():
        ax.scatter(
            rounds[fired], column("hopkins")[fired], marker="o", s=60, facecolors="none",
            edgecolors="tab:red", zorder=3,
            label=f"re-clustered: {int(fired.sum())} of {len(rows)} rounds",
        )  # fmt: skip
    ax.set(xlabel="round", ylabel="Hopkins statistic", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save_figure(fig, path)
    return True


def write_similarity_png(path: str, similarity: Similarity, title: str) -> None:
    """The matrix a clustering step used (`Similarity`), rows (and, for a client-by-client
    matrix, columns) ordered by the cluster each client was given, blocks outlined."""
    plt = pyplot()
    labels = np.asarray(similarity.labels)
    order = np.argsort(labels, kind="stable")[:MAX_CLIENTS_SHOWN]
    matrix = np.asarray(similarity.matrix, np.float64)[order]
    square = similarity.columns is None
    if square:
        matrix = matrix[:, order]
    shown = labels[order]
    fig, ax = plt.subplots(figsize=(7.5, 6))
    image = ax.imshow(matrix, aspect="auto", interpolation="nearest", cmap="viridis")
    for edge in np.flatnonzero(np.diff(shown)) + 0.5:
        ax.axhline(edge, color="white", linewidth=1)
        if square:
            ax.axvline(edge, color="white", linewidth=1)
    clusters, starts, counts = np.unique(shown, return_index=True, return_counts=True)
    ax.set_yticks(starts + (counts - 1) / 2, [f"{k} ({n})" for k, n in zip(clusters, counts)])
    if square:
        ax.set_xticks(starts + (counts - 1) / 2, [str(k) for k in clusters])
        ax.set_xlabel("client, ordered by cluster")
    else:
        ax.set_xticks(range(len(similarity.columns)), similarity.columns, rotation=30)
    ax.set(
        ylabel="client, by cluster (size)",
        title=f"{title}\n{len(labels)} clients, round {similarity.round_num}",
    )
    fig.colorbar(image, ax=ax, label=similarity.measure)
    save_figure(fig, path)


def write_labels_png(
    path: str, label_counts: np.ndarray, client_ids: Sequence[str], title: str
) -> None:
    """The partition: training examples of each class (columns) at each client (rows)."""
    plt = pyplot()
    shown = label_counts[:MAX_CLIENTS_SHOWN]
    fig, ax = plt.subplots(figsize=(8, max(3.0, min(12.0, 0.08 * len(shown) + 2))))
    image = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set(xlabel="class", ylabel=f"client (first {len(shown)} of {len(client_ids)})", title=title)
    fig.colorbar(image, ax=ax, label="training examples")
    save_figure(fig, path)


def write_comparison_png(
    path: str,
    histories: Mapping[tuple[str, str], Sequence[Sequence[Mapping[str, Any]]]],
    title: str,
    key: str = "accuracy",
) -> None:
    """Test accuracy against rounds, one panel per setting, one curve per algorithm: the mean
    over seeds with a band of ± one std where there are several."""
    plt = pyplot()
    settings = list(dict.fromkeys(setting for setting, _ in histories))
    fig, axes = plt.subplots(1, len(settings), figsize=(8 * len(settings), 5), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for (where, name), runs in histories.items():
            if where != setting:
                continue
            curves = [
                {r["round"]: r[key] for r in h if not math.isnan(r.get(key, math.nan))}
                for h in runs
            ]
            rounds = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if not rounds:
                continue
            values = np.array([[c[t] for t in rounds] for c in curves])
            (line,) = ax.plot(rounds, values.mean(axis=0), label=name)
            if len(values) > 1:
                std = values.std(axis=0, ddof=1)
                mean = values.mean(axis=0)
                ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        ax.set(xlabel="round", ylabel=f"test {key.replace('_', ' ')}", title=setting, ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    fig.suptitle(title)
    save_figure(fig, path)
