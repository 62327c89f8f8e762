#!/usr/bin/env bash
# bench/malloc_run.sh BUILD_DIR [REPS]: the malloc side of heapprof, side by
# side in one run (interleaved, medians of REPS, default 7; thread CPU ns):
#  - a C program's malloc/free churn (bench/malloc_churn.cpp, depth 24, sizes
#    16-256 B): plain; heapprof compiled in (HEAPPROF_REPLACE_MALLOC); the plain
#    binary under LD_PRELOAD=libheapprof_preload.so; and the same on jemalloc
#    and tcmalloc (Debian libjemalloc2, libtcmalloc-minimal4) when installed;
#  - new/delete churn with sized and with unsized deletes (bench/churn.cpp).
# Then instructions per pair with callgrind (repeatable on a noisy machine).
set -euo pipefail
build=${1:?usage: bench/malloc_run.sh BUILD_DIR [REPS]}
reps=${2:-7}
bin=$build/bench
pairs=${PAIRS:-10000000}
preload=$build/libheapprof_preload.so
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

configs=(
  "glibc|plain||$bin/bench_malloc_churn_plain 0 $pairs 24"
  "glibc|heapprof compiled in, 524288||$bin/bench_malloc_churn_heapprof 524288 $pairs 24"
  "glibc|heapprof preloaded, 524288|LD_PRELOAD=$preload|$bin/bench_malloc_churn_plain 0 $pairs 24"
)
for alt in jemalloc:libjemalloc.so.2 tcmalloc:libtcmalloc_minimal.so.4; do
  lib=/usr/lib/$(uname -m)-linux-gnu/${alt#*:}
  [[ -e $lib ]] || continue
  configs+=(
    "${alt%%:*}|plain|LD_PRELOAD=$lib|$bin/bench_malloc_churn_plain 0 $pairs 24"
    "${alt%%:*}|heapprof compiled in, 524288|LD_PRELOAD=$lib|$bin/bench_malloc_churn_heapprof 524288 $pairs 24"
    "${alt%%:*}|heapprof preloaded, 524288|LD_PRELOAD=$preload:$lib|$bin/bench_malloc_churn_plain 0 $pairs 24"
  )
done
configs+=(
  "new/delete|plain, sized delete||$bin/bench_churn_plain 0 $pairs 24 sized"
  "new/delete|heapprof 524288, sized delete||$bin/bench_churn_heapprof 524288 $pairs 24 sized"
  "new/delete|plain, unsized delete[]||$bin/bench_churn_plain 0 $pairs 24 unsized"
  "new/delete|heapprof 524288, unsized delete[]||$bin/bench_churn_heapprof 524288 $pairs 24 unsized"
)
declare -A results
for ((r = 0; r < reps; r++)); do
  for c in "${configs[@]}"; do
    IFS='|' read -r group name envs cmd <<<"$c"
    results[$group|$name]+="$(env $envs $cmd) "
  done
done
printf '%-11s %-34s %9s %7s\n' allocator configuration ns/pair ratio
declare -A base
for c in "${configs[@]}"; do
  IFS='|' read -r group name envs cmd <<<"$c"
  m=$(echo "${results[$group|$name]}" | tr ' ' '\n' | grep . | median)
  key=$group
  [[ $group == new/delete ]] && key="$group ${name##*, }"
  [[ -z ${base[$key]:-} ]] && base[$key]=$m
  printf '%-11s %-34s %9.2f %7.3f\n' "$group" "$name" "$m" "$(echo "$m ${base[$key]}" | awk '{print $1/$2}')"
done

if command -v valgrind >/dev/null; then
  echo
  echo "## instructions per pair (callgrind, the churn loop only, 1M pairs, glibc)"
  ir() {  # ir COMMAND...: instructions per pair inside Churn (the 100k warm-up + 1M measured pairs)
    local out
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*Churn*' "$@" >/dev/null 2>"$out" || true
    awk '/Collected/ {print $4 / 1100000}' "$out"
    rm -f "$out"
  }
  printf '%-44s %8s\n' configuration instr/pair
  printf '%-44s %8.1f\n' "malloc/free plain" "$(ir "$bin/bench_malloc_churn_plain" 0 1000000 24)"
  printf '%-44s %8.1f\n' "malloc/free heapprof 524288" "$(ir "$bin/bench_malloc_churn_heapprof" 524288 1000000 24)"
  printf '%-44s %8.1f\n' "new/delete sized, plain" "$(ir "$bin/bench_churn_plain" 0 1000000 24 sized)"
  printf '%-44s %8.1f\n' "new/delete sized, heapprof 524288" "$(ir "$bin/bench_churn_heapprof" 524288 1000000 24 sized)"
  printf '%-44s %8.1f\n' "new/delete unsized delete[], plain" "$(ir "$bin/bench_churn_plain" 0 1000000 24 unsized)"
  printf '%-44s %8.1f\n' "new/delete unsized delete[], heapprof 524288" "$(ir "$bin/bench_churn_heapprof" 524288 1000000 24 unsized)"
fi
