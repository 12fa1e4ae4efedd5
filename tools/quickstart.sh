#!/usr/bin/env bash
# Installs what is missing, builds Strata (Release) and runs the default job: describe this
# machine, then train the demo model (configs/demo.json: a small GPT-2 on the built-in synthetic
# Markov source, whose entropy floor is known exactly) for under three minutes on 2 cores with
# its parameters and optimizer state on the NVMe tier (strata_out/nvme) under a device budget well
# below the model's training state, compare the final loss with that floor, and say where the
# bytes lived.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh" "$root/build" Release >/dev/null
strata="$root/build/strata"
cd "$root"
mkdir -p strata_out/nvme  # the NVMe tier of configs/demo.json: swap files live here while it trains

echo "== strata report"
"$strata" report --path strata_out
echo
echo "== strata train --config configs/demo.json --overwrite"
# --overwrite: running the quick start again replaces its previous run in strata_out (a fresh run
# otherwise refuses to replace another run's checkpoints: docs/reliability.md).
summary="$("$strata" train --config configs/demo.json --overwrite)"
echo "$summary"
echo
final_loss="$(echo "$summary" | sed -n 's/.*"final_loss":\([0-9.eE+-]*\).*/\1/p')"
floor="$(echo "$summary" | sed -n 's/.*"entropy_floor":\([0-9.eE+-]*\).*/\1/p')"
awk -v loss="$final_loss" -v floor="$floor" 'BEGIN {
  printf "final loss %.4f nats/token; the synthetic source'"'"'s entropy floor is %.4f (%.1f%% above it)\n",
         loss, floor, 100 * (loss / floor - 1) }'
field() { echo "$summary" | sed -n "s/.*\"$1\":\([0-9.eE+-]*\).*/\1/p"; }
echo "where the bytes lived (peak of each tier against its budget):"
for tier in device host nvme; do
  awk -v t="$tier" -v peak="$(field "${tier}_bytes_peak")" -v max="$(field "${tier}_bytes_max")" 'BEGIN {
    printf "  %-6s %8.1f MiB peak", t, peak / 1048576
    if (max > 0) printf " of a %.1f MiB budget", max / 1048576
    if (t == "nvme") printf " (parameters, master weights, Adam moments, gradients: strata_out/nvme)"
    printf "\n" }'
done
echo "metrics: strata_out/metrics.jsonl; model: strata_out/final (loads with transformers)"
