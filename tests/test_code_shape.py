"""The code's shape, read from its source with `ast` (no TF): function size, concern, nesting.

Three rules say what a line count of files did not:

- a function or method is at most `MAX_FUNCTION_LINES` lines (its `def` to its last line,
  docstring included), or the line above its `def` (above its decorators, if any) is a comment
  `# Long: <reason>` saying why the long form is the clearest (a table, a paper's algorithm
  written step by step);
- a module's docstring states its concern in its first line: one sentence, ending the line,
  then a blank line or the docstring's end;
- a function defines at most `MAX_NESTED_DEFS` functions inside it (at any depth). Four is the
  largest set of closures one TFF computation takes: `tff.federated_aggregate`'s zero,
  accumulate, merge and report. A function holding more is building a round (or a pipeline) of
  nested blocks, where named module-level parts that compose belong.

Code other parts of the redesign are rewriting still breaks the rules; each such place is
listed below by name. The lists only shrink: a listed place that keeps its rule now (or no
longer exists) fails the test as surely as a new offender does, so each list says exactly
what is left to do.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("tff_clustered", "binaries", "scripts")
MAX_FUNCTION_LINES = 60
MAX_NESTED_DEFS = 4
LONG_REASON = re.compile(r"^\s*# Long: (\S+\s+){3,}\S")  # a reason of four words or more
# A sentence's end inside a line: ". A", "? The" (an abbreviation before a digit or a
# lower-case word, "Alg. 3", "et al. (", is not one).
SENTENCE_BREAK = re.compile(r"[.?!]\s+[A-Z]")

# Functions over MAX_FUNCTION_LINES lines without a `# Long:` reason still being rewritten: none
# left; a new entry needs a reason to be here rather than a `# Long:` comment.
LONG_FUNCTIONS_BEING_REWRITTEN: set[str] = set()
# Functions defining more than MAX_NESTED_DEFS functions: two benchmarks build the TFF
# computations they time as closures over the benchmark's sizes (no test runs them); the round
# itself is composed once (federated/round.py). Only shrinks.
NESTED_BLOCKS_BEING_REWRITTEN = {
    "tff_clustered/cli/benchmarks/round_floors.py:floor_round_fns",
    "tff_clustered/cli/benchmarks/tff_client_costs.py:model_paths",
}
# Modules whose docstring does not state their concern in a one-sentence first line: none left.
MODULES_WITHOUT_A_ONE_LINE_CONCERN: set[str] = set()


def sources() -> Iterator[Path]:
    for folder in CHECKED:
        yield from sorted((ROOT / folder).rglob("*.py"))


@functools.cache
def parsed(path: Path) -> tuple[list[str], ast.Module]:
    """The file's lines and syntax tree, read once for the three rules."""
    text = path.read_text()
    return text.splitlines(), ast.parse(text)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef]]:
    """Every function and method of `tree` with its qualified name (`Class.method`,
    `outer.inner`), nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def length(node: ast.FunctionDef) -> int:
    return node.end_lineno - node.lineno + 1


def has_long_reason(node: ast.FunctionDef, lines: list[str]) -> bool:
    """Whether the comment above the function's first line (its first decorator's, if any)
    is a `# Long: <reason>` (the reason may go on over the comment's next lines)."""
    above = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 2
    while (
        above >= 1 and lines[above].lstrip().startswith("#") and not LONG_REASON.match(lines[above])
    ):
        above -= 1
    return above >= 0 and bool(LONG_REASON.match(lines[above]))


def nested_defs(node: ast.FunctionDef) -> int:
    return sum(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not node
        for n in ast.walk(node)
    )


def long_functions() -> set[str]:
    found = set()
    for path in sources():
        lines, tree = parsed(path)
        for name, node in functions(tree):
            if length(node) > MAX_FUNCTION_LINES and not has_long_reason(node, lines):
                found.add(f"{relative(path)}:{name}")
    return found


def outermost_functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef]]:
    """The functions and methods of `tree` not inside another function."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
        elif isinstance(node, ast.ClassDef):
            yield from outermost_functions(node, f"{prefix}{node.name}.")
        else:
            yield from outermost_functions(node, prefix)


def nested_blocks() -> set[str]:
    found = set()
    for path in sources():
        for name, node in outermost_functions(parsed(path)[1]):
            if nested_defs(node) > MAX_NESTED_DEFS:
                found.add(f"{relative(path)}:{name}")
    return found


def concern_problem(tree: ast.Module) -> str:
    """What is wrong with the module's statement of its concern ("" when nothing is)."""
    docstring = ast.get_docstring(tree, clean=False)
    if not docstring:
        return "no docstring"
    first, _, rest = docstring.partition("\n")
    first = first.strip()
    if not first:
        return "the docstring's first line is empty"
    if not first.endswith((".", "?", "!")):
        return "the first line is not a whole sentence (it runs on)"
    if SENTENCE_BREAK.search(first):
        return "the first line holds more than one sentence"
    if rest.strip() and rest.split("\n")[0].strip():
        return "the first line is not followed by a blank line"
    return ""


