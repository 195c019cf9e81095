"""`scoring_ways`: the in-process round's three ways of scoring clients.

`scoring_ways` (run only when named): the in-process round's three ways of scoring clients
with personal models (`in_process_scoring.py`: alone, looped, vectorised) on FedPer's model of
the population benchmark (the 16-unit MLP on 32 features, 10 classes, the head personal) and
`--scoring_clients` clients of `--scoring_examples` test examples: each way's seconds per call,
the one-time cost of building the looped and the vectorised graph, and the constants of
vectorising's cost model they give (`in_process_scoring.LOOPED_SECONDS_PER_OP`,
`CONVERSION_SECONDS_PER_OP`), against those in the code."""

from __future__ import annotations

import collections
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from absl import flags

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup, alternate, seconds_row
from tff_clustered.federated import client_work, in_process_scoring
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import evaluation_input
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model

flags.DEFINE_integer("scoring_clients", 1000, "Clients per call (scoring_ways).", lower_bound=2)
flags.DEFINE_integer("scoring_examples", 10, "Test examples per client.", lower_bound=1)
flags.DEFINE_integer("scoring_builds", 3, "Builds timed per way (scoring_ways).", lower_bound=1)
FEATURES, CLASSES, HIDDEN_UNITS = 32, 10, 16  # the population benchmark's data and model
BATCH_SIZE = np.int64(64)  # `round_inputs.evaluation_batch_size` of the runs' batch of 10


# Long: one benchmark as a script: clients built, each way timed in turn, build costs, report
def scoring_ways(setup: Setup) -> dict:
    """Steady seconds per call of each way (`alternate`), and each grouped way's build cost:
    its first call on a freshly built round less its steady call, median of
    `--scoring_builds` builds. The clients are drawn from `setup.rng`."""
    spec = model_spec("mlp", (FEATURES,), CLASSES, hidden_units=HIDDEN_UNITS)
    model = functional_model(spec.build(), spec.input_spec())
    w0 = [np.asarray(w) for w in initial_weights(spec, FLAGS.seed)]
    signature = RoundSignature(1, tuple(range(len(w0) - 2)), client_work.LocalSGD())  # FedPer
    fns = round_functions(model, spec.input_spec(), signature, w0)
    n, rng = FLAGS.scoring_clients, setup.rng
    clients = [
        evaluation_input(
            collections.OrderedDict(
                x=rng.normal(size=(FLAGS.scoring_examples, FEATURES)).astype(np.float32),
                y=rng.integers(0, CLASSES, FLAGS.scoring_examples).astype(np.int32),
            ),
            np.zeros(1, np.int32),
            tuple(np.asarray(w0[j], np.float32) for j in fns.io.store_in),
        )
        for _ in range(n)
    ]
    models = tuple(np.asarray(w, np.float32)[None] for w in w0)

    def scored(scoring: in_process_scoring.ClientScoring, way: str) -> Callable[[], list]:
        return lambda: scoring.score(way, models, clients, BATCH_SIZE)

    def new_scoring() -> in_process_scoring.ClientScoring:
        """A freshly built round's scoring, one call at a time per core (as in a run)."""
        return in_process_scoring.ClientScoring(fns, None, os.cpu_count() or 1)

    built = new_scoring()
    t = alternate({way: scored(built, way) for way in in_process_scoring.WAYS}, FLAGS.rounds)
    builds: dict[str, list[float]] = {"looped": [], "vectorised": []}
    for _ in range(FLAGS.scoring_builds):
        for way, times in builds.items():
            fresh = new_scoring()
            start = time.perf_counter()
            scored(fresh, way)()
            times.append(time.perf_counter() - start - t[way])
    build = {way: statistics.median(times) for way, times in builds.items()}
    ops = built.ops
    measured = {
        "LOOPED_SECONDS_PER_OP": (t["looped"] - t["vectorised"]) / n / ops,
        "CONVERSION_SECONDS_PER_OP": build["vectorised"] / ops,
    }
    in_code = {name: getattr(in_process_scoring, name) for name in measured}
    vectorise_from = (
        in_process_scoring.CLEAR_MARGIN
        * in_code["CONVERSION_SECONDS_PER_OP"]
        / in_code["LOOPED_SECONDS_PER_OP"]
    )
    print(
        f"Scoring {n} personal clients of {FLAGS.scoring_examples} examples (FedPer, mlp "
        f"{FEATURES}-{HIDDEN_UNITS}-{CLASSES}, {ops} ops) in process: alone {t['alone']:.3f} s, "
        f"looped {t['looped']:.3f} s (built in {build['looped']:.2f} s), vectorised "
        f"{t['vectorised']:.3f} s (built in {build['vectorised']:.2f} s). Constants measured "
        + ", ".join(f"{k} {v:.2g} (code {in_code[k]:.2g})" for k, v in measured.items())
        + f"; the code vectorises a call of {vectorise_from:.0f} clients or more",
        flush=True,
    )
    return {
        **seconds_row(t),
        "clients": n,
        "ops": ops,
        "build_s": {way: round(v, 3) for way, v in build.items()},
        "measured": {k: float(f"{v:.3g}") for k, v in measured.items()},
        "in_code": in_code,
        "alone_over_looped": round(t["alone"] / t["looped"], 2),
        "looped_over_vectorised": round(t["looped"] / t["vectorised"], 2),
    }


BENCHMARK = Benchmark(scoring_ways, by_default=False, in_tff_runtime=False)
