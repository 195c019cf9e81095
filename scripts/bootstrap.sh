#!/usr/bin/env bash
# Creates .venv with the pinned, complete lock that is known to import and run TFF 0.87.
# `pip install tensorflow-federated` no longer resolves (its jaxlib==0.4.14 pin is gone from the
# index), so TFF is installed with --no-deps on top of requirements/lock.txt (jax/jaxlib 0.4.13).
if [ -z "${BASH_VERSION:-}" ]; then
  echo "error: scripts/bootstrap.sh is a bash script; run it as: bash scripts/bootstrap.sh" >&2
  exit 2
fi
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv

# A Python 3.9-3.11: $PYTHON, one on PATH, or one that uv provisions (scripts/python_for_venv.sh).
PY=$(bash scripts/python_for_venv.sh) || exit $?

echo "[bootstrap] using $PY ($("$PY" --version 2>&1)); creating $VENV"
if [ -e "$VENV" ] && [ ! -d "$VENV" ]; then
  echo "error: $PWD/$VENV exists and is not a folder; remove it (rm $VENV) and run again" >&2
  exit 2
fi
if ! made=$("$PY" -m venv "$VENV" 2>&1) || [ ! -x "$VENV/bin/python" ]; then
  said=$(printf '%s\n' "$made" | grep -v '^[[:space:]]*$' | tail -n 1 || true)
  echo "error: $PY -m venv $VENV made no $VENV/bin/python${said:+ ($said)}; set PYTHON to a Python 3.9-3.11 with its venv module (on Ubuntu: apt-get install python3.11-venv), delete $VENV and run again" >&2
  exit 2
fi
# setuptools<70 for the build environments: SQLAlchemy 1.4.20 and jax 0.4.13 ship as sdists whose
# setup.py imports pkg_resources, which newer setuptools no longer provides.
export PIP_CONSTRAINT="$PWD/requirements/build-constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/python" -m pip install --quiet --no-deps -r requirements/lock.txt
"$VENV/bin/python" -m pip install --quiet --no-deps "tensorflow-federated==0.87.0"
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
  || "$VENV/bin/python" -m pip install --quiet --no-deps -e .
TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c "import tensorflow_federated, tff_clustered" \
  || { echo "error: the installed environment does not import; delete .venv and run again." >&2; exit 1; }
touch "$VENV/.installed"
echo "[bootstrap] environment ready in $VENV"
