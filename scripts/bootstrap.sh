#!/usr/bin/env bash
# Creates .venv with the pinned, complete lock that is known to import and run TFF 0.87.
# `pip install tensorflow-federated` no longer resolves (its jaxlib==0.4.14 pin is gone from the
# index), so TFF is installed with --no-deps on top of requirements/lock.txt (jax/jaxlib 0.4.13).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv

pick_python() {
  for candidate in ${PYTHON:-} python3.11 python3.10 python3.9 python3; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  return 1
}

if ! PY=$(pick_python); then
  echo "error: TensorFlow Federated 0.87 needs Python 3.9, 3.10 or 3.11, and none was found." >&2
  echo "fix: install Python 3.11 (for example 'apt-get install python3.11 python3.11-venv'," >&2
  echo "     or 'pyenv install 3.11'), or point PYTHON=/path/to/python3.11 at one." >&2
  exit 2
fi
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "error: $PY has no 'venv'/'ensurepip' module, so the virtual environment cannot be made." >&2
  echo "fix: install it, for example 'apt-get install python3-venv' (or python3.X-venv for your version)." >&2
  exit 2
fi

echo "[bootstrap] using $PY ($("$PY" --version 2>&1)); creating $VENV"
"$PY" -m venv "$VENV"
# setuptools<70 for the build environments: SQLAlchemy 1.4.20 and jax 0.4.13 ship as sdists whose
# setup.py imports pkg_resources, which newer setuptools no longer provides.
export PIP_CONSTRAINT="$PWD/requirements/build-constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/python" -m pip install --quiet --no-deps -r requirements/lock.txt
"$VENV/bin/python" -m pip install --quiet --no-deps "tensorflow-federated==0.87.0"
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
  || "$VENV/bin/python" -m pip install --quiet --no-deps -e .
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -c "import tensorflow_federated, tff_clustered" \
  || { echo "error: the installed environment does not import; delete .venv and run again." >&2; exit 1; }
touch "$VENV/.installed"
echo "[bootstrap] environment ready in $VENV"
