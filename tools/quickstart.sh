#!/usr/bin/env bash
# Installs what is missing, builds Strata (Release) and runs the default job.
# Until the trainer lands, the default job describes this machine and estimates the memory the
# demo profile needs per tier.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh" "$root/build" Release >/dev/null
strata="$root/build/strata"
mkdir -p "$root/strata_out"

echo "== strata report"
"$strata" report --path "$root/strata_out"
echo
echo "== strata config check configs/demo.json"
"$strata" config check "$root/configs/demo.json" >/dev/null && echo "configs/demo.json: ok"
echo
echo "== strata estimate: the demo model, and a 7B Llama on one 24 GiB GPU with NVMe offload"
"$strata" estimate --config "$root/configs/demo.json"
"$strata" estimate --config "$root/configs/zero3-nvme-bf16.json" --params 7e9 \
  --device-bytes 24GiB --host-bytes 64GiB
