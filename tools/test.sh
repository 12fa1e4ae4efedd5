#!/usr/bin/env bash
# Installs what is missing, builds, and runs the default test suite (every label but `slow`), then
# (without arguments) a short run of every fuzz target (tools/fuzz.sh: 2,000 inputs each, in
# build-fuzz/).
# Usage: tools/test.sh [extra ctest args...]   e.g. tools/test.sh -L slow   to run the slow tests
# Environment: STRATA_SANITIZE=address,undefined runs the suite under sanitizers (in build-asan/);
# STRATA_SKIP_FUZZ=1 skips the fuzz run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/tools/setup.sh"

build_dir="$root/build"
build_type=Release
if [ -n "${STRATA_SANITIZE:-}" ]; then
  build_dir="$root/build-asan"
  build_type=RelWithDebInfo
  # Full unwinding at malloc, so that leaks inside third-party libraries are matched by library
  # (tools/lsan.supp); frame-pointer unwinding stops in their frames.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0}"
  export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/tools/lsan.supp:print_suppressions=0}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
fi
bash "$root/tools/build.sh" "$build_dir" "$build_type"

cd "$build_dir"
default_run=0
if [ $# -eq 0 ]; then
  default_run=1
  set -- -LE slow
fi
ctest --output-on-failure --parallel "$(nproc)" "$@"
if [ "$default_run" = 1 ] && [ -z "${STRATA_SKIP_FUZZ:-}" ] && [ -z "${STRATA_SANITIZE:-}" ]; then
  bash "$root/tools/fuzz.sh" --runs 2000
fi
