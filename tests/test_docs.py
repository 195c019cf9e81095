"""The documentation: the tables generated from the code (`binaries/docs_tables.py`) are the
committed ones, every relative link of README.md and docs/*.md leads somewhere inside the
repository, and the README stays a ten-minute read that links every page of docs/."""

from __future__ import annotations

import glob
import os
import re
from types import ModuleType

import pytest
from conftest import ROOT

REGENERATE = "run .venv/bin/python binaries/docs_tables.py"
README = os.path.join(ROOT, "README.md")
DOCS_PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
DOCUMENTS = [README, *DOCS_PAGES]
# The README is read in ten minutes; the rest is one link away, in docs/.
README_MAX_LINES = 250
# Its sections, in order (other pages link to some of them by anchor).
README_SECTIONS = ["Quickstart", "What the default run shows", "Results", "Where to go next"]
# The last column of a results table that names each row's command: a link to the committed
# table and the flagfile under configs/ (with any extra flags) that wrote it.
COMMAND_COLUMN = "table: `--flagfile=configs/...`"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


@pytest.fixture(scope="module")
def docs_tables() -> ModuleType:
    from tff_clustered.cli import docs_tables

    return docs_tables


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans removed."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces to hyphens;
    a repeated one gets -1, -2, ..."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_generated_tables_are_the_committed_ones(docs_tables: ModuleType) -> None:
    for path, text in docs_tables.generated().items():
        name = os.path.relpath(path, ROOT)
        assert os.path.exists(path), f"{name} is missing: {REGENERATE}"
        assert read(path) == text, f"{name} is out of date with the code: {REGENERATE}"


def test_every_algorithm_has_a_summary_a_paper_and_a_page(docs_tables: ModuleType) -> None:
    assert list(docs_tables.PAGES) == docs_tables.ordered(docs_tables.ALGORITHMS)
    for name, cls in docs_tables.ALGORITHMS.items():
        assert docs_tables.summary(cls), name
        assert cls.paper, f"{name} names no paper"
        page = docs_tables.PAGES[name].split("#")[0]
        assert os.path.isfile(os.path.join(ROOT, "docs", page)), f"{name}: no docs/{page}"


def test_algorithms_table_sits_between_the_markers(docs_tables: ModuleType) -> None:
    """The generated algorithm table lives in docs/algorithms.md, which the README links."""
    assert docs_tables.ALGORITHMS_PAGE == os.path.join(ROOT, "docs", "algorithms.md")
    page = read(docs_tables.ALGORITHMS_PAGE)
    start, end = page.index(docs_tables.START), page.index(docs_tables.END)
    names = [line.split("|")[1].strip().strip("`") for line in page[start:end].splitlines()[3:]]
    assert names == list(docs_tables.PAGES)
    readme = read(README)
    assert docs_tables.START not in readme, "the algorithm table moved to docs/"
    assert f"{len(docs_tables.PAGES)} algorithms in all" in " ".join(readme.split())


def test_readme_is_read_in_ten_minutes() -> None:
    lines = read(README).splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail one link "
        "away into docs/ (docs/results.md, docs/algorithms.md, ...)"
    )
    sections = [line[3:].strip() for line in prose_lines(read(README)) if line.startswith("## ")]
    assert sections == README_SECTIONS


def test_every_docs_page_is_linked_from_the_readme() -> None:
    targets = {
        os.path.normpath(os.path.join(ROOT, target.partition("#")[0]))
        for target in LINK.findall("\n".join(prose_lines(read(README))))
    }
    unlinked = [os.path.relpath(page, ROOT) for page in DOCS_PAGES if page not in targets]
    assert not unlinked, f"README.md links no {unlinked}: add them to 'Where to go next'"


@pytest.mark.parametrize("document", ["README.md", "docs/results.md"])
def test_every_result_row_names_its_table_and_command(document: str) -> None:
    """Each row of a results table with a command column links a committed table under
    results/ and names the flagfile of configs/ that wrote it."""
    rows = []
    command_column = None
    for line in read(os.path.join(ROOT, document)).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            command_column = None
        elif COMMAND_COLUMN in cells:
            command_column = cells.index(COMMAND_COLUMN)
        elif command_column is not None and not set(cells[0]) <= set("-:"):
            rows.append(cells[command_column])
    assert len(rows) >= 6, f"{document}: no results table with a {COMMAND_COLUMN!r} column"
    results = os.path.join(ROOT, "results")
    opened = False
    for cell in rows:
        if cell == "the same":  # the row above's table and command
            assert opened, f"{document}: 'the same' opens a table"
            continue
        links = LINK.findall(cell)
        flagfiles = re.findall(r"`([\w.-]+\.flags)\b", cell)
        assert links and flagfiles, f"{document}: no table or no flagfile in {cell}"
        table = os.path.normpath(os.path.join(ROOT, os.path.dirname(document), links[0]))
        assert os.path.commonpath([table, results]) == results, f"{document}: {links[0]}"
        assert os.path.isfile(table), f"{document}: no {links[0]}"
        assert "- command: `" in read(table), f"{links[0]} records no command"
        assert os.path.isfile(os.path.join(ROOT, "configs", flagfiles[0])), flagfiles[0]
        opened = True


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_lead_to_existing_files_and_headings(document: str) -> None:
    text = read(document)
    broken = []
    for target in LINK.findall("\n".join(prose_lines(text))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(document), path))
        if path and os.path.commonpath([resolved, ROOT]) != ROOT:
            broken.append(f"{target}: outside the repository")
        elif path and not os.path.exists(resolved):
            broken.append(f"{target}: no file {os.path.relpath(resolved, ROOT)}")
        elif anchor and (not path or resolved.endswith(".md")):
            if anchor not in heading_anchors(read(resolved) if path else text):
                broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{os.path.relpath(document, ROOT)}: " + "; ".join(broken)
