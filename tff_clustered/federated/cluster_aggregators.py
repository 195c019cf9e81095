"""The aggregator part of a round, one instance per cluster (`ClusterAggregator`).

The aggregator part of a round, one instance per cluster: what happens to a client's shared
update between its training and its cluster's mean, and to each cluster's sum on the server.

Every aggregator, the default `ClusterMean` (the weighted mean per cluster,
`clustered_mean.py`) included, runs as the same plain TF functions on every execution (TFF's
worker, several workers, in process), on the one path of the round (`round.py`), so every
execution and a resumed run give the same results:

* client side, `preprocess(params, delta, cluster, weight, seed) -> (delta, weight, stats)`:
  the client's update for its cluster (clipped, zeroed or quantized with its cluster's
  parameters `params`, which the server broadcasts in the round's hyperparameters), its weight
  in the cluster's sum, and a small statistics row of `stats_width` values. The round adds the
  update into its cluster's row of the `[K, ...]` stack and the statistics into the row of a
  `[K, stats_width]` stack, O(d) per client whatever the number of clusters;
* server side, `finalize(sums, total_weight, stats, state, inputs) -> (means, updated, state,
  measurements)`: each cluster's mean update from its sums, which clusters step (the server
  optimizer's `updated`), the aggregator's new state (one row per cluster) and what the round
  reports. `inputs` are the round's values the loop sets (`round_inputs`): a seed for any
  randomness (stateless, so the same on every execution) and each cluster's expected number
  of clients (a private mean divides by it, never by the realised count).

An aggregator is a frozen value, part of the round's `RoundSignature` (the built round's cache
key). Its state lives in the round's server state (`server_state.ServerState`), slot
`aggregator`: `{"state": {name: [K] array}, "inputs": {"seed": int64[2], "denominator":
float32[K]}}` for one that `takes_round_inputs`; `()` for the mean, which takes none.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated.clustered_mean import cluster_mean
from tff_clustered.options import checked_fields, described

AggregatorState = dict[str, np.ndarray]  # each entry one row per cluster


@dataclasses.dataclass(frozen=True)
class ClusterAggregator:
    """Base of the aggregators (see the module docstring). Subclasses set `name` and override
    the steps they change; the base's steps are the identity (a plain per-cluster sum divided
    by the expected counts)."""

    name: ClassVar[str] = ""
    # It reads per-round inputs the loop sets (a noise seed, each cluster's expected count:
    # `round_inputs`) and parameters its clients read (`client_params`, in the round's
    # hyperparameters), and keeps its state in the server state's slot; one that does not (the
    # mean) has an empty slot and no parameters.
    takes_round_inputs: ClassVar[bool] = True
    # Every client weighs 1 in its cluster's sum (a private sum needs a bounded contribution):
    # the round's signature must then weigh clients uniformly.
    uniform_weights: ClassVar[bool] = False
    # It gives differential privacy to what comes out of it (`round_event`), which an
    # algorithm that reads individual clients' updates would void
    # (`Algorithm.models_from_aggregate`).
    private: ClassVar[bool] = False
    # It runs only as one TFF computation over all of a round's clients (a `tff.aggregators`
    # factory: `tff_factory_aggregator.py`), not as TF functions in process or over shares.
    tff_computation_only: ClassVar[bool] = False

    # -- its declarations: what users and the loop see of it (`federated.aggregators`) ---------
    # One line saying what it does, for the flags' help and docs/options.md.
    summary: ClassVar[str] = ""
    # Its settings as users give them (the flags, `tff_clustered.run`, docs/options.md): a
    # frozen `AggregatorOptions` dataclass of `options.option(...)` fields, each a flag, built
    # into the aggregator by `from_options`; None: its own fields are its settings.
    Options: ClassVar[Optional[type]] = None
    # It bounds, noises or encodes each client's update (every aggregator but the mean): an
    # algorithm that reads clients' individual updates beside the aggregate voids it, and
    # round metrics, which read them, are refused (`loop.aggregation.check_aggregator`).
    voided_by_individual_updates: ClassVar[bool] = True
    # It is built from its settings alone, so the command line (`--aggregator`) and `run`
    # take it by name; a `tff.aggregators` factory is a Python object, given to `run` only.
    named: ClassVar[bool] = True
    # Its settings that only a cold start reading clients' own updates uses (`cold_start_
    # mechanism`): given for algorithms without one, they are refused (`cli.run_flags`).
    cold_start_settings: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def options_type(cls) -> type:
        """The dataclass of its settings: `Options`, or the aggregator itself."""
        return cls.Options or cls

    @classmethod
    def from_options(cls, options: Any) -> ClusterAggregator:
        """The aggregator its settings `options` describe (an aggregator without `Options`:
        they are the aggregator)."""
        return options

    def options(self) -> Any:
        """The settings that build this aggregator back (`from_options`)."""
        return self

    @classmethod
    def record(cls, options: Any = None) -> dict[str, Any]:
        """What a run records of its settings `options` (summary.json, checkpoints): each
        option's value (None: each option's default)."""
        fields = dataclasses.fields(cls.options_type())
        if options is None:
            return {f.name: f.default for f in fields}
        return {f.name: getattr(options, f.name) for f in fields}

    @classmethod
    def privacy_budget(cls, options: Any) -> Optional[PrivacyBudget]:
        """What the accountant reads of its settings (`loop.accounting`): None for an
        aggregator that adds no noise."""
        return None

    @classmethod
    def with_noise_multiplier(cls, options: Any, noise_multiplier: float) -> Any:
        """Its settings with the noise multiplier calibrated to their target epsilon (only
        for one whose `privacy_budget` says `calibrate`)."""
        raise ValueError(f"the {cls.name} aggregator has no noise multiplier to calibrate")

    @classmethod
    def with_cold_start_noise_multiplier(cls, options: Any, noise_multiplier: float) -> Any:
        """Its settings with the private cold start's noise multiplier set by the budget's
        rule (only for one whose `privacy_budget` has a `cold_start_share`)."""
        raise ValueError(f"the {cls.name} aggregator has no private cold start")

    def cold_start_mechanism(self) -> Optional[tuple[float, float]]:
        """The Gaussian mechanism individual clients' pre-training updates go through before a
        private run's server reads them (a cold start's: `loop.update_release`), as (clip norm,
        noise multiplier); None: they are read raw."""
        return None

    def privacy_record(self) -> dict[str, Any]:
        """Its mechanism's settings in summary.json's `privacy` block (one that adds noise)."""
        return {}

    @property
    def secure_noise(self) -> bool:
        """Its round's noise key is to come from the operating system's CSPRNG, fresh each
        round and never recorded (`loop.aggregation.noise_key`), not from the run's seed."""
        return False

    def resume_warning(self) -> str:
        """What a resumed run should be told of settings its checkpoint could not record ("":
        nothing)."""
        return ""

    def __post_init__(self) -> None:
        """Every field of its declared type, as the command line's flag parser gives it: a
        wrong type is a TypeError naming the field and what to write (`options.checked_value`:
        `ClusterDP(noise_multiplier="1")` is refused with "write 1.0"); NumPy scalars become
        Python values. A subclass's own range checks follow, in its `__post_init__`."""
        for name, value in checked_fields(self, type(self).__name__).items():
            object.__setattr__(self, name, value)
        check_hashable(self)

    def divergence_hint(self) -> str:
        """What of this aggregator's settings may have made a model non-finite, and the fix,
        for the message that stops such a run ("" when nothing of it can: the learning rate
        is then the cause named)."""
        return ""

    def check_workers(self, num_workers: int = 1) -> None:
        """Refuses a round split over `num_workers` > 1 workers when it cannot run one
        (`tff_computation_only`: one process over all of a round's clients). Which execution
        can run the aggregator at all is the execution's check
        (`executions.Execution.check_aggregator`)."""
        if self.tff_computation_only and num_workers > 1:
            raise ValueError(
                f"the {self.name} aggregator (a tff.aggregators factory) runs each cluster's "
                f"process over all of a round's clients in one computation, which a round "
                f"split over {num_workers} workers cannot: run it on one worker (no --workers)"
            )

    @property
    def stats_width(self) -> int:
        """Values per client in the statistics `preprocess` returns (0: none)."""
        return 0

    def initial_state(self, num_clusters: int) -> AggregatorState:
        """The state of `num_clusters` clusters before their first round, one row each."""
        return collections.OrderedDict()

    def state_or_initial(
        self, state: Optional[Mapping[str, np.ndarray]], num_clusters: int
    ) -> AggregatorState:
        """`state` while it holds `num_clusters` rows of this aggregator's entries, else the
        initial state (a change in the number of clusters restarts it)."""
        initial = self.initial_state(num_clusters)
        if state is None or set(state) != set(initial):
            return initial
        if any(len(np.asarray(value)) != num_clusters for value in state.values()):
            return initial
        return collections.OrderedDict((key, np.asarray(state[key])) for key in initial)

    def client_params(self, state: Mapping[str, Any]) -> collections.OrderedDict:
        """What the clients read of the state (broadcast in the round's hyperparameters)."""
        return collections.OrderedDict()

    def preprocess(
        self,
        params: Mapping[str, tf.Tensor],
        delta: tuple,
        cluster: tf.Tensor,
        weight: tf.Tensor,
        seed: tf.Tensor,
    ) -> tuple[tuple, tf.Tensor, tf.Tensor]:
        """One client's `(delta, weight, stats)` for its cluster `cluster` (a scalar int32):
        `delta` its shared update (a tuple of tensors), `weight` its weight in the cluster's
        sum (0 for a client whose update diverged), `seed` its stateless seed (int32[2])."""
        return tuple(delta), weight, tf.zeros([self.stats_width], tf.float32)

    def finalize(
        self,
        sums: tuple,
        total_weight: tf.Tensor,
        stats: tf.Tensor,
        state: Mapping[str, tf.Tensor],
        inputs: Mapping[str, tf.Tensor],
    ) -> tuple[tuple, tf.Tensor, collections.OrderedDict, collections.OrderedDict]:
        """`(means, updated, state, measurements)` from each cluster's sums of the clients'
        weighted updates (`[K, ...]` per tensor), their total weights (`[K]`) and statistics
        (`[K, stats_width]`): the mean update of each cluster, which clusters step (`[K]`
        bool), the new state and what the round reports (each `[K]`)."""
        denominator = inputs["denominator"]
        in_use = denominator > 0
        means = tuple(divide_rows(t, denominator) for t in sums)
        return means, in_use, collections.OrderedDict(state), collections.OrderedDict()

    def measurement_columns(
        self, measurements: Mapping[str, np.ndarray], num_clusters: int
    ) -> dict[str, float]:
        """A round's metrics.csv columns from its `measurements` (`name_cluster_k`)."""
        return {
            f"{name}_cluster_{k}": float(np.asarray(values)[k])
            for name, values in measurements.items()
            if name != "cluster_weight"
            for k in range(num_clusters)
        }

    def upload_bits(self, tensor_sizes: Sequence[int]) -> int:
        """Bits one client's upload of its shared update takes, its tensors of `tensor_sizes`
        values each: 32 a value (float32) unless the aggregator encodes them otherwise."""
        return 32 * sum(int(n) for n in tensor_sizes)

    def round_event(self) -> Any:
        """The round's privacy mechanism before client sampling (a `dp_accounting.DpEvent`
        with every cluster's row noised: a client touches one row), None when it gives no
        differential privacy."""
        return None

    # -- the server state's slot (see the module docstring) -----------------------------------
    def round_inputs(self, seed: np.ndarray, denominator: np.ndarray) -> collections.OrderedDict:
        """The round's inputs: the noise seed (int64[2]) and each cluster's expected count."""
        return collections.OrderedDict(
            seed=np.asarray(seed, np.int64).reshape([2]),
            denominator=np.asarray(denominator, np.float32),
        )

    def server_slot(
        self, state: Mapping[str, Any], inputs: Mapping[str, Any]
    ) -> collections.OrderedDict:
        """The server state's `aggregator` entry."""
        return collections.OrderedDict(
            state=collections.OrderedDict(state), inputs=collections.OrderedDict(inputs)
        )

    def finalize_slot(
        self, sums: tuple, total_weight: tf.Tensor, stats: tf.Tensor, slot: Any
    ) -> tuple[tuple, tf.Tensor, Any, collections.OrderedDict]:
        """`finalize` on the server state's slot: `(means, updated, new slot, measurements)`."""
        inputs = slot["inputs"]
        finalized = self.finalize(sums, total_weight, stats, slot["state"], inputs)
        means, updated, state, measured = checked_output(
            self,
            "finalize",
            finalized,
            ("means", "updated", "state", "measurements"),
            (
                tuple(sums),
                tf.TensorSpec(total_weight.shape, tf.bool),
                slot["state"],
                None,  # what the round reports: checked below, any [K] tensors by name
            ),
        )
        check_measurements(self, measured, total_weight.shape)
        return means, updated, self.server_slot(state, inputs), measured

    def initial_slot(self, num_clusters: int) -> Any:
        """The `aggregator` entry of a round's initial server state: the initial state, and
        inputs that step no cluster until the loop sets the round's."""
        inputs = self.round_inputs(np.zeros(2), np.zeros(num_clusters))
        return self.server_slot(self.initial_state(num_clusters), inputs)

    def slot_spec(self, num_clusters: int) -> collections.OrderedDict:
        """TF specs of the server state's `aggregator` entry."""
        return tf.nest.map_structure(spec_of, self.initial_slot(num_clusters))

    def params_spec(self, num_clusters: int) -> collections.OrderedDict:
        """TF specs of `client_params` (in the round's hyperparameters)."""
        params = self.client_params(self.initial_state(num_clusters))
        return tf.nest.map_structure(spec_of, params)


