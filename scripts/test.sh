#!/usr/bin/env bash
# Quick start, part 2: build (if needed) and run the whole test suite. GPU
# tests print SKIPPED on machines without a GPU (run them with tests/gpu/run.sh
# on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --preset default "$@"
