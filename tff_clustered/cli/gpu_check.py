"""Does `--execution=in_process` train on this machine's GPU, and how much faster than on its CPU?

  make gpu-extras   # once: TensorFlow's CUDA libraries (requirements/gpu.txt)
  make gpu-check    # this script

1. What TensorFlow sees: its version, the CUDA and cuDNN it was built with, its GPUs.
2. Two rounds of the in-process round (the very graph `--execution=in_process` runs), each timed
   on the CPU and on the GPU (`--accelerator`, default the first GPU), each device in a fresh
   child process with TensorFlow's placement log on:
   - `mlp`: the benchmark's round (FedAvg's core, 20 clients x 100 examples, 784 features,
     MLP 784-128-10, 5 local epochs, batch 10);
   - `cnn`: FedTSDP's CNN on 32x32x3 inputs, 20 clients x 500 examples, 2 local epochs,
     batch 50 (6.4 M parameters).
3. From the accelerator's placement log: the training ops (the model's forward, the loss, its
   gradient, the minibatch gather, the per-cluster sum) must all be placed on the accelerator.
4. The CNN round's floating-point work (3x the forward pass's, the usual estimate for forward
   and backward) against the measured time, and against `--gpu_tflops` (your GPU's nominal
   FP32 throughput) when given: how close to the device's limit the round runs.
5. One summary line: `gpu-check: ok | FAILED | no GPU`, with both times and their ratio.

Exit code 0 when the check passes, and when TensorFlow sees no GPU (after the CPU part: there is
nothing to check); 1 when a training op is not placed on the accelerator; 2 on bad flags.

`--logical_cpus=2 --accelerator=/CPU:1` splits the CPU into two logical devices and checks the
second as if it were a GPU: how the check itself is tested on machines without one.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf
from absl import flags

from tff_clustered.cli import exits, logs
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.federated.placement import (
    placed_devices,
    training_ops_elsewhere,
)
from tff_clustered.models.keras_models import ModelSpec, model_spec

FLAGS = flags.FLAGS
# Each device's child process runs this binary again (`--child_device`).
BINARY = os.path.join(REPOSITORY, "binaries", "gpu_check.py")
flags.DEFINE_bool(logs.FLAG, False, logs.FLAG_HELP)
flags.DEFINE_string(
    "accelerator", None, "The device checked, e.g. /GPU:1. Default: the first GPU TensorFlow sees."
)
flags.DEFINE_integer(
    "logical_cpus",
    0,
    "Split the CPU into this many logical devices (testing without a GPU).",
    lower_bound=0,
)
flags.DEFINE_list("workloads", ["mlp", "cnn"], "Rounds timed: mlp (the benchmark's), cnn.")
flags.DEFINE_integer(
    "rounds", 3, "Timed rounds per workload on the accelerator (median).", lower_bound=1
)
flags.DEFINE_integer(
    "cpu_rounds",
    1,
    "Timed rounds per workload on the CPU (the CNN's take about a minute).",
    lower_bound=1,
)
flags.DEFINE_integer("clients", 20, "Clients per round.", lower_bound=1)
flags.DEFINE_integer("mlp_examples", 100, "Examples per client, mlp round.", lower_bound=1)
flags.DEFINE_integer("cnn_examples", 500, "Examples per client, cnn round.", lower_bound=1)
flags.DEFINE_float("gpu_tflops", None, "Your GPU's nominal FP32 TFLOP/s (spec sheet), if known.")
flags.DEFINE_string("child_device", None, "Internal: time the rounds on this device.")


class Workload(NamedTuple):
    """One timed round: the model, its input shape, and the clients' local training."""

    model: str
    input_shape: tuple[int, ...]
    examples_flag: str  # the flag giving each client's number of examples
    epochs: int
    batch_size: int

    def spec(self) -> ModelSpec:
        return model_spec(self.model, self.input_shape, 10, image_shape=self.input_shape)

    @property
    def examples(self) -> int:
        return getattr(FLAGS, self.examples_flag)


