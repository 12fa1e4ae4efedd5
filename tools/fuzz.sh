#!/usr/bin/env bash
# Builds the fuzz targets of tests/fuzz (libFuzzer with AddressSanitizer and UBSan; clang) in
# build-fuzz/ and runs each from its seed corpus (tests/fuzz/corpus/<target>/). A crash, a hang
# (-timeout), running out of memory (-rss_limit_mb) or a rejection without a named error stops
# it with a non-zero exit and leaves the input in build-fuzz/artifacts/.
# Usage: tools/fuzz.sh [--runs N | --time SECONDS] [TARGET...]
#   tools/fuzz.sh                     2,000 inputs per target after its corpus (tools/test.sh runs this)
#   tools/fuzz.sh --time 3600         an hour per target (the long run of docs/reliability.md)
#   tools/fuzz.sh fuzz_safetensors    one target
# Environment: STRATA_FUZZ_CXX (default clang++-14, else clang++).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"
limit=(-runs=2000)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) limit=(-runs="$2"); shift 2 ;;
    --time) limit=(-max_total_time="$2"); shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done

cxx="${STRATA_FUZZ_CXX:-}"
if [ -z "$cxx" ]; then
  for candidate in clang++-14 clang++; do
    if command -v "$candidate" >/dev/null 2>&1; then cxx="$candidate"; break; fi
  done
fi
if [ -z "$cxx" ]; then
  echo "fuzz: no clang++ found; install clang and libclang-rt-dev (tools/setup.sh does)" >&2
  exit 1
fi
generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build/Makefile" ]; then generator=(-G Ninja); fi
launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$root" -B "$build" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$cxx" -DSTRATA_FUZZ=ON -DSTRATA_CUDA=OFF -DSTRATA_MPI=OFF \
  -DSTRATA_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --parallel "$(nproc)"

if [ ${#targets[@]} -eq 0 ]; then
  for corpus in "$root"/tests/fuzz/corpus/*/; do targets+=("$(basename "$corpus")"); done
fi
mkdir -p "$build/artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
for target in "${targets[@]}"; do
  work="$(mktemp -d)"  # new inputs go here; the seed corpus in the repository stays as it is
  log="$build/artifacts/$target.log"
  echo "fuzz: $target (${limit[*]})"
  if ! "$build/tests/fuzz/$target" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
      -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" \
      "$work" "$root/tests/fuzz/corpus/$target" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz: $target FAILED; the input is in $build/artifacts/ (log: $log)" >&2
    rm -rf "$work"
    exit 1
  fi
  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$log" | tail -n 2 | sed "s/^/fuzz: $target: /"
  rm -rf "$work"
done
echo "fuzz: ${#targets[@]} target(s), no crash, hang or unnamed rejection"
