#!/usr/bin/env bash
# bench/run.sh BUILD_DIR [REPS]: heapprof side by side with a plain build, in
# one run. Runs every configuration REPS times (default 7), interleaved so
# machine noise hits all of them alike, and prints medians and ratios.
# Also counts instructions per pair with callgrind when valgrind is present:
# repeatable even on a noisy machine.
set -euo pipefail
build=${1:?usage: bench/run.sh BUILD_DIR [REPS]}
reps=${2:-7}
bin=$build/bench
pairs=${PAIRS:-20000000}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

configs=(
  "plain|$bin/bench_churn_plain 0 $pairs 24 sized"
  "heapprof rate 0|$bin/bench_churn_heapprof 0 $pairs 24 sized"
  "heapprof rate 524288|$bin/bench_churn_heapprof 524288 $pairs 24 sized"
  "heapprof rate 1|$bin/bench_churn_heapprof 1 $((pairs / 20)) 24 sized"
  "plain (unsized delete)|$bin/bench_churn_plain 0 $pairs 24 unsized"
  "heapprof rate 524288 (unsized delete)|$bin/bench_churn_heapprof 524288 $pairs 24 unsized"
)
declare -A results
for ((r = 0; r < reps; r++)); do
  for c in "${configs[@]}"; do
    name=${c%%|*}
    results[$name]+="$(${c#*|}) "
  done
done

echo "## new+delete pair, mixed sizes 16-256 B, stack depth 24 (median of $reps, ns)"
printf '%-40s %10s %8s\n' configuration ns/pair ratio
plain=$(echo "${results[plain]}" | tr ' ' '\n' | grep . | median)
plain_unsized=$(echo "${results[plain (unsized delete)]}" | tr ' ' '\n' | grep . | median)
for c in "${configs[@]}"; do
  name=${c%%|*}
  m=$(echo "${results[$name]}" | tr ' ' '\n' | grep . | median)
  base=$plain
  [[ $name == *unsized* ]] && base=$plain_unsized
  printf '%-40s %10.2f %8.3f\n' "$name" "$m" "$(echo "$m $base" | awk '{print $1/$2}')"
done

echo
echo "## one sample at depth 32 (unwind + record)"
"$bin/bench_sample_cost" 32
echo
echo "## writing a profile with 10,000 stacks"
"$bin/bench_write_profile" 10000
echo
echo "## entering and leaving a label scope"
"$bin/bench_labels"
if [[ -x "$bin/bench_unwind" ]]; then
  echo
  echo "## unwinders on the same 32-deep stack"
  "$bin/bench_unwind"
fi

if command -v valgrind >/dev/null; then
  echo
  echo "## instructions per new+delete pair (callgrind, Churn() only, 1M pairs)"
  for c in "plain|$bin/bench_churn_plain 0" "heapprof rate 0|$bin/bench_churn_heapprof 0" \
           "heapprof rate 524288|$bin/bench_churn_heapprof 524288"; do
    for mode in sized unsized; do
      out=$(mktemp)
      valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*Churn*' \
        ${c#*|} 1000000 24 $mode >/dev/null 2>"$out" || true
      # Churn runs twice: the 100k warm-up and the 1M measured pairs.
      printf '%-40s %8.1f\n' "${c%%|*} ($mode)" "$(awk '/Collected/ {print $4 / 1100000}' "$out")"
      rm -f "$out"
    done
  done
fi
