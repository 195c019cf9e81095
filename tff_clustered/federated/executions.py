"""Where a run's computations run (`Execution`), and its rounds built once each (`RoundCache`).

An execution is chosen once, by name (`execution_class`: `EXECUTIONS`), and from then on the
run asks it, never its name: it builds a round's functions into a `round.FederatedRound`
(`build_round`), makes the server's TF functions runnable (`runnable`: scoring and inference),
says where pooled examples live (`pooled_examples`), whether a round's clients are read on a
worker (`read_on_worker`) and which aggregators it can run (`check_aggregator`).

* `TffRuntime`: TFF computations on the TFF runtime, each round's clients split over its
  workers when it has several (`sharded.py`);
* `InProcess`: the same TF functions run by TensorFlow in this process, on its GPU when it
  sees one, or on the device named (`in_process.py`).

Adding an execution is one subclass and one line of `EXECUTIONS`; no algorithm, aggregator or
loop module names an execution."""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from typing import Any, Callable, ClassVar, Optional

import numpy as np

from tff_clustered.federated import graphs, grouping, in_process, sharded
from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.federated.resident import WorkerArrays
from tff_clustered.federated.round import FederatedRound
from tff_clustered.federated.round_functions import RoundFunctions, round_functions
from tff_clustered.federated.round_inputs import (
    WorkerData,
    client_examples,
    client_input,
    client_seed,
)
from tff_clustered.federated.scoring import (
    pooled_examples_specs,
    pooled_scores_fn,
    pooled_scores_specs,
    predict_probabilities_fn,
    predict_probabilities_specs,
)
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.federated.tff_execution import tff_round_parts
from tff_clustered.frameworks import tff, to_type
from tff_clustered.models.functional import FunctionalModel
from tff_clustered.runtime import context as runtime

# "auto" reads on the worker clients of at least this many float values on average, even when
# this process holds them: measured as fast as sending them (docs/runtime.md).
READ_ON_WORKER_VALUES = 16_000

# Where a round's clients could be read on a worker, or None with the reason why not
# (`data/client_files.worker_source`): asked only by an execution that reads them there.
WorkerSource = Callable[[], tuple[Optional[WorkerData], Optional[str]]]


def reads_on_worker(mode: str, worker_data: WorkerData) -> bool:
    """Whether a TFF round reads its clients' examples on the worker (`runtime.client_data`):
    as asked, or for "auto" when that was measured faster for the setting (docs/runtime.md):
    clients this process would read from the file anyway (a population larger than it keeps),
    or clients of at least `READ_ON_WORKER_VALUES` values."""
    if mode != "auto":
        return mode == "read_on_worker"
    return not worker_data.held_here or worker_data.mean_values >= READ_ON_WORKER_VALUES


class Execution(abc.ABC):
    """Where one run's computations run. Its rounds, scoring and inference are the same TF
    functions (`round_functions.RoundFunctions`, `scoring.py`) whatever runs them."""

    name: ClassVar[str]
    # Runs TFF computations (what an aggregator that is one, a `tff.aggregators` factory, needs).
    runs_tff_computations: ClassVar[bool] = False
    # Where the rounds' clients' examples are read on a worker (`read_on_worker`); None: sent.
    worker_data: Optional[WorkerData] = None

    @abc.abstractmethod
    def build_round(self, fns: RoundFunctions) -> FederatedRound:
        """The round of `fns`, run by this execution."""

    @abc.abstractmethod
    def runnable(self, fn: Callable[..., Any], specs: Sequence[Any]) -> Callable[..., Any]:
        """The TF function `fn` of arguments `specs` (`tf.TensorSpec`s), run by this execution
        on the server's values (scoring, inference)."""

    def pooled_examples(
        self, x: np.ndarray, y: np.ndarray, input_spec: dict
    ) -> Callable[[], tuple]:
        """Where a `runnable` scoring finds pooled examples it scores many times: a callable
        giving the `(x, y)` arguments to pass; by default the arrays themselves."""
        return lambda: (x, y)

    def read_on_worker(self, worker_source: WorkerSource, mode: Optional[str] = None) -> None:
        """Reads the rounds' clients' examples on a worker where it can and gains (by default
        nowhere: the rounds take the clients' arrays)."""
        del worker_source, mode

    @classmethod
    def check_aggregator(cls, aggregator: ClusterAggregator, num_workers: int = 1) -> None:
        """Refuses an aggregator this execution (on `num_workers` workers) cannot run: one that
        is a TFF computation (`tff_computation_only`) outside TFF's runtime, and whatever the
        aggregator refuses itself (`ClusterAggregator.check_workers`)."""
        if aggregator.tff_computation_only and not cls.runs_tff_computations:
            raise ValueError(
                f"the {aggregator.name} aggregator (a tff.aggregators factory) runs only as a "
                f"TFF computation: execution={cls.name!r} cannot run it; use execution='tff' "
                "(the Python API's execution argument)"
            )
        aggregator.check_workers(num_workers)


