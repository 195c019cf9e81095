"""The in-process execution (the GPU path) against the TFF runtime: every algorithm, same seed,
same clusters and the same results within float tolerance; and ops placed where asked."""

from __future__ import annotations

import collections
import dataclasses
import json
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_binary

from tff_clustered.algorithms import ALGORITHMS, make_algorithm
from tff_clustered.algorithms.dfl import Decentralized
from tff_clustered.data import load_dataset
from tff_clustered.federated import client_work, graphs, grouping, in_process, placement
from tff_clustered.federated.distributions import Distribution, LowestLossCluster, OwnCluster
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.round_functions import (
    round_functions,
)
from tff_clustered.federated.round_inputs import (
    client_seed,
    evaluation_input,
    round_clients,
    round_hparams,
)
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model

pytestmark = pytest.mark.usefixtures("tff_context")
CONFIG = TrainingConfig(
    rounds=2, clients_per_round=6, local_epochs=1, learning_rate=0.1, seed=3, eval_every=2
)
# Options that make each clustered method decide within two rounds of twelve clients.
CLUSTERED = {"cfl", "fesem", "fedtsdp", "ifca", "fedac", "flhc", "cgpfl"} | {
    a for a in ALGORITHMS if a.startswith("fedgroup")
}
OPTIONS = {
    "fedtsdp": {"tsdp_trigger": "paper", "hopkins_threshold": 0.5},
    "cfl": {  # splits at once
        "cfl_criterion": "absolute",
        "cfl_warmup_rounds": 1,
        "cfl_eps1": 100.0,
        "cfl_eps2": 1e-6,
    },
    "ditto": {"ditto_lambda": 0.5},
    "fedac": {"num_clusters": 2, "fedac_components": 5},  # warm-up: rounds 1-2
    "flhc": {"flhc_cluster_round": 1},
}
# Decentralized algorithms: every peer takes part in every round and pulls 3 others.
DECENTRALIZED = {a for a, cls in ALGORITHMS.items() if issubclass(cls, Decentralized)}
OPTIONS["uapdfl"] = OPTIONS["dispfl"] = {"num_neighbours": 3}
TOLERANCE = 1e-4  # float32 sums in another order, over two rounds


def run(algorithm: str, execution: str) -> Experiment:
    data = load_dataset("digits_dirichlet", seed=CONFIG.seed, num_clients=12, dirichlet_beta=0.2)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    exp = Experiment(
        data,
        model,
        make_algorithm(algorithm, **OPTIONS.get(algorithm, {})),
        dataclasses.replace(CONFIG, clients_per_round=12) if algorithm in DECENTRALIZED else CONFIG,
        execution=RunExecution.of(execution),
    )
    exp.start()
    list(exp.rounds())
    return exp


def numbers(row: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if not k.endswith("_seconds") and isinstance(v, (int, float, np.number))
    }


# Algorithms whose rounds are another's with different server-side decisions: the decentralized
# baselines but DisPFL run one peer step (`peer_work.PeerStep`) with other mixing weights
# (CriticalFL-DFL's shorter queues are data); FedAvg's round is FedGroup's with one cluster,
# FedProx's is FedGrouProx's; FedGroup's variants differ from fedgroup / fedgrouprox only in
# how the server clusters. FedAvgM's and FedAdam's finalizers step a server optimizer inside
# the round, so they are compared. The executions are compared on the rounds, so one of each
# covers them.
SAME_ROUNDS_AS_ANOTHER = (DECENTRALIZED - {"uapdfl", "dispfl"}) | {
    "fedgroup_madc", "fedgrouprox_madc", "fedgroup_rac", "fedgroup_rcc", "fedavg", "fedprox",
}  # fmt: skip
COMPARED = sorted(set(ALGORITHMS) - SAME_ROUNDS_AS_ANOTHER)


