#!/usr/bin/env bash
# Runs tools/convert_pytorch_bin.py (pytorch_model.bin -> safetensors) in the tools' virtual
# environment (tools/make_fixtures.sh creates it on first use). Usage: tools/convert_pytorch_bin.sh DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${STRATA_FIXTURES_VENV:-$HOME/.cache/strata/fixtures-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch, safetensors" 2>/dev/null; then
  "$venv/bin/pip" install --quiet torch safetensors
fi
exec "$venv/bin/python" "$root/tools/convert_pytorch_bin.py" "$@"