class TffRuntime(Execution):
    """TFF computations on the started TFF runtime (`tff_execution.py`), a round's clients
    split over its workers when it has several (`sharded.py`)."""

    name = "tff"
    runs_tff_computations = True

    def __init__(self, device: Optional[str] = None, rounds: int = 0) -> None:
        del device, rounds  # TFF's worker places its work; its rounds train clients one by one

    def build_round(self, fns: RoundFunctions) -> FederatedRound:
        return sharded.sharded_round(tff_round_parts(fns, self.worker_data))

    def runnable(self, fn: Callable[..., Any], specs: Sequence[Any]) -> Callable[..., Any]:
        return tff.tensorflow.computation(*[to_type(s) for s in specs])(fn)

    def pooled_examples(
        self, x: np.ndarray, y: np.ndarray, input_spec: dict
    ) -> Callable[[], tuple]:
        """Sent to the worker once and passed by reference afterwards
        (`resident.WorkerArrays`)."""
        types = tuple(to_type(s) for s in pooled_examples_specs(input_spec))
        return WorkerArrays((x, y), types).values

    def read_on_worker(self, worker_source: WorkerSource, mode: Optional[str] = None) -> None:
        """The rounds take each client's reference (`WorkerData.reference`) instead of its
        arrays, the TFF worker reading its examples, when `worker_source` finds where (else
        it says why not; a source that is `local_only` needs every worker on this machine) and
        `mode` (default: the started runtime's `client_data`) asks for it
        (`reads_on_worker`)."""
        mode = runtime.client_data() if mode is None else mode
        worker_data, refusal = worker_source()
        if worker_data is not None and worker_data.local_only and not runtime.workers_here():
            worker_data, refusal = None, "its files are written here and --workers are elsewhere"
        if worker_data is None:
            if mode == "read_on_worker":
                raise ValueError(
                    "--client_data=read_on_worker reads a file of TFF's SQL format "
                    "(--dataset=tff_sql), or files this process writes for workers on this "
                    f"machine; this data can only be sent ({refusal or 'not read here'}). Use "
                    "--client_data=auto."
                )
            return
        self.worker_data = worker_data if reads_on_worker(mode, worker_data) else None


class InProcess(Execution):
    """The TF functions run by TensorFlow in this process (`in_process.py`), placed on
    `device` when one is named. `rounds`, the run's length (0: not known), decides whether
    rounds train clients together (vectorised, padded to a common size): only a run long
    enough to earn back the conversion does (`grouping.vectorises_for`)."""

    name = "in_process"

    def __init__(self, device: Optional[str] = None, rounds: int = 0) -> None:
        graphs.check_device(device)
        self.device, self.vectorise = device, grouping.vectorises_for(rounds)

    def build_round(self, fns: RoundFunctions) -> FederatedRound:
        return in_process.in_process_round(fns, self.device, vectorise=self.vectorise)

    def runnable(self, fn: Callable[..., Any], specs: Sequence[Any]) -> Callable[..., Any]:
        return graphs.GraphFunction(fn, specs, self.device)


EXECUTIONS: dict[str, type[Execution]] = {e.name: e for e in (TffRuntime, InProcess)}


