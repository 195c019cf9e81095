"""The decentralized loop UA-PDFL runs on, and the baselines of its comparison.

UA-PDFL (Zhu, Fan, Xie, "UA-PDFL: A Personalized Approach for Decentralized Federated
Learning") compares against Local, FedAvg-DFL, FedPer-DFL and DFedAvgM, each a `Decentralized`
algorithm here saying which part of the model its peers mix. Peers are TFF clients and the
server only routes (`federated/peer_work.py`: a peer's round as client work, `PeerStep` for
the baselines); after the round the mailbox is the peers' new models. The queue Q_i of each
peer is drawn by the orchestration from the keyed stream (seed, round, peer), the same draw a
peer would make.

Every peer takes part in every round: set --clients_per_round to the number of peers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import numpy as np

from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Plan,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
    check,
    layers_to_tensors,
    per_seed_text,
)
from tff_clustered.federated import client_work
from tff_clustered.federated.distributions import Neighbours
from tff_clustered.federated.peer_work import PeerStep
from tff_clustered.options import option
from tff_clustered.seeds import ALGORITHM, derived_seed

TOPOLOGIES = ("dynamic", "static")


class Decentralized(Algorithm):
    """The shared decentralized loop: every peer active every round, each pulling N_com rows
    chosen uniformly among the other peers (redrawn every round, or once: `--dfl_topology`);
    after the round the mailbox is the peers' new models. A subclass says which part of the
    model its peers mix (`mixes_base`, `mixes_head`) or gives its own `client_work`."""

    distribution = Neighbours()  # each instance: Neighbours(num_neighbours)
    keep_client_models = True
    model_kinds = ("personal",)
    mixes_base: ClassVar[bool] = True  # g averaged over {i} and Q_i
    mixes_head: ClassVar[bool] = True  # h averaged over {i} and Q_i
    refused = {
        **Algorithm.refused,
        "num_clusters": "a decentralized algorithm has no clusters (peers pull --num_neighbours)",
    }

    @dataclasses.dataclass(frozen=True)
    class Options:
        num_neighbours: int = option(5, "Decentralized: peers each peer pulls per round (N_com).")
        dfl_topology: str = option(
            "dynamic", "Decentralized: redraw the queues every round, or once.", TOPOLOGIES
        )
        dfl_head_layers: int = option(
            0,
            "Decentralized: top weighted layers forming the head h (the rest is g); 0: the "
            "fully connected layers after the last convolutional/BN layer (the top layer of a "
            "model of Dense layers only).",
        )
        dfl_local_statistics: bool = option(
            False,
            "Decentralized: keep each peer's BatchNorm moving statistics its own (FedBN-style) "
            "instead of mixing them with their layer's weights.",
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check(
            [
                (self.options.num_neighbours >= 0, "num_neighbours must be >= 0"),
                (self.options.dfl_head_layers >= 0, "dfl_head_layers must be >= 0"),
            ]
        )
        self.distribution = Neighbours(self.num_neighbours)

    @property
    def num_neighbours(self) -> int:
        return int(self.options.num_neighbours)

    def head_start(self, run: RunInfo) -> int:
        """The first trainable tensor of the head h."""
        layers = self.options.dfl_head_layers or run.classifier_layers or 1
        if layers > len(run.layer_sizes):
            raise ValueError(
                f"{self.name}: --dfl_head_layers={layers} but the model has "
                f"{len(run.layer_sizes)} weighted layers; lower --dfl_head_layers"
            )
        return len(layers_to_tensors(run.layer_sizes, layers))  # g's tensors come first

    def peer_step(self, run: RunInfo, momentum: float) -> client_work.ClientWork:
        """A peer's whole round, as client work (`PeerStep` for the baselines)."""
        return PeerStep(
            self.head_start(run),
            mix_base=self.mixes_base,
            mix_head=self.mixes_head,
            momentum=momentum,
            local_statistics=bool(self.options.dfl_local_statistics),
        )

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        step = self.peer_step(run, self.peer_momentum(momentum))
        if step.reads_features and not run.reads_features:
            raise ValueError(
                f"{self.name} compares and aligns the peers' auxiliary representations, the "
                "output of the feature extractor g on the unit input (Eqs. 4, 12), and this "
                "model gives no inner layer's output (it runs through TFF's functional model): "
                "use a model of the layers the functional interpreter runs (Dense, convolution, "
                "pooling, BatchNorm, Embedding, LSTM; e.g. --model=cnn)"
            )
        return step

    def peer_momentum(self, momentum: float) -> float:
        """The local momentum of the peers' SGD: the run's `--momentum`."""
        return float(momentum)

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        """Common initialisation (one seed): every mailbox row is the initial model."""
        peers = len(run.client_ids)
        if run.clients_per_round < peers:
            raise ValueError(
                f"{self.name}: every peer takes part in every round; set --clients_per_round "
                f"to the number of peers ({peers}), got {run.clients_per_round}"
            )
        if self.num_neighbours > peers - 1:
            raise ValueError(
                f"{self.name}: num_neighbours={self.num_neighbours} but a peer has only "
                f"{peers - 1} others; lower --num_neighbours"
            )
        return Decision(
            assignment={c: i for i, c in enumerate(run.client_ids)},
            cluster_models=np.repeat(run.initial_model[None, :], peers, axis=0),
            state=None,
        )

    def queues(self, run: RunInfo, round_num: int) -> np.ndarray:
        """Q_i for every peer (rows: peers in `run.client_ids` order), N_com distinct other
        peers drawn uniformly from the stream (seed, round, peer); round 0's for every round
        with a static topology."""
        peers, n = len(run.client_ids), self.num_neighbours
        r = round_num if self.options.dfl_topology == "dynamic" else 0
        rows = []
        for i in range(peers):
            rng = np.random.default_rng(derived_seed(run.seed, ALGORITHM, r, i))
            others = rng.choice(peers - 1, n, replace=False)
            rows.append(np.where(others >= i, others + 1, others))
        return np.array(rows, np.int32).reshape(peers, n)

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        index = {c: i for i, c in enumerate(run.client_ids)}
        rows = np.array([index[c] for c in client_ids], np.int32)
        return Plan(rows, neighbours=self.queues(run, view.round_num + 1)[rows])

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        """The mailbox becomes the peers' new models; the round's reports are logged
        (`round_log`)."""
        mailbox = queries.client_models(list(run.client_ids))
        return Decision(cluster_models=mailbox, metrics=self.round_log(result.client_metrics))

    def round_log(self, client_metrics: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Per-round log of the peers' reports: the mean number of neighbours received and
        the values received in all (`floats_communicated`); a subclass adds its own."""
        return {
            "neighbours_mean": float(np.mean(client_metrics["neighbours_received"])),
            "floats_communicated": float(np.sum(client_metrics["values_received"])),
        }

    @classmethod
    def run_figures(cls, trained: Sequence[Mapping[str, Any]]) -> dict[str, Optional[float]]:
        """The mean number of neighbours a peer mixed per round."""
        counts = [r["neighbours_mean"] for r in trained if "neighbours_mean" in r]
        return {"neighbours_mean": float(np.mean(counts)) if counts else None}

    @classmethod
    def figures_text(cls, runs: Sequence[Mapping[str, Any]]) -> list[str]:
        return per_seed_text(runs, "neighbours_mean", "neighbours", "{:.1f}")


class LocalDFL(Decentralized):
    """Local training only, in the decentralized loop (UA-PDFL's "Local" column)."""

    name = "local_dfl"
    mixes_base = mixes_head = False
    paper = "baseline of UA-PDFL: each peer trains alone"


class FedAvgDFL(Decentralized):
    """Each peer averages the whole models of itself and its neighbours, then trains.

    FedAvg made decentralized as UA-PDFL's comparison does ("each client its own server"):
    w_i <- the |D|-weighted mean of the whole models of {i} and Q_i, then local SGD."""

    name = "fedavg_dfl"
    paper = "McMahan et al. 2017, decentralized as in UA-PDFL's comparison"


class FedPerDFL(Decentralized):
    """FedPer made decentralized: g averaged over {i} and Q_i (|D| weights), h kept local."""

    name = "fedper_dfl"
    mixes_head = False
    paper = "Arivazhagan et al. 2019, decentralized as in UA-PDFL's comparison"


class DFedAvgM(Decentralized):
    """Neighbour averaging, then local SGD with heavy-ball momentum.

    DFedAvgM (Sun, Li, Wang, "Decentralized Federated Averaging", TPAMI 2023): neighbour
    averaging then local SGD with heavy-ball momentum (`--dfedavgm_momentum`, used instead of
    --momentum). Its mixing here is UA-PDFL's adaptation (|D| weights over {i} and Q_i), not
    the paper's doubly stochastic matrix; UA-PDFL runs it with twice the local iterations and
    half the rounds (set --local_epochs and --rounds)."""

    name = "dfedavgm"
    paper = "Sun et al., Decentralized Federated Averaging, TPAMI 2023"

    @dataclasses.dataclass(frozen=True)
    class Options(Decentralized.Options):
        dfedavgm_momentum: float = option(0.9, "DFedAvgM: local heavy-ball momentum.")

    def peer_momentum(self, momentum: float) -> float:
        return float(self.options.dfedavgm_momentum)
