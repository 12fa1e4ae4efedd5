#!/usr/bin/env bash
# Creates (once) the Python environment of the data-preparation tool, tools/prepare_data.py:
# tokenizers, transformers (for chat templates; no PyTorch), numpy, xxhash and tqdm from PyPI,
# in ${STRATA_DATA_VENV:-~/.cache/strata/data-venv} (about 300 MB). Prints the venv's python.
# Tools only: Strata itself never needs Python.
set -euo pipefail
venv="${STRATA_DATA_VENV:-$HOME/.cache/strata/data-venv}"
modules="import tokenizers, transformers, jinja2, numpy, xxhash, tqdm"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$modules" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
python=python3
if [ -x /usr/bin/python3 ]; then
  python=/usr/bin/python3
fi
echo "data-venv: creating $venv" >&2
"$python" -m venv "$venv" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  "tokenizers>=0.19" "transformers>=4.44" "jinja2>=3.1" numpy xxhash tqdm >&2
"$venv/bin/python" -c "$modules"
echo "$venv/bin/python"