@dataclasses.dataclass(frozen=True)
class ClusterMean(ClusterAggregator):
    """The weighted mean per cluster (`clustered_mean.py`), the default: clients' updates
    summed unchanged with their weights, each cluster's sum divided by its total weight; a
    cluster no client trained in does not step. No state, no round inputs: an empty slot."""

    summary: ClassVar[str] = "the weighted mean of the cluster's clients' updates"
    voided_by_individual_updates: ClassVar[bool] = False  # it sends each update as it is
    name: ClassVar[str] = "mean"
    takes_round_inputs: ClassVar[bool] = False

    def finalize(
        self,
        sums: tuple,
        total_weight: tf.Tensor,
        stats: tf.Tensor,
        state: Mapping[str, tf.Tensor],
        inputs: Mapping[str, tf.Tensor],
    ) -> tuple[tuple, tf.Tensor, collections.OrderedDict, collections.OrderedDict]:
        """Each cluster's weighted mean (`cluster_mean`); the clusters of some weight step."""
        means = cluster_mean(sums, total_weight)
        return means, total_weight > 0, collections.OrderedDict(), collections.OrderedDict()

    def finalize_slot(
        self, sums: tuple, total_weight: tf.Tensor, stats: tf.Tensor, slot: Any
    ) -> tuple[tuple, tf.Tensor, Any, collections.OrderedDict]:
        means, updated, _, measured = self.finalize(sums, total_weight, stats, {}, {})
        return means, updated, (), measured

    def initial_slot(self, num_clusters: int) -> tuple:
        """The mean keeps nothing in the server state."""
        return ()


