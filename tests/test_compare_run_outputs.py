"""The bit-for-bit comparison of scripts/compare_run_outputs.py on tiny fake run folders (no
TFF, no training): identical runs are ok, one array byte or one metric differs, a timing column
does not count, a missing or failed case fails, and another machine is refused."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from conftest import load_script

from tff_clustered.runs.state_encoding import RELOCATED

RUN = {"round": 3, "weights": np.arange(6, dtype=np.float32).reshape(2, 3)}


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script(os.path.join("scripts", "compare_run_outputs.py"))


SETTINGS = {"algorithm": "fedavg", "seed": 0}


def encoded(settings: dict) -> dict:
    """Nested settings as a checkpoint's JSON holds them (`state_encoding.encode_tree`)."""
    return {"dict": [[k, encoded(v) if isinstance(v, dict) else v] for k, v in settings.items()]}


def write_checkpoint(
    path: Path, weights: np.ndarray, history_seconds: float = 0.5, settings: dict = SETTINGS
) -> None:
    """A checkpoint as tff_clustered/checkpoint.py writes one: arrays by entry name and the
    state as JSON in the `meta.json` entry, with a metrics row holding a timing."""
    meta = {
        "format": 3,
        "settings": encoded(settings),
        "state": {
            "dataclass": "tff_clustered.loop.state:RunState",
            "fields": {
                "round_num": 3,
                "cluster_models": {"ndarray": "a0"},
                "assignment": {"str_int_dict": ["a1", "a2"]},
                "history": {
                    "list": [
                        {"dict": [["round", 3], ["loss", 0.25], ["train_seconds", history_seconds]]}
                    ]
                },
            },
        },
        "data_source": {"root": "", "files": {}},
    }
    arrays = {
        "a0": weights,
        "a1": np.array(["c0", "c1"], dtype=str),
        "a2": np.array([0, 1], dtype=np.int64),
    }
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, **{"meta.json": np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    path.write_bytes(buffer.getvalue())


def write_run(
    folder: Path,
    weights: np.ndarray = RUN["weights"],
    loss: str = "0.25",
    seconds: str = "1.5",
    settings: dict = SETTINGS,
) -> None:
    folder.mkdir(parents=True)
    write_checkpoint(folder / "checkpoint.npz", weights, float(seconds), settings)
    (folder / "metrics.csv").write_text(
        f"round,accuracy,loss,train_seconds\n0,0.1,2.3,\n3,0.5,{loss},{seconds}\n"
    )


def write_manifest(script: ModuleType, folder: Path, cases: dict[str, str]) -> None:
    """A manifest of `cases` (name: error, '' when it ran) recorded on this machine."""
    manifest = {
        "machine": script.machine(),
        "cases": {
            name: {"args": ["--algorithm=fedavg"], "kill_after_round": None, "error": error}
            for name, error in cases.items()
        },
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))


def recorded(script: ModuleType, folder: Path, **runs: dict) -> Path:
    """`folder` holding one fake run per keyword (its `write_run` arguments) and a manifest."""
    for name, values in runs.items():
        write_run(folder / name, **values)
    write_manifest(script, folder, {name: "" for name in runs})
    return folder


def verdicts(script: ModuleType, baseline: Path, other: Path) -> dict[str, str]:
    return dict(script.compare_folders(str(baseline), str(other)))


def test_identical_runs_are_ok(script: ModuleType, tmp_path: Path) -> None:
    baseline = recorded(script, tmp_path / "a", fedavg={}, ifca={})
    other = recorded(script, tmp_path / "b", fedavg={}, ifca={})
    assert verdicts(script, baseline, other) == {"fedavg": "ok", "ifca": "ok"}
    assert script.diff(str(baseline), str(other), None) == 0


def test_one_array_byte_differs(script: ModuleType, tmp_path: Path) -> None:
    changed = RUN["weights"].copy()
    changed.reshape(-1).view(np.uint8)[13] ^= 1  # one bit of the fourth float
    baseline = recorded(script, tmp_path / "a", fedavg={}, ifca={})
    other = recorded(script, tmp_path / "b", fedavg={"weights": changed}, ifca={})
    found = verdicts(script, baseline, other)
    assert found["ifca"] == "ok"
    assert found["fedavg"].startswith("DIFFERS: checkpoint.npz: ")
    assert "cluster_models: array element 3" in found["fedavg"]
    assert script.diff(str(baseline), str(other), None) == 1


