"""TensorFlow's import-time log lines stay out of every binary's output (issue 49, item 19):
a newcomer reads "E tensorflow/... Unable to register cuDNN factory" as an error. Each binary
calls `logs.quiet_tensorflow` before TensorFlow is imported (`--tf_logs` or a
TF_CPP_MIN_LOG_LEVEL the user set shows them again; tests/test_train_binary.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_binary

BINARIES = sorted(Path(ROOT, "binaries").glob("*.py"))
# The worker binary imports no TensorFlow (it starts TFF's C++ worker).
WITHOUT_TENSORFLOW = {"worker.py"}


def imports_before_quieting(path: Path) -> list[str]:
    """The modules of the package (and of TensorFlow) that `path` imports before its
    `logs.quiet_tensorflow(...)` call (all of them, and a note, when it makes none)."""
    imported = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Expr) and "logs.quiet_tensorflow" in ast.unparse(node):
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


@pytest.mark.parametrize("path", BINARIES, ids=lambda p: p.name)
def test_every_binary_quiets_tensorflow_before_importing_it(path: Path) -> None:
    if path.name in WITHOUT_TENSORFLOW:
        assert "import tensorflow" not in path.read_text()
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
