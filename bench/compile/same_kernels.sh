#!/bin/bash
# Are two builds' kernels byte-identical? For a list of one-node plans (every
# collective, several schedules, dtypes, ops, zero-copy and the :direct
# hierarchical stand-in), `mkc compile --no-cache` with each build's mkc
# (each with its own MK_CACHE_DIR) and the sha256 of the cubins compared.
# Not a test: a check for changes that must not touch device code.
#
#   bench/compile/same_kernels.sh OLD_BUILD_DIR [NEW_BUILD_DIR]   (default new: build)
#
# e.g. git worktree add /tmp/old REV && (cd /tmp/old && cmake --preset default &&
#      ninja -C build mkc) && bench/compile/same_kernels.sh /tmp/old/build
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
old=${1:?usage: same_kernels.sh OLD_BUILD_DIR [NEW_BUILD_DIR]}
new=${2:-$here/build}
for b in "$old" "$new"; do [ -x "$b/mkc" ] || { echo "same_kernels.sh: $b/mkc not found" >&2; exit 2; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
same=0 differ=0 failed=0
while read -r s args; do
  ok=1
  for v in old new; do
    b=$old; [ $v = new ] && b=$new
    # shellcheck disable=SC2086  # $args is a list of options
    MK_CACHE_DIR=$tmp/cache-$v "$b/mkc" compile -s "$s" $args --no-cache -o "$tmp/$v" >"$tmp/$v.log" 2>&1 ||
      { echo "FAILED ($v): $s $args: $(tail -1 "$tmp/$v.log")"; ok=0; }
  done
  if [ $ok = 1 ]; then
    a=$(cd "$tmp/old" && sha256sum ./*.cubin | sha256sum)
    c=$(cd "$tmp/new" && sha256sum ./*.cubin | sha256sum)
    n=$(find "$tmp/new" -name '*.cubin' | wc -l)
    if [ "$a" = "$c" ]; then same=$((same + 1)); echo "same    $s $args ($n cubins)"
    else differ=$((differ + 1)); echo "DIFFER  $s $args"; fi
  else
    failed=$((failed + 1))
  fi
  rm -rf "$tmp/old" "$tmp/new"
done <<'LIST'
allreduce.ring --ranks 8 --dtype bf16 --op sum
allreduce.one_shot --ranks 4 --dtype fp32 --op sum
allreduce.two_shot --ranks 8 --dtype bf16 --op sum
allreduce.halving_doubling --ranks 8 --dtype bf16 --op sum
allreduce.direct --ranks 8 --dtype fp32 --op sum --zero-copy
allgather.direct --ranks 8 --dtype fp16
allgather.ring --ranks 4 --dtype fp32
reducescatter.direct --ranks 4 --dtype bf16 --op sum
reducescatter.pull --ranks 4 --dtype bf16 --op sum --zero-copy
reducescatter.ring --ranks 3 --dtype fp32 --op max
broadcast.direct --ranks 3 --dtype fp32
reduce.direct --ranks 4 --dtype fp32 --op max
alltoall.direct --ranks 8 --dtype fp32
allreduce.hier --topology 2x4:direct --dtype bf16 --op sum
LIST
echo "same: $same, differ: $differ, failed: $failed"
[ $differ = 0 ] && [ $failed = 0 ]