@dataclasses.dataclass(frozen=True)
class AggregatorOptions:
    """Base of an aggregator's `Options`: every field of its declared type, as the flag
    parser gives it (`options.checked_fields`: a wrong type is a TypeError naming it). A
    subclass's own checks follow, in its `__post_init__`."""

    def __post_init__(self) -> None:
        for name, value in checked_fields(self, type(self).__qualname__).items():
            object.__setattr__(self, name, value)


@dataclasses.dataclass(frozen=True)
class PrivacyBudget:
    """What the accountant reads of a private aggregator's settings: the `delta` every epsilon
    is stated at, the `target_epsilon` (0: none) and whether the noise multiplier is to be
    calibrated to it (`calibrate`: none given)."""

    delta: float
    target_epsilon: float
    calibrate: bool = False
    # The private cold start (`loop.update_release`): the share of the run's epsilon its one
    # release per client costs when its noise multiplier is not given (0: the cold start is
    # read raw, outside the guarantee), and the noise multiplier when given.
    cold_start_share: float = 0.0
    cold_start_noise_multiplier: Optional[float] = None


def check_hashable(aggregator: ClusterAggregator) -> None:
    """Refuses a field of an unhashable value (a list, a dict, an array): an aggregator is part
    of the round's signature, the built round's cache key. A TypeError naming the field."""
    for field in dataclasses.fields(aggregator):
        if not (field.compare if field.hash is None else field.hash):
            continue  # not part of its hash
        value = getattr(aggregator, field.name)
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"{type(aggregator).__name__}: field {field.name} is {described(value)}, which "
                "cannot be hashed (an aggregator is part of the round's cache key); give a tuple "
                "or another hashable value"
            ) from None


