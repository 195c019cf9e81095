"""The interface every algorithm implements: typed inputs in, decisions out.

An algorithm never touches the training loop. The loop (`orchestration.Experiment`) shows it
a read-only `ServerView` and a `Queries` service (local updates from a given model, losses of
cluster models on clients, inference of client models, stored client models; the loop passes
`loop.queries.ServerQueries`, those five and nothing else of it), and applies
the `Decision` it returns: cluster assignments, new cluster models (their number may change),
a new base/personal split, and the algorithm's own state, which is explicit and checkpointed
with the run. Per round:

    init(run, queries)                       -> Decision     (before round 1)
    eligible(view)                           -> client ids   (who may be sampled)
    plan(view, sampled, queries)             -> Plan         (cluster of each sampled client)
    ... the loop runs the federated round (`federated/round.py`) ...
    after_round(view, result, queries)       -> Decision     (re-cluster, move the split)

Each algorithm owns its options: a frozen dataclass `Options` whose fields are its
command-line flags (`options.define_flags`), so a new flag is one field in the paper's file.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional, Protocol

import numpy as np

from tff_clustered import options as options_lib
from tff_clustered.federated import client_work
from tff_clustered.federated.distributions import Distribution, OwnCluster
from tff_clustered.federated.server_optimizers import ServerOptimizer

UNCHANGED: Any = "unchanged"  # a Decision's state that keeps the previous one
# Models a client can be scored with: "global" (one model for everyone: the one-cluster model,
# or the mean of the cluster models), "cluster" (its cluster's whole model), "personal" (its
# cluster's shared tensors joined with its own others, or its own whole model).
MODEL_KINDS = ("global", "cluster", "personal")


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """Facts about the run that do not change."""

    client_ids: tuple[str, ...]
    train_sizes: Mapping[str, int]
    seed: int
    clients_per_round: int
    layer_sizes: tuple[int, ...]  # trainable tensors per layer, bottom to top
    tensor_sizes: tuple[int, ...]  # values of each trainable tensor, in order
    num_trainable_values: int  # length of the trainable prefix of a flat model
    initial_model: np.ndarray  # flat initial model (all variables)
    public_x: Optional[np.ndarray] = None  # the server's unlabeled public inputs, if any
    input_shape: tuple[int, ...] = ()  # the shape of one example's input
    trainable_shapes: tuple[tuple[int, ...], ...] = ()  # the shape of each trainable tensor
    # Weighted layers after the last convolutional/normalisation one (the FC classifier; 0 for
    # a model of Dense layers only): `models.split.classifier_layers`.
    classifier_layers: int = 0
    total_rounds: int = 0  # the run's length in rounds (0: unknown, outside a run)
    # The model gives an inner layer's output (`FunctionalModel.features`); not a model TFF's
    # functional builder runs (the LSTM).
    reads_features: bool = True

    @property
    def num_tensors(self) -> int:
        return sum(self.layer_sizes)


@dataclasses.dataclass(frozen=True)
class ServerView:
    """What the server holds between rounds; read-only for the algorithm."""

    round_num: int
    cluster_models: np.ndarray  # (num_clusters, D): one flat model per cluster
    assignment: Mapping[str, int]  # client -> cluster, -1: not assigned yet
    shared: tuple[int, ...]  # trainable tensor indices shared within a cluster
    state: Any  # the algorithm's own state
    anchor: Optional[np.ndarray] = None  # (D,) flat model broadcast beside the clusters', if any

    @property
    def num_clusters(self) -> int:
        return len(self.cluster_models)


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What came back from the sampled clients in one round."""

    round_num: int
    client_ids: tuple[str, ...]
    clusters: np.ndarray  # the cluster each client trained in (its own pick, when it picks)
    num_examples: np.ndarray
    loss_sums: np.ndarray
    model_deltas: Optional[np.ndarray]  # (n, D) flat updates, when asked for
    cluster_models_before: np.ndarray  # (num_clusters, D) before aggregation
    # What the client work reported per client (`ClientOutputs.metrics`), stacked by client.
    client_metrics: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Similarity:
    """The matrix a clustering step decided on, kept for the similarity picture. Rows are the
    clients `client_ids` with the clusters `labels` they were given; columns are the same
    clients, or the named `columns` (cluster centers) when given. `measure` says what an entry
    is (a distance or a similarity, and the paper's equation)."""

    measure: str
    client_ids: tuple[str, ...]
    matrix: np.ndarray
    labels: tuple[int, ...]
    round_num: int
    columns: Optional[tuple[str, ...]] = None

    @classmethod
    def to_centers(
        cls,
        measure: str,
        client_ids: Sequence[str],
        matrix: np.ndarray,
        labels: Sequence[int],
        round_num: int,
        center_name: str = "center",
    ) -> Similarity:
        """Clients (rows) against the cluster centers (columns "center 0", ...)."""
        return cls(
            measure,
            tuple(client_ids),
            matrix,
            tuple(int(k) for k in labels),
            round_num,
            columns=tuple(f"{center_name} {k}" for k in range(matrix.shape[1])),
        )


