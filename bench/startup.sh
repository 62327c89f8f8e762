#!/usr/bin/env bash
# bench/startup.sh BUILD_DIR [STARTS] [REPS]: what heapprof adds to starting a
# process, side by side in one run (interleaved, medians of REPS, default 5):
# STARTS (default 500) starts of each configuration, wall time per start, and
# what each adds to the plain program's. Then instructions per start
# (callgrind, when valgrind is present: repeatable on a noisy machine).
#  - bench_startup (bench/startup.cpp), plain and with heapprof compiled in,
#    sampling off (rate=0) and at the default rate. At the default rate a
#    start samples now and then: libstdc++ allocates a 72 KiB pool at start-up
#    (13% of starts sample it at 512 KiB), and a first sample finds the
#    unwind rules of its stack one FDE at a time (rate=1: every start does);
#  - /bin/true (a C program), plain and under LD_PRELOAD=libheapprof_preload.so
#    (which also loads libstdc++ into it).
set -euo pipefail
build=${1:?usage: bench/startup.sh BUILD_DIR [STARTS] [REPS]}
starts=${2:-500}
reps=${3:-5}
bin=$build/bench
preload=$build/libheapprof_preload.so
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

configs=(
  "startup plain||$bin/bench_startup_plain"
  "startup heapprof, sampling off|HEAPPROF=rate=0|$bin/bench_startup_heapprof"
  "startup heapprof, default rate||$bin/bench_startup_heapprof"
  "startup heapprof, rate=1 (a first sample)|HEAPPROF=rate=1|$bin/bench_startup_heapprof"
  "/bin/true plain||/bin/true"
)
[[ -e $preload ]] && configs+=(
  "/bin/true preloaded, sampling off|LD_PRELOAD=$preload HEAPPROF=rate=0|/bin/true"
  "/bin/true preloaded, default rate|LD_PRELOAD=$preload|/bin/true"
)
# Wall microseconds per start of `env ... cmd` (the loop's own fork and exec
# included: the same for every configuration).
time_starts() {
  local envs=$1 cmd=$2 t0 t1
  t0=$(date +%s%N)
  for ((i = 0; i < starts; i++)); do env -u HEAPPROF $envs $cmd >/dev/null; done
  t1=$(date +%s%N)
  echo $(((t1 - t0) / starts / 1000))
}
declare -A results
for ((r = 0; r < reps; r++)); do
  for c in "${configs[@]}"; do
    IFS='|' read -r name envs cmd <<<"$c"
    results[$name]+="$(time_starts "$envs" "$cmd") "
  done
done

echo "## process start-up: wall us per start (median of $reps runs of $starts starts each)"
printf '%-46s %10s %10s\n' configuration us/start added
for c in "${configs[@]}"; do
  IFS='|' read -r name envs cmd <<<"$c"
  m=$(echo "${results[$name]}" | tr ' ' '\n' | grep . | median)
  case $name in
    /bin/true*) base=$(echo "${results[/bin/true plain]}" | tr ' ' '\n' | grep . | median) ;;
    *) base=$(echo "${results[startup plain]}" | tr ' ' '\n' | grep . | median) ;;
  esac
  printf '%-46s %10s %+10s\n' "$name" "$m" "$((m - base))"
done

if command -v valgrind >/dev/null; then
  echo
  echo "## instructions per start (callgrind, whole process)"
  for c in "${configs[@]}"; do
    IFS='|' read -r name envs cmd <<<"$c"
    [[ $name == *default* ]] && continue  # sampled or not by chance
    n=$(env -u HEAPPROF $envs valgrind --tool=callgrind --callgrind-out-file=/dev/null $cmd 2>&1 |
      sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
    printf '%-46s %12s\n' "$name" "$n"
  done
fi
