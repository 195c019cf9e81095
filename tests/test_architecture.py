"""The code's shape, checked from its source (no TF): no import circle between the package's
modules, each layer importing only the layers its rule allows, the architecture page's layout
naming every module, no paper's name in the loop or the round's composition, a way of
distributing models decided only by its `Distribution` class, and a round step the loop calls
once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tff_clustered"
# The loop and the round's composition: generic, whatever the algorithm.
GENERIC = [
    "loop/orchestration.py",
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
# The package's layers, bottom up: each sub-package is one; the modules at the package's root
# are the foundation, which every layer may import and which imports no other layer.
LAYERS = (
    "foundation",
    "models",
    "clustering",
    "data",
    "runtime",
    "federated",
    "algorithms",
    "loop",
    "report",
    "runs",
    "comparison",
    "cli",
)
# Which layers each layer's modules may import besides its own and the foundation: the real
# graph. A new arrow is a decision: it must point down (`LAYERS`) and be added here.
MAY_IMPORT = {
    "foundation": set(),
    "models": set(),
    "clustering": set(),
    "data": set(),
    "runtime": set(),
    "federated": {"models", "runtime"},
    "algorithms": {"clustering", "federated"},
    "loop": {"algorithms", "data", "federated", "models", "runtime"},
    "report": {"algorithms"},
    "runs": {"algorithms", "data", "federated", "loop", "models", "report", "runtime"},
    "comparison": {"algorithms", "loop", "report", "runs"},
    "cli": {
        "algorithms",
        "clustering",
        "comparison",
        "data",
        "federated",
        "loop",
        "models",
        "report",
        "runs",
        "runtime",
    },
}
# Modules at the package's root that belong to a layer above the foundation, until they move
# into its package.
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# The layout's column where a module's concern starts (the lines of a wrapped concern too).
CONCERN_COLUMN = 31
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


def layer(module: str) -> str:
    """The layer of a module of the package (`tff_clustered.loop.state`: loop)."""
    parts = module.split(".")
    if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir():
        return parts[1]
    return "foundation"


def layout_section() -> list[str]:
    """The lines of the code block of docs/architecture.md's "Layout" section."""
    text = ARCHITECTURE.read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return text.split("```")[1].strip("\n").splitlines()


def layout_paths(lines: list[str]) -> list[str]:
    """The paths the layout names, from its indentation (two spaces a level): `loop/` under
    `tff_clustered/` is `tff_clustered/loop/`. Lines indented to the concern's column continue
    the concern above."""
    paths: list[str] = []
    parents: list[str] = []
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if indent >= CONCERN_COLUMN:
            continue
        depth, name = indent // 2, line.split()[0]
        parents[depth:] = [name]
        paths.append("".join(parents))
    return paths


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


def test_each_layer_imports_only_the_layers_its_rule_allows() -> None:
    found = modules()
    known = set(found)
    offenders = sorted(
        f"{name} ({layer(name)}) imports {target} ({layer(target)})"
        for name, path in found.items()
        for target in imported(path, name, known)
        if layer(target) not in {layer(name), "foundation", *MAY_IMPORT[layer(name)]}
    )
    assert not offenders, "imports across the layer rules (MAY_IMPORT): " + "; ".join(offenders)


def test_the_layer_rules_point_down_and_name_every_sub_package() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages | {"foundation"} == set(LAYERS) == set(MAY_IMPORT)
    upward = [
        f"{low} -> {high}"
        for low, allowed in MAY_IMPORT.items()
        for high in allowed
        if LAYERS.index(high) >= LAYERS.index(low)
    ]
    assert not upward, f"rules that point up or sideways: {upward}"


def test_the_architecture_page_names_every_module_of_the_package_and_no_other() -> None:
    named = [p for p in layout_paths(layout_section()) if p.startswith("tff_clustered/")]
    assert len(named) == len(set(named)), "named twice: " + ", ".join(
        sorted({p for p in named if named.count(p) > 1})
    )
    tree = {
        str(path.relative_to(ROOT)) + ("/" if path.is_dir() else "")
        for path in [PACKAGE, *PACKAGE.rglob("*")]
        if (path.is_dir() and (path / "__init__.py").exists())
        or (path.suffix == ".py" and path.name != "__init__.py")
    } | {"tff_clustered/__init__.py"}
    missing, extra = sorted(tree - set(named)), sorted(set(named) - tree)
    assert not missing, f"docs/architecture.md's Layout does not name {missing}"
    assert not extra, f"docs/architecture.md's Layout names what does not exist: {extra}"


def test_the_architecture_page_gives_each_module_its_concern() -> None:
    lines = layout_section()
    entries = [line for line in lines if len(line) - len(line.lstrip()) < CONCERN_COLUMN]
    bare = [line.strip() for line in entries if not re.match(r"^ *\S+ {2,}\S", line)]
    assert not bare, f"named without a concern: {bare}"


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
    tree = ast.parse((PACKAGE / "loop" / "orchestration.py").read_text())
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
    for step in ("sample_clients", "plan", "federated_round", "after_round", "training_row"):
        assert calls.count(step) == 1, f"train_round calls {step} {calls.count(step)} times"
