"""A binary ends as soon as its work has (`exits.end_now`, called by `launch`): the exit code
and every effect of a normal exit kept, the interpreter's slow teardown skipped."""

from __future__ import annotations

import os

import pytest
from conftest import run_binary

# A work that leaves what a normal exit finishes: an atexit function, a thread still writing, an
# executor never shut down, a temporary folder removed by its finalizer, buffered output.
ENDING = """
import atexit, concurrent.futures, os, shutil, sys, tempfile, threading, time, weakref
from tff_clustered.cli import exits

out, code = sys.argv[1], sys.argv[2]
atexit.register(lambda: open(os.path.join(out, "atexit"), "w").close())
def late():
    time.sleep(0.3)
    open(os.path.join(out, "thread"), "w").close()
threading.Thread(target=late).start()
pool = concurrent.futures.ThreadPoolExecutor(1)
pool.submit(time.sleep, 0.1)
class Holder:
    pass
holder = Holder()
folder = tempfile.mkdtemp(dir=out, prefix="scratch-")
weakref.finalize(holder, shutil.rmtree, folder, True)
print("the last line")
try:
    raise SystemExit(int(code) if code.isdigit() else code)
except SystemExit as e:
    exits.end_now(e.code)
"""


@pytest.mark.parametrize("code, expected", [("0", 0), ("3", 3), ("a message", 1)])
def test_a_binary_ends_with_its_code_and_what_a_normal_exit_finishes(
    tmp_path: object, code: str, expected: int
) -> None:
    done = run_binary(["-c", ENDING, str(tmp_path), code])
    assert done.returncode == expected, done.stderr[-2000:]
    assert done.stdout == "the last line\n"
    assert ("a message" in done.stderr) == (code == "a message")
    assert sorted(os.listdir(tmp_path)) == ["atexit", "thread"]  # the folder removed
