"""`client_data`: one FedAvg round of a population's clients on TFF's runtime.

`client_data` (run only when named): seconds of one FedAvg round on TFF's runtime (the
started worker, or `--workers`) of `--clients` clients of a population file in TFF's SQL format,
for each `--client_data_settings` (examples x features per client), the clients' examples
reaching the worker three ways: sent as arrays read by this process from the file (fresh
clients every round, as in a large population), sent as arrays this process already holds (the
same clients every round), and read on the worker from the file (`--client_data`)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence

from absl import flags

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup, alternate, seconds_row
from tff_clustered.data.population import PopulationSpec, write_population_sql
from tff_clustered.data.tff_sql import load_tff_sql
from tff_clustered.data.worker_reader import worker_reader
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.round_inputs import client_input, client_seed, round_hparams
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model

flags.DEFINE_list(
    "client_data_settings",
    ["20x32", "500x784"],
    "Examples x features per client (client_data).",
)
flags.DEFINE_integer("client_data_rounds", 3, "Timed rounds per way (client_data).", lower_bound=1)


def setting_rounds(examples: int, features: int, folder: str) -> dict[str, Callable[[], None]]:
    """One round's callable per way for clients of `examples` x `features`: each call trains
    the next `--clients` clients of a population written for the timed and warm-up rounds."""
    rounds = FLAGS.client_data_rounds + 1
    population = PopulationSpec(
        num_clients=FLAGS.clients * rounds,
        train_examples=examples,
        test_examples=1,
        num_features=features,
        num_classes=FLAGS.num_classes,
        seed=FLAGS.seed,
    )
    path = os.path.join(folder, population.file_name)
    write_population_sql(population, path)
    data = load_tff_sql(path, FLAGS.num_classes)
    spec = model_spec(FLAGS.model, (features,), FLAGS.num_classes, FLAGS.hidden_units)
    w0 = initial_weights(spec, FLAGS.seed)
    model = functional_model(spec.build(), spec.input_spec())
    signature = RoundSignature(1, tuple(range(len(w0))))
    hparams = round_hparams(FLAGS.learning_rate, FLAGS.batch_size, FLAGS.local_epochs)
    ids = data.client_ids

    def way(read_on_worker: bool, fresh: bool) -> Callable[[], None]:
        """Round after round: `fresh` clients each (first read then, by this process or the
        worker), or the first `--clients` every time (after the first round, held here)."""
        cache = RoundCache(model, spec.input_spec(), w0, "tff")
        reader = worker_reader(data)
        cache.read_on_worker(lambda: (reader, None), "read_on_worker" if read_on_worker else "sent")
        process = cache.get(signature)
        state = process.initialize()
        calls = [0]

        def run() -> None:
            start = (calls[0] % rounds if fresh else 0) * FLAGS.clients
            calls[0] += 1
            clients: Sequence[str] = ids[start : start + FLAGS.clients]
            inputs = [
                client_input(
                    reader.reference(c, data.train_sizes[c])
                    if read_on_worker
                    else data.arrays("train", c),
                    0,
                    (),
                    1.0,
                    client_seed(i, i),
                )
                for i, c in enumerate(clients)
            ]
            process.next(state, inputs, hparams)

        return run

    return {
        "sent_read_here": way(False, True),
        "sent_held": way(False, False),
        "read_on_worker": way(True, True),
    }


def client_data(setup: Setup) -> dict:
    """Each setting's median seconds a round, each way."""
    report = {}
    with tempfile.TemporaryDirectory() as folder:
        for setting in FLAGS.client_data_settings:
            examples, features = (int(v) for v in setting.split("x"))
            fns = setting_rounds(examples, features, folder)
            t = alternate(fns, FLAGS.client_data_rounds)
            print(
                f"Client data on TFF's worker, {FLAGS.clients} clients x {examples} examples x "
                f"{features} features, {FLAGS.local_epochs} epochs, batch {FLAGS.batch_size}, "
                f"{FLAGS.model}: sent (read here) {t['sent_read_here']:.3f} s, sent (held) "
                f"{t['sent_held']:.3f} s, read on the worker {t['read_on_worker']:.3f} s a round"
            )
            report[setting] = seconds_row(t)
    return report


BENCHMARK = Benchmark(client_data, by_default=False)
