"""scripts/python_for_venv.sh: which Python 3.9-3.11 the setup builds .venv from.

Each test runs the script with a PATH of its own making: the few tools it needs, shims for the
interpreters the test wants on it, and a stand-in `uv` that records its calls. The stand-in
prints a real interpreter (this test's own Python 3.11) when asked to find 3.11 after an
install, and fails the install when told it is offline, as uv does without a network.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "python_for_venv.sh"
TOOLS = ("bash", "dirname", "mkdir", "touch")

# A Python that reports the version it is given: the code of `-c` runs with sys.version_info
# replaced, which is all the script asks of an interpreter.
VERSION_SHIM = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then
  exec {python} -c 'import sys; code = sys.argv[1]; sys.argv = ["-c"]; \
sys.version_info = ({major}, {minor}, 1, "final", 0); exec(code)' "$2"
fi
exec {python} "$@"
"""

FAKE_UV = """#!/usr/bin/env bash
echo "$*" >> "{calls}"
case "$1 $2" in
  "python find") [ -f "{state}/installed" ] && {{ echo "{python}"; exit 0; }}; exit 1 ;;
  "python install")
    if [ -n "${{FAKE_UV_OFFLINE:-}}" ]; then echo "error: failed to lookup address" >&2; exit 1; fi
    touch "{state}/installed"; exit 0 ;;
esac
exit 1
"""


def _executable(path: pathlib.Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture()
def sandbox(tmp_path: pathlib.Path) -> pathlib.Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is needed by the bootstrap script"
        (bin_dir / tool).symlink_to(found)
    (tmp_path / "state").mkdir()
    return tmp_path


def _shim(sandbox: pathlib.Path, name: str, minor: int) -> pathlib.Path:
    path = sandbox / "bin" / name
    _executable(path, VERSION_SHIM.format(python=sys.executable, major=3, minor=minor))
    return path


def _fake_uv(sandbox: pathlib.Path) -> None:
    _executable(
        sandbox / "bin" / "uv",
        FAKE_UV.format(calls=sandbox / "uv_calls", state=sandbox / "state", python=sys.executable),
    )


def _run(sandbox: pathlib.Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": str(sandbox / "bin"),
        "HOME": str(sandbox),
        "BOOTSTRAP_DIR": str(sandbox / "bootstrap"),
        **extra,
    }
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        executable=shutil.which("bash"),
    )


def _uv_calls(sandbox: pathlib.Path) -> list[str]:
    calls = sandbox / "uv_calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_only_python_3_12_on_path_takes_the_uv_route(sandbox: pathlib.Path) -> None:
    _shim(sandbox, "python3", 12)
    _fake_uv(sandbox)
    result = _run(sandbox)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == sys.executable
    assert _uv_calls(sandbox) == [
        "python find --system --no-project 3.11",
        "python install 3.11",
        "python find --system --no-project 3.11",
    ]
    said = [line for line in result.stderr.splitlines() if line.startswith("[bootstrap]")]
    assert len(said) == 1 and "python3 is 3.12.1" in said[0] and "MB" in said[0]
    assert str(sandbox / "bootstrap" / "python") in said[0]


def test_a_python_uv_already_has_is_reused_without_a_download(sandbox: pathlib.Path) -> None:
    _shim(sandbox, "python3", 13)
    _fake_uv(sandbox)
    (sandbox / "state" / "installed").touch()
    result = _run(sandbox)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == sys.executable
    assert _uv_calls(sandbox) == ["python find --system --no-project 3.11"]
    assert "using the Python 3.11 that uv already has" in result.stderr
    assert "downloading" not in result.stderr


def test_uv_that_cannot_fetch_an_interpreter_is_a_one_line_error(sandbox: pathlib.Path) -> None:
    _shim(sandbox, "python3", 12)
    _fake_uv(sandbox)
    result = _run(sandbox, FAKE_UV_OFFLINE="1")
    assert result.returncode == 2
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if not line.startswith("[bootstrap]")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("error: ")
    assert "uv python install 3.11" in errors[0] and "PYTHON=" in errors[0]
    assert "failed to lookup address" in (sandbox / "bootstrap" / "uv.log").read_text()


def test_no_python_and_no_uv_is_a_one_line_error(sandbox: pathlib.Path) -> None:
    result = _run(sandbox)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("[bootstrap]")]
    assert len(errors) == 1 and "no Python 3.8+ with pip to install uv" in errors[0]


def test_a_python_3_11_on_path_is_used_as_before_and_uv_is_not_asked(
    sandbox: pathlib.Path,
) -> None:
    _shim(sandbox, "python3", 12)
    shim = _shim(sandbox, "python3.11", 11)
    _fake_uv(sandbox)
    result = _run(sandbox)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(shim)
    assert _uv_calls(sandbox) == []
    assert result.stderr == ""


def test_python_set_by_the_user_is_the_only_one_considered(sandbox: pathlib.Path) -> None:
    newer = _shim(sandbox, "python3.12", 12)
    _shim(sandbox, "python3.11", 11)
    _fake_uv(sandbox)
    result = _run(sandbox, PYTHON=str(newer))
    assert result.returncode == 2
    assert f"PYTHON={newer} is Python 3.12.1" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert _uv_calls(sandbox) == []
    older = sandbox / "bin" / "python3.11"
    result = _run(sandbox, PYTHON=str(older))
    assert result.returncode == 0 and result.stdout.strip() == str(older)


