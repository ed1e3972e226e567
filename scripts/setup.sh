#!/usr/bin/env bash
# Quick start, part 1: install what is missing, build, and run the main job:
# compile the built-in all-reduce for an 8-GPU node into a plan (plan.json +
# cubins for sm_90) and print its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
build/mkc verify --schedule allreduce.ring --ranks 8
build/mkc compile --schedule allreduce.ring --ranks 8 --dtype bf16 --op sum --arch sm_90 -o plans/allreduce_ring_8
