#!/usr/bin/env bash
# Runs tools/prepare_data.py in its Python environment (tools/data_venv.sh creates it on first use).
# Usage: tools/prepare_data.sh --model MODEL_DIR --input FILE... --output OUT_DIR [options]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="$(bash "$root/tools/data_venv.sh")"
exec "$python" "$root/tools/prepare_data.py" "$@"
