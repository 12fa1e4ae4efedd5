#!/usr/bin/env bash
# Runs tools/convert_pytorch_bin.py (pytorch_model.bin -> safetensors) in the tools' virtual
# environment (tools/py_venv.sh creates it on first use). Usage: tools/convert_pytorch_bin.sh DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="$(STRATA_PY_VENV="${STRATA_FIXTURES_VENV:-${STRATA_PY_VENV:-$HOME/.cache/strata/py-venv}}" \
  bash "$root/tools/py_venv.sh")"
exec "$python" "$root/tools/convert_pytorch_bin.py" "$@"
