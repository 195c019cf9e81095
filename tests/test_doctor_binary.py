"""`binaries/doctor.py`: versions, a worker that starts and stops, GPU, data folders; each
problem with its fix and a non-zero exit."""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import uuid

from conftest import TESTDATA, run_binary, runs_in_one_process, worker_pids_with_tag

DOCTOR = os.path.join("binaries", "doctor.py")


def test_doctor_passes_here_and_reports_bad_folders_with_fixes(tmp_path: object) -> None:
    """Both runs in one process of the doctor's main (TensorFlow imported once)."""
    tag = uuid.uuid4().hex
    good, bad = runs_in_one_process(
        [
            [
                f"--data_dir={os.path.join(TESTDATA, 'svhn_tiny')}",
                f"--glove_path={os.path.join(TESTDATA, 'sent140_tiny', 'glove_tiny.300d.txt')}",
            ],
            [f"--data_dir={tmp_path}", f"--tfds_dir={tmp_path / 'nowhere'}"],
        ],
        "doctor",
        {"TFF_CLUSTERED_RUN_TAG": tag},
    )
    assert good.returncode == 0, good.stdout + good.stderr[-2000:]
    for expected in (
        "tensorflow: 2.14.1",
        "tensorflow-federated: 0.87.0",
        "worker start: ran",
        "worker stop: stopped",
        "TensorFlow GPUs",
        "can serve: svhn",
    ):
        assert expected in good.stdout, good.stdout
    assert not worker_pids_with_tag(tag)
    assert bad.returncode == 1
    assert "PROBLEM  --data_dir" in bad.stdout and "PROBLEM  --tfds_dir" in bad.stdout
    assert bad.stdout.count("fix: ") == 2 and "2 problem(s)" in bad.stdout


# The doctor's data checks of several sets of flags, in one process of its own (the doctor's
# flags and train.py's, which other tests import, cannot be defined in one process): a JSON list
# of [problems, output] per set.
DATA_CHECKS = """
import contextlib, io, json, os, sys
from unittest import mock
from absl.testing import flagsaver
from tff_clustered.cli import doctor
doctor.FLAGS.mark_as_parsed()
found = []
for given in json.loads(sys.argv[1]):
    report, out = doctor.Report(), io.StringIO()
    environ = given.pop("environ", {})
    flags = {"data_dir": None, "glove_path": None, "tfds_dir": None, **given}
    with flagsaver.flagsaver(**flags), contextlib.redirect_stdout(out):
        with mock.patch.dict(os.environ, environ):
            doctor.check_data(report)
    found.append([report.problems, out.getvalue()])
print(json.dumps(found))
"""


def test_doctor_checks_data_as_the_loaders_read_it(tmp_path: pathlib.Path) -> None:
    """A SQLite file of TFF's format is what train.py's tff_sql takes; one of other tables, a
    GloVe file that is not GloVe text, a TFDS folder holding no prepared dataset, a LEAF split
    holding a named pipe and a LEAF cache bound that is not a number are problems, each with
    its fix (issue 64 probe: the other tables and the bound passed)."""
    population, other = tmp_path / "pop.sqlite", tmp_path / "other.sqlite"
    with sqlite3.connect(population) as db:
        db.execute("CREATE TABLE client_metadata (client_id TEXT)")
        db.execute("CREATE TABLE examples (client_id TEXT)")
    sqlite3.connect(other).execute("CREATE TABLE t (a)")
    (tmp_path / "glove.6B.300d.txt").write_text("a\n")
    (tmp_path / "not_tfds").mkdir()
    for split in ("train", "test"):
        (tmp_path / "leaf" / split).mkdir(parents=True)
        (tmp_path / "leaf" / split / "a.json").write_text("{}")
    os.mkfifo(tmp_path / "leaf" / "train" / "pipe.json")
    cases = [
        {"data_dir": str(population)},
        {"glove_path": str(tmp_path / "glove.6B.300d.txt"), "tfds_dir": str(tmp_path / "not_tfds")},
        {"tfds_dir": os.path.join(TESTDATA, "tfds_tiny")},
        {"data_dir": str(tmp_path / "leaf")},
        {"data_dir": str(other), "environ": {"TFF_CLUSTERED_CACHE_MB": "\u00b2"}},
    ]
    done = run_binary(["-c", DATA_CHECKS, json.dumps(cases)], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (
        (sqlite, sqlite_out),
        (bad, bad_out),
        (tfds, tfds_out),
        (leaf, leaf_out),
        (
            other_sql,
            other_out,
        ),
    ) = json.loads(done.stdout.strip().splitlines()[-1])
    assert sqlite == 0 and "can serve: tff_sql" in sqlite_out, sqlite_out
    assert bad == 2 and "PROBLEM  --glove_path" in bad_out and "PROBLEM  --tfds_dir" in bad_out
    assert tfds == 0 and "can serve: cifar10 3.0.2" in tfds_out, tfds_out
    assert leaf == 1 and "pipe.json: is a named pipe" in leaf_out, leaf_out
    assert other_sql == 2, other_out
    assert "not a SQLite file of TFF's SqlClientData format (tables: ['t']" in other_out
    assert "PROBLEM  LEAF cache: TFF_CLUSTERED_CACHE_MB='\u00b2' is not a number" in other_out
