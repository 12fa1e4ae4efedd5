#!/usr/bin/env bash
# Runs tools/make_fixtures.py in a virtual environment with PyTorch (CPU use only) and
# transformers from PyPI, created on first use under ~/.cache/strata/fixtures-venv (several GB:
# PyPI's torch wheel brings its CUDA libraries). Tools only: Strata itself never needs Python.
# Usage: tools/make_fixtures.sh [make_fixtures.py arguments...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${STRATA_FIXTURES_VENV:-$HOME/.cache/strata/fixtures-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch, transformers, safetensors, numpy" 2>/dev/null; then
  "$venv/bin/pip" install --quiet torch transformers safetensors numpy
fi
exec "$venv/bin/python" "$root/tools/make_fixtures.py" "$@"