def test_a_program_that_is_no_python_is_refused_or_passed_over(sandbox: pathlib.Path) -> None:
    """A program that exits 0 whatever it is asked (no Python) is refused in one line when it
    is $PYTHON, and passed over on PATH, where a real Python 3.10 behind it is taken."""
    silent = sandbox / "bin" / "python3.11"
    _executable(silent, "#!/usr/bin/env bash\nexit 0\n")
    result = _run(sandbox, PYTHON=str(silent))
    assert result.returncode == 2
    assert f"PYTHON={silent} is not a Python interpreter" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    shim = _shim(sandbox, "python3.10", 10)
    result = _run(sandbox)
    assert result.returncode == 0 and result.stdout.strip() == str(shim), result.stderr


def test_the_bootstrap_builds_the_venv_from_the_interpreter_the_script_chose() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert "PY=$(bash scripts/python_for_venv.sh) || exit $?" in bootstrap
    assert '"$PY" -m venv "$VENV"' in bootstrap
    assert os.access(SCRIPT, os.R_OK)


# A program that answers the interpreter checks as a Python 3.11 with venv would, and does
# nothing else: its `-m venv` makes no environment.
ANSWERS_ONLY = """#!/bin/sh
case "$*" in *venv*ensurepip*) echo venv;; *version_info*) echo "python 3.11.4";; esac
exit 0
"""


def test_a_venv_step_that_makes_no_environment_is_one_line_and_exit_2(
    tmp_path: pathlib.Path,
) -> None:
    """scripts/bootstrap.sh in a copy of the scripts: an interpreter whose `-m venv` makes no
    .venv/bin/python, a .venv that is a file, and the script run by sh are each one line naming
    the fix, exit 2 (issue 64 probe: exit 127 with bash's "No such file", exit 1 with venv's
    own two lines)."""
    (tmp_path / "scripts").mkdir()
    for name in ("bootstrap.sh", "python_for_venv.sh"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    fake = tmp_path / "python3.11"
    _executable(fake, ANSWERS_ONLY)
    script = str(tmp_path / "scripts" / "bootstrap.sh")
    environ = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}

    def bootstrap(shell: str, python: pathlib.Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [shell, script], env={**environ, "PYTHON": str(python)}, capture_output=True, text=True
        )

    done = bootstrap("bash", fake)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: {fake} -m venv .venv made no .venv/bin/python; set PYTHON to a Python 3.9-3.11 "
        "with its venv module (on Ubuntu: apt-get install python3.11-venv), delete .venv and "
        "run again"
    ]
    (tmp_path / ".venv").write_text("")
    done = bootstrap("bash", pathlib.Path(sys.executable))
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"error: {tmp_path}/.venv exists and is not a folder; remove it (rm .venv) and run again"
    ], done.stderr
    done = bootstrap("sh", fake)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "error: scripts/bootstrap.sh is a bash script; run it as: bash scripts/bootstrap.sh"
    ], done.stderr


DOCKER_INSTRUCTIONS = {
    "FROM",
    "RUN",
    "CMD",
    "WORKDIR",
    "COPY",
    "ADD",
    "ENV",
    "ARG",
    "LABEL",
    "EXPOSE",
    "ENTRYPOINT",
    "USER",
    "VOLUME",
    "SHELL",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "ONBUILD",
}


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) per logical line, continuations joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        pending += " " + stripped.rstrip("\\").strip()
        if stripped.endswith("\\"):
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        instructions.append((keyword, arguments.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def test_the_dockerfile_parses_and_runs_the_readmes_setup_and_commands() -> None:
    instructions = _dockerfile_instructions()
    assert all(keyword in DOCKER_INSTRUCTIONS for keyword, _ in instructions), instructions
    assert instructions[0] == ("FROM", "python:3.11-slim-bookworm")
    runs = [arguments for keyword, arguments in instructions if keyword == "RUN"]
    makefile = (ROOT / "Makefile").read_text()
    assert "VENV := .venv" in makefile and "STAMP := $(VENV)/.installed" in makefile
    assert "make .venv/.installed" in runs  # the Makefile's setup target, as `make test` runs it
    assert ("CMD", '["make", "run"]') in instructions
    readme = (ROOT / "README.md").read_text()
    for command in ("make run", "make test"):
        assert f"```sh\n{command}\n```" in readme
    assert "docker run --rm tff-clustered make test" in (ROOT / "Dockerfile").read_text()
    assert "docker run --rm tff-clustered make test" in readme
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv/" in ignored and ".bootstrap/" in ignored


def test_every_binary_is_a_console_script_the_editable_install_provides() -> None:
    """setup.cfg's console scripts: `tff-NAME` for each binaries/NAME.py, each a function of
    tff_clustered/cli/launch.py starting tff_clustered/cli/NAME.py; scripts/bootstrap.sh
    installs the package editable (`pip install -e .`), so they exist on a fresh machine and
    binaries/NAME.py imports the checkout's package without a sys.path edit."""
    import configparser

    from tff_clustered.cli import launch

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    scripts = dict(
        (name.strip(), target.strip())
        for name, _, target in (
            line.partition("=")
            for line in config["options.entry_points"]["console_scripts"].strip().splitlines()
        )
    )
    binaries = sorted(p.stem for p in (ROOT / "binaries").glob("*.py"))
    assert sorted(scripts) == [f"tff-{b.replace('_', '-')}" for b in binaries]
    for binary in binaries:
        assert scripts[f"tff-{binary.replace('_', '-')}"] == f"tff_clustered.cli.launch:{binary}"
        assert callable(getattr(launch, binary))
        assert (ROOT / "tff_clustered" / "cli" / f"{binary}.py").exists()
        assert f"launch.{binary}()" in (ROOT / "binaries" / f"{binary}.py").read_text()
    assert (
        "-m pip install --quiet --no-deps -e ." in (ROOT / "scripts" / "bootstrap.sh").read_text()
    )
