"""Where TensorFlow put the training ops, read from its placement log.

Where TensorFlow put the training ops, read from its placement log: how the GPU path is
checked (`binaries/gpu_check.py`, `tests/test_in_process.py`). With
`tf.debugging.set_log_device_placement(True)` and `TF_CPP_MIN_LOG_LEVEL=0`, the placer logs one
line per op of every graph it places, e.g.

  ... placer.cc:125] loop_body/while/body/_1/gradient_tape/Reshape: (Reshape):
      /job:localhost/replica:0/task:0/device:GPU:0

(one line in the log, broken here).
"""

from __future__ import annotations

import collections

# The training work of a round, as the placer logs it: by op type, and the gradient by its
# ops' name scope (`tf.GradientTape` names them `gradient_tape/...`). The model's forward pass
# is the interpreter's ops (`models/functional.py`), every model ending in a dense layer.
TRAINING_OPS = {
    "forward (dense layers)": "MatMul",
    "loss": "SparseSoftmaxCrossEntropyWithLogits",
    "gradient": "gradient_tape/",
    "minibatch gather": "GatherV2",
    "per-cluster sum": "TensorScatterAdd",
}
_SCOPES = tuple(key for key in TRAINING_OPS.values() if key.endswith("/"))


def placed_devices(log: str) -> dict[str, set[str]]:
    """Op type (and each training name scope) -> the devices (`device:GPU:0`) the placer put
    them on, from the lines of a placement log."""
    placed: dict[str, set[str]] = collections.defaultdict(set)
    for line in log.splitlines():
        if "placer.cc" not in line or "device:" not in line or "(" not in line:
            continue
        device = line.rsplit("/", 1)[-1].strip()
        placed[line.split("(")[-1].split(")")[0]].add(device)
        for scope in _SCOPES:
            if scope in line:
                placed[scope].add(device)
    return dict(placed)


def training_ops_elsewhere(placed: dict[str, set[str]], device: str) -> list[str]:
    """Each training op of `TRAINING_OPS` not placed on `device` (e.g. "/GPU:0") alone, with
    where it went instead, or that the log does not show it."""
    want = "device:" + device.strip("/").upper()
    problems = []
    for what, key in TRAINING_OPS.items():
        seen = placed.get(key, set())
        if seen != {want}:
            where = ", ".join(sorted(seen)) or "not in the placement log"
            problems.append(f"{what} ({key.rstrip('/')}): {where}")
    return problems
