#!/usr/bin/env bash
# The GPU checks: what a session that draws a GPU runs, in one go, on a build with CUDA.
#   tools/gpu_checks.sh [--build DIR] [--repeat N] [--sanitize] [--bench] [--only PHASE]
# Phases, in order (each writes its log under $OUT, default DIR/gpu-checks, and prints one line):
#   tests     every gpu test program (DIR/tests/strata_*_gpu_tests), whole, then the TFLOP/s
#             lines of the tensor-core flash attention (tests/kernels/flash_attention_gputest.cc,
#             `flash_forward_tflops` / `flash_backward_tflops shape=... tflops=...`) from its log,
#             beside PyTorch's SDPA at the same shapes (tools/bench_sdpa.py, PYTHON with torch);
#             then the CUDA backend's fast paths (`strata report`), a short bf16 `strata bench step`
#             with them, one with cuDNN's attention made to fail its check (Strata's flash kernels
#             alone: the two attentions side by side in a whole step) and one with the flash
#             attention's check made to fail (STRATA_TEST_FAST_PATH_FAIL: the fallback to the fp32
#             kernels), and the quick-start job in bf16;
#   repeat    the determinism tests N times in one process (default 10): two trainers in one
#             process give the same bits (TrainCuda.TwoRunsGiveTheSameBits) and the fixtures'
#             three AdamW steps land on torch's weights (FixtureAdamWCuda.*); one process on
#             purpose, so later runs get device memory that earlier ones used; then twice more
#             with every device arena poisoned at creation (STRATA_TEST_STREAM_JITTER);
#   sanitize  (with --sanitize) compute-sanitizer's memcheck, racecheck, synccheck and initcheck
#             over the gpu test programs (SANITIZE_FILTER, a gtest filter, default every test;
#             for strata_kernels_gpu_tests FLASH_SANITIZE_FILTER, default the flash attention's
#             correctness cases '*CudaFlashAttention.*', not its timing: racecheck's shared-memory
#             hazards between the cp.async tile loads and the ldmatrix reads, memcheck's bounds of
#             the zero-filled tile edges) and over a short `strata train` of configs/demo.json on
#             the CUDA backend;
#   bench     (with --bench) tools/bench_gpu_vs_pytorch.sh for GPT-2 124M (8 x 1024) and the Llama
#             1.1B shape (4 x 1024), BENCH_REPS runs each (default 2); for each, the step-time
#             model's prediction for this card with PyTorch's tokens/s (`strata bench step
#             --predict`) and, with ncu, the measured kernel time per family beside the predicted
#             one (tools/kernel_times.py). On an H200 (2026-11-28) this phase took about 7
#             minutes and the tests phase 1: run them as two commands of one call (run.sh's
#             STEP_S each);
#   torch     strata.torch on CUDA parameters: the Python tests of OffloadAdamW (overlap=True gives
#             the bits of overlap=False on the GPU; PYTHON, default python3, with torch) and of
#             offload_parameters (an offloaded model trains to the in-memory bits on CUDA) and of
#             the sharded optimizer across ranks (gloo CPU ranks, NCCL one rank per GPU), and with
#             --bench tools/bench_torch_offload.py: the Llama-3.2-1B shape (torch fused AdamW on
#             the GPU, OffloadAdamW cpu with and without overlap, FSDP2 + CPUOffloadPolicy,
#             DeepSpeed ZeRO-2 where it imports), the same shape with its parameters offloaded
#             (strata-param-cpu, strata-param-nvme, DeepSpeed ZeRO-3 offload_param where it
#             imports), then the Llama-3.1-8B shape with OffloadAdamW
#             nvme (NVME_DIR, default /tmp).
# On the GPU machine, after ../shared/gpu/bundle.sh: bash .gpu/run.sh 'tools/gpu_checks.sh
# --build $B --sanitize' (run.sh gives each command STEP_S seconds: raise it, or run the phases as
# separate commands with --only). Exit status: 0 when every phase passed, 1 otherwise.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-gpu"
repeat=10
sanitize=0
bench=0
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --sanitize) sanitize=1; shift ;;
    --bench) bench=1; shift ;;
    --only) only="$2"; shift 2 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "gpu_checks: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$only" in ""|tests|repeat|sanitize|bench|torch) ;; *)
  echo "gpu_checks: --only '$only'; valid: tests, repeat, sanitize, bench, torch" >&2; exit 2 ;;
