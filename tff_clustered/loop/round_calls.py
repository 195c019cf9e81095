"""One run's calls of its built computations: training and scoring (`RoundCalls`).

`RoundCalls` is one run's training call of a round's `next`
(`training_call.TrainingCalls.train`, one `TrainRequest`) and its scoring calls
(`scoring_calls.ScoringCalls`: a round's `evaluate`, the pooled scoring and the inference
computations). It changes nothing of the run: what to store and apply is the caller's
(`round_step.py`)."""

from __future__ import annotations

import functools

from tff_clustered.data.client_files import worker_source
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.signature import ModelLayout
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.scoring_calls import ScoringCalls
from tff_clustered.loop.training_call import TrainingCalls


class RoundCalls(TrainingCalls, ScoringCalls):
    """Calls the built computations of one run's data, model layout and training settings:
    training (`TrainingCalls`) and scoring (`ScoringCalls`)."""

    def __init__(
        self,
        data: FederatedData,
        layout: ModelLayout,
        rounds_cache: RoundCache,
        config: TrainingConfig,
    ) -> None:
        TrainingCalls.__init__(self, data, layout, rounds_cache, config)
        ScoringCalls.__init__(self, data, layout, rounds_cache, config)
        # read on a worker when the execution can and gains
        rounds_cache.read_on_worker(functools.partial(worker_source, data, rounds_cache.input_spec))