def modules_without_a_concern() -> dict[str, str]:
    return {
        relative(path): problem
        for path in sources()
        if (problem := concern_problem(parsed(path)[1]))
    }


def check_listed(found: set[str], listed: set[str], rule: str) -> None:
    new = sorted(found - listed)
    assert not new, f"{rule}: {new}"
    done = sorted(listed - found)
    assert not done, f"these keep the rule now (or are gone): take them off the list: {done}"


def test_no_function_is_over_60_lines_without_a_reason() -> None:
    check_listed(
        long_functions(),
        LONG_FUNCTIONS_BEING_REWRITTEN,
        f"over {MAX_FUNCTION_LINES} lines: cut at a real sub-step, or say '# Long: <why>' "
        "on the line above the def",
    )


def test_no_function_builds_a_block_of_nested_functions() -> None:
    check_listed(
        nested_blocks(),
        NESTED_BLOCKS_BEING_REWRITTEN,
        f"more than {MAX_NESTED_DEFS} nested functions: make them module-level parts",
    )


def test_every_module_states_its_concern_in_its_first_line() -> None:
    found = modules_without_a_concern()
    new = {path: found[path] for path in sorted(set(found) - MODULES_WITHOUT_A_ONE_LINE_CONCERN)}
    assert not new, f"state the module's concern in one sentence on its first line: {new}"
    done = sorted(MODULES_WITHOUT_A_ONE_LINE_CONCERN - set(found))
    assert not done, f"these state their concern now (or are gone): take them off: {done}"


def test_the_rules_find_what_they_are_for() -> None:
    """Each rule, on a small made-up module: it catches its case, and lets its exception by."""
    source = "\n".join(
        [
            '"""A module. Two sentences."""',
            "def short():",
            "    pass",
            "# Long: a table of the paper's cases,",
            "# one line each",
            "def tabled():",
            *["    pass"] * 61,
            "def long():",
            *["    pass"] * 61,
            "def nests():",
            *[f"    def f{i}():\n        pass" for i in range(5)],
        ]
    )
    tree = ast.parse(source)
    lines = source.splitlines()
    named = dict(functions(tree))
    assert [length(named[n]) > MAX_FUNCTION_LINES for n in ("short", "tabled", "long")] == [
        False,
        True,
        True,
    ]
    assert [has_long_reason(named[n], lines) for n in ("tabled", "long")] == [True, False]
    assert nested_defs(named["nests"]) == 5
    assert [name for name, _ in outermost_functions(tree)] == ["short", "tabled", "long", "nests"]
    assert concern_problem(tree) == "the first line holds more than one sentence"
    cited = '"""CNT (Alg. 3 of Zhang et al., arXiv:2403.16460).\n\nMore."""'
    assert concern_problem(ast.parse(cited)) == ""
    assert concern_problem(ast.parse('"""Runs on\nto the next line."""')).endswith("(it runs on)")
    assert concern_problem(ast.parse('"""One line.\nThen more."""')).endswith("by a blank line")
    assert concern_problem(ast.parse("x = 1")) == "no docstring"
