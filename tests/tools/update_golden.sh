#!/bin/sh
# Rewrites the golden files in tests/golden/ from the current code, then shows
# what changed. Review the diff before committing: a golden file is a reviewed
# snapshot, not something to refresh blindly.
#
#   tests/tools/update_golden.sh [BUILD_DIR]     (default: build)
#
# It runs only the golden tests (names containing "golden") with
# MK_UPDATE_GOLDEN=1, which makes them write their output instead of comparing.
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
tests=$build/tests/mk_tests
if [ ! -x "$tests" ]; then
  echo "update_golden: $tests not found; build first (cmake --build $build)" >&2
  exit 2
fi
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
MK_UPDATE_GOLDEN=1 MK_CACHE_DIR=$cache "$tests" -tc='*golden*'
# and check that they now pass as ordinary tests
MK_CACHE_DIR=$cache "$tests" -tc='*golden*' >/dev/null
cd "$here"
if command -v git >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; then
  git status --short -- tests/golden
  git --no-pager diff --stat -- tests/golden
fi