@pytest.mark.parametrize("algorithm", COMPARED)
def test_in_process_round_gives_the_tff_rounds_results(algorithm: str) -> None:
    tff_run, local_run = run(algorithm, "tff"), run(algorithm, "in_process")
    if algorithm in CLUSTERED:  # the clustering path is compared too, not a single model
        assert len(set(tff_run.state.assignment.values())) > 1
    assert local_run.calls.rounds_cache.execution.name == "in_process"
    # The same decisions: clusters, assignments, split.
    assert local_run.state.assignment == tff_run.state.assignment
    assert local_run.state.shared == tff_run.state.shared
    assert len(local_run.state.cluster_models) == len(tff_run.state.cluster_models)
    np.testing.assert_allclose(
        local_run.state.cluster_models, tff_run.state.cluster_models, atol=TOLERANCE
    )
    for c in tff_run.data.client_ids:
        np.testing.assert_allclose(
            local_run.queries.client_models([c]), tff_run.queries.client_models([c]), atol=TOLERANCE
        )
    for ours, theirs in zip(local_run.state.history, tff_run.state.history, strict=True):
        a, b = numbers(ours), numbers(theirs)
        assert a.keys() == b.keys()
        for key in a:
            if np.isnan(b[key]):
                assert np.isnan(a[key]), key
            else:
                assert a[key] == pytest.approx(b[key], abs=1e-3), key


def test_in_process_ifca_round_with_an_anchor_matches_tff() -> None:
    """The two distributor options the algorithms above may not combine: clients that pick
    their cluster (IFCA) and a broadcast anchor read by the client work (a proximal pull to
    it), in one round, against the TFF round."""
    spec = model_spec("mlp", (6,), 3, hidden_units=5)
    functional = functional_model(spec.build(), spec.input_spec())
    w0 = initial_weights(spec, 0)
    signature = RoundSignature(
        3,
        tuple(range(len(w0))),
        client_work.LocalSGD(prox_mu=0.3),
        return_model_deltas=True,
        distribution=LowestLossCluster(),
        anchor=(0, 1),
    )
    rng = np.random.default_rng(0)
    arrays = [
        collections.OrderedDict(
            x=rng.normal(size=(n, 6)).astype(np.float32),
            y=rng.integers(0, 3, size=n).astype(np.int32),
        )
        for n in (7, 12, 3, 9)
    ]
    results = {}
    for execution in ("tff", "in_process"):
        cache = RoundCache(functional, spec.input_spec(), w0, execution, rounds=1)
        fed_round = cache.get(signature)
        state = fed_round.initialize()
        models = [np.array(m) for m in state.cluster_models]
        for j in range(3):  # three different clusters
            models = [
                m + np.float32(0.1 * j) * (np.arange(3) == j).reshape(3, *[1] * (m.ndim - 1))
                for m in models
            ]
        state = state._replace(
            cluster_models=tuple(models),
            anchor=tuple(np.array(a) * 0.5 for a in state.anchor),
        )
        new_state, outputs, measurements = fed_round.next(
            state,
            round_clients(
                arrays,
                [np.array([0], np.int32)] * 4,
                [()] * 4,
                [np.float32(1.0)] * 4,
                [client_seed(i, i) for i in range(4)],
            ),
            round_hparams(0.1, 4, 2, num_clusters=3),
        )
        scores = fed_round.evaluate(
            new_state.cluster_models,
            [evaluation_input(a, o["cluster"], ()) for a, o in zip(arrays, outputs)],
            np.int64(64),
        )
        results[execution] = (new_state, outputs, measurements, scores)
    (s1, o1, m1, e1), (s2, o2, m2, e2) = results["tff"], results["in_process"]
    for a, b in zip(s1.cluster_models, s2.cluster_models, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)
    assert [o["cluster"] for o in o2] == [o["cluster"] for o in o1]
    assert len({int(o["cluster"]) for o in o1}) > 1  # the picks are not all the same
    for a, b in zip(o1, o2, strict=True):
        np.testing.assert_allclose(b["model_delta"], a["model_delta"], atol=1e-5)
        assert b["num_examples"] == a["num_examples"]
    np.testing.assert_allclose(m2["cluster_weight"], m1["cluster_weight"])
    for a, b in zip(e1, e2, strict=True):
        assert b["loss_sum"] == pytest.approx(a["loss_sum"], rel=1e-5)


