"""`binaries/doctor.py`: versions, a worker that starts and stops, GPU, data folders; each
problem with its fix and a non-zero exit."""

from __future__ import annotations

import os
import uuid

from conftest import TESTDATA, run_binary, worker_pids_with_tag

DOCTOR = os.path.join("binaries", "doctor.py")


def test_doctor_passes_here_and_reports_bad_folders_with_fixes(tmp_path: object) -> None:
    tag = uuid.uuid4().hex
    good = run_binary(
        [
            DOCTOR,
            f"--data_dir={os.path.join(TESTDATA, 'svhn_tiny')}",
            f"--glove_path={os.path.join(TESTDATA, 'sent140_tiny', 'glove_tiny.300d.txt')}",
        ],
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
    bad = run_binary(
        [DOCTOR, f"--data_dir={tmp_path}", f"--tfds_dir={tmp_path / 'nowhere'}"],
        {"TFF_CLUSTERED_RUN_TAG": tag},
    )
    assert bad.returncode == 1
    assert "PROBLEM  --data_dir" in bad.stdout and "PROBLEM  --tfds_dir" in bad.stdout
    assert bad.stdout.count("fix: ") == 2 and "2 problem(s)" in bad.stdout
