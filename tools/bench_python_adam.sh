#!/usr/bin/env bash
# Runs tools/bench_python_adam.py (one optimizer step over a Llama-7B-shaped parameter set:
# torch AdamW foreach and fused, DeepSpeed's DeepSpeedCPUAdam, Strata's OffloadAdamW on cpu and
# nvme) with DeepSpeed's CPU accelerator. DeepSpeed is a benchmark tool here, not a Strata
# dependency: it goes into a second venv, ${STRATA_BENCH_DS_VENV:-~/.cache/strata/bench-ds-venv},
# layered over tools/py_venv.sh's (torch comes from there through a .pth file), installed with
# DS_BUILD_OPS=0 (no ops built at install time: DeepSpeedCPUAdam's op is JIT-built with g++ on
# its first use, about 90 s, cached in ~/.cache/torch_extensions). The strata module is taken from
# build/python when it has been built (PYTHONPATH), else its variants are reported as skipped.
# Usage: tools/bench_python_adam.sh [bench_python_adam.py arguments...]
#   e.g. tools/bench_python_adam.sh --params 1e8 --rounds 5
#        tools/bench_python_adam.sh --dry-run          (what 1e9 needs, and whether it fits)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="$(bash "$root/tools/py_venv.sh")"
venv="${STRATA_BENCH_DS_VENV:-$HOME/.cache/strata/bench-ds-venv}"
base_site="$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
stamp="$venv/.strata-bench-ds-venv-stamp"
want="over=$base_site packages=wheel ninja deepspeed"
check="import torch, deepspeed; from deepspeed.ops.adam import DeepSpeedCPUAdam"

if ! { [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
  DS_ACCELERATOR=cpu "$venv/bin/python" -c "$check" >/dev/null 2>&1; }; then
  if [ ! -x "$venv/bin/python" ]; then
    echo "bench-ds-venv: creating $venv over $base_site" >&2
    "$py" -m venv "$venv" >&2
  fi
  rm -f "$stamp"
  site="$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
  echo "$base_site" >"$site/strata-py-venv.pth"
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" wheel ninja >&2
  DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation deepspeed >&2
  DS_ACCELERATOR=cpu "$venv/bin/python" -c "$check" >&2
  echo "$want" >"$stamp"
fi

if [ -d "$root/build/python/strata" ]; then
  export PYTHONPATH="$root/build/python${PYTHONPATH:+:$PYTHONPATH}"
fi
export DS_ACCELERATOR=cpu
exec "$venv/bin/python" "$root/tools/bench_python_adam.py" "$@"
