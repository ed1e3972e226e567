#!/bin/sh
# Compile-scale benchmark: for each schedule and rank count, the time of
# `mkc verify` and of a cold `mkc compile` (fresh cache: lowering, codegen and
# NVRTC for every size bucket, with mkc's own split of the three) and the
# peak memory (max RSS, MiB) of each. Not a test: it takes minutes. Prints a
# markdown table.
#
#   bench/compile/run.sh [BUILD_DIR] [RANKS...]     (default: build, 2 4 8 16 64 256 1024)
#
# Every plan is bf16 sum (MK_BENCH_DTYPE sets another dtype). Schedules: every
# built-in that compiles to a kernel (copy-engine ones have none) at up to 64
# ranks; every built-in fusion (`mkc list`'s fusions) on every all-reduce
# schedule at up to 64 ranks (`--fusion NAME`, its plan as the runtime's first
# fused call compiles it); the hierarchical ones
# (allreduce.hier, allgather.hier, reducescatter.hier, compiled with
# --topology (N/8)x8:direct: 8 GPUs a node, every pair linked, so that it
# measures the compiler and not the transport) and allreduce.halving_doubling
# at every rank count. Up to 64 ranks the plan serves every rank; above, it is
# one rank's plan (`mkc compile --rank 0`: only rank 0's class), as a rank's
# runtime JIT compiles it. MK_BENCH_TIMEOUT (seconds, default 600) bounds each
# command; a command over it shows "timeout". MK_BENCH_REPEAT (default 1): runs
# of each command, the fastest kept (a shared machine's speed drifts by 2x).
# MK_BENCH_RANK_PLAN=1: rank 0's plan at every rank count (what a rank's first
# call compiles: its own class's code path only), not the plan of every rank.
# MK_BENCH_TUNE: MK_TUNE-style knobs for every compile (e.g. one_pass_generic=1).
set -u
# NVRTC 12.9+ also keeps its results in the driver's compute cache (~/.nv)
# where a libcuda is loadable (the GPU host; not the CPU machine, which has
# none): a second run there would time cache hits. Cold means both off.
export CUDA_CACHE_DISABLE=1
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
[ $# -gt 0 ] && shift
ranks=${*:-2 4 8 16 64 256 1024}
dtype=${MK_BENCH_DTYPE:-bf16}
mkc=$build/mkc
limit=${MK_BENCH_TIMEOUT:-600}
if [ ! -x "$mkc" ]; then echo "run.sh: $mkc not found; build mkc first" >&2; exit 2; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run CMD...: seconds and peak MB of CMD into $secs $mb, its status into $rc.
# MK_BENCH_REPEAT=K runs it K times (the cache cleared before each) and keeps
# the least time and the largest peak: a shared machine's speed drifts.
repeat=${MK_BENCH_REPEAT:-1}
run() {
  secs="" mb=0
  r_k=0
  while [ $r_k -lt "$repeat" ]; do
    r_k=$((r_k + 1))
    [ -n "${MK_CACHE_DIR:-}" ] && rm -rf "$MK_CACHE_DIR" && mkdir -m 700 "$MK_CACHE_DIR"
    /usr/bin/time -f '%e %M' -o "$tmp/time" timeout "$limit" "$@" >"$tmp/out" 2>&1
    rc=$?
    if [ $rc -eq 124 ]; then secs="timeout"; return; fi
    # the last line: time(1) writes "Command exited with non-zero status N" above it
    r_s=$(tail -1 "$tmp/time" | awk '{ print $1 }')
    r_m=$(tail -1 "$tmp/time" | awk '{ printf "%d", $2 / 1024 }')
    if [ -z "$secs" ] || [ "$(echo "$r_s < $secs" | bc)" = 1 ]; then secs=$r_s; cp "$tmp/out" "$tmp/best"; fi
    [ "$r_m" -gt "$mb" ] && mb=$r_m
    [ $rc -ne 0 ] && return
  done
  cp "$tmp/best" "$tmp/out"  # mkc's own split, of the fastest run
}

# row LABEL N TOPOLOGY SCHEDULE-ARGS...: a table row
row() {
  label=$1 n=$2 topo=$3
  shift 3
  export MK_CACHE_DIR="$tmp/cache.$n"
  rm -rf "$MK_CACHE_DIR"
  mkdir -m 700 "$MK_CACHE_DIR"
  if [ "$topo" = - ]; then set -- "$@" -n "$n"; else set -- "$@" --topology "$topo"; fi
  set -- "$@" --dtype "$dtype"
  [ -n "${MK_BENCH_TUNE:-}" ] && set -- "$@" --tune "$MK_BENCH_TUNE"
  plan=all
  [ "$n" -gt 64 ] || [ "${MK_BENCH_RANK_PLAN:-0}" = 1 ] && plan="rank 0"
  run "$mkc" verify "$@"
  vs=$secs vmb=$mb vrc=$rc
  vnote=""
  [ $vrc -ne 0 ] && vnote="verify: $(grep -m1 -o 'mk\.[a-z]*\.E[0-9]*\|internal error\|Killed\|bad_alloc' "$tmp/out") (rc $vrc)"
  if [ "$plan" = all ]; then run "$mkc" compile "$@" -o "$tmp/plan"; else run "$mkc" compile "$@" --rank 0 -o "$tmp/plan"; fi
  note="$vnote"
  if [ $rc -ne 0 ] && [ "$secs" != timeout ]; then
    note="$note compile: $(grep -m1 -o 'mk\.[a-z]*\.E[0-9]*\|internal error\|Killed\|bad_alloc' "$tmp/out") (rc $rc)"
  fi
  classes=$(grep -o 'classes=[0-9]*' "$tmp/out" | cut -d= -f2 | sort -n | tail -1)
  # "...; 1234 ms (lower 12, codegen 3, NVRTC 1200)"
  split=$(sed -n 's/.*ms (lower \([0-9]*\), codegen \([0-9]*\), NVRTC \([0-9]*\).*/\1 | \2 | \3/p' "$tmp/out" | tail -1)
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$n" "$topo" "$plan" "$vs" "$vmb" \
    "$secs" "${split:-- | - | -}" "$mb" "${classes:--}" "$note"
}

echo "| schedule | ranks | topology | plan | verify s | verify MB | compile s | lower ms | codegen ms | NVRTC ms | compile MB | classes | note |"
echo "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
# `mkc list`: schedules, then a blank line and the composites, then the fusions.
schedules=$("$mkc" list | awk 'NR > 1 && NF == 0 { exit } NR > 1 { print $1 }')
fusions=$("$mkc" list | awk '/^fusion / { f = 1; next } f && NF > 0 { print $1 }')
for s in $schedules; do
  case $s in *.ce) continue ;; esac  # copy engines: no kernel to compile
  for n in $ranks; do
    case $s in
      *.hier)
        [ $((n % 8)) -eq 0 ] || continue
        row "$s" "$n" "$((n / 8))x8:direct" -s "$s" ;;
      allreduce.halving_doubling) row "$s" "$n" - -s "$s" ;;
      *) [ "$n" -le 64 ] && row "$s" "$n" - -s "$s" ;;
    esac
  done
done
for f in $fusions; do
  for s in $schedules; do
    case $s in allreduce.*) ;; *) continue ;; esac
    case $s in *.ce | *.hier) continue ;; esac
    for n in $ranks; do
      [ "$n" -le 64 ] && row "$s --fusion $f" "$n" - -s "$s" --fusion "$f"
    done
  done
done
