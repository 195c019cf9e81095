#!/usr/bin/env bash
# Prints the path of a Python 3.9-3.11 interpreter for .venv (TensorFlow 2.14, hence TFF 0.87,
# has wheels for those versions only). Messages go to stderr; the path alone goes to stdout.
#
# The order:
#   1. PYTHON=/path/to/python, when set: that interpreter and no other (exit 2 if it is unusable).
#   2. python3.11, python3.10, python3.9, python3 on PATH, the first in 3.9-3.11.
#   3. Otherwise uv provisions Python 3.11: the `uv` on PATH, or uv installed from PyPI into
#      .bootstrap/uv by any Python 3.8+ with pip. `uv python find 3.11` reuses a 3.11 uv can see
#      (an earlier download included); otherwise `uv python install 3.11` downloads
#      python-build-standalone's build into .bootstrap/python (or $UV_PYTHON_INSTALL_DIR).
# A failure is one line on stderr naming what was tried and the manual fix, and exit code 2.
set -euo pipefail
cd "$(dirname "$0")/.."
BOOTSTRAP_DIR="${BOOTSTRAP_DIR:-$PWD/.bootstrap}"
# The uv release installed from PyPI when none is on PATH (its Python 3.11 is then 3.11.18).
UV_PIN="uv==0.13.9"
MANUAL_FIX="install Python 3.11 yourself (pyenv install 3.11; on Ubuntu 24.04 the deadsnakes PPA: add-apt-repository ppa:deadsnakes/ppa && apt-get install python3.11 python3.11-venv) and rerun, or set PYTHON=/path/to/python3.11, or use the Dockerfile (README)"

# The version (3.11.4) of the interpreter $1, printed by it, or status 1 when it does not print
# one: a program that is no Python (a script that exits 0) passes a check of exit codes alone.
python_version() {
  local said
  said=$("$1" -c 'import sys; print("python %d.%d.%d" % sys.version_info[:3])' 2>/dev/null) || return 1
  [[ "$said" =~ ^python\ ([0-9]+\.[0-9]+\.[0-9]+)$ ]] || return 1
  echo "${BASH_REMATCH[1]}"
}

supported() {
  local version
  version=$(python_version "$1") || return 1
  [[ "$version" =~ ^3\.(9|10|11)\. ]]
}

has_venv() {
  [ "$("$1" -c 'import venv, ensurepip; print("venv")' 2>/dev/null)" = "venv" ]
}

version_of() {
  python_version "$1" || echo "unknown version"
}

fail() {
  echo "error: $1" >&2
  exit 2
}

if [ -n "${PYTHON:-}" ]; then
  command -v "$PYTHON" >/dev/null 2>&1 || fail "PYTHON=$PYTHON is not an executable; fix: point PYTHON at a Python 3.9-3.11, or unset it to let the setup find or fetch one."
  python_version "$PYTHON" >/dev/null || fail "PYTHON=$PYTHON is not a Python interpreter (it did not print its version for -c 'import sys; print(sys.version_info)'); fix: point PYTHON at a Python 3.9-3.11, or unset it to let the setup find or fetch one."
  supported "$PYTHON" || fail "PYTHON=$PYTHON is Python $(version_of "$PYTHON"), and TensorFlow Federated 0.87 needs 3.9, 3.10 or 3.11; fix: point PYTHON at one of those, or unset it to let the setup find or fetch one."
  has_venv "$PYTHON" || fail "PYTHON=$PYTHON has no 'venv'/'ensurepip' module, so .venv cannot be made; fix: install it (for example 'apt-get install python3.11-venv'), or unset PYTHON."
  command -v "$PYTHON"
  exit 0
fi

for candidate in python3.11 python3.10 python3.9 python3; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  supported "$candidate" || continue
  has_venv "$candidate" \
    || fail "$candidate has no 'venv'/'ensurepip' module, so .venv cannot be made; fix: install it, for example 'apt-get install python3-venv' (or python3.X-venv for your version)."
  command -v "$candidate"
  exit 0
done

# No supported interpreter on PATH: uv provisions one.
found=""
for candidate in python3 python; do
  if command -v "$candidate" >/dev/null 2>&1; then found="$candidate is $(version_of "$candidate")"; break; fi
done
mkdir -p "$BOOTSTRAP_DIR"
export UV_PYTHON_INSTALL_DIR="${UV_PYTHON_INSTALL_DIR:-$BOOTSTRAP_DIR/python}"
# uv would also link python3.11 into ~/.local/bin; keep everything inside .bootstrap.
export UV_PYTHON_BIN_DIR="${UV_PYTHON_BIN_DIR:-$BOOTSTRAP_DIR/bin}"
LOG="$BOOTSTRAP_DIR/uv.log"
: > "$LOG"

find_311() {
  "$UV" python find --system --no-project 3.11 2>>"$LOG"
}

if command -v uv >/dev/null 2>&1; then
  UV=$(command -v uv)
else
  UV="$BOOTSTRAP_DIR/uv/bin/uv"
fi
if [ -x "$UV" ] && PY=$(find_311); then
  echo "[bootstrap] no Python 3.9-3.11 on PATH (${found:-no python3 at all}); using the Python 3.11 that uv already has" >&2
else
  uv_download=""
  [ -x "$UV" ] || uv_download="uv from PyPI (about 18 MB) and "
  echo "[bootstrap] no Python 3.9-3.11 on PATH (${found:-no python3 at all}); setting one up with uv: downloading ${uv_download}Python 3.11 (python-build-standalone, a few tens of MB) into ${UV_PYTHON_INSTALL_DIR}" >&2
  if [ -n "$uv_download" ]; then
    pip_python=""
    for candidate in python3 python; do
      command -v "$candidate" >/dev/null 2>&1 || continue
      "$candidate" -c 'import sys, pip; sys.exit(0 if sys.version_info >= (3, 8) else 1)' 2>/dev/null || continue
      pip_python="$candidate"; break
    done
    [ -n "$pip_python" ] || fail "no Python 3.9-3.11 on PATH, no uv on PATH, and no Python 3.8+ with pip to install uv from PyPI; fix: $MANUAL_FIX (or install uv: https://docs.astral.sh/uv/getting-started/installation/)."
    "$pip_python" -m pip install --quiet --disable-pip-version-check --target "$BOOTSTRAP_DIR/uv" "$UV_PIN" >>"$LOG" 2>&1 \
      || fail "no Python 3.9-3.11 on PATH, and '$pip_python -m pip install $UV_PIN' failed (offline? details in $LOG); fix: $MANUAL_FIX."
  fi
  if [ -z "$uv_download" ] || ! PY=$(find_311); then
    "$UV" python install 3.11 >>"$LOG" 2>&1 \
      || fail "no Python 3.9-3.11 on PATH, and '$UV python install 3.11' could not fetch one (offline? details in $LOG); fix: $MANUAL_FIX."
    PY=$(find_311) \
      || fail "'$UV python install 3.11' succeeded but 'uv python find 3.11' finds no interpreter (details in $LOG); fix: $MANUAL_FIX."
  fi
fi
supported "$PY" || fail "uv gave $PY, which is Python $(version_of "$PY"), not 3.9-3.11 (details in $LOG); fix: $MANUAL_FIX."
has_venv "$PY" || fail "uv's $PY has no 'venv'/'ensurepip' module (details in $LOG); fix: $MANUAL_FIX."
echo "$PY"
