#!/bin/sh
# Compile-scale benchmark: for each schedule and rank count, the time of
# `mkc verify` and of a cold `mkc compile` (fresh cache: lowering, codegen and
# NVRTC for every size bucket) and the compile's peak memory (max RSS).
# Not a test: it takes minutes. Prints a markdown table.
#
#   bench/compile/run.sh [BUILD_DIR] [RANKS...]     (default: build, 8 64 256 1024)
#
# Schedules: every built-in at 8 and 64 ranks; the hierarchical ones
# (allreduce.hier, allgather.hier, reducescatter.hier: skipped, with a line
# saying so, while not registered) and allreduce.halving_doubling at every
# rank count; and the TEST-ONLY stand-ins bench/compile/hier_*.cpp (8 GPUs a
# node) at every rank count. Compiled with the default single-node topology
# of the same rank count. MK_BENCH_TIMEOUT (seconds, default 600) bounds each
# command; a command over it shows "timeout".
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
[ $# -gt 0 ] && shift
ranks=${*:-8 64 256 1024}
mkc=$build/mkc
limit=${MK_BENCH_TIMEOUT:-600}
if [ ! -x "$mkc" ]; then echo "run.sh: $mkc not found; build mkc first" >&2; exit 2; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

registered() { "$mkc" list | awk 'NR > 1 { print $1 }' | grep -qx "$1"; }

# run LABEL CMD...: seconds and peak MB of CMD into $secs $mb, its status into $rc
run() {
  /usr/bin/time -f '%e %M' -o "$tmp/time" timeout "$limit" "$@" >"$tmp/out" 2>&1
  rc=$?
  secs=$(awk '{ print $1 }' "$tmp/time" | tail -1)
  mb=$(awk '{ printf "%d", $2 / 1024 }' "$tmp/time" | tail -1)
  if [ $rc -eq 124 ]; then secs="timeout"; fi
}

# one SCHEDULE-ARGS N: a table row
row() {
  label=$1 n=$2
  shift 2
  export MK_CACHE_DIR="$tmp/cache.$n"
  rm -rf "$MK_CACHE_DIR"
  mkdir -m 700 "$MK_CACHE_DIR"
  "$mkc" verify "$@" -n 1 >/dev/null 2>&1  # a plugin's host compilation is not what we measure
  run "$mkc" verify "$@" -n "$n"
  vs=$secs vrc=$rc
  run "$mkc" compile "$@" -n "$n" -o "$tmp/plan"
  note=""
  [ $vrc -ne 0 ] && note="verify failed: $(grep -m1 error "$tmp/out" | cut -c1-80)"
  if [ $rc -ne 0 ] && [ "$secs" != timeout ]; then note="$note $(grep -m1 -o 'mk\.[a-z]*\.E[0-9]*' "$tmp/out")"; fi
  classes=$(grep -o 'classes=[0-9]*' "$tmp/out" | cut -d= -f2 | sort -n | tail -1)
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$n" "$vs" "$secs" "$mb" "${classes:--}" "$note"
}

echo "| schedule | ranks | verify s | compile s | peak MB | classes | note |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
for s in $("$mkc" list | awk 'NR > 1 { print $1 }'); do
  for n in $ranks; do
    case $s in allreduce.halving_doubling|*.hier) ;; *) [ "$n" -gt 64 ] && continue ;; esac
    row "$s" "$n" -s "$s"
  done
done
for s in allreduce.hier allgather.hier reducescatter.hier; do
  registered "$s" || echo "skipped $s: not registered (lands with the topology work)" >&2
done
for f in allreduce allgather reducescatter; do
  for n in $ranks; do row "test.$f.hier8" "$n" "$here/bench/compile/hier_$f.cpp"; done
done
