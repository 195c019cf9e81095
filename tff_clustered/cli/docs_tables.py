"""The documentation's tables written from the code, so that they cannot drift from it.

Writes the documentation tables that come from the code, so that they cannot drift from it:

* `docs/options.md`: every algorithm of the registry (`tff_clustered.algorithms.ALGORITHMS`)
  with the first line of its class docstring and its paper, then each algorithm's options
  (the fields of its `Options`, declared with `options.option(default, help)`): flag, default
  and help text; then every aggregator of `tff_clustered.federated.aggregators.AGGREGATORS`
  with its summary and its options, as the algorithms';
* the algorithms table of `docs/algorithms.md` (which the README links), between the lines
  `<!-- algorithms:start -->` and `<!-- algorithms:end -->`.

  .venv/bin/python binaries/docs_tables.py            # rewrite both (also: make docs)
  .venv/bin/python binaries/docs_tables.py --check    # exit 1 if either is out of date

`tests/test_docs.py` fails when the committed files differ from what this writes. A new
algorithm needs a line in `PAGES` (the docs page that describes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import sys
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from tff_clustered import options as options_lib
from tff_clustered import search_space
from tff_clustered.algorithms import ALGORITHMS
from tff_clustered.algorithms.base import Algorithm
from tff_clustered.cli import exits
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.federated.aggregators import AGGREGATORS
from tff_clustered.federated.cluster_aggregators import ClusterAggregator

ROOT = REPOSITORY
ALGORITHMS_PAGE = os.path.join(ROOT, "docs", "algorithms.md")
OPTIONS_PAGE = os.path.join(ROOT, "docs", "options.md")
START, END = "<!-- algorithms:start -->", "<!-- algorithms:end -->"
REGENERATE = ".venv/bin/python binaries/docs_tables.py"

# Each algorithm's page under docs/ (with an anchor where the page covers several), in the
# order of the tables: the five papers, then the baselines they compare with.
PAGES: dict[str, str] = {
    "fedgroup": "fedgroup.md",
    "fedgrouprox": "fedgroup.md",
    "fedgroup_madc": "fedgroup.md",
    "fedgrouprox_madc": "fedgroup.md",
    "fedgroup_rcc": "fedgroup.md#ablations-rcc-and-rac",
    "fedgroup_rac": "fedgroup.md#ablations-rcc-and-rac",
    "fesem": "fesem.md",
    "fedac": "fedac.md",
    "fedtsdp": "fedtsdp.md",
    "uapdfl": "uapdfl.md",
    "fedavg": "baselines.md#fedavg",
    "fedprox": "baselines.md#fedprox",
    "fedavgm": "baselines.md#fedavgm-and-fedadam-server-optimizers",
    "fedadam": "baselines.md#fedavgm-and-fedadam-server-optimizers",
    "fedper": "baselines.md#fedper",
    "fedrep": "baselines.md#fedrep",
    "lg_fedavg": "baselines.md#lg-fedavg",
    "local": "baselines.md#local",
    "ifca": "baselines.md#ifca",
    "cfl": "baselines.md#cfl",
    "ditto": "baselines.md#ditto",
    "flhc": "baselines.md#flhc",
    "cgpfl": "baselines.md#cgpfl",
    "local_dfl": "baselines.md#decentralized-baselines",
    "fedavg_dfl": "baselines.md#decentralized-baselines",
    "fedper_dfl": "baselines.md#decentralized-baselines",
    "dfedavgm": "baselines.md#decentralized-baselines",
    "criticalfl_dfl": "baselines.md#criticalfl-dfl",
    "dispfl": "baselines.md#dispfl",
}


def summary(cls: type[Algorithm]) -> str:
    """The first line of the class's own docstring (not inherited)."""
    doc = cls.__dict__.get("__doc__")
    if not doc or not doc.strip():
        raise ValueError(
            f"algorithm {cls.name} ({cls.__module__}.{cls.__qualname__}) has no docstring; "
            "its first line is the algorithm's summary in the docs"
        )
    return inspect.cleandoc(doc).splitlines()[0].strip()


def cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def source_file(cls: type[Algorithm]) -> str:
    """The class's module file, relative to the repository."""
    return cls.__module__.replace(".", "/") + ".py"


def ordered(algorithms: Mapping[str, type[Algorithm]]) -> list[str]:
    """The algorithms in `PAGES` order; every registered one must have a page, and only those."""
    missing = sorted(set(algorithms) - set(PAGES))
    extra = sorted(set(PAGES) - set(algorithms))
    if missing or extra:
        raise ValueError(
            f"binaries/docs_tables.py PAGES: add a docs page for {missing or 'none'}, "
            f"remove {extra or 'none'}"
        )
    return list(PAGES)


def algorithms_table(algorithms: Mapping[str, type[Algorithm]], docs_prefix: str) -> str:
    """One row per algorithm: name, summary, paper, link to its page (`docs_prefix` + page)."""
    lines = [
        "| `--algorithm` | what it is | paper | guide |",
        "|---|---|---|---|",
    ]
    for name in ordered(algorithms):
        cls = algorithms[name]
        page = PAGES[name]
        title = page.split("#")[0]
        lines.append(
            f"| `{name}` | {cell(summary(cls))} | {cell(cls.paper)} | "
            f"[{title}]({docs_prefix}{page}) |"
        )
    return "\n".join(lines) + "\n"


def format_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def option_rows(options_cls: type) -> list[str]:
    """Flag, default and help text of each field of an `Options` dataclass."""
    hints = typing.get_type_hints(options_cls)
    rows = []
    for field in dataclasses.fields(options_cls):
        help_text = field.metadata.get("help") or field.name
        choices: Sequence[str] = field.metadata.get("choices") or ()
        if choices:
            help_text += " One of: " + ", ".join(f"`{c}`" for c in choices) + "."
        type_name = options_lib.base_type(hints[field.name]).__name__
        flag = options_lib.flag_name(field)
        rows.append(
            f"| `--{flag}` | {type_name} | {format_default(field.default)} | {cell(help_text)} |"
        )
    return rows


