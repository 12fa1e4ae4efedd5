#!/usr/bin/env bash
# Installs what is missing, builds Strata (Release) and runs the default job: describe this
# machine, then train the demo model (configs/demo.json: a small GPT-2 on the built-in synthetic
# Markov source, whose entropy floor is known exactly) for a couple of minutes, and compare the
# final loss with that floor.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh" "$root/build" Release >/dev/null
strata="$root/build/strata"
cd "$root"
mkdir -p strata_out

echo "== strata report"
"$strata" report --path strata_out
echo
echo "== strata train --config configs/demo.json"
summary="$("$strata" train --config configs/demo.json)"
echo "$summary"
echo
final_loss="$(echo "$summary" | sed -n 's/.*"final_loss":\([0-9.eE+-]*\).*/\1/p')"
floor="$(echo "$summary" | sed -n 's/.*"entropy_floor":\([0-9.eE+-]*\).*/\1/p')"
awk -v loss="$final_loss" -v floor="$floor" 'BEGIN {
  printf "final loss %.4f nats/token; the synthetic source'"'"'s entropy floor is %.4f (%.1f%% above it)\n",
         loss, floor, 100 * (loss / floor - 1) }'
echo "metrics: strata_out/metrics.jsonl; model: strata_out/final (loads with transformers)"
