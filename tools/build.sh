#!/usr/bin/env bash
# Configures and builds Strata. Usage: tools/build.sh [BUILD_DIR] [BUILD_TYPE] [extra cmake args...]
# Environment: STRATA_SANITIZE=address,undefined builds with sanitizers (use its own BUILD_DIR).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="${1:-$root/build}"
build_type="${2:-Release}"
shift $(( $# > 2 ? 2 : $# ))

generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build_dir/Makefile" ]; then
  generator=(-G Ninja)
fi
cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE="$build_type" \
  -DSTRATA_SANITIZE="${STRATA_SANITIZE:-}" "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