WORKLOADS = {
    "mlp": Workload("mlp", (784,), "mlp_examples", epochs=5, batch_size=10),
    "cnn": Workload("tsdp_cnn", (32, 32, 3), "cnn_examples", epochs=2, batch_size=50),
}
LEARNING_RATE = 0.01
PLACEMENT_MARK = "=== placement above: "


def split_cpu(count: int) -> None:
    """Before TensorFlow initialises its devices: `count` logical CPUs (0: leave it)."""
    if count:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count
        )


def workload_clients(workload: Workload, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    n = workload.examples
    return [
        collections.OrderedDict(
            x=rng.random((n, *workload.input_shape), dtype=np.float32),
            y=rng.integers(0, 10, n).astype(np.int32),
        )
        for _ in range(FLAGS.clients)
    ]


def forward_flops(spec: ModelSpec) -> float:
    """Floating-point operations of one example's forward pass, counted by TensorFlow's
    profiler on the model's graph."""
    model = spec.build()
    call = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([1, *spec.input_shape], tf.float32)
    )
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profile = tf.compat.v1.profiler.profile(call.graph, options=options)
    return float(profile.total_float_ops)


def time_rounds(device: str) -> list[dict]:
    """In a child process: each workload's round on `device`, after one warm-up round (the
    trace, and the placement log), `--rounds` timed rounds."""
    from tff_clustered.federated.executions import RoundCache, repeated_round
    from tff_clustered.federated.round_inputs import round_hparams
    from tff_clustered.models import initial_weights
    from tff_clustered.models.functional import functional_model

    tf.debugging.set_log_device_placement(True)
    results = []
    for name in FLAGS.workloads:
        workload = WORKLOADS[name]
        spec = workload.spec()
        cache = RoundCache(
            functional_model(spec.build(), spec.input_spec()),
            spec.input_spec(),
            initial_weights(spec, 0),
            "in_process",
            device,
        )
        hparams = round_hparams(LEARNING_RATE, workload.batch_size, workload.epochs)
        run = repeated_round(cache, workload_clients(workload), 1, hparams)
        run()
        print(PLACEMENT_MARK + name, file=sys.stderr, flush=True)
        seconds = []
        for _ in range(FLAGS.cpu_rounds if device == "/CPU:0" else FLAGS.rounds):
            start = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - start)
        results.append({"workload": name, "device": device, "seconds": seconds})
    return results


def run_child(device: str, argv: Sequence[str]) -> tuple[list[dict], str]:
    """This script again with `--child_device`, TensorFlow's log on: (results, stderr)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    command = [sys.executable, BINARY, *argv[1:], f"--child_device={device}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-25:])
        print(
            f"{tail}\nerror: the rounds on {device} failed (exit {done.returncode})",
            file=sys.stderr,
        )
        raise SystemExit(1)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return results, done.stderr


def per_workload(stderr: str) -> dict[str, str]:
    """A child's stderr cut into each workload's placement log (the child marks the end of
    each with a line `=== placement above: NAME`)."""
    logs_by_name, lines = {}, []
    for line in stderr.splitlines():
        if line.startswith(PLACEMENT_MARK):
            logs_by_name[line[len(PLACEMENT_MARK) :]] = "\n".join(lines)
            lines = []
        else:
            lines.append(line)
    return logs_by_name


def describe_tensorflow() -> list[str]:
    """Prints what TensorFlow sees; returns its GPUs' logical names."""
    build = tf.sysconfig.get_build_info()
    print(f"TensorFlow {tf.__version__}")
    print(
        f"  built with CUDA {build.get('cuda_version', 'none')}, "
        f"cuDNN {build.get('cudnn_version', 'none')}"
    )
    gpus = tf.config.list_logical_devices("GPU")
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        print(
            f"  sees {gpu.name}: {details.get('device_name', '?')}, "
            f"compute capability {details.get('compute_capability', '?')}"
        )
    if not gpus:
        print("  sees no GPU")
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    print(f"  CPU devices: {', '.join(cpus)}")
    return [g.name for g in gpus]


