#!/usr/bin/env bash
# What including heapprof costs a translation unit, side by side in one run:
# bench/compile_cost/handler.cpp (a request handler: <string>, <vector>,
# <map>, <unordered_map>, <memory>, <mutex>, <algorithm>) compiled at -O2 -c
# without heapprof and with it (-DWITH_HEAPPROF: ScopedLabels per request and
# heapprof::allocator vectors), for g++ and clang++. Runs alternate A/B and the
# table gives medians, their ratio and the preprocessed lines of each.
#
#   bench/compile_cost.sh [RUNS]           (default 11 runs of each)
#   HEAPPROF_INCLUDE=/old/checkout/include bench/compile_cost.sh
#                                          (measure another heapprof's headers)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs="${1:-11}"
inc="${HEAPPROF_INCLUDE:-$PWD/include}"
src=bench/compile_cost/handler.cpp
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# seconds CMD...: wall time of one run, in seconds with 3 decimals.
seconds() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }
  t1=$(date +%s%N)
  echo "scale=3; ($t1 - $t0) / 1000000000" | bc
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

printf '%-8s %12s %12s %7s %12s %12s %8s\n' compiler "without (s)" "with (s)" ratio "lines w/o" "lines with" "+lines"
for cxx in g++ clang++; do
  command -v "$cxx" >/dev/null || { echo "$cxx: not installed, skipped"; continue; }
  flags=(-std=c++17 -O2 -Wall -Wextra -I"$inc")
  : >"$tmp/a"; : >"$tmp/b"
  "$cxx" "${flags[@]}" -c "$src" -o "$tmp/warm.o"  # warm the page cache
  for ((i = 0; i < runs; i++)); do
    seconds "$cxx" "${flags[@]}" -c "$src" -o "$tmp/a.o" >>"$tmp/a"
    seconds "$cxx" "${flags[@]}" -DWITH_HEAPPROF -c "$src" -o "$tmp/b.o" >>"$tmp/b"
  done
  a=$(median <"$tmp/a"); b=$(median <"$tmp/b")
  la=$("$cxx" "${flags[@]}" -E -P "$src" | wc -l)
  lb=$("$cxx" "${flags[@]}" -DWITH_HEAPPROF -E -P "$src" | wc -l)
  printf '%-8s %12s %12s %7s %12s %12s %8s\n' "$cxx" "$a" "$b" "$(echo "scale=3; $b / $a" | bc)x" "$la" "$lb" "+$((lb - la))"
done
echo "($runs runs each, alternating; -std=c++17 -O2 -c; $(nproc) cores; $(uname -m))"
