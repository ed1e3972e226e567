#!/bin/sh
# What proving network operations costs: `mkc verify` (lowering, sync and the
# proof of every size bucket) of the hierarchical schedules on NxG (transfers
# between nodes become puts, proved in the verifier's network model) and on
# NxG:direct (the same shape with every pair linked: plain stores), time and
# peak memory side by side. Not a test. Prints a markdown table.
#
#   bench/compile/network.sh [BUILD_DIR] [SHAPES...]   (default: build, 2x4 8x8 32x8 128x8)
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
[ $# -gt 0 ] && shift
shapes=${*:-2x4 8x8 32x8 128x8}
mkc=$build/mkc
if [ ! -x "$mkc" ]; then echo "network.sh: $mkc not found; build mkc first" >&2; exit 2; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one: secs and peak MB of `mkc verify -s $1 --topology $2`, or its error
one() {
  /usr/bin/time -f '%e %M' -o "$tmp/time" "$mkc" verify -s "$1" --topology "$2" >"$tmp/out" 2>&1
  if [ $? -ne 0 ]; then echo "error: $(grep -o 'mk\.[a-z]*\.E[0-9]*' "$tmp/out" | head -1)"; return; fi
  tail -1 "$tmp/time" | awk '{ printf "%.2f s, %d MiB", $1, $2 / 1024 }'
}
echo "| schedule | shape | ops (NxG) | NxG (puts) | NxG:direct |"
echo "| --- | --- | ---: | --- | --- |"
for s in allreduce.hier allreduce.hier_tree allgather.hier reducescatter.hier reducescatter.hier_direct; do
  for t in $shapes; do
    net=$(one "$s" "$t")
    ops=$(grep -o '[0-9]* operations' "$tmp/out" | head -1 | awk '{ print $1 }')
    direct=$(one "$s" "$t:direct")
    echo "| $s | $t | ${ops:-?} | $net | $direct |"
  done
done
