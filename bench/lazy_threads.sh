#!/usr/bin/env bash
# bench/lazy_threads.sh BUILD_DIR [REPS] [ROUNDS]: recording every allocation
# (rate 1) on 1, 2 and 8 threads of one process, side by side in one run
# (interleaved, medians of REPS, default 7). Each configuration is a fresh
# process (bench/lazy_threads.cpp) whose threads start together:
#  - off:   sampling off (the workload's own cost and scaling);
#  - lazy:  the default policy, objects finding their rules one FDE at a time
#           until they build their tables (the loader's lock taken per lookup);
#  - build: every object builds its table at its first lookup.
# Prints wall and CPU ms, and CPU ns per allocation above `off`'s.
set -euo pipefail
build=${1:?usage: bench/lazy_threads.sh BUILD_DIR [REPS] [ROUNDS]}
reps=${2:-7}
rounds=${3:-100}
bin=$build/bench/bench_lazy_threads
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

declare -A wall cpu allocs
for ((r = 0; r < reps; r++)); do
  for t in 1 2 8; do
    for m in off lazy build; do
      # threads T MODE wall_ms W cpu_ms C (sys S) allocations A ...
      read -r _ _ _ _ w _ c _ _ _ a _ < <("$bin" "$t" "$m" "$((rounds * 8 / t))")
      wall[$t $m]+="$w "
      cpu[$t $m]+="$c "
      allocs[$t $m]=$a
    done
  done
done

echo "## rate 1 on T threads of one process, the same total work (median of $reps runs)"
printf '%-8s %-6s %10s %10s %12s %22s\n' threads mode wall_ms cpu_ms allocations "profiler CPU ns/alloc"
for t in 1 2 8; do
  off_cpu=$(echo "${cpu[$t off]}" | tr ' ' '\n' | grep . | median)
  for m in off lazy build; do
    w=$(echo "${wall[$t $m]}" | tr ' ' '\n' | grep . | median)
    c=$(echo "${cpu[$t $m]}" | tr ' ' '\n' | grep . | median)
    per=$(awk -v c="$c" -v o="$off_cpu" -v a="${allocs[$t $m]}" 'BEGIN {printf "%.1f", (c - o) * 1e6 / a}')
    [[ $m == off ]] && per=-
    printf '%-8s %-6s %10s %10s %12s %22s\n' "$t" "$m" "$w" "$c" "${allocs[$t $m]}" "$per"
  done
done
