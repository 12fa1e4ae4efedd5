#!/usr/bin/env bash
# Installs, from Debian packages, everything Strata needs to build and test, then the
# data-preparation tool's Python environment from PyPI (tools/data_venv.sh; its tests run in
# the default suite) and the PyTorch environment of the Python package's tests (tools/py_venv.sh;
# pybind11-dev and python3-dev build the package itself). Idempotent: packages already present are not fetched again. CUDA is
# optional and is used when nvcc is found (it is not installed here). clang-14 and
# libclang-rt-14-dev (libFuzzer, ASan, UBSan) build the fuzz targets (tools/fuzz.sh).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libhwloc-dev libtbb-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libjsoncpp-dev libcli11-dev libfmt-dev libxxhash-dev
  libopenblas-pthread-dev
  libopenmpi-dev openmpi-bin
  clang-format
  python3 python3-venv python3-dev pybind11-dev
  clang-14 libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

echo "setup: data-preparation environment $(bash "$(dirname "$0")/data_venv.sh")"
echo "setup: PyTorch environment for the Python package's tests $(bash "$(dirname "$0")/py_venv.sh")"