@dataclasses.dataclass(frozen=True)
class ReleasedUpdates:
    """Individual clients' updates as the server may read them outside the round's aggregate
    (`Queries.released_updates`: a cold start's pre-training updates), one row per client of
    `client_ids`; `noise_multiplier` is the Gaussian mechanism's they went through (each
    clipped to `clip` in L2 norm, noise of that multiplier times it per value), None when they
    are raw (a run without noise, or one whose cold start is read raw)."""

    client_ids: tuple[str, ...]
    updates: np.ndarray
    noise_multiplier: Optional[float] = None
    clip: Optional[float] = None

    @property
    def noise_stddev(self) -> float:
        """The noise's standard deviation per value (0: raw)."""
        return (self.noise_multiplier or 0.0) * (self.clip or 0.0)


@dataclasses.dataclass(frozen=True)
class Decision:
    """Changes the loop applies. `assignment` entries replace those clients' clusters;
    `cluster_models` replaces all cluster models (their number may change); `shared` moves the
    base/personal boundary; `anchor` replaces the broadcast anchor model (flat, (D,)); `state`
    replaces the algorithm state unless UNCHANGED; `similarity` is the matrix a clustering step
    used (for the run's picture; it changes nothing); `released` are the individual updates the
    decision read (`Queries.released_updates`), which a private run's ledger charges to the
    clients that sent them."""

    assignment: Mapping[str, int] = dataclasses.field(default_factory=dict)
    cluster_models: Optional[np.ndarray] = None
    shared: Optional[tuple[int, ...]] = None
    anchor: Optional[np.ndarray] = None
    state: Any = UNCHANGED
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    similarity: Optional[Similarity] = None
    released: tuple[ReleasedUpdates, ...] = ()


@dataclasses.dataclass(frozen=True)
class Plan:
    """The sampled clients' clusters for this round (None when each client picks its own in the
    round, `LowestLossCluster`), one number per client for its client work
    (`ClientInputs.client_scalar`, 1.0 when not given: FeSEM's proximal scales, UA-PDFL's
    divergence threshold), any decision taken before
    training (for instance newcomers assigned on first sight), and, for decentralized peers
    (the `Neighbours` distribution), the rows each one receives besides its own, (clients,
    `num_neighbours`)."""

    clusters: Optional[np.ndarray]
    client_scalars: Optional[np.ndarray] = None
    decision: Decision = Decision()
    neighbours: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class Releases:
    """What an algorithm's run sends the server from individual clients' data beside the
    per-cluster aggregate, each item one phrase (a private run states them: summary.json's
    `privacy.covers` and `privacy.not_covered`, `loop.accounting.coverage`). `cold_start`: what
    its cold start and its newcomers' placement read of individual clients' updates, which a
    private cold start (the run's aggregator's `cold_start_mechanism`) clips and noises;
    `outside`: what reaches the server outside any mechanism."""

    cold_start: tuple[str, ...] = ()
    outside: tuple[str, ...] = ()


