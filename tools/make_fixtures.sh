#!/usr/bin/env bash
# Runs tools/make_fixtures.py in a virtual environment with PyTorch (CPU use only) and
# transformers from PyPI: tools/py_venv.sh's, created on first use under ~/.cache/strata/py-venv
# (several GB: PyPI's torch wheel brings its CUDA libraries; STRATA_FIXTURES_VENV, where set, names
# another folder for it). Tools only: Strata's C++ trainer never needs Python.
# Usage: tools/make_fixtures.sh [make_fixtures.py arguments...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="$(STRATA_PY_VENV="${STRATA_FIXTURES_VENV:-${STRATA_PY_VENV:-$HOME/.cache/strata/py-venv}}" \
  bash "$root/tools/py_venv.sh")"
exec "$python" "$root/tools/make_fixtures.py" "$@"
