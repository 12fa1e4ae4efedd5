#!/usr/bin/env bash
# Compares Strata's training step on the GPU (`strata bench step --backend cuda`) with the same
# model trained in plain PyTorch (tools/bench_gpu_vs_pytorch.py: everything on the GPU,
# torch.optim.AdamW(fused=True)), on the same machine, alternating the two, and prints a markdown
# table of median tokens/s and the Strata/PyTorch ratio. PyTorch is a benchmark tool here, not a
# Strata dependency: the first Python found with torch (CUDA) and transformers is used ($PYTHON,
# then python3 on PATH, then the bench venv); only when none has them is PyTorch installed from
# PyPI into a virtual environment (~/.cache/strata/bench-venv, several GB), so the script runs on a
# GPU machine that has PyTorch and no package registry.
#
# Usage: tools/bench_gpu_vs_pytorch.sh [MODEL.json] [REPS]
#   MODEL.json  a Hugging Face config.json (default configs/models/gpt2-124m.json)
#   REPS        repetitions (default 3); odd ones run PyTorch first, even ones Strata first
# Environment: STRATA=path/to/strata (default build/strata), BATCH=8, SEQ_LEN=1024, STEPS=20,
#              WARMUP=5, PRECISION=bf16 (bf16|fp16|fp32), DEVICE_BYTES=0 (strata's device
#              budget; 0 = the GPU's free memory), STRATA_EXTRA=more `strata bench step` options,
#              RAW=file to keep every run's JSON line in.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model="${1:-$root/configs/models/gpt2-124m.json}"
reps="${2:-3}"
strata="${STRATA:-$root/build/strata}"
batch="${BATCH:-8}"
seq="${SEQ_LEN:-1024}"
steps="${STEPS:-20}"
warmup="${WARMUP:-5}"
precision="${PRECISION:-bf16}"
device_bytes="${DEVICE_BYTES:-0}"
raw="${RAW:-$(mktemp)}"
venv="${STRATA_BENCH_VENV:-$HOME/.cache/strata/bench-venv}"

[ -x "$strata" ] || { echo "bench_gpu_vs_pytorch: no strata program at $strata (build first)" >&2; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 || { echo "bench_gpu_vs_pytorch: no nvidia-smi: this needs a GPU" >&2; exit 2; }
has_torch() { "$1" -c "import torch, transformers; assert torch.cuda.is_available()" 2>/dev/null; }
py=""
for candidate in "${PYTHON:-}" "$(command -v python3 || true)" "$venv/bin/python"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && has_torch "$candidate"; then
    py="$candidate"
    break
  fi
done
if [ -z "$py" ]; then
  echo "bench_gpu_vs_pytorch: no Python with torch (CUDA) and transformers; installing them into $venv" >&2
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch transformers
  py="$venv/bin/python"
  has_torch "$py" || { echo "bench_gpu_vs_pytorch: $py still cannot import torch with CUDA" >&2; exit 2; }
fi
echo "bench_gpu_vs_pytorch: PyTorch from $py" >&2

echo "bench_gpu_vs_pytorch: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)" >&2
echo "bench_gpu_vs_pytorch: model $model, batch $batch x $seq tokens, $precision, $steps steps after $warmup" >&2

run_strata() {
  "$strata" bench step --model "$model" --batch "$batch" --seq-len "$seq" --steps "$steps" \
    --warmup "$warmup" --precision "$precision" --backend cuda --device-bytes "$device_bytes" \
    --peak-sizes 4096,8192 --json ${STRATA_EXTRA:-} | tail -1
}
run_torch() {
  "$py" "$root/tools/bench_gpu_vs_pytorch.py" --model "$model" --batch "$batch" \
    --seq-len "$seq" --steps "$steps" --warmup "$warmup" --precision "$precision" | tail -1
}
field() { "$py" -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

strata_tps=()
torch_tps=()
for ((r = 1; r <= reps; r++)); do
  if ((r % 2)); then order="torch strata"; else order="strata torch"; fi
  for who in $order; do
    if [ "$who" = strata ]; then
      line="$(run_strata)"
      strata_tps+=("$(field "$line" tokens_per_s)")
    else
      line="$(run_torch)"
      torch_tps+=("$(field "$line" tokens_per_s)")
    fi
    echo "$line" >>"$raw"
    echo "bench_gpu_vs_pytorch: run $r $who: $(field "$line" tokens_per_s) tokens/s" >&2
  done
done

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
s="$(median "${strata_tps[@]}")"
t="$(median "${torch_tps[@]}")"
echo
echo "| run | tokens/s (median of $reps) | runs |"
echo "|---|---|---|"
echo "| Strata (\`strata bench step --backend cuda\`, in memory) | $s | ${strata_tps[*]} |"
echo "| PyTorch (AdamW fused, all on GPU) | $t | ${torch_tps[*]} |"
echo "| ratio Strata / PyTorch | $(awk -v a="$s" -v b="$t" 'BEGIN {printf "%.3f", a / b}') | |"
echo
echo "bench_gpu_vs_pytorch: every run's JSON is in $raw" >&2