class Queries(Protocol):
    """Computations the loop runs for an algorithm; none of them changes the run's state."""

    def local_updates(
        self,
        client_ids: Sequence[str],
        start: np.ndarray,
        epochs: int,
        round_num: int,
        steps: Optional[int] = None,
    ) -> np.ndarray:
        """Flat updates of plain local SGD from flat model `start`, one row per client:
        `epochs` passes over each client's data, or `steps` minibatches when given."""

    def released_updates(
        self,
        client_ids: Sequence[str],
        start: np.ndarray,
        epochs: int,
        round_num: int,
        steps: Optional[int] = None,
    ) -> ReleasedUpdates:
        """The `local_updates` as the server may read them: in a private run, each clipped and
        noised by the Gaussian mechanism (`loop.update_release`); otherwise raw (this default).
        A decision that uses them returns them in `Decision.released`, so that the run's
        ledger charges their clients."""
        updates = self.local_updates(client_ids, start, epochs, round_num, steps)
        return ReleasedUpdates(tuple(client_ids), updates)

    def cluster_losses(self, cluster_models: np.ndarray, client_ids: Sequence[str]) -> np.ndarray:
        """Mean training loss of every cluster model on each client, (clients, clusters)."""

    def client_models(self, client_ids: Sequence[str]) -> np.ndarray:
        """The clients' stored own models, flat, one row per client."""

    def predict_probabilities(self, models: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Softmax outputs of each flat model on inputs `x`, (models, len(x), classes)."""

    def initial_model(self, seed: int) -> np.ndarray:
        """A freshly initialised flat model, a fixed function of `seed`."""


class Algorithm:
    """Base class: every client in cluster 0 of one model, trained by local SGD (FedAvg)."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""

    @dataclasses.dataclass(frozen=True)
    class Options:
        pass

    # Options of other algorithms this one refuses, with the hint its error gives.
    refused: ClassVar[Mapping[str, str]] = {
        "num_clusters": "it trains one model; pick a clustered algorithm (ifca, fedgroup, ...)",
        "mu": "it has no proximal term; use --algorithm=fedprox for --mu > 0",
        "personal_layers": "it keeps no personal layers; use --algorithm=fedper",
    }
    # How clients are weighted in each cluster's mean: "num_examples" or "uniform" (an
    # algorithm may set its own from its options, as it may `needs_model_deltas`,
    # `distribution` and `models_from_aggregate`).
    client_weighting: str = "num_examples"
    # Clients keep their whole trained model in the store (stateful clients).
    keep_client_models: ClassVar[bool] = False
    # Each client's flat model update is needed on the server after a round.
    needs_model_deltas: bool = False
    # The model kinds evaluated (`MODEL_KINDS`), the one the paper reports first.
    model_kinds: ClassVar[tuple[str, ...]] = ("global",)
    # How each sampled client receives its model (`federated.distributions`): its own cluster's,
    # every cluster's to pick the lowest-loss one from (IFCA), or its neighbours' rows (peers).
    distribution: Distribution = OwnCluster()
    # Its cluster models come from the round's per-cluster aggregate only (what the server
    # does to them after is post-processing), so a private aggregator (`--aggregator=dp`)
    # protects them and a robust or compressed one shapes all its clients send; false for an
    # algorithm that reads individual clients' models or updates to set models (a split, an
    # M-step, a regrouping), which then takes the mean only: `loop.aggregation.check_aggregator`.
    models_from_aggregate: bool = True
    # Where it is not, the options that would make it so, for the refusal's message.
    private_mode: ClassVar[str] = ""
    # What it sends the server from individual clients beside the aggregate (`Releases`): what
    # a private run says its epsilon covers or not (nothing: its models are the aggregate's).
    # A `cold_start` entry means its start reads clients' own pre-training updates, through
    # `Queries.released_updates` (FedGroup's cold start and newcomers, FeSEM's and CGPFL's
    # K-means), which a private run's cold start clips and noises.
    releases: ClassVar[Releases] = Releases()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An algorithm that declares its own `Options` gets them type-checked where they are
        made, in code as on the command line: `IFCA.Options(num_clusters=2.7)` is a TypeError
        naming the option (`options.checked_fields`), and NumPy scalars become Python values."""
        super().__init_subclass__(**kwargs)
        options_cls = cls.__dict__.get("Options")
        if options_cls is None or not dataclasses.is_dataclass(options_cls):
            return
        made = options_cls.__init__
        if hasattr(made, "__wrapped__"):  # Options shared with another algorithm: checked once
            return
        owner = cls.name or cls.__name__

        @functools.wraps(made)  # keeps the fields' signature for introspection
        def checked_init(self: Any, *args: Any, **values: Any) -> None:
            made(self, *args, **values)
            for name, value in options_lib.checked_fields(self, owner).items():
                object.__setattr__(self, name, value)

        options_cls.__init__ = checked_init

    def __init__(self, options: Optional[Any] = None) -> None:
        self.options = options if options is not None else self.Options()
        if not isinstance(self.options, self.Options):
            raise TypeError(f"{self.name} takes {self.Options.__qualname__}")

    @property
    def cold_start_updates(self) -> bool:
        """Whether its start reads clients' own pre-training updates (its `releases` name a
        cold start), which a private run's cold start clips, noises and charges."""
        return bool(self.releases.cold_start)

    # -- what the round runs ---------------------------------------------------------------------
    @property
    def prox_mu(self) -> float:
        return 0.0

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        return client_work.LocalSGD(prox_mu=float(self.prox_mu), momentum=float(momentum))

    def initial_shared(self, run: RunInfo) -> tuple[int, ...]:
        """Trainable tensors shared within a cluster at the start (default: all)."""
        return tuple(range(run.num_tensors))

    def server_optimizer(self, configured: ServerOptimizer) -> ServerOptimizer:
        """The finalizer's step with each cluster's mean update (default: the run's
        `--server_optimizer`, plain addition unless set)."""
        return configured

    def anchor_tensors(self, run: RunInfo) -> tuple[int, ...]:
        """Trainable tensors of the anchor model broadcast to every client beside its
        cluster's (default: none). It starts as the initial model; `Decision.anchor` moves it."""
        return ()

    # -- decisions ------------------------------------------------------------------------------
    def init(self, run: RunInfo, queries: Queries) -> Decision:
        """Before round 1: by default one cluster holding everybody, from the initial model."""
        return Decision(assignment=dict.fromkeys(run.client_ids, 0), state=None)

    def eligible(self, run: RunInfo, view: ServerView) -> Sequence[str]:
        """Clients that may be sampled in `view.round_num + 1` (default: all)."""
        return run.client_ids

    def early_eligible(self, num_clients: int) -> tuple[int, ...]:
        """How many of `num_clients` clients `eligible` gives each of the first rounds while
        it gives fewer than all, known before the run starts: what a private run's noise is
        calibrated and its first round checked on (default: none, every client eligible)."""
        return ()

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        """Cluster of each sampled client for this round (default: its stored assignment)."""
        return Plan(np.array([view.assignment[c] for c in client_ids], np.int32))

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        """After aggregation (`view` holds the aggregated cluster models)."""
        return Decision()

    def evaluation_clusters(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> np.ndarray:
        """The cluster each client is scored with: its own; one not assigned yet gets the
        cluster model of lowest loss on its training data (IFCA's rule)."""
        clusters = np.array([view.assignment.get(c, -1) for c in client_ids], np.int32)
        waiting = np.flatnonzero(clusters < 0)
        if len(waiting) and view.num_clusters == 1:
            clusters[waiting] = 0
        elif len(waiting):
            losses = queries.cluster_losses(view.cluster_models, [client_ids[i] for i in waiting])
            clusters[waiting] = np.argmin(losses, axis=1)
        return clusters

    # -- reporting ------------------------------------------------------------------------------
    def values_sent_per_round(
        self,
        num_sampled: int,
        shared_values: int,
        num_clusters: int,
        anchor_values: int = 0,
        value_bits: int = 1,
        upload_bits: Optional[int] = None,
    ) -> int:
        """Model values communicated in one round: each sampled client downloads its model
        (IFCA: all cluster models) and the anchor, if any, and uploads its update; personal
        tensors never travel. Counted in values (`value_bits` 1), or in bits with `value_bits`
        32 (float32) and `upload_bits` the bits of one client's upload as its aggregator
        encodes it (`ClusterAggregator.upload_bits`; None: `value_bits` a value)."""
        downloads = self.distribution.models_downloaded(num_clusters)
        if upload_bits is None:
            upload_bits = shared_values * value_bits
        return num_sampled * (
            (shared_values * downloads + anchor_values) * value_bits + upload_bits
        )

    def describe(self) -> dict[str, Any]:
        return dict(algorithm=self.name, **dataclasses.asdict(self.options))

    def run_choices(self, run: RunInfo) -> dict[str, tuple[str, str]]:
        """What this algorithm chose for this run where an option left it to the data (`auto`):
        option -> (value, why, with the numbers). Said on stdout when a run starts and kept in
        summary.json's config (`algorithm_choices`). A pure function of `run`: never of
        measured time, so the same seed gives the same choice on any machine."""
        return {}

    # -- what a comparison table reports of a run, beside the generic figures ----------------
    @classmethod
    def run_figures(cls, trained: Sequence[Mapping[str, Any]]) -> dict[str, Optional[float]]:
        """Figures of a whole run from its rows after round 0 (`comparison.csv` columns):
        none by default; FedTSDP its re-clustering triggers, UA-PDFL its regimes."""
        return {}

    @classmethod
    def figures_text(cls, runs: Sequence[Mapping[str, Any]]) -> list[str]:
        """A table cell's diagnostics from its seeds' `run_figures`, e.g. `triggers 2/3/2`."""
        return []


def per_seed_text(runs: Sequence[Mapping[str, Any]], key: str, label: str, fmt: str) -> list[str]:
    """`label v1/v2/...`: one value per seed (`-` where a seed has none), or nothing when no
    seed has one."""
    values = [r.get(key) for r in runs]
    if all(v is None or v == "" for v in values):
        return []
    shown = ("-" if v in (None, "") else fmt.format(float(v)) for v in values)
    return [f"{label} " + "/".join(shown)]


def check(conditions: Sequence[tuple[bool, str]]) -> None:
    """Raises ValueError with the first failing condition's message."""
    for ok, message in conditions:
        if not ok:
            raise ValueError(message)


def check_cluster_count(name: str, num_clusters: int, run: RunInfo) -> None:
    """Refuses more clusters than the run has clients, naming the flag to lower."""
    if num_clusters > len(run.client_ids):
        raise ValueError(
            f"{name}: num_clusters={num_clusters} exceeds the {len(run.client_ids)} clients; "
            "lower --num_clusters"
        )


def head_layers(given: Optional[int], run: RunInfo) -> int:
    """The top layers an option names, or when unset the model's classifier head (the fully
    connected layers after its last convolutional one; the top layer of a Dense-only model)."""
    return given if given is not None else (run.classifier_layers or 1)


def layers_to_tensors(layer_sizes: Sequence[int], top_layers: int) -> tuple[int, ...]:
    """Indices of the trainable tensors of all but the top `top_layers` layers (-1: none)."""
    if top_layers == -1:
        return ()
    if not 0 <= top_layers <= len(layer_sizes):
        raise ValueError(
            f"asked for {top_layers} personal layers but the model has only {len(layer_sizes)}; "
            "lower --personal_layers"
        )
    kept = sum(layer_sizes[: len(layer_sizes) - top_layers])
    return tuple(range(kept))
