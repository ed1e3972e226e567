#!/usr/bin/env bash
# Runs the whole GPU suite on a machine with NVIDIA GPUs and prints a summary.
#
#   tests/gpu/run.sh [BUILD_DIR] [--quick] [--only NAME|=NAME] (=: that scenario only)
#
# 1. compiles every plan the suite needs on all CPU cores (into the JIT cache),
# 2. runs build/tests/mk_gpu_tests (each scenario in its own processes).
# Without a GPU the suite prints SKIPPED and exits 0.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
[ $# -gt 0 ] && shift
# Never enable NVLink multicast on shared machines.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export MK_CACHE_DIR=${MK_CACHE_DIR:-$build/gpu-cache}
export MK_TIMEOUT_MS=${MK_TIMEOUT_MS:-60000}
export LD_LIBRARY_PATH=$build:${LD_LIBRARY_PATH:-}
bin=$build/tests/mk_gpu_tests
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi -L
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  "$bin" --prewarm "$arch"
fi
"$bin" "$@"