def test_another_dtype_differs_though_the_values_are_equal(
    script: ModuleType, tmp_path: Path
) -> None:
    baseline = recorded(script, tmp_path / "a", fedavg={})
    other = recorded(script, tmp_path / "b", fedavg={"weights": RUN["weights"].astype(np.float64)})
    assert "array float32[2, 3] != float64[2, 3]" in verdicts(script, baseline, other)["fedavg"]


def test_a_metric_differs(script: ModuleType, tmp_path: Path) -> None:
    baseline = recorded(script, tmp_path / "a", fedavg={})
    other = recorded(script, tmp_path / "b", fedavg={"loss": "0.250001"})
    assert verdicts(script, baseline, other)["fedavg"] == (
        "DIFFERS: metrics.csv: row 1 column loss: '0.25' != '0.250001'"
    )


def test_timing_columns_and_fields_do_not_count(script: ModuleType, tmp_path: Path) -> None:
    """A `_seconds` column of metrics.csv and the same field in the checkpoint's history are
    wall-clock times: they differ between any two runs."""
    baseline = recorded(script, tmp_path / "a", fedavg={"seconds": "1.5"})
    other = recorded(script, tmp_path / "b", fedavg={"seconds": "2.75"})
    assert verdicts(script, baseline, other) == {"fedavg": "ok"}


def test_a_missing_or_failed_case_fails(script: ModuleType, tmp_path: Path) -> None:
    baseline = recorded(script, tmp_path / "a", fedavg={}, ifca={}, fedgroup={})
    other = recorded(script, tmp_path / "b", fedavg={}, fedgroup={})
    write_manifest(script, other, {"fedavg": "", "fedgroup": "exit code 2: error: bad flag"})
    found = verdicts(script, baseline, other)
    assert found == {
        "fedavg": "ok",
        "ifca": "FAILED: missing from the rerun",
        "fedgroup": "FAILED: exit code 2: error: bad flag",
    }
    assert script.diff(str(baseline), str(other), None) == 1


def test_a_file_only_one_run_wrote_differs(script: ModuleType, tmp_path: Path) -> None:
    baseline = recorded(script, tmp_path / "a", fedavg={})
    other = recorded(script, tmp_path / "b", fedavg={})
    (other / "fedavg" / "clients.csv").write_text("round,client\n0,c0\n")
    assert verdicts(script, baseline, other)["fedavg"] == (
        "DIFFERS: clients.csv: in the rerun only"
    )


def test_a_baseline_of_another_machine_is_refused(script: ModuleType, tmp_path: Path) -> None:
    baseline = recorded(script, tmp_path / "a", fedavg={})
    manifest = json.loads((baseline / "manifest.json").read_text())
    manifest["machine"]["cpu"] = "Another CPU"
    (baseline / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="another CPU or TensorFlow build.*cpu: baseline"):
        script.diff(str(baseline), str(baseline), None)


def test_the_matrix_covers_each_execution_aggregator_and_two_workers(script: ModuleType) -> None:
    cases = {case.name: case for case in script.matrix(["fedavg", "ifca", "fedgroup", "fedadam"])}
    for execution in ("tff", "in_process"):
        assert f"fedgroup-{execution}" in cases
        for aggregator in ("dp", "robust", "compression", "secure"):
            assert f"fedadam-{execution}-{aggregator}" in cases
    assert cases["ifca-tff-2workers-secure"].workers == 2
    assert cases["fedavg-tff"].workers == 1
    assert cases["fedavg-tff-resumed"].kill_after_round == 1
    filled = script.command(cases["fedavg-tff-2workers"].args, "/out", "h:1,h:2")
    assert "--output_dir=/out" in filled and "--workers=h:1,h:2" in filled


