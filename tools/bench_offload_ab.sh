#!/usr/bin/env bash
# A/B of `strata bench offload` between two builds of strata, alternating them (A first in odd
# repetitions, B first in even ones) so that a machine that speeds up or slows down during the
# session does not favour either; prints every run's ratios and the medians per build.
#
# Usage: tools/bench_offload_ab.sh A_BINARY B_BINARY DIR [REPS] [-- extra bench offload options]
#   A_BINARY, B_BINARY  the two strata programs (e.g. a build of main and one of a branch)
#   DIR                 a directory on the NVMe drive for the swap files
#   REPS                repetitions per build (default 3)
# Environment: MODEL=the model (default configs/models/gpt2-124m.json), RAW=file to keep the
#              JSON lines in, CHRT="chrt -f 10" to run each benchmark at real-time priority (as
#              docs/benchmarks.md did on a quiet machine).
# Example: tools/bench_offload_ab.sh /work/main/build/strata build/strata /tmp/bench 3
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
a="${1:?usage: tools/bench_offload_ab.sh A_BINARY B_BINARY DIR [REPS] [-- options]}"
b="${2:?usage: tools/bench_offload_ab.sh A_BINARY B_BINARY DIR [REPS] [-- options]}"
dir="${3:?usage: tools/bench_offload_ab.sh A_BINARY B_BINARY DIR [REPS] [-- options]}"
reps="${4:-3}"
shift $(( $# >= 4 ? 4 : $# ))
[ "${1:-}" = "--" ] && shift
model="${MODEL:-$root/configs/models/gpt2-124m.json}"
raw="${RAW:-$(mktemp)}"
: > "$raw"
mkdir -p "$dir"

run() {  # run LABEL BINARY [options]
  local label="$1" binary="$2" line
  shift 2
  # shellcheck disable=SC2086
  line="$(${CHRT:-} "$binary" bench offload --model "$model" --path "$dir" --json "$@" | tail -1)"
  echo "$label $line" >> "$raw"
  echo "$label $line" | python3 -c '
import json, sys
label, text = sys.stdin.read().split(" ", 1)
j = json.loads(text)
nan = float("nan")
print("%s: step_ratio %.3f  compute_wait_fraction %.3f  optimizer_ratio %.3f  nvme step %.0f ms"
      % (label, j.get("step_ratio", nan), j["compute_wait_fraction"],
         j.get("optimizer_ratio", nan), j["nvme_step_ms_median"]))' >&2
}

for ((i = 1; i <= reps; ++i)); do
  if (( i % 2 == 1 )); then
    run A "$a" "$@"; run B "$b" "$@"
  else
    run B "$b" "$@"; run A "$a" "$@"
  fi
done

python3 - "$raw" <<'EOF'
import json, statistics, sys
runs = {"A": [], "B": []}
for line in open(sys.argv[1]):
    label, text = line.split(" ", 1)
    runs[label].append(json.loads(text))
keys = ["step_ratio", "compute_wait_fraction", "optimizer_ratio", "nvme_step_ms_median",
        "memory_step_ms_median", "optimizer_ms_median"]
print("| figure | A median | B median | A runs | B runs |")
print("|---|---|---|---|---|")
for k in keys:
    va = [r[k] for r in runs["A"] if k in r]
    vb = [r[k] for r in runs["B"] if k in r]
    if not va or not vb:
        continue
    fmt = (lambda v: f"{v:.0f}") if k.endswith("_ms_median") else (lambda v: f"{v:.3f}")
    print(f"| {k} | {fmt(statistics.median(va))} | {fmt(statistics.median(vb))} | "
          f"{', '.join(fmt(v) for v in va)} | {', '.join(fmt(v) for v in vb)} |")
EOF
echo "raw JSON lines: $raw" >&2