def checked_output(
    aggregator: ClusterAggregator,
    method: str,
    got: Any,
    names: Sequence[str],
    expected: Sequence[Any],
) -> tuple:
    """What `aggregator.method` returned (`got`), checked against what the round expects
    (`expected`, one entry per name of `names`; None: any tensors) while the round is traced,
    before TensorFlow meets it: the number of values, each one's structure, and each tensor's
    shape and dtype. A ValueError of one line names the aggregator, the method, the value and
    what differs (a user's own aggregator's mistake otherwise surfaces deep in TF)."""
    where = f"{type(aggregator).__name__}.{method}"
    if not isinstance(got, (tuple, list)) or len(got) != len(names):
        raise ValueError(
            f"{where} returned {output_text(got)}; it must return {len(names)} values "
            f"({', '.join(names)})"
        )
    for name, value, want in zip(names, got, expected):
        if want is None:
            continue
        try:
            tf.nest.assert_same_structure(want, value, check_types=False)
        except (ValueError, TypeError):
            raise ValueError(
                f"{where} returned {name} of {output_text(value)}, expected {output_text(want)}"
            ) from None
        leaves = zip(leaf_paths(want), tf.nest.flatten(want), tf.nest.flatten(value))
        for path, wanted, leaf in leaves:
            label = f"{name}{path}"
            if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
                try:
                    leaf = tf.convert_to_tensor(leaf)
                except (TypeError, ValueError):
                    raise ValueError(
                        f"{where} returned {label} = {described(leaf)}, not a tensor; expected "
                        f"{tensor_text(wanted)}"
                    ) from None
            same_dtype = tf.as_dtype(leaf.dtype) == tf.as_dtype(wanted.dtype)
            if not same_dtype or not tf.TensorShape(leaf.shape).is_compatible_with(wanted.shape):
                raise ValueError(
                    f"{where} returned {label} of {tensor_text(leaf)}, expected "
                    f"{tensor_text(wanted)}"
                )
    return tuple(got)


