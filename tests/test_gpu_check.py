"""`binaries/gpu_check.py` (`make gpu-check`), checked without a GPU: the CPU split into two
logical devices, the second checked as the accelerator; and the placement log reader it and
`test_in_process.py` share, on logs where an op is elsewhere or missing."""

from __future__ import annotations

import os

from conftest import run_binary

from tff_clustered.federated import placement

GPU_CHECK = os.path.join("binaries", "gpu_check.py")
TINY = ["--clients=2", "--mlp_examples=10", "--cnn_examples=20", "--rounds=1"]


def test_gpu_check_finds_the_training_ops_on_the_checked_device_and_times_both() -> None:
    """The MLP's round, its two clients vectorised: the training ops `placement` checks are the
    same for every model (the CNN's FLOP line: the test below)."""
    done = run_binary(
        [GPU_CHECK, "--logical_cpus=2", "--accelerator=/CPU:1", "--workloads=mlp", *TINY],
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu-check: ok; mlp CPU "), done.stdout
    assert "/CPU:1" in last and last.endswith("x")
    assert "TensorFlow 2.14" in done.stdout


def test_gpu_check_without_a_gpu_times_the_cpu_and_exits_0() -> None:
    """The CNN's round on the CPU, with its floating-point work; one client, so that the round
    is not vectorised (a conversion of seconds: the test above checks the vectorised round)."""
    done = run_binary([GPU_CHECK, "--workloads=cnn", *TINY, "--clients=1"], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "sees no GPU" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("gpu-check: no GPU"), done.stdout
    assert "cnn round: " in done.stdout and "GFLOP" in done.stdout


def test_gpu_check_refuses_a_device_tensorflow_does_not_see() -> None:
    done = run_binary([GPU_CHECK, "--accelerator=/GPU:3"])
    assert done.returncode == 2
    assert "--accelerator=/GPU:3 is not a device TensorFlow sees" in done.stderr
    assert "Traceback" not in done.stderr


def _line(name: str, op_type: str, device: str) -> str:
    return (
        f"2026-11-24 06:35:48.95: I tensorflow/core/common_runtime/placer.cc:125] {name}: "
        f"({op_type}): /job:localhost/replica:0/task:0/device:{device}"
    )


def test_placement_reader_names_ops_placed_elsewhere_or_missing() -> None:
    log = "\n".join(
        [
            _line("while/body/_1/MatMul", "MatMul", "GPU:0"),
            _line("while/body/_1/loss", "SparseSoftmaxCrossEntropyWithLogits", "CPU:0"),
            _line("while/body/_1/gradient_tape/MatMul", "MatMul", "GPU:0"),
            _line("while/body/_1/gradient_tape/Sum", "Sum", "CPU:0"),
            _line("while/body/_1/GatherV2", "GatherV2", "GPU:0"),
            "an unrelated line (with parentheses) device:GPU:0",
        ]
    )
    placed = placement.placed_devices(log)
    assert placed["gradient_tape/"] == {"device:GPU:0", "device:CPU:0"}
    problems = placement.training_ops_elsewhere(placed, "/GPU:0")
    assert problems == [
        "loss (SparseSoftmaxCrossEntropyWithLogits): device:CPU:0",
        "gradient (gradient_tape): device:CPU:0, device:GPU:0",
        "per-cluster sum (TensorScatterAdd): not in the placement log",
    ]
    fixed = log.replace("CPU:0", "GPU:0") + "\n" + _line("s", "TensorScatterAdd", "GPU:0")
    assert placement.training_ops_elsewhere(placement.placed_devices(fixed), "/gpu:0") == []
