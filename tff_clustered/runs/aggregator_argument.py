"""The Python API's `aggregator` argument (`tff_clustered.run`) as the training's settings.

It is a name, an aggregator (a user's own `ClusterAggregator` subclass too), a
`tff.aggregators` factory or an `AggregatorConfig`."""

from __future__ import annotations

import dataclasses
from typing import Any, Union

from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.federated.tff_factory_aggregator import TffFactoryPerCluster, is_factory
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig, named_at_defaults
from tff_clustered.options import described


def with_aggregator(
    training: TrainingConfig, aggregator: Union[str, ClusterAggregator, AggregatorConfig, Any, None]
) -> TrainingConfig:
    """`training` with `run`'s `aggregator` argument as its aggregator (None: its own; a
    `tff.aggregators` factory: one instance per cluster, `TffFactoryPerCluster`); an argument
    that contradicts a non-default `training.aggregator` is refused."""
    if aggregator is None:
        return training
    if is_factory(aggregator):
        aggregator = TffFactoryPerCluster(aggregator)
    named = named_at_defaults()
    if isinstance(aggregator, str):
        if aggregator not in named:
            raise ValueError(
                f"aggregator={aggregator!r}: give one of {', '.join(map(repr, named))}, or the "
                "aggregator itself, e.g. "
                "aggregator=tff_clustered.ClusterDP(noise_multiplier=1.0, clip=0.1)"
            )
        config = AggregatorConfig(aggregator)
    elif isinstance(aggregator, ClusterAggregator):
        config = AggregatorConfig.of(aggregator)
    elif isinstance(aggregator, AggregatorConfig):
        config = aggregator
    else:
        raise TypeError(
            f"aggregator must be a name ({', '.join(named)}), a ClusterAggregator "
            "(ClusterDP, ClusterRobust, your own subclass, ...), a tff.aggregators factory (e.g. "
            "tff.aggregators.MeanFactory()) or an AggregatorConfig, got "
            f"{described(aggregator)}"
        )
    if training.aggregator not in (AggregatorConfig(), config):
        raise ValueError(
            f"aggregator={aggregator!r} contradicts training.aggregator="
            f"{training.aggregator!r}; give it in one place"
        )
    return dataclasses.replace(training, aggregator=config)
