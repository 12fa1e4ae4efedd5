#!/usr/bin/env bash
# Creates or updates the Python environment of the `strata` Python package (issue 18: its tests in
# python/tests, the Hugging Face Trainer example, tools/bench_python_adam.py) and of the fixture
# tools (tools/make_fixtures.sh, tools/convert_pytorch_bin.sh): torch, transformers, accelerate,
# pytest, numpy and safetensors from PyPI, in ${STRATA_PY_VENV:-~/.cache/strata/py-venv}.
# PyPI's torch wheel brings its CUDA libraries (several GB); set STRATA_TORCH_INDEX_URL (e.g.
# https://download.pytorch.org/whl/cpu) to take torch from another index (the CPU wheel is
# ~200 MB) where that index is reachable.
# Idempotent: a stamp file in the venv records the package list it was installed with; while it
# matches and the modules import, nothing is fetched. Prints the venv's python on stdout
# (progress goes to stderr). Use the package with:
#   PYTHONPATH=build/python "$(tools/py_venv.sh)" -m pytest python/tests
set -euo pipefail
venv="${STRATA_PY_VENV:-$HOME/.cache/strata/py-venv}"
packages=(torch "transformers>=4.44" "accelerate>=0.26" pytest numpy safetensors peft)
modules="import torch, transformers, accelerate, pytest, numpy, safetensors, peft"
torch_index="${STRATA_TORCH_INDEX_URL:-}"
stamp="$venv/.strata-py-venv-stamp"
want="packages=${packages[*]} torch_index=${torch_index}"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
  "$venv/bin/python" -c "$modules" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
python=python3
if [ -x /usr/bin/python3 ]; then
  python=/usr/bin/python3
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "py-venv: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv" >&2
else
  echo "py-venv: updating $venv" >&2
fi
rm -f "$stamp"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if [ -n "$torch_index" ]; then
  "${pip[@]}" --index-url "$torch_index" torch >&2
fi
"${pip[@]}" "${packages[@]}" >&2
"$venv/bin/python" -c "$modules"
echo "$want" >"$stamp"
echo "$venv/bin/python"
