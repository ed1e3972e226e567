#!/bin/bash
# Cold compile time of a few plans with two libmkernel builds side by side,
# alternating, in the same phase of the machine (whose speed drifts by up to
# 2x: tables of separate runs do not compare). Prints a markdown table: the
# plan of every rank with the old library and the new one, rank 0's plan (what
# its first call compiles) and the plan of every rank with
# MK_TUNE one_pass_generic=1, all with the new `mkc`.
#
#   bench/compile/side_by_side.sh OLD_LIB_DIR [BUILD_DIR]
#
# OLD_LIB_DIR holds the old libmkernel.so.0 (e.g. built at the old commit).
set -u
# NVRTC 12.9+ also keeps its results in the driver's compute cache (~/.nv)
# where a libcuda is loadable (the GPU host; not the CPU machine, which has
# none): a second run there would time cache hits. Cold means both off.
export CUDA_CACHE_DISABLE=1
old=${1:?usage: side_by_side.sh OLD_LIB_DIR [BUILD_DIR]}
build=${2:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t() {  # LIBDIR ARGS: wall seconds of a cold compile
  rm -rf "$tmp/c" "$tmp/o"
  /usr/bin/time -f %e -o "$tmp/t" env LD_LIBRARY_PATH="$1" MK_CACHE_DIR="$tmp/c" "$build/mkc" compile $2 --dtype bf16 \
    -o "$tmp/o" >/dev/null 2>&1
  tail -1 "$tmp/t"
}
printf '| plan | old s | new s | new, rank 0 s | new, one_pass_generic=1 s |\n| --- | ---: | ---: | ---: | ---: |\n'
while read -r label args; do
  printf '| %s | %s | %s | %s | %s |\n' "$label" "$(t "$old" "$args")" "$(t "$build" "$args")" \
    "$(t "$build" "$args --rank 0")" "$(t "$build" "$args --tune one_pass_generic=1")"
done <<'LIST'
one_shot-n4 -s allreduce.one_shot -n 4
one_shot-n8 -s allreduce.one_shot -n 8
one_shot-n16 -s allreduce.one_shot -n 16
one_shot-n64 -s allreduce.one_shot -n 64
one_shot+rmsnorm-n8 -s allreduce.one_shot -n 8 --fusion allreduce.rmsnorm
two_shot-n16 -s allreduce.two_shot -n 16
two_shot-n64 -s allreduce.two_shot -n 64
reducescatter.direct-n64 -s reducescatter.direct -n 64
allgather.direct-n64 -s allgather.direct -n 64
alltoall.direct-n16 -s alltoall.direct -n 16
broadcast.direct-n64 -s broadcast.direct -n 64
reducescatter.hier-1x8 -s reducescatter.hier --topology 1x8:direct
reducescatter.pull-n8 -s reducescatter.pull -n 8
allreduce.ring-n64 -s allreduce.ring -n 64
LIST
