#!/usr/bin/env bash
# Configures (once) and builds into build/ with the default CMake preset.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/build.ninja ] || cmake --preset default ${MK_CUDA_ROOT:+-DMK_CUDA_ROOT=$MK_CUDA_ROOT}
cmake --build --preset default