esac
[ -x "$build/strata" ] || { echo "gpu_checks: no $build/strata: build with CUDA first" >&2; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 || { echo "gpu_checks: no nvidia-smi: this needs a GPU" >&2; exit 2; }
out="${OUT:-$build/gpu-checks}"
mkdir -p "$out"
failed=0
programs=("$build"/tests/strata_*_gpu_tests)
echo "gpu_checks: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); logs in $out"

want() { [ -z "$only" ] || [ "$only" = "$1" ]; }
# Runs a command with its log in $out/NAME.log and prints one line.
step() {
  local name="$1"; shift
  local start=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "gpu_checks: $name rc=$rc $((SECONDS - start))s: $(grep -E '^\[  (PASSED|FAILED) ' "$out/$name.log" | tr '\n' ' ' | cut -c1-160)"
  [ $rc -eq 0 ] || failed=1
  return $rc
}

if want tests; then
  for p in "${programs[@]}"; do step "tests.$(basename "$p")" "$p"; done
  # The flash attention's speed (printed by its timing tests, not asserted), and SDPA's.
  log="$out/tests.strata_kernels_gpu_tests.log"
  [ -f "$log" ] && grep -hE '^flash_(forward|backward)_tflops ' "$log" | sed 's/^/gpu_checks:   /'
  step bench.sdpa "${PYTHON:-python3}" "$root/tools/bench_sdpa.py"
  grep -hE '^sdpa_' "$out/bench.sdpa.log" 2>/dev/null | sed 's/^/gpu_checks:   /'
  # The fast paths as `strata report` lists them (each checked at the CUDA backend's start), a
  # short bf16 step with them, then the same with the flash attention's check made to fail
  # (STRATA_TEST_FAST_PATH_FAIL): one warning naming it, and the fp32 kernels run instead.
  step fastpaths.report "$build/strata" report
  grep -hE '^  [a-z_0-9]+: (on|off)' "$out/fastpaths.report.log" | sed 's/^/gpu_checks:   /'
  small=(bench step --model "$root/configs/models/gpt2-124m.json" --backend cuda --batch 2
         --seq-len 256 --steps 3 --warmup 1 --precision bf16)
  step fastpaths.on "$build/strata" "${small[@]}"
  STRATA_TEST_FAST_PATH_FAIL=cudnn_attention step fastpaths.flash_only "$build/strata" "${small[@]}"
  STRATA_TEST_FAST_PATH_FAIL=flash_attention step fastpaths.fallback "$build/strata" "${small[@]}"
  grep -hE '^(fast path|time|throughput)|fast path .* is off' "$out/fastpaths.on.log" \
    "$out/fastpaths.flash_only.log" "$out/fastpaths.fallback.log" | sed 's/^/gpu_checks:   /'
  # The quick-start job (8 MiB device budget) on the CUDA backend in bf16: the checks fit beside
  # the backend's workspaces.
  tmp_demo="$(mktemp -d)"
  step fastpaths.demo "$build/strata" train --config "$root/configs/demo.json" \
    --set strata.backend=cuda --set strata.gemm_precision=bf16 --steps 3 \
    --set strata.output_dir="$tmp_demo" --quiet
  grep -h "fast path" "$out/fastpaths.demo.log" | sed 's/^/gpu_checks:   /'
  rm -rf "$tmp_demo"
fi

if want repeat; then
  filter='TrainCuda.TwoRunsGiveTheSameBits:*FixtureAdamWCuda.*'
  step "repeat.train_cuda" "$build/tests/strata_train_gpu_tests" --gtest_repeat="$repeat" \
    --gtest_filter="$filter"
  # Again with every arena poisoned (all bits set) when it is made: a read of device memory
  # before its first write turns into NaN here instead of into a value left by an earlier run.
  STRATA_TEST_STREAM_JITTER=1 step "repeat.train_cuda_poisoned" \
    "$build/tests/strata_train_gpu_tests" --gtest_repeat=2 --gtest_filter="$filter"
fi

if want sanitize && { [ "$sanitize" = 1 ] || [ "$only" = sanitize ]; }; then
  cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  if [ ! -x "$cs" ]; then
    echo "gpu_checks: no compute-sanitizer on this machine"; failed=1
  else
    tmp="$(mktemp -d)"
    for tool in memcheck racecheck synccheck initcheck; do
      args=(--tool "$tool" --error-exitcode 1)
      [ "$tool" = memcheck ] && args+=(--leak-check full)
      [ "$tool" = racecheck ] && args+=(--racecheck-report hazard)
      for p in "${programs[@]}"; do
        filter="${SANITIZE_FILTER:-*}"
        [ "$(basename "$p")" = strata_kernels_gpu_tests ] &&
          filter="${FLASH_SANITIZE_FILTER:-*CudaFlashAttention.*}"
        step "sanitize.$tool.$(basename "$p")" "$cs" "${args[@]}" "$p" --gtest_filter="$filter"
      done
      step "sanitize.$tool.strata_train" "$cs" "${args[@]}" "$build/strata" train \
        --config "$root/configs/demo.json" --set strata.backend=cuda --steps 2 \
        --set strata.output_dir="$tmp/$tool" --quiet
    done
    rm -rf "$tmp"
  fi
fi

if want bench && { [ "$bench" = 1 ] || [ "$only" = bench ]; }; then
  # Issue 36's two rows, each against PyTorch (BENCH_REPS alternating runs), then the model's
  # prediction for the card (`strata bench step --predict`) with PyTorch's measured tokens/s, and,
  # where Nsight Compute is there, each kernel family's measured time per step beside it
  # (tools/kernel_times.py: ncu times every kernel of a 1-step and a 2-step run; the difference is
  # one step).
  card=h100
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in *H200*) card=h200 ;; *A100*) card=a100 ;; esac
  ncu_bin="$(command -v ncu || { [ -x /usr/local/cuda/bin/ncu ] && echo /usr/local/cuda/bin/ncu; } || true)"
  for row in "gpt2 gpt2-124m 8" "llama_1b llama-1b 4"; do
    read -r name model batch <<<"$row"
    STRATA="$build/strata" BATCH=$batch step "bench.$name" bash "$root/tools/bench_gpu_vs_pytorch.sh" \
      "$root/configs/models/$model.json" "${BENCH_REPS:-2}"
    grep -hE '^\| (Strata|PyTorch|ratio)' "$out/bench.$name.log" | sed 's/^/gpu_checks:   /'
    torch_tps="$(sed -n 's/^| PyTorch[^|]*| \([0-9.]*\) |.*/\1/p' "$out/bench.$name.log")"
    step "predict.$name" "$build/strata" bench step --predict --json --card "$card" \
      --model "$root/configs/models/$model.json" --batch "$batch" --seq-len 1024 \
      ${torch_tps:+--reference-tokens-per-s "$torch_tps"}
  done
  [ -n "$ncu_bin" ] || echo "gpu_checks:   no ncu on this machine: no per-family kernel times"
  for row in "gpt2 gpt2-124m 8" "llama_1b llama-1b 4"; do
    [ -n "$ncu_bin" ] || break
    read -r name model batch <<<"$row"
    profile=(bench step --model "$root/configs/models/$model.json" --backend cuda --precision bf16
             --batch "$batch" --seq-len 1024 --warmup 0 --device-bytes 0 --peak-sizes 256
             --peak-repeats 1)
    ncu_args=(--csv --metrics gpu__time_duration.sum --clock-control none --print-units base)
    step "kernels.$name.1" "$ncu_bin" "${ncu_args[@]}" --log-file "$out/kernels.$name.1.csv" \
      "$build/strata" "${profile[@]}" --steps 1
    step "kernels.$name.2" "$ncu_bin" "${ncu_args[@]}" --log-file "$out/kernels.$name.2.csv" \
      "$build/strata" "${profile[@]}" --steps 2
    step "kernels.$name" "${PYTHON:-python3}" "$root/tools/kernel_times.py" --label "$name" \
      --short "$out/kernels.$name.1.csv" --long "$out/kernels.$name.2.csv" --steps 1 \
      --predict "$out/predict.$name.log"
    sed 's/^/gpu_checks:   /' "$out/kernels.$name.log"
  done
