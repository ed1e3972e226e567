#!/usr/bin/env bash
# Installs the Debian packages mKernel builds with (only what is missing).
# The CUDA toolkit (NVRTC, cuda.h, nccl.h) is expected under /usr/local/cuda.
set -euo pipefail
# python3-venv and python3-pip: the Python package's test builds the wheel and
# installs it into a fresh virtualenv (offline). libibverbs-dev: rdma-core's headers
# for the verbs transport (opened lazily, never linked) and its fake in tests.
pkgs=(cmake ninja-build g++ nlohmann-json3-dev libfmt-dev doctest-dev libcli11-dev python3 python3-venv python3-pip
      libibverbs-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ! -f "${MK_CUDA_ROOT:-/usr/local/cuda}/include/nvrtc.h" ]; then
  echo "error: the CUDA toolkit (nvrtc.h) is not under ${MK_CUDA_ROOT:-/usr/local/cuda}; set MK_CUDA_ROOT" >&2
  exit 1
fi
