"""The cluster-indexed federated round, composed once from its four parts (`ComposedRound`).

The executions only run it.

Server state (`server_state.ServerState`) holds `num_clusters` models stacked along a leading
cluster axis, the anchor, the server optimizer's state and the aggregator's slot. A round
follows `tff.learning.templates.compose_learning_process` (distributor -> client work ->
aggregator -> finalizer), its parts the TF functions of `round_functions.RoundFunctions`:

* distributor (`distributors.py`): each client trains the **shared** variables of its own
  cluster (its key), every cluster's broadcast and the client taking its key's row, joined
  with the rest of its **own stored model** (a CLIENTS-placed input from the per-client
  store); the signature's `Distribution` (`distributions.py`) may choose another: the cluster
  of lowest loss (IFCA), or the rows a peer's key names (decentralized peers: the server only
  relays, nothing is aggregated). The anchor (FedAC's global embedding) is broadcast too;
* client work: a `ClientWork`, a pure TF function (`client_work.LocalSGD`, ...), the client
  batching its arrays itself (`batching.ArrayBatches`), then the aggregator's client side;
* aggregator: the signature's `ClusterAggregator` (`cluster_aggregators.py`; the default
  `ClusterMean`): each client's preprocessed update added into its cluster's row of the
  per-cluster sums (`server_state.ClientSums`, mergeable over any split of the clients), then
  its server side on the sums; a `tff.aggregators` factory (`tff_factory_aggregator.py`) runs
  its own federated process instead, on TFF's runtime only;
* finalizer: each cluster's mean update added to its shared variables and the server
  optimizer's step (`server_optimizers.server_step`: FedAvgM, FedAdam). A cluster no client
  trained in keeps its model (and optimizer state) bit for bit.

`ComposedRound.next` is that sequence, written once. An execution (`RoundExecution`) says how
the parts run: as federated computations on TFF's runtime (`tff_execution.py`), split over
several TFF workers (`sharded.py`), or as graphs in this process (`in_process.py`).

`compose_learning_process` itself cannot express this round: its `next` takes only
`(state, client_data)` and returns nothing per client, while this one takes cluster keys and
stored client variables in, and returns stored client variables and model updates out:
`next(state, clients, hparams) -> (state, client_outputs, measurements)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol

from tff_clustered.federated.signature import ModelLayout, RoundIO, RoundSignature


class RoundExecution(Protocol):
    """How an execution runs the round's parts (`round_functions.RoundFunctions`) on its
    values: server values and client lists, or TFF's federated values."""

    def train_clients(self, state: Any, clients: Any, hparams: Any) -> Any:
        """Distributor and client work: every client's `ClientResult`, as the execution
        holds them (and their sums, when it sums while training), with the clients' outputs
        in client order as its `outputs`."""

    def aggregate(self, state: Any, trained: Any) -> Any:
        """Aggregator and finalizer: the `server_state.Finalized` of the round."""

    def after_round(self, state: Any, finalized: Any) -> Any:
        """`state` with the finalizer's slots."""

    def nothing_aggregated(self) -> Any:
        """The measurements of a round that only relays (nothing aggregated)."""


@dataclasses.dataclass(frozen=True)
class ComposedRound:
    """The round, composed once: `next(state, clients, hparams) -> (state, client_outputs,
    measurements)`, run by `execution`. `relays`: the distributor only routes peers' rows
    (`Distributor.relays`): the state is the peers' mailbox, nothing is aggregated."""

    execution: RoundExecution
    relays: bool = False

    def next(self, state: Any, clients: Any, hparams: Any) -> tuple[Any, Any, Any]:
        trained = self.execution.train_clients(state, clients, hparams)
        if self.relays:
            return state, trained.outputs, self.execution.nothing_aggregated()
        finalized = self.execution.aggregate(state, trained)
        new_state = self.execution.after_round(state, finalized)
        return new_state, trained.outputs, finalized.measurements


@dataclasses.dataclass
class FederatedRound:
    """A built round of one signature: `initialize() -> state`, `next(state, clients, hparams)
    -> (state, client_outputs, measurements)` (`clients`: one `round_inputs.client_input` each) and
    `evaluate(cluster_models, clients, batch_size) -> client results` (`clients`: one
    `round_inputs.evaluation_input` each), whichever execution runs them."""

    initialize: Callable[..., Any]
    next: Callable[..., Any]
    evaluate: Callable[..., Any]
    signature: RoundSignature
    io: RoundIO
    layout: ModelLayout
    # `evaluate` with each client's scores those of a call of its own, bit for bit, whatever
    # else the call holds: what decisions score with (an argmin over losses must not turn on
    # rounding). None: `evaluate` itself scores each client on its own (TFF's computations).
    evaluate_exactly: Optional[Callable[..., Any]] = None