def check_measurements(aggregator: ClusterAggregator, measured: Any, shape: Any) -> None:
    """What `finalize` reports must be a dict of tensors of `shape` ([K], a value per
    cluster: metrics.csv's `NAME_cluster_k`); another is a ValueError naming it."""
    where = f"{type(aggregator).__name__}.finalize"
    if not isinstance(measured, Mapping):
        raise ValueError(
            f"{where} returned measurements of {output_text(measured)}; expected a dict of "
            f"tensors of shape {tf.TensorShape(shape)} (one value per cluster)"
        )
    for key, value in measured.items():
        tensor = hasattr(value, "shape") and hasattr(value, "dtype")
        if not tensor or not tf.TensorShape(value.shape).is_compatible_with(shape):
            got = f"of {tensor_text(value)}" if tensor else f"= {described(value)}"
            raise ValueError(
                f"{where} returned measurements[{key}] {got}, expected a tensor of shape "
                f"{tf.TensorShape(shape)} (one value per cluster)"
            )


def leaf_paths(structure: Any, prefix: str = "") -> list[str]:
    """Each leaf's path in `structure`, in `tf.nest.flatten`'s order: `[0]`, `[state][clip]`."""
    if isinstance(structure, Mapping):
        return [p for k in sorted(structure) for p in leaf_paths(structure[k], f"{prefix}[{k}]")]
    if isinstance(structure, (tuple, list)):
        return [p for i, v in enumerate(structure) for p in leaf_paths(v, f"{prefix}[{i}]")]
    return [prefix]