@pytest.mark.parametrize("name, shape, vectorised", [("mlp", (6,), True), ("lstm", (4, 3), False)])
def test_a_model_that_loops_over_time_is_not_vectorised(
    name: str, shape: tuple, vectorised: bool
) -> None:
    # pfor cannot convert the gradient of the LSTM's loop over time (its TensorLists): such
    # clients train one each, as clients of a too-large graph do.
    import tensorflow as tf

    spec = model_spec(name, shape, 3, hidden_units=5)
    model = functional_model(spec.build(), spec.input_spec())
    with tf.Graph().as_default() as graph:  # as TFF and the in-process round trace it
        weights = [tf.compat.v1.placeholder(tf.float32, s) for s in model.trainable_shapes]
        x = tf.compat.v1.placeholder(tf.float32, [None, *shape])
        loss = tf.reduce_sum(model.apply(weights, [], x, True, None)[0])
        tf.gradients(loss, weights)
    assert graphs.vectorisable(graph) == vectorised


def test_clients_of_a_large_model_train_one_each_with_the_vectorised_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Same-size clients train vectorised (one `tf.vectorized_map` graph) unless one client's
    graph exceeds `VECTORISE_MAX_OPS` (pfor's conversion cost 98 s for ResNet18 and 230 s for
    the Sent140 LSTM); then each trains alone, with the same results, and the vectorised graph
    is never traced. So does every client of a run too short to earn back the conversion
    (fewer than `VECTORISE_MIN_ROUNDS` rounds)."""
    spec = model_spec("mlp", (6,), 3, hidden_units=5)
    functional = functional_model(spec.build(), spec.input_spec())
    w0 = initial_weights(spec, 0)
    signature = RoundSignature(2, tuple(range(len(w0))), client_work.LocalSGD())
    rng = np.random.default_rng(0)
    arrays = [
        collections.OrderedDict(
            x=rng.normal(size=(n, 6)).astype(np.float32),
            y=rng.integers(0, 3, size=n).astype(np.int32),
        )
        for n in (8, 8, 5, 8)
    ]
    traced: dict[tuple[int, int], list[str]] = {}
    results = {}
    default, short_run = graphs.VECTORISE_MAX_OPS, grouping.VECTORISE_MIN_ROUNDS - 1
    original = graphs.GraphFunction
    for max_ops, rounds in ((default, 0), (0, 0), (default, short_run)):
        names = traced.setdefault((max_ops, rounds), [])

        class Recorded(original):  # type: ignore[misc, valid-type]
            def __init__(self, fn: object, specs: list, *args: object, names: list = names) -> None:
                names.append(traced_name(fn, specs))
                super().__init__(fn, specs, *args)

        monkeypatch.setattr(graphs, "GraphFunction", Recorded)
        monkeypatch.setattr(graphs, "VECTORISE_MAX_OPS", max_ops)
        fed_round = RoundCache(functional, spec.input_spec(), w0, "in_process", rounds=rounds).get(
            signature
        )
        results[max_ops, rounds] = fed_round.next(
            fed_round.initialize(),
            round_clients(
                arrays,
                [np.array([i % 2], np.int32) for i in range(4)],
                [()] * 4,
                [np.float32(1.0)] * 4,
                [client_seed(i, i) for i in range(4)],
            ),
            round_hparams(0.1, 4, 2, num_clusters=2),
        )
    assert "train_padded_clients" in traced[default, 0]  # 8 and 5 examples: the same 4 steps
    assert "train_padded_clients" not in traced[0, 0] and "train_client" in traced[0, 0]
    assert traced[default, short_run] == traced[0, 0]
    (s1, o1, m1), *others = results.values()
    for s2, o2, m2 in others:
        for a, b in zip(s1.cluster_models, s2.cluster_models, strict=True):
            np.testing.assert_allclose(b, a, atol=1e-6)
        for a, b in zip(o1, o2, strict=True):
            assert a.keys() == b.keys()
            for key in a:
                np.testing.assert_allclose(b[key], a[key], atol=1e-6, rtol=1e-6)
        np.testing.assert_allclose(m2["cluster_weight"], m1["cluster_weight"])


def traced_name(fn: object, specs: list) -> str:
    """The name of a traced graph's function; `train_stacked` given the clients' sizes last
    (padded clients) is `train_padded_clients`."""
    last = specs[-1]
    padded = isinstance(last, tf.TensorSpec) and last.dtype == tf.int64 and last.shape == [None]
    return "train_padded_clients" if fn.__name__ == "train_stacked" and padded else fn.__name__


def unequal_round_results(
    functional: object, w0: list, work: object, distribution: Distribution, **round_options: object
) -> tuple[tuple, list[str]]:
    """One in-process round of six clients of unequal sizes (two of them equal), and the
    names of the graphs it traced."""
    signature = RoundSignature(2, tuple(range(len(w0))), work, distribution=distribution)
    fns = round_functions(functional, model_spec("mlp", (6,), 3).input_spec(), signature, w0)
    names: list[str] = []
    original = graphs.GraphFunction

    class Recorded(original):  # type: ignore[misc, valid-type]
        def __init__(self, fn: object, specs: list, *args: object) -> None:
            names.append(traced_name(fn, specs))
            super().__init__(fn, specs, *args)

    graphs.GraphFunction = Recorded
    try:
        return run_unequal_round(in_process.in_process_round(fns, **round_options), w0, work), names
    finally:
        graphs.GraphFunction = original


def run_unequal_round(fed_round: object, w0: list, work: object) -> tuple:
    rng = np.random.default_rng(1)
    arrays = [
        collections.OrderedDict(
            x=rng.normal(size=(n, 6)).astype(np.float32),
            y=rng.integers(0, 3, size=n).astype(np.int32),
        )
        for n in (8, 13, 5, 8, 3, 21)
    ]
    state = fed_round.initialize()
    state = state._replace(
        cluster_models=tuple(
            m + np.float32(0.2) * (np.arange(2) == 1).reshape(2, *[1] * (m.ndim - 1))
            for m in state.cluster_models
        )
    )
    stored = [tuple(np.asarray(w) * 0.9 for w in w0) if work.reads_own_model else ()] * 6
    return fed_round.next(
        state,
        round_clients(
            arrays,
            [np.array([i % 2], np.int32) for i in range(6)],
            stored,
            [np.float32(1.0 + 0.1 * i) for i in range(6)],
            [client_seed(i, i) for i in range(6)],
        ),
        round_hparams(0.1, 4, 2, num_clusters=2),
    )


@pytest.mark.parametrize(
    "work,distribution",
    [
        # IFCA's pick (every cluster scored on the client's data first), a pull, momentum
        (client_work.LocalSGD(prox_mu=0.3, momentum=0.5), LowestLossCluster()),
        (client_work.DittoSGD(ditto_lambda=0.5), OwnCluster()),  # two passes over the data
    ],
)
def test_clients_of_unequal_sizes_train_padded_with_the_results_of_training_alone(
    work: object, distribution: Distribution
) -> None:
    """Clients of different sizes train in one vectorised call, each padded to the largest
    with masked batches, and every output (models, kept models, counts, losses, clusters)
    equals that of each client training alone: a padded step changes nothing (no update, no
    momentum, no pull)."""
    spec = model_spec("mlp", (6,), 3, hidden_units=5)
    functional = functional_model(spec.build(), spec.input_spec())
    w0 = initial_weights(spec, 0)
    (s1, o1, m1), padded_names = unequal_round_results(functional, w0, work, distribution)
    (s2, o2, m2), alone_names = unequal_round_results(
        functional, w0, work, distribution, vectorise=False
    )
    assert "train_padded_clients" in padded_names
    assert "train_padded_clients" not in alone_names
    for a, b in zip(s1.cluster_models, s2.cluster_models, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(o1, o2, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(  # loss sums of float32: a relative error
                np.concatenate([np.ravel(t) for t in tf_nest_flatten(a[key])]),
                np.concatenate([np.ravel(t) for t in tf_nest_flatten(b[key])]),
                atol=1e-6,
                rtol=1e-6,
                err_msg=key,
            )
    np.testing.assert_allclose(m1["cluster_weight"], m2["cluster_weight"])


def tf_nest_flatten(value: object) -> list:
    import tensorflow as tf

    return [np.asarray(v, np.float64) for v in tf.nest.flatten(value)] or [np.zeros(0)]


def test_a_model_with_dropout_is_not_padded() -> None:
    """Dropout draws its mask for the batch's shape, so a padded batch would draw other
    numbers for the client's own rows: such a model's clients of different sizes are not
    padded (nor a BatchNorm model's, whose batch statistics the padding would change)."""
    import tensorflow as tf

    keras_model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(6,)),
            tf.keras.layers.Dense(5, activation="relu"),
            tf.keras.layers.Dropout(0.5),
            tf.keras.layers.Dense(3),
        ]
    )
    functional = functional_model(keras_model)
    assert not functional.rows_independent
    w0 = [w.numpy() for w in keras_model.trainable_weights]
    _, names = unequal_round_results(functional, w0, client_work.LocalSGD(), OwnCluster())
    assert "train_padded_clients" not in names and "train_stacked" in names


