#!/usr/bin/env bash
# Runs the GPU suite on a machine with NVIDIA GPUs and prints a summary.
#
#   tests/gpu/run.sh [BUILD_DIR] [--quick] [--only NAME|=NAME] (=: that scenario only)
#       the whole suite (or the scenarios --only names) in one mk_gpu_tests process
#   tests/gpu/run.sh [BUILD_DIR] [--quick] --scenarios "A B ..." [--limit S] [--deadline S]
#                    [--logs DIR] [--memcheck NAME] [--racecheck NAME] [--no-prewarm]
#       each named scenario in its own mk_gpu_tests process, at most S seconds each
#       (--limit, default 300), none started after --deadline seconds (default: no
#       deadline; the rest print "NOT RUN (time)"); its output into DIR/NAME.log
#       (--logs, default $OUT/suite when $OUT is set, else a temporary directory,
#       archived as suite-logs.tgz beside it); then NAME under compute-sanitizer's
#       memcheck or racecheck. "--scenarios all" is every scenario in the suite's order.
#
# 1. compiles every plan the suite needs on all CPU cores (into the JIT cache),
# 2. runs build/tests/mk_gpu_tests (each scenario in its own processes).
# Without a GPU the suite prints SKIPPED and exits 0. A session's record of
# what ran (the command line, the summary, logs) goes under
# bench/results/runs/DATE-NAME/.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$here/build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
# Never enable NVLink multicast on shared machines.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export MK_CACHE_DIR=${MK_CACHE_DIR:-$build/gpu-cache}
export MK_TIMEOUT_MS=${MK_TIMEOUT_MS:-60000}
export LD_LIBRARY_PATH=$build:${LD_LIBRARY_PATH:-}
bin=$build/tests/mk_gpu_tests
[ -x "$bin" ] || bin=$build/mk_gpu_tests  # a folder of carried binaries
pass=() scenarios="" limit=300 deadline="" logs="" memcheck="" racecheck="" prewarm=1
while [ $# -gt 0 ]; do
  case "$1" in
    --scenarios) scenarios=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --memcheck) memcheck=$2; shift 2 ;;
    --racecheck) racecheck=$2; shift 2 ;;
    --no-prewarm) prewarm=0; shift ;;
    *) pass+=("$1"); shift ;;
  esac
done
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi -L
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  [ $prewarm = 1 ] && "$bin" --prewarm "$arch"
fi
if [ -z "$scenarios" ] && [ -z "$memcheck" ] && [ -z "$racecheck" ]; then
  exec "$bin" "${pass[@]}"
fi
[ "$scenarios" = all ] && scenarios=$("$bin" --list)
logs=${logs:-${OUT:+$OUT/suite}}
logs=${logs:-$(mktemp -d)}
mkdir -p "$logs"
t0=$(date +%s) failed=0
for s in $scenarios; do
  el=$(( $(date +%s) - t0 ))
  if [ -n "$deadline" ] && [ $el -ge "$deadline" ]; then echo "NOT RUN (time): $s"; continue; fi
  ts=$(date +%s)
  timeout "$limit" "$bin" "${pass[@]}" --only "=$s" > "$logs/$s.log" 2>&1
  rc=$?
  r=$(grep -E "^(PASS|FAIL|SKIP)[A-Z]* +$s|^SKIPPED: no GPU" "$logs/$s.log" | head -1)
  echo "${r:-NO RESULT $s} rc=$rc ($(( $(date +%s) - ts )) s)"
  if [ $rc -ne 0 ]; then
    failed=1
    tail -4 "$logs/$s.log"
  fi
done
for tool in memcheck racecheck; do
  s=${!tool}
  [ -z "$s" ] && continue
  timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 9 "$bin" "${pass[@]}" --only "=$s" \
    > "$logs/$tool-$s.log" 2>&1
  rc=$?
  echo "== $tool $s rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/$tool-$s.log" | tail -1)"
  [ $rc -ne 0 ] && failed=1
done
tar czf "$logs/../suite-logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")" 2>/dev/null
exit $failed