def choose_accelerator(gpus: list[str]) -> Optional[str]:
    """The device checked: `--accelerator`, else the first GPU, else None."""
    if FLAGS.accelerator:
        seen = [d.name for d in tf.config.list_logical_devices()]
        name = FLAGS.accelerator.strip("/").upper()
        if f"/DEVICE:{name}" not in {d.upper() for d in seen}:
            raise exits.usage_error(
                f"--accelerator={FLAGS.accelerator} is not a device TensorFlow sees "
                f"({', '.join(sorted(seen))}); "
                "name one of those, or leave the flag out"
            )
        return "/" + name
    return "/GPU:0" if gpus else None


def cnn_work(seconds: float) -> str:
    """The CNN round's floating-point work against its time and the GPU's nominal rate."""
    cnn = WORKLOADS["cnn"]
    steps = FLAGS.clients * cnn.epochs * -(-cnn.examples // cnn.batch_size)
    flop = 3.0 * forward_flops(cnn.spec()) * steps * cnn.batch_size
    text = f"cnn round: {flop / 1e9:.1f} GFLOP (3x forward), {flop / seconds / 1e12:.2f} TFLOP/s"
    if FLAGS.gpu_tflops:
        floor = flop / (FLAGS.gpu_tflops * 1e12)
        text += (
            f"; at the nominal {FLAGS.gpu_tflops:g} TFLOP/s the round would take "
            f"{floor * 1e3:.1f} ms: measured {seconds / floor:.1f}x that"
        )
    else:
        text += " (pass --gpu_tflops=<your GPU's nominal FP32 TFLOP/s> to compare)"
    return text


def main(argv: list[str]) -> int:
    split_cpu(FLAGS.logical_cpus)
    unknown = sorted(set(FLAGS.workloads) - set(WORKLOADS))
    if unknown:
        raise exits.usage_error(
            f"--workloads: unknown {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
        )
    if FLAGS.child_device:
        for result in time_rounds(FLAGS.child_device):
            print(json.dumps(result), flush=True)
        return 0
    if len(argv) > 1:
        raise exits.usage_error(f"unexpected arguments: {' '.join(argv[1:])}")
    accelerator = choose_accelerator(describe_tensorflow())
    devices = ["/CPU:0"] + ([accelerator] if accelerator else [])
    medians: dict[tuple[str, str], float] = {}
    problems: list[str] = []
    for device in devices:
        print(f"\nrounds on {device} (in a child process, placement log on)")
        results, stderr = run_child(device, sys.argv)
        placed = per_workload(stderr)
        for result in results:
            median = statistics.median(result["seconds"])
            medians[(result["workload"], device)] = median
            print(f"  {result['workload']}: median {median:.3f} s over {len(result['seconds'])}")
            if device == accelerator:
                log = placed.get(result["workload"], "")
                for problem in training_ops_elsewhere(placed_devices(log), accelerator):
                    problems.append(f"{result['workload']}: {problem}")
    if "cnn" in FLAGS.workloads:
        print("\n" + cnn_work(medians[("cnn", accelerator or "/CPU:0")]))
    for problem in problems:
        print(f"NOT ON {accelerator}: {problem}")
    line, code = summary(medians, problems, accelerator)
    print("\n" + line)
    return code


def summary(
    medians: dict[tuple[str, str], float], problems: list[str], accelerator: Optional[str]
) -> tuple[str, int]:
    """The last line and the exit code, from each (workload, device)'s median seconds and the
    training ops found off the accelerator."""
    times = []
    for name in FLAGS.workloads:
        cpu = medians[(name, "/CPU:0")]
        if accelerator:
            other = medians[(name, accelerator)]
            times.append(f"{name} CPU {cpu:.3f} s, {accelerator} {other:.3f} s, {cpu / other:.1f}x")
        else:
            times.append(f"{name} CPU {cpu:.3f} s")
    if accelerator is None:
        status = "no GPU (TensorFlow sees none; `make doctor` says why)"
    else:
        status = "FAILED" if problems else "ok"
    return f"gpu-check: {status}; " + "; ".join(times), 1 if problems else 0


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    exits.run_main("gpu_check.py", main)