def execution_class(name: str) -> type[Execution]:
    """The execution of that name (`EXECUTIONS`)."""
    if name not in EXECUTIONS:
        raise ValueError(f"execution must be one of {tuple(EXECUTIONS)}, got {name!r}")
    return EXECUTIONS[name]


class RoundCache:
    """One run's built rounds by signature, run by the `Execution` named `execution`, made
    with the `device` and the run's number of `rounds`: a signature that comes back costs no
    rebuild."""

    def __init__(
        self,
        model: FunctionalModel,
        input_spec: dict,
        initial_variables: Sequence[np.ndarray],
        execution: str = "tff",
        device: Optional[str] = None,
        rounds: int = 0,
        on_build: Optional[Callable[[float], None]] = None,
    ) -> None:
        self.model, self.input_spec = model, input_spec
        self.initial_variables = list(initial_variables)
        self.execution = execution_class(execution)(device, rounds)
        self._built: dict[RoundSignature, FederatedRound] = {}
        self.builds = 0  # how many times a round was traced and built
        self.on_build = on_build  # gets each build's seconds (a run's `tracing` part)

    @property
    def worker_data(self) -> Optional[WorkerData]:
        """Where the rounds read their clients' examples on a worker; None: sent."""
        return self.execution.worker_data

    def read_on_worker(self, worker_source: WorkerSource, mode: Optional[str] = None) -> None:
        """`Execution.read_on_worker`, before the first round is built."""
        if self._built:
            raise ValueError("read_on_worker must come before the first round is built")
        self.execution.read_on_worker(worker_source, mode)

    def predict_probabilities(self) -> Callable[..., Any]:
        """Server-side inference (`scoring.predict_probabilities_fn`), run by the execution."""
        specs = predict_probabilities_specs(self.model, self.input_spec)
        return self.execution.runnable(predict_probabilities_fn(self.model), specs)

    def pooled_scores(self, head_start: Optional[int] = None) -> Callable[..., Any]:
        """Scoring of one model on many clients' pooled examples (`scoring.pooled_scores_fn`;
        with `head_start`, each client's own head), run by the execution."""
        specs = pooled_scores_specs(self.model, self.input_spec, head_start)
        return self.execution.runnable(pooled_scores_fn(self.model, head_start), specs)

    def pooled_examples(self, x: np.ndarray, y: np.ndarray) -> Callable[[], tuple]:
        """`Execution.pooled_examples` of these arrays."""
        return self.execution.pooled_examples(x, y, self.input_spec)

    def get(self, signature: RoundSignature) -> FederatedRound:
        if signature not in self._built:
            started = time.perf_counter()
            self.execution.check_aggregator(signature.aggregator)
            fns = round_functions(self.model, self.input_spec, signature, self.initial_variables)
            self._built[signature] = self.execution.build_round(fns)
            self.builds += 1
            if self.on_build is not None:
                self.on_build(time.perf_counter() - started)
        return self._built[signature]


def repeated_round(
    cache: RoundCache,
    clients: Sequence[dict],
    num_clusters: int,
    hparams: dict,
    client_ids: Optional[Sequence[str]] = None,
) -> Callable[[], None]:
    """A callable that runs one more round of `cache`'s clustered core on the same `clients`
    (arrays, as `next` takes them; when the cache reads on the worker, each client's
    reference by its id in `client_ids`), client i in cluster i mod `num_clusters`, every
    client's weight 1: the fixed workload the benchmark and the GPU check time."""
    process = cache.get(RoundSignature(num_clusters, tuple(range(len(cache.initial_variables)))))
    state = process.initialize()
    if cache.worker_data is not None:
        if client_ids is None:
            raise ValueError("a round that reads its clients on the worker needs their ids")
        clients = [
            cache.worker_data.reference(c, client_examples(data))
            for c, data in zip(client_ids, clients)
        ]
    inputs = [
        client_input(data, i % num_clusters, (), 1.0, client_seed(i, i))
        for i, data in enumerate(clients)
    ]

    def run() -> None:
        nonlocal state
        state, _, _ = process.next(state, inputs, hparams)

    return run
