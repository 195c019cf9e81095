"""TensorFlow's import-time log lines stay out of every binary's output (issue 49, item 19):
a newcomer reads "E tensorflow/... Unable to register cuDNN factory" as an error. Each binary
calls `logs.quiet_tensorflow` before TensorFlow is imported, in `tff_clustered.cli.launch`, the
one start of every binary (`--tf_logs` or a TF_CPP_MIN_LOG_LEVEL the user set shows them again;
tests/test_train_binary.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_binary

BINARIES = sorted(Path(ROOT, "binaries").glob("*.py"))
LAUNCH = Path(ROOT, "tff_clustered", "cli", "launch.py")
# The worker binary imports no TensorFlow (it starts TFF's C++ worker).
WITHOUT_TENSORFLOW = {"worker.py"}


def imports_before_quieting(path: Path) -> list[str]:
    """The modules of the package (and of TensorFlow) that `path` imports before its
    `logs.quiet_tensorflow(...)` call, or before it hands over to `launch` (which quiets first:
    `test_the_launch_quiets_tensorflow_before_it_imports_the_binary`); all of them, and a note,
    when it makes neither."""
    imported = []
    for node in ast.parse(path.read_text()).body:
        quiets = ("logs.quiet_tensorflow", "launch.")
        if isinstance(node, (ast.Expr, ast.If)) and any(q in ast.unparse(node) for q in quiets):
            return imported
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tff_clustered"):
            imported += [
                f"{node.module}.{alias.name}"
                if Path(ROOT, *node.module.split("."), f"{alias.name}.py").exists()
                else node.module
                for alias in node.names
            ]
        if isinstance(node, (ast.Import, ast.ImportFrom)) and "tensorflow" in ast.unparse(node):
            imported.append(ast.unparse(node))
    return [*imported, "(no logs.quiet_tensorflow call)"]


# The package's modules a binary may import before quieting: they import no TensorFlow
# (checked below).
LIGHT = {
    "tff_clustered.cli.launch",
    "tff_clustered.cli.exits",
    "tff_clustered.cli.logs",
    "tff_clustered.runtime.signals",
    "tff_clustered.loop.phases",
    "tff_clustered.run_folder",
    "tff_clustered.comparison.committed_tables",
    "tff_clustered.comparison.numerics",
}


def test_the_modules_imported_before_quieting_import_no_tensorflow() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        + "; ".join(f"import {module}" for module in sorted(LIGHT))
        + "; print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_launch_quiets_tensorflow_before_it_imports_the_binary() -> None:
    """`launch.imported` calls `logs.quiet_tensorflow` before it imports the binary's module
    (the module's imports load TensorFlow), unless the binary loads none (the worker)."""
    (imported,) = [
        node
        for node in ast.parse(LAUNCH.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name == "imported"
    ]
    lines: dict[str, list[int]] = {}
    for node in ast.walk(imported):
        if isinstance(node, ast.Call):
            lines.setdefault(ast.unparse(node.func), []).append(node.lineno)
    assert "logs.quiet_tensorflow" in lines and "importlib.import_module" in lines
    assert min(lines["logs.quiet_tensorflow"]) < min(lines["importlib.import_module"])


@pytest.mark.parametrize("path", BINARIES, ids=lambda p: p.name)
def test_every_binary_quiets_tensorflow_before_importing_it(path: Path) -> None:
    if path.name in WITHOUT_TENSORFLOW:
        assert "import tensorflow" not in path.read_text()
        assert "import tensorflow" not in Path(ROOT, "tff_clustered", "cli", path.name).read_text()
        return
    heavy = [m for m in imports_before_quieting(path) if m not in LIGHT]
    assert heavy == [], f"{path.name} imports {heavy} before logs.quiet_tensorflow"


def test_a_binary_prints_no_tensorflow_registration_errors() -> None:
    """client_store_cost.py imports TensorFlow before parsing its flags: its `--help` shows
    what a newcomer sees first, with TensorFlow's logging at a shell's defaults."""
    done = run_binary(["binaries/client_store_cost.py", "--help"], {"TF_CPP_MIN_LOG_LEVEL": None})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--clients" in done.stdout
    assert "Unable to register" not in done.stderr, done.stderr[-2000:]
    assert "tensorflow/" not in done.stderr, done.stderr[-2000:]