def tensor_text(value: Any) -> str:
    """A tensor as an error names it: `shape (8, 128) float32`."""
    return f"shape {tf.TensorShape(value.shape)} {tf.as_dtype(value.dtype).name}"


def output_text(value: Any) -> str:
    """A returned value's structure, short: `3 values`, `a dict of keys a, b`, a tensor's shape."""
    if isinstance(value, (tuple, list)):
        return f"{len(value)} value{'s' * (len(value) != 1)}"
    if isinstance(value, Mapping):
        return f"a dict of keys {', '.join(map(str, value)) or '(none)'}"
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray)):
        return f"a tensor of {tensor_text(value)}"
    return described(value)


def spec_of(value: Any) -> tf.TensorSpec:
    """The TF spec of an array."""
    array = np.asarray(value)
    return tf.TensorSpec(array.shape, tf.as_dtype(array.dtype))


def divide_rows(total: tf.Tensor, denominator: tf.Tensor) -> tf.Tensor:
    """Each row `k` of `total` divided by `denominator[k]`; a row of denominator 0 is 0."""
    shaped = tf.reshape(denominator, [-1] + [1] * (len(total.shape) - 1))
    return tf.math.divide_no_nan(total, shaped)


def add_to_row(stack: tf.Tensor, row: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """`values` added into row `row` of `stack` only."""
    return tf.tensor_scatter_nd_add(stack, tf.reshape(row, [1, 1]), values[None])


def geometric_quantile_step(
    estimate: tf.Tensor,
    centred_below: tf.Tensor,
    count: tf.Tensor,
    target_quantile: float,
    learning_rate: float,
    in_use: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor]:
    """One geometric update of each cluster's quantile estimate (Andrew, Thakkar, McMahan and
    Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021,
    Algorithm 1; Tensorflow Privacy's `QuantileEstimatorQuery.get_noised_result` step for
    step): from the sum of its clients' centred indicators `[norm <= estimate] - 1/2` (noised
    or not) over `count`, the fraction below `b = clamp(sum / count + 1/2, 0, 1)` moves the
    estimate to `estimate * exp(-learning_rate * (b - target_quantile))` on the rows `in_use`
    says (the others keep theirs). Returns `(new estimates, b)`, each `[K]`."""
    below = divide_rows(centred_below, count) + 0.5
    below = tf.minimum(1.0, tf.maximum(0.0, below))
    update = learning_rate * (below - target_quantile)
    return tf.where(in_use, estimate * tf.math.exp(-update), estimate), below
