#!/usr/bin/env bash
# Runs the Python package's tests (python/tests, pytest) against a build: CTest's python.pytest
# calls it with the build folder; by hand: tools/py_test.sh build [pytest args...].
# The tests need torch, transformers and pytest: tools/py_venv.sh provides them in
# ~/.cache/strata/py-venv (tools/setup.sh runs it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="$(cd "${1:-$root/build}" && pwd)"
shift $(( $# > 0 ? 1 : 0 ))
python="$(bash "$root/tools/py_venv.sh")"
if [ ! -f "$build_dir/python/strata/__init__.py" ]; then
  echo "py_test: $build_dir/python/strata is missing: configure with -DSTRATA_PYTHON=ON (needs pybind11-dev and python3-dev)" >&2
  exit 1
fi
# A build with sanitizers (STRATA_SANITIZE=... and STRATA_PYTHON=ON) has an instrumented
# extension: python needs the sanitizer runtimes loaded first. Leaks are not checked (python and
# torch keep memory to the end by design); every other error aborts.
sanitize="$(sed -n 's/^STRATA_SANITIZE:STRING=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)"
if [ -n "$sanitize" ]; then
  preload=""
  case "$sanitize" in *address*) preload="$(gcc -print-file-name=libasan.so)" ;; esac
  case "$sanitize" in *undefined*) preload="$preload${preload:+:}$(gcc -print-file-name=libubsan.so)" ;; esac
  export LD_PRELOAD="$preload${LD_PRELOAD:+:$LD_PRELOAD}"
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
fi
export PYTHONPATH="$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"
export STRATA_BIN="${STRATA_BIN:-$build_dir/strata}"
export STRATA_REQUIRE_PYTHON="${STRATA_REQUIRE_PYTHON:-1}"
cd "$root"
exec "$python" -m pytest -q -p no:cacheprovider python/tests "$@"