def test_a_state_class_moved_to_another_module_is_noted_not_a_difference(
    script: ModuleType, tmp_path: Path
) -> None:
    """A move listed in `state_encoding.RELOCATED` (which still decodes the old name) changes
    the name the checkpoint records; its values are compared as ever. The same class name in
    another module, not listed, is a difference."""
    (old_name, new_name), *_ = RELOCATED.items()
    baseline = recorded(script, tmp_path / "a", fedavg={}, ifca={})
    other = recorded(script, tmp_path / "b", fedavg={}, ifca={})
    unlisted = "tff_clustered.run.state:" + old_name.partition(":")[2]
    for folder, case, name in (
        (baseline, "fedavg", old_name),
        (other, "fedavg", new_name),
        (baseline, "ifca", old_name),
        (other, "ifca", unlisted),
    ):
        path = folder / case / "checkpoint.npz"
        meta, arrays = script.read_checkpoint(str(path))
        meta["state"]["dataclass"] = name
        buffer = io.BytesIO()
        np.savez(
            buffer, **arrays, **{"meta.json": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
        )
        path.write_bytes(buffer.getvalue())
    found = verdicts(script, baseline, other)
    assert found["fedavg"] == f"ok (class moved: {old_name} -> {new_name})"
    assert found["ifca"].startswith("DIFFERS: checkpoint.npz: checkpoint.state.dataclass: ")


def test_settings_added_since_the_baseline_at_the_value_its_run_had_are_noted_not_differences(
    script: ModuleType, tmp_path: Path
) -> None:
    """A setting the rerun's code records and the baseline's predates (`checkpoint.
    ADDED_SETTINGS`, the model's layers) is not a difference at the value the baseline's run
    had, as a resume accepts it, whichever of the two is older; at another value, or a setting
    no table lists, it is. The settings' order does not count."""
    added = {
        **SETTINGS,
        "training": {"eval_clients": 0, "client_sampling": "fixed"},
        "model_architecture": {"layer 1 Dense": {"units": 4}},
    }
    reordered = dict(reversed(list(added.items())))
    baseline = recorded(script, tmp_path / "a", old={}, new={"settings": added}, other={})
    other = recorded(
        script,
        tmp_path / "b",
        old={"settings": reordered},
        new={},
        other={"settings": {**SETTINGS, "training": {"eval_clients": 5}}},
    )
    found = verdicts(script, baseline, other)
    assert found["old"] == (
        "ok (settings the baseline predates: model_architecture, training.client_sampling, "
        "training.eval_clients)"
    )
    assert found["new"] == (
        "ok (settings the rerun predates: model_architecture, training.client_sampling, "
        "training.eval_clients)"
    )
    assert found["other"] == (
        "DIFFERS: checkpoint.npz: checkpoint.settings.training.eval_clients: in the rerun only"
    )
    same = recorded(script, tmp_path / "c", old={"settings": added}, new={"settings": added})
    again = recorded(script, tmp_path / "d", old={"settings": reordered}, new={"settings": added})
    assert verdicts(script, same, again) == {"old": "ok", "new": "ok"}
    changed = recorded(
        script, tmp_path / "e", old={"settings": {**SETTINGS, "seed": 1}}, new={"settings": added}
    )
    assert verdicts(script, same, changed)["old"] == (
        "DIFFERS: checkpoint.npz: checkpoint.settings.seed: 0 != 1"
    )


def test_a_long_dict_compares_by_its_keys_and_values_across_the_ways_a_checkpoint_keeps_it(
    script: ModuleType,
) -> None:
    """A population's assignment kept as an array of strings (older checkpoints) and as text
    with lengths (`state_encoding.encode_tree` now) is the same dict when its keys and values
    are; one key or one value changed is a difference."""
    from tff_clustered.runs.state_encoding import encode_tree

    clients = {f"c{i}": i % 3 for i in range(2000)}
    new: dict[str, np.ndarray] = {}
    tree = encode_tree(clients, new)
    old = {"k": np.array(list(clients), dtype=str), "v": np.fromiter(clients.values(), np.int64)}
    older = {"str_int_dict": ["k", "v"]}
    assert script.TreeComparison(old, new).first_difference(older, tree, "a") is None
    renamed = dict(old, k=np.array([*list(clients)[:-1], "other"], dtype=str))
    found = script.TreeComparison(renamed, new).first_difference(older, tree, "a")
    assert found is not None and found.startswith("a.keys")
    moved = dict(old, v=old["v"] + (np.arange(2000) == 7))
    found = script.TreeComparison(moved, new).first_difference(older, tree, "a")
    assert found is not None and found.startswith("a.values")