fi

if want torch; then
  py="${PYTHON:-python3}"
  PYTHONPATH="$build/python" STRATA_REQUIRE_PYTHON=1 step torch.pytest "$py" -m pytest -q \
    "$root/python/tests/test_offload_overlap.py" "$root/python/tests/test_offload_adamw.py" \
    "$root/python/tests/test_param_offload.py" "$root/python/tests/test_shard.py"
  if [ "$bench" = 1 ]; then
    PYTHONPATH="$build/python" step torch.bench_1b "$py" "$root/tools/bench_torch_offload.py" \
      --preset 1b --json --variants \
      torch-fused,strata-cpu,strata-cpu-sync,fsdp2-cpu-offload,deepspeed-zero2
    PYTHONPATH="$build/python" step torch.bench_1b_params "$py" "$root/tools/bench_torch_offload.py" \
      --preset 1b --json --variants strata-param-cpu,strata-param-nvme,deepspeed-zero3-offload-param \
      --nvme-dir "${NVME_DIR:-/tmp}"
    PYTHONPATH="$build/python" step torch.bench_8b "$py" "$root/tools/bench_torch_offload.py" \
      --preset 8b --json --steps 2 --warmup 1 --batch 4 --variants strata-nvme \
      --offload-ratio 0.45 --nvme-dir "${NVME_DIR:-/tmp}"
  fi
fi

echo "gpu_checks: $([ $failed = 0 ] && echo every phase passed || echo FAILED: see the logs above)"
exit $failed
