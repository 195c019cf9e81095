"""Several TFF workers on loopback (`binaries/worker.py`, `--workers=a,b`): the same results as
one worker, a worker killed mid-run named and the run resumed, an unreachable worker named at
start, and a worker that listens where it says only."""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import portpicker
import pytest
import tensorflow_federated as tff
from conftest import ROOT, finished_runs, started_runs

from tff_clustered.algorithms import make_options
from tff_clustered.data.population import PopulationSpec, write_population_sql
from tff_clustered.data.spec import DataSpec
from tff_clustered.federated import sharded
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.federated.tff_factory_aggregator import TffFactoryPerCluster
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.loop.evaluation import server_models
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.runs.runner import spec_experiment
from tff_clustered.runtime.context import RuntimeConfig, WorkerLostError, tff_runtime

WORKER = os.path.join("binaries", "worker.py")
TRAIN = os.path.join("binaries", "train.py")


def start_worker_service(port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, WORKER, f"--port={port}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    line = process.stdout.readline()
    assert line.strip() == f"TFF worker listening on 127.0.0.1:{port} (loopback only).", (
        line + process.stderr.read()
    )
    return process


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def two_workers() -> Iterator[list]:
    services = [start_worker_service(portpicker.pick_unused_port()) for _ in range(2)]
    yield services
    for service in services:
        stop(service)


def address(service: subprocess.Popen) -> str:
    port = next(a for a in service.args if a.startswith("--port=")).split("=")[1]
    return f"127.0.0.1:{port}"


def test_split_clients_gives_contiguous_balanced_non_empty_shares() -> None:
    assert sharded.split_clients([10] * 6, 2) == [slice(0, 3), slice(3, 6)]
    assert sharded.split_clients([100, 1, 1, 1, 1], 2) == [slice(0, 1), slice(1, 5)]
    assert sharded.split_clients([1, 1, 1, 100], 3) == [slice(0, 2), slice(2, 3), slice(3, 4)]
    assert sharded.split_clients([5, 5], 4) == [slice(0, 1), slice(1, 2)]
    assert sharded.split_clients([], 2) == []
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(0, 50, rng.integers(1, 30))
        shards = sharded.split_clients(list(sizes), int(rng.integers(1, 6)))
        assert shards[0].start == 0 and shards[-1].stop == len(sizes)
        assert all(a.stop == b.start for a, b in zip(shards[:-1], shards[1:]))
        assert all(s.stop > s.start for s in shards)


def test_two_workers_give_the_one_worker_result(two_workers: list, monkeypatch: object) -> None:
    """IFCA (clients pick their cluster; per-client outputs must come back in order) with
    server momentum per cluster (the finalizer's state), each round's clients split over both
    workers."""
    spec = RunSpec(
        algorithm="ifca",
        training=TrainingConfig(
            rounds=2,
            clients_per_round=8,
            local_epochs=1,
            learning_rate=0.1,
            server_optimizer=ServerOptimizer("sgdm", learning_rate=1.0, momentum=0.9),
        ),
    )
    used = []
    call_on = sharded._call_on
    monkeypatch.setattr(sharded, "_call_on", lambda c, *a: used.append(id(c)) or call_on(c, *a))
    results = []
    for workers in ([address(two_workers[0])], [address(s) for s in two_workers]):
        with tff_runtime(RuntimeConfig(workers=tuple(workers))):
            experiment = spec_experiment(spec)
            experiment.start()
            history = list(experiment.rounds())
            # per-client scoring (the path of personal models), split over the workers too
            ids = experiment.data.client_ids
            models, keys = server_models(
                experiment.state.cluster_models, "cluster", np.arange(len(ids)) % 2
            )
            scores = experiment.calls.score(experiment.current_round(), models, keys, ids)
            results.append((experiment.state, history, scores))
    assert len(set(used)) == 2  # both workers trained and scored clients
    (one, one_history, one_scores), (two, two_history, two_scores) = results
    assert one_scores.keys() == two_scores.keys()
    for client, expected in one_scores.items():
        assert two_scores[client] == pytest.approx(expected, rel=1e-5), client
    assert one.assignment == two.assignment
    np.testing.assert_allclose(one.cluster_models, two.cluster_models, atol=1e-5)
    for key, value in one.server_optimizer_state.items():
        np.testing.assert_allclose(two.server_optimizer_state[key], value, atol=1e-5)
    assert np.abs(one.server_optimizer_state["accumulator"]).max() > 0  # momentum was kept
    for a, b in zip(one_history, two_history):
        assert a.keys() == b.keys()
        for key in a:
            if not key.endswith("_seconds") and isinstance(a[key], float):
                assert a[key] == pytest.approx(b[key], abs=1e-6, nan_ok=True), key


@pytest.mark.parametrize("algorithm", ["ifca", "fesem"])
def test_two_workers_give_the_one_worker_result_with_dp(
    algorithm: str, two_workers: list, monkeypatch: object
) -> None:
    """--aggregator=dp with adaptive clipping and noise: each worker sums its share of the
    clipped updates and below-clip counts, the shares are merged, and the one finalizer adds
    the seeded noise once, so two workers give the one-worker run; the clients pick their
    cluster in the round (IFCA's lowest loss, FeSEM's client-side E-step)."""
    private = AggregatorConfig("dp", noise_multiplier=0.5, clip=0.5, clipping="adaptive")
    options = {"fesem": make_options("fesem", fesem_estep="client")}.get(algorithm)
    spec = RunSpec(
        algorithm=algorithm,
        algorithm_options=options,
        training=TrainingConfig(
            rounds=2, clients_per_round=8, local_epochs=1, learning_rate=0.1, aggregator=private
        ),
    )
    used = []
    call_on = sharded._call_on
    monkeypatch.setattr(sharded, "_call_on", lambda c, *a: used.append(a[0]) or call_on(c, *a))
    results = []
    for workers in ([address(two_workers[0])], [address(s) for s in two_workers]):
        with tff_runtime(RuntimeConfig(workers=tuple(workers))):
            experiment = spec_experiment(spec)
            experiment.start()
            results.append((experiment.state, list(experiment.rounds())))
    assert len(used) > 2  # shares of two rounds, then each round's finalizer
    (one, one_history), (two, two_history) = results
    assert one.assignment == two.assignment
    np.testing.assert_allclose(one.cluster_models, two.cluster_models, atol=1e-5)
    clips = one.aggregator_state["clip"]
    np.testing.assert_allclose(two.aggregator_state["clip"], clips, rtol=1e-6)
    assert not np.allclose(clips, 0.5)  # the clips moved
    for a, b in zip(one_history, two_history):
        assert a.keys() == b.keys()
        for key in a:
            if not key.endswith("_seconds") and isinstance(a[key], float):
                assert a[key] == pytest.approx(b[key], abs=1e-6, nan_ok=True), key


def test_two_workers_reading_their_clients_give_the_one_worker_sending_them(
    two_workers: list, tmp_path: object
) -> None:
    """Each worker reads its share of the clients from the population file itself
    (`--client_data=read_on_worker`; the shares split by the listed example counts)."""
    population = PopulationSpec(num_clients=10, train_examples=6, test_examples=3, num_features=5)
    path = str(tmp_path / population.file_name)
    write_population_sql(population, path)
    spec = RunSpec(
        algorithm="fedper",
        data=DataSpec(dataset="tff_sql", data_dir=path, num_classes=population.num_classes),
        training=TrainingConfig(rounds=2, clients_per_round=6, local_epochs=1, eval_every=1),
    )
    results = []
    for workers, client_data in (
        ([address(two_workers[0])], "sent"),
        ([address(s) for s in two_workers], "read_on_worker"),
    ):
        with tff_runtime(RuntimeConfig(workers=tuple(workers), client_data=client_data)):
            experiment = spec_experiment(spec)
            experiment.start()
            history = list(experiment.rounds())
            assert (experiment.calls.rounds_cache.worker_data is None) == (client_data == "sent")
            results.append((experiment.state.cluster_models, history))
    (one, one_history), (two, two_history) = results
    np.testing.assert_allclose(one, two, atol=1e-5)
    for a, b in zip(one_history, two_history):
        for key in a:
            if not key.endswith("_seconds") and isinstance(a[key], float):
                assert a[key] == pytest.approx(b[key], abs=1e-6, nan_ok=True), key


def test_an_unreachable_worker_is_named_at_start() -> None:
    dead = f"127.0.0.1:{portpicker.pick_unused_port()}"
    config = RuntimeConfig(workers=("127.0.0.1:1", dead), connect_timeout_s=1.0)
    with pytest.raises(WorkerLostError, match="127.0.0.1:1 is unreachable.*binaries/worker.py"):
        with tff_runtime(config):
            pass


def test_a_silent_worker_is_named_within_its_timeout_and_a_busy_one_is_not_cut() -> None:
    """A stopped worker (SIGSTOP: a stalled machine) keeps its connection open, so a call
    without a deadline would wait for ever; a long computation on a live worker must still end."""
    import tensorflow as tf
    import tensorflow_federated as tff

    @tff.tensorflow.computation(np.int32)
    def long_sum(steps: tf.Tensor) -> tf.Tensor:
        x = tf.fill([300, 300], 1e-3)
        _, total = tf.while_loop(
            lambda i, t: i < steps,
            lambda i, t: (i + 1, t + tf.reduce_sum(tf.matmul(x, x))),
            (tf.constant(0), tf.constant(0.0)),
        )
        return total

    port = portpicker.pick_unused_port()
    service = start_worker_service(port)
    config = RuntimeConfig(workers=(f"127.0.0.1:{port}",), worker_timeout_s=2.0, probe_every_s=0.1)
    try:
        with tff_runtime(config):
            long_sum(1)  # traced and sent once, so the timing below is the computation's
            start = time.monotonic()
            assert long_sum(3000) == pytest.approx(3000 * 300 * 300 * 300 * 1e-6, rel=1e-3)
            assert time.monotonic() - start > 5 * config.probe_every_s  # it was probed, not cut
            os.kill(service.pid, signal.SIGSTOP)
            start = time.monotonic()
            with pytest.raises(
                WorkerLostError,
                match=f"127.0.0.1:{port} stopped answering.*liveness probe in 2s.*--resume",
            ):
                long_sum(1)
            assert time.monotonic() - start < 15
    finally:
        service.send_signal(signal.SIGCONT)
        stop(service)


def test_a_silent_worker_is_named_within_twice_its_timeout_and_stays_lost() -> None:
    """--worker_timeout bounds the wait whatever the probe interval: a stopped worker is
    named after at least its timeout and within twice it; once named, later calls (TFF's
    clean-ups among them) fail at once instead of each waiting for a probe of their own, and
    the runtime stops at once."""
    import tensorflow as tf
    import tensorflow_federated as tff

    @tff.tensorflow.computation(np.int32)
    def add_one(x: tf.Tensor) -> tf.Tensor:
        return x + 1

    port = portpicker.pick_unused_port()
    service = start_worker_service(port)
    timeout = 2.0
    config = RuntimeConfig(workers=(f"127.0.0.1:{port}",), worker_timeout_s=timeout)
    assert config.probe_every_s > 2 * timeout  # the default interval is not what bounds it
    try:
        with tff_runtime(config) as runtime:
            assert add_one(1) == 2
            os.kill(service.pid, signal.SIGSTOP)
            start = time.monotonic()
            with pytest.raises(WorkerLostError, match=f"127.0.0.1:{port} stopped answering"):
                add_one(1)
            named = time.monotonic() - start
            assert timeout <= named < 2 * timeout + 2, named
            start = time.monotonic()
            with pytest.raises(WorkerLostError, match=f"127.0.0.1:{port} stopped answering"):
                add_one(2)
            assert time.monotonic() - start < 1.0
            start = time.monotonic()
        runtime.stop()
        assert time.monotonic() - start < 2.0
    finally:
        service.send_signal(signal.SIGCONT)
        stop(service)


def test_a_worker_killed_mid_run_is_named_and_the_run_resumes(tmp_path: object) -> None:
    """A run on two workers, one of them killed after round 2: the run stops naming it (exit
    3, one line), and resumed once the worker is back ends as the uninterrupted run. The
    resumption and then the uninterrupted run share one train.py process (one TensorFlow
    import), started with the run whose worker is killed: the resumption is its first run."""
    ports = [portpicker.pick_unused_port() for _ in range(2)]
    services = [start_worker_service(p) for p in ports]
    workers = f"--workers=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    flags = ["--rounds=6", "--clients_per_round=6", "--local_epochs=1", workers]
    flags += ["--checkpoint_every=1", "--algorithm=fedavg"]
    reference = str(tmp_path / "reference")
    out = str(tmp_path / "killed")
    runs = started_runs(
        ["wait", [*flags, f"--output_dir={out}", "--resume"], [*flags, f"--output_dir={reference}"]]
    )
    try:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        process = subprocess.Popen(
            [sys.executable, TRAIN, *flags, f"--output_dir={out}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        metrics = os.path.join(out, "metrics.csv")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if os.path.exists(metrics) and len(read_csv(metrics)) >= 3:  # rounds 0..2 done
                break
            time.sleep(0.05)
        assert process.poll() is None, "the run finished before its worker could be killed"
        services[1].kill()  # the machine goes away: its TFF worker dies with the service
        services[1].wait()
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 3, stderr[-3000:]
        assert f"TFF worker 127.0.0.1:{ports[1]} stopped answering" in stderr
        # One line, and nothing at exit (TFF's finalizers disposing of values on the lost
        # worker printed `Exception ignored in: <finalize object>` with a traceback).
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
        assert "--resume" in stderr
        assert len(read_csv(metrics)) < 7

        services[1] = start_worker_service(ports[1])
        resumed, done = finished_runs(runs)  # the resumption starts now
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "resuming" in resumed.stdout
        assert done.returncode == 0, done.stderr[-3000:]

        def strip(rows: list[dict]) -> list[dict]:
            return [{k: v for k, v in r.items() if not k.endswith("_seconds")} for r in rows]

        assert strip(read_csv(metrics)) == strip(read_csv(os.path.join(reference, "metrics.csv")))
    finally:
        if runs.poll() is None:
            runs.kill()
            runs.communicate()
        for service in services:
            stop(service)


def test_a_worker_listens_on_loopback_only(two_workers: list) -> None:
    port = int(address(two_workers[0]).rpartition(":")[2])
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this finds our own address
            own = probe.getsockname()[0]
        except OSError:
            own = None
    if own is None or own.startswith("127."):
        pytest.skip("this machine has no non-loopback address to try")
    with pytest.raises(OSError):
        socket.create_connection((own, port), timeout=5).close()


def read_csv(path: str) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_a_tff_factory_per_cluster_is_refused_on_two_workers(two_workers: list) -> None:
    """A `tff.aggregators` factory per cluster runs each cluster's process over all of a
    round's clients in one computation: a run over two workers is refused when it is built,
    before any training, naming the fix."""
    factory = TffFactoryPerCluster(tff.aggregators.MeanFactory())
    spec = RunSpec(
        algorithm="fedavg",
        training=TrainingConfig(rounds=1, aggregator=AggregatorConfig.of(factory)),
    )
    with tff_runtime(RuntimeConfig(workers=tuple(address(s) for s in two_workers))):
        with pytest.raises(ValueError, match="split over 2 workers.*run it on one worker"):
            spec_experiment(spec)