def search_lines(options_cls: type) -> list[str]:
    """The line saying what `compare.py --tune` draws for an `Options` class's own knobs (its
    fields' `search` ranges), none when it declares none."""
    space = options_lib.search_space_of(options_cls)
    if not space:
        return []
    knobs = "; ".join(f"`--{name}` {knob.text()}" for name, knob in space.items())
    return [f"Tuned by `compare.py --tune` (beside `--learning_rate`): {knobs}.", ""]


def options_page(algorithms: Mapping[str, type[Algorithm]]) -> str:
    """The text of docs/options.md."""
    out = [
        "# Algorithm and aggregator options",
        "",
        f"<!-- Written by binaries/docs_tables.py from the code; do not edit. After changing an "
        f"algorithm's docstring or options, run `{REGENERATE}` (or `make docs`). -->",
        "",
        "Every algorithm's options are the fields of the `Options` dataclass in its own file "
        "(each declared with `option(default, help)`, `tff_clustered/options.py`), and each "
        "field is a flag of the same name of `binaries/train.py` and `binaries/compare.py`. "
        "`train.py` refuses a flag of another algorithm; `compare.py` gives each algorithm the "
        "options it has. The general flags (data, model, training, runtime) are in "
        "[flags.md](flags.md). This page is generated from the code; the guide of each "
        "algorithm says which values are its paper's and which are ours.",
        "",
        "A knob a tuned comparison searches declares its range beside its default "
        "(`option(..., search=...)`, `tff_clustered/search_space.py`); every algorithm's "
        f"learning rate is drawn {search_space.LEARNING_RATE.text()} "
        "([tuning.md](tuning.md)).",
        "",
        "## Algorithms",
        "",
        algorithms_table(algorithms, "").rstrip("\n"),
        "",
    ]
    for name in ordered(algorithms):
        cls = algorithms[name]
        title = PAGES[name].split("#")[0]
        out += [
            f"## `{name}`",
            "",
            f"{summary(cls)} Paper: {cls.paper}. Code: `{cls.__qualname__}` in "
            f"[`{source_file(cls)}`](../{source_file(cls)}); guide: "
            f"[{title}]({PAGES[name]}).",
            "",
        ]
        rows = option_rows(cls.Options)
        if rows:
            out += ["| flag | type | default | help |", "|---|---|---|---|", *rows, ""]
        else:
            out += ["No options of its own: only the general flags of [flags.md](flags.md).", ""]
        out += search_lines(cls.Options)
    out += aggregators_section(AGGREGATORS)
    return "\n".join(out)


def aggregators_section(aggregators: Mapping[str, type[ClusterAggregator]]) -> list[str]:
    """docs/options.md's aggregators: each one's name, summary, code and settings (the fields
    of its `Options`, each a flag), in the registry's order."""
    out = [
        "## Aggregators",
        "",
        "What each cluster does with its clients' updates (`--aggregator`, or `tff_clustered."
        "run`'s `aggregator` argument; [aggregation.md](aggregation.md), "
        "[privacy.md](privacy.md)). Each aggregator's settings are the fields of its `Options` "
        "(declared with `option(default, help, flag=...)`), each a flag of `binaries/train.py`"
        " and `binaries/compare.py`; a flag of another aggregator than the one chosen, changed "
        "from its default, is refused. Registry: `tff_clustered/federated/aggregators.py`.",
        "",
    ]
    for name, cls in aggregators.items():
        how = "`--aggregator`" if cls.named else "`tff_clustered.run`'s `aggregator` argument only"
        out += [
            f"### `{name}`",
            "",
            f"{cell(cls.summary[:1].upper() + cls.summary[1:])}. Code: `{cls.__qualname__}` in "
            f"[`{source_file(cls)}`](../{source_file(cls)}); chosen by {how}.",
            "",
        ]
        rows = option_rows(cls.options_type()) if cls.named else []
        if rows:
            out += ["| flag | type | default | help |", "|---|---|---|---|", *rows, ""]
        else:
            out += ["No settings of its own.", ""]
    return out


def page_with_table(page: str, table: str) -> str:
    """`page` (docs/algorithms.md) with the text between the two marker lines replaced by
    `table`."""
    if page.count(START) != 1 or page.count(END) != 1:
        raise ValueError(f"docs/algorithms.md must hold the lines {START} and {END} once each")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}{END}{tail}"


def generated() -> dict[str, str]:
    """Path -> the text it should have."""
    with open(ALGORITHMS_PAGE, encoding="utf-8") as f:
        page = f.read()
    return {
        OPTIONS_PAGE: options_page(ALGORITHMS),
        ALGORITHMS_PAGE: page_with_table(page, algorithms_table(ALGORITHMS, "")),
    }


def stale(files: Mapping[str, str]) -> list[str]:
    """The paths whose content differs from `files`."""
    out = []
    for path, text in files.items():
        current = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                current = f.read()
        if current != text:
            out.append(os.path.relpath(path, ROOT))
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="Write nothing; exit 1 if a file is out of date."
    )
    args = parser.parse_args(argv)
    files = generated()
    if args.check:
        out_of_date = stale(files)
        for path in out_of_date:
            print(f"{path} is out of date: run {REGENERATE}")
        return 1 if out_of_date else 0
    for path, text in files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path, ROOT)}")
    return 0


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    with exits.one_line_on_signals("docs_tables.py: ", ""):
        code = main(sys.argv[1:])
    sys.exit(code)