def test_client_groups_pad_only_where_it_pays() -> None:
    """Same-size clients always share a call; padding joins sizes whose step counts are
    close, and leaves a client whose steps are far fewer than the others' to a call of its
    own, by the modelled cost (CALL_COST, STEP_COST)."""
    hparams = round_hparams(0.1, 10, 1)
    assert grouping.client_groups([30, 50, 30], hparams) == [[0, 2], [1]]
    assert grouping.client_groups([30, 50, 30], hparams, vectorise=False) == [[0], [1], [2]]
    assert grouping.client_groups([30, 50, 30], hparams, pad=True) == [[0, 1, 2]]
    groups = grouping.client_groups([10_000, 10, 9_990, 20], hparams, pad=True)
    assert groups == [[0, 2], [1, 3]]
    sizes = list(np.random.default_rng(0).integers(4, 166, 40))
    groups = grouping.client_groups(sizes, hparams, pad=True)
    assert sorted(i for g in groups for i in g) == list(range(40))
    assert 1 <= len(groups) < len(set(sizes))


# One experiment per device of the JSON sys.argv[1] in turn, each a round with TensorFlow's
# placement log on, followed on stderr by the line `PLACED_MARK` and on stdout by a JSON line.
PLACED_MARK = "=== placed above"
PLACEMENT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tff_clustered.data import load_digits_clusters
    from tff_clustered.algorithms import make_algorithm
    from tff_clustered.models import model_spec
    from tff_clustered.loop.config import TrainingConfig
    from tff_clustered.loop.execution import RunExecution
    from tff_clustered.loop.orchestration import Experiment
    tf.debugging.set_log_device_placement(True)
    for device in json.loads(sys.argv[1]):
        data = load_digits_clusters(num_clients=4, num_groups=2, seed=0)
        model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
        config = TrainingConfig(rounds=1, clients_per_round=2, seed=0)
        in_process = RunExecution.of("in_process", device or None)
        exp = Experiment(data, model, make_algorithm("fedavg"), config, execution=in_process)
        exp.start()
        list(exp.rounds())
        children = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read()
            except OSError:
                continue
            if parent == os.getpid() and b"worker_binary" in command:
                children.append(pid)
        result = {"accuracy": exp.state.history[-1]["accuracy"], "workers": children}
        print(PLACED_MARK, file=sys.stderr, flush=True)
        print(json.dumps(result), flush=True)
    """
).replace("PLACED_MARK", repr(PLACED_MARK))
DEVICES = ["/CPU:1", ""]


@pytest.fixture(scope="module")
def placements() -> dict[str, tuple[str, dict]]:
    """By device of `DEVICES`: (the placement log of its experiment, its JSON line), all in
    one process (one TensorFlow import) split into two logical CPUs."""
    result = run_binary(
        ["-c", PLACEMENT_SCRIPT, json.dumps(DEVICES)],
        env_extra={"TF_CPP_MIN_LOG_LEVEL": "0"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logs = result.stderr.split(PLACED_MARK + "\n")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(logs) == len(lines) + 1 == len(DEVICES) + 1, result.stdout + result.stderr[-3000:]
    return {device: (log, json.loads(line)) for device, log, line in zip(DEVICES, logs, lines)}


@pytest.mark.parametrize("device", DEVICES)
def test_in_process_rounds_run_on_the_named_device_without_a_tff_worker(
    device: str, placements: dict
) -> None:
    """With two logical CPUs, `device="/CPU:1"` puts the training's matmuls on the second and
    TensorFlow's default leaves them on the first; no TFF computation runs (none is needed).
    On a GPU machine the same log shows `device:GPU:0` (see docs/gpu.md)."""
    log, result = placements[device]
    # The model's forward (a function call), its loss and gradient, the batch gather of the
    # training loop and the per-cluster sum: the work that must land on the device.
    placed = placement.placed_devices(log)
    assert placement.training_ops_elsewhere(placed, device or "/CPU:0") == []
    assert result["workers"] == []  # nothing of TFF's was started
    assert 0.0 <= result["accuracy"] <= 1.0


def test_execution_settings_that_cannot_work_are_refused_with_the_fix() -> None:
    from tff_clustered.runtime.context import RuntimeConfig

    with pytest.raises(ValueError, match="Drop one of the two"):
        RuntimeConfig(execution="in_process", workers=("host:8000",))
    with pytest.raises(ValueError, match="Add --execution=in_process or drop --device"):
        RuntimeConfig(device="/GPU:0")
    with pytest.raises(ValueError, match="execution must be tff or in_process"):
        RuntimeConfig(execution="gpu")
    with pytest.raises(ValueError, match="is not one TensorFlow sees"):
        graphs.check_device("/GPU:7")
    graphs.check_device("/CPU:0")
    spec = model_spec("mlp", (5,), 3, hidden_units=4)
    functional = functional_model(spec.build(), spec.input_spec())
    with pytest.raises(ValueError, match="execution must be one of"):
        RoundCache(functional, spec.input_spec(), initial_weights(spec, 0), "gpu")


# The model of issue 64's abort (a LayerNormalization, which TFF's builder runs with the
# FusedBatchNorm kernels) under oneDNN (TF's default on AVX-512 CPUs only, so set here): its
# training step called `CALLS` times from two threads, as `InProcessExecution.train_clients`
# calls one client's graph, and its forward run on batches of 16 sizes in one loop of parallel
# iterations, as `ClientScoring` scores clients of other sizes. Before such a graph ran one
# call and one iteration at a time, each aborted the process with heap corruption (6 of 6
# tries of 500 calls; 3 of 3 of 1,500 loops).
CONCURRENT_CALLS_SCRIPT = textwrap.dedent(
    """
    import concurrent.futures, json
    import numpy as np
    import tensorflow as tf
    from tff_clustered.federated.graphs import GraphFunction
    from tff_clustered.models.functional import functional_model

    CALLS = 1000
    layers = tf.keras.layers
    spec = {"x": tf.TensorSpec([None, 8], tf.float32), "y": tf.TensorSpec([None], tf.int32)}
    flags = {}
    for name, norm in (("dense", layers.Dense(8)), ("layer_norm", layers.LayerNormalization())):
        keras_model = tf.keras.Sequential([layers.InputLayer((8,)), layers.Dense(8), norm])
        model = functional_model(keras_model, spec)

        def step(weights, x):
            logits, _ = model.apply(weights, (), x, True)
            return tf.gradients(tf.reduce_sum(logits), list(weights))

        weight_specs = tuple(tf.TensorSpec(s, tf.float32) for s in model.trainable_shapes)
        step_graph = GraphFunction(step, [weight_specs, tf.TensorSpec([None, 8])], None)
        flags[name] = step_graph.one_call_at_a_time
    rng = np.random.default_rng(0)
    weights = tuple(rng.random(s, np.float32) for s in model.trainable_shapes)
    batches = [rng.random((n, 8), np.float32) for n in (20, 16, 5)]
    alone = [step_graph(weights, x) for x in batches]

    def same_as_alone(i):
        got = step_graph(weights, batches[i % 3])
        return all(np.array_equal(a, b) for a, b in zip(got, alone[i % 3]))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        same = all(pool.map(same_as_alone, range(CALLS)))

    def forward_of_each_size(weights, x):
        def forward(i):  # batch i: the first 4 + i rows of x[i]
            return tf.reduce_sum(model.apply(weights, (), x[i, : 4 + i], False)[0])

        each = tf.range(tf.shape(x)[0])
        return tf.map_fn(forward, each, parallel_iterations=10, fn_output_signature=tf.float32)

    loop_graph = GraphFunction(
        forward_of_each_size, [weight_specs, tf.TensorSpec([None, None, 8])], None
    )
    x = rng.random((16, 20, 8), np.float32)
    first = loop_graph(weights, x)
    same_in_loops = all(np.array_equal(loop_graph(weights, x), first) for _ in range(CALLS))
    print(json.dumps({"same": [same, same_in_loops], "one_call_at_a_time": flags}))
    """
)


def test_a_graph_whose_kernels_cannot_run_twice_at_once_runs_one_call_at_a_time() -> None:
    result = run_binary(
        ["-c", CONCURRENT_CALLS_SCRIPT], env_extra={"TF_ENABLE_ONEDNN_OPTS": "1"}, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    want = {"same": [True, True], "one_call_at_a_time": {"dense": False, "layer_norm": True}}
    assert outcome == want
