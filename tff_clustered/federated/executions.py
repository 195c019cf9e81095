"""Which execution runs a built round, each built once per signature (`RoundCache`).

`RoundCache` builds one per `RoundSignature` for an execution,
"tff" (TFF computations: `tff_execution.tff_round_parts`, split over several workers by
`sharded.py`) or "in_process" (`in_process.py`), and reuses it whenever the signature comes
back."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np

from tff_clustered.federated import graphs, grouping, in_process, sharded
from tff_clustered.federated.resident import WorkerArrays
from tff_clustered.federated.round import FederatedRound
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import (
    WorkerData,
    client_examples,
    client_input,
    client_seed,
)
from tff_clustered.federated.scoring import (
    build_pooled_scores,
    build_predict_probabilities,
    pooled_examples_specs,
    to_type,
)
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.federated.tff_execution import tff_round_parts
from tff_clustered.models.functional import FunctionalModel
from tff_clustered.runtime import context as runtime

EXECUTIONS = ("tff", "in_process")


# "auto" reads on the worker clients of at least this many float values on average, even when
# this process holds them: measured as fast as sending them (docs/runtime.md).
READ_ON_WORKER_VALUES = 16_000


def reads_on_worker(mode: str, worker_data: WorkerData) -> bool:
    """Whether a TFF round reads its clients' examples on the worker (`runtime.client_data`):
    as asked, or for "auto" when that was measured faster for the setting (docs/runtime.md):
    clients this process would read from the file anyway (a population larger than it keeps),
    or clients of at least `READ_ON_WORKER_VALUES` values."""
    if mode != "auto":
        return mode == "read_on_worker"
    return not worker_data.held_here or worker_data.mean_values >= READ_ON_WORKER_VALUES


class RoundCache:
    """Built rounds by signature: a signature that comes back costs no rebuild. `execution`
    says what runs them: "tff" (TFF computations on the TFF runtime, each round's clients split
    over its workers when it has several: `sharded.py`), or "in_process" (the same
    TF functions run by TensorFlow in this process, on its GPU when it sees one;
    `in_process.py`) placed on `device` when one is named. `rounds`, the run's length (0: not
    known), decides whether in-process rounds train clients together (vectorised, padded to a
    common size): only a run long enough to earn back the conversion does
    (`grouping.vectorises_for`)."""

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
        if execution not in EXECUTIONS:
            raise ValueError(f"execution must be one of {EXECUTIONS}, got {execution!r}")
        self.model, self.input_spec = model, input_spec
        self.initial_variables = list(initial_variables)
        self.execution, self.device = execution, device
        self.vectorise = grouping.vectorises_for(rounds)
        self._built: dict[RoundSignature, FederatedRound] = {}
        self.builds = 0  # how many times a round was traced and built
        self.on_build = on_build  # gets each build's seconds (a run's `tracing` part)
        # Where TFF's workers read each client's training examples themselves; None: sent.
        self.worker_data: Optional[WorkerData] = None

    def read_on_worker(
        self,
        worker_data: Optional[WorkerData],
        mode: Optional[str] = None,
        refusal: Optional[str] = None,
    ) -> None:
        """Builds rounds whose `next` takes each client's reference (`WorkerData.reference`)
        instead of its arrays, the TFF worker reading its examples, when the data can be read
        there (`worker_data` given; None: `refusal` says why not; one that is `local_only`
        needs every worker on this machine), the execution is "tff" and `mode` (default: the
        started runtime's `client_data`) asks for it (`reads_on_worker`). Call it before the
        first build."""
        if self._built:
            raise ValueError("read_on_worker must come before the first round is built")
        mode = runtime.client_data() if mode is None else mode
        if self.execution != "tff":
            return
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
        if reads_on_worker(mode, worker_data):
            self.worker_data = worker_data

    def get(self, signature: RoundSignature) -> FederatedRound:
        if signature not in self._built:
            started = time.perf_counter()
            signature.aggregator.check_execution(self.execution)
            fns = round_functions(self.model, self.input_spec, signature, self.initial_variables)
            if self.execution == "tff":
                self._built[signature] = sharded.sharded_round(
                    tff_round_parts(fns, self.worker_data)
                )
            else:
                self._built[signature] = in_process.in_process_round(
                    fns, self.device, vectorise=self.vectorise
                )
            self.builds += 1
            if self.on_build is not None:
                self.on_build(time.perf_counter() - started)
        return self._built[signature]

    def predict_probabilities(self) -> Callable[..., Any]:
        """Server-side inference (`predict_probabilities_fn`) run by this cache's execution."""
        if self.execution == "tff":
            return build_predict_probabilities(self.model, self.input_spec)
        return graphs.in_process_predict(self.model, self.input_spec, self.device)

    def pooled_scores(self, head_start: Optional[int] = None) -> Callable[..., Any]:
        """Scoring of one model on many clients' pooled examples (`pooled_scores_fn`; with
        `head_start`, each client's own head) run by this cache's execution."""
        if self.execution == "tff":
            return build_pooled_scores(self.model, self.input_spec, head_start)
        return graphs.in_process_pooled_scores(self.model, self.input_spec, self.device, head_start)

    def pooled_examples(self, x: np.ndarray, y: np.ndarray) -> Callable[[], tuple]:
        """Where `pooled_scores` finds pooled examples it scores many times: a callable giving
        the `(x, y)` arguments to pass. On TFF's runtime they are sent to the worker once and
        passed by reference afterwards (`resident.WorkerArrays`); in process, the arrays."""
        if self.execution == "tff":
            types = tuple(to_type(s) for s in pooled_examples_specs(self.input_spec))
            return WorkerArrays((x, y), types).values
        return lambda: (x, y)


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
