"""What defines a run: the algorithm and its options, the data, the model, the training.

What defines a run of `binaries/train.py`: the algorithm and its options, the dataset
(`DataSpec`), the model (`ModelChoice`) and the training. The flags, the runner and the
registry pass these records on whole; each checks its values when it is made."""

from __future__ import annotations

import dataclasses
from typing import Any

from tff_clustered.algorithms import make_algorithm, make_options
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.data.spec import DataSpec
from tff_clustered.loop.aggregation import check_aggregator
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.models import model_spec
from tff_clustered.models.keras_models import ModelSpec
from tff_clustered.options import checked_fields

# The sizes of a `ModelChoice`, each at least 1.
MODEL_SIZES = ("hidden_units", "cnn_dense_units", "resnet_width")


@dataclasses.dataclass(frozen=True)
class ModelChoice:
    """One of the project's models (`models.MODEL_NAMES`) and its sizes; each field is the
    command-line flag of the same name, with the flag's default. `hidden_units`: the MLP's,
    `cnn_dense_units`: the CNN's dense layer, `resnet_width`: the channels of resnet18's first
    stage. The data gives the rest (`spec_for`)."""

    model: str = "mlp"
    hidden_units: int = 64
    cnn_dense_units: int = 128
    resnet_width: int = 64

    def __post_init__(self) -> None:
        for name, value in checked_fields(self, "ModelChoice").items():
            object.__setattr__(self, name, value)
        for name in MODEL_SIZES:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}={getattr(self, name)}: give at least 1")

    def spec_for(self, data: FederatedData) -> ModelSpec:
        """The model for `data`'s inputs and classes."""
        return model_spec(
            self.model,
            data.input_shape,
            data.num_classes,
            hidden_units=self.hidden_units,
            image_shape=data.image_shape,
            cnn_dense_units=self.cnn_dense_units,
            resnet_width=self.resnet_width,
            vocabulary_size=data.vocabulary_size,
        )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything that defines a run's results (and so must match on resume). The training's
    seed also seeds the data's random choices."""

    algorithm: str = "fedper"
    data: DataSpec = DataSpec()
    model_choice: ModelChoice = ModelChoice()
    algorithm_options: Any = None  # the algorithm's Options (None: its defaults)
    training: TrainingConfig = TrainingConfig(rounds=50, local_epochs=5, learning_rate=0.1)

    def __post_init__(self) -> None:
        if self.algorithm_options is None:
            object.__setattr__(self, "algorithm_options", make_options(self.algorithm))
        # An aggregator the algorithm cannot use, refused before any data is loaded.
        check_aggregator(
            make_algorithm(self.algorithm, self.algorithm_options),
            self.training.aggregator.build(),
        )

    def settings(self) -> dict[str, Any]:
        """The run's settings as its checkpoints and summary.json record them: the dataset's
        and the model's fields beside the algorithm's, its options and the training."""
        data = dataclasses.asdict(self.data)
        if data["split"] == "test":  # the default, recorded only when validation (as before it)
            del data["split"]
        return {
            "algorithm": self.algorithm,
            **data,
            **dataclasses.asdict(self.model_choice),
            "algorithm_options": dataclasses.asdict(self.algorithm_options),
            "training": self.training.settings(),
        }
