"""The code's shape, checked from its source (no TF): no import
circle between the package's modules, no paper's name in the loop or the round's composition,
a way of distributing models decided only by its `Distribution` class, and a round step the
loop calls once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tff_clustered"
# The loop and the round's composition: generic, whatever the algorithm.
GENERIC = [
    "orchestration.py",
    "loop/config.py",
    "loop/evaluation.py",
    "loop/queries.py",
    "loop/round_calls.py",
    "loop/round_step.py",
    "loop/scoring_calls.py",
    "loop/training_call.py",
    "loop/state.py",
    "federated/round.py",
    "federated/round_functions.py",
    "federated/server_state.py",
    "federated/tff_execution.py",
    "federated/round_inputs.py",
    "federated/executions.py",
    "federated/in_process.py",
]
# Every registered algorithm's name and its paper's short name.
PAPER_NAMES = (
    "fedgroup fedgrouprox fesem fedac fedtsdp uapdfl ifca cfl ditto fedper fedrep fedprox "
    "dispfl criticalfl cgpfl flhc lg fedadam fedavgm"
).split()


def modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def imported(path: Path, name: str, known: set[str]) -> set[str]:
    """The package's modules `path` imports (anywhere in it, lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known}
    found.discard(name)
    return found


def docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(
            node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        ) and ast.get_docstring(node, clean=False):
            ids.add(id(node.body[0].value))
    return ids


def test_the_package_has_no_import_circle() -> None:
    found = modules()
    known = set(found)
    graph = {name: imported(path, name, known) for name, path in found.items()}
    # A package's __init__ re-exporting its modules is not a circle through its modules.
    graph = {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in graph.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("relative", GENERIC)
def test_the_loop_and_the_round_name_no_paper_in_their_code(relative: str) -> None:
    """Docstrings may cite a paper as an example; names and strings of the code may not."""
    tree = ast.parse((PACKAGE / relative).read_text())
    docstrings = docstring_nodes(tree)
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            words.append(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                words.append(node.value)
    named = sorted({p for w in words for p in PAPER_NAMES if p in w.lower().split("_")})
    assert not named, f"{relative} names {named}"


def test_no_code_tests_a_distribution_by_name() -> None:
    """How a round sends models is decided by its `Distribution` class, not a string compared
    anywhere."""
    names = ("own_cluster", "lowest_loss_cluster", "neighbours")
    offenders = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "binaries").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                strings = [
                    c.value
                    for c in [node.left, *node.comparators]
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ]
                if any(s in names for s in strings):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_train_round_reads_as_one_step_in_under_40_lines() -> None:
    tree = ast.parse((PACKAGE / "orchestration.py").read_text())
    (train_round,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "train_round"
    ]
    lines = train_round.end_lineno - train_round.lineno + 1
    assert lines < 40, f"train_round has {lines} lines"
    calls = [
        n.func.attr
        for n in ast.walk(train_round)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    ]
    for step in ("sample_clients", "plan", "run", "after_round", "training_row"):
        assert calls.count(step) == 1, f"train_round calls {step} {calls.count(step)} times"
