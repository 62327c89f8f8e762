#!/usr/bin/env bash
# bench/field.sh BUILD_DIR [REPS]: heapprof against what a user would pick
# instead, side by side, in one run, on the same workloads (issue 6).
#
#   workloads   churn  new+delete pairs, 16-256 B, stack depth 24 (bench/churn.cpp)
#               kv     2 threads, each an unordered_map<string,string> store (bench/kv.cpp)
#               deep   new+delete pairs at stack depth 64-128 (bench/deep.cpp)
#   configs     glibc; heapprof at rate 0, 524288, 65536 and 1 with each
#               unwinder; jemalloc plain, with prof at 512 KiB and 64 KiB, and
#               under heapprof; tcmalloc plain, with HEAPPROFILE, and under
#               heapprof; heaptrack.
#
# Every configuration runs REPS times (default 5), interleaved, the order
# rotated each repetition so that the machine's noise falls on all of them
# alike; the table shows medians (thread CPU time per op: see the workloads)
# and the ratio to the matching plain allocator. Full-recording
# configurations (rate 1, HEAPPROFILE, heaptrack) run a twentieth of the ops.
# Then: full recording measured as CPU of the whole process tree (heaptrack's
# second process included), the scaling check (1 vs 2 threads), callgrind
# instructions per pair, one sample's cost, profile writing, process start-up
# (bench/startup.sh), and the accuracy
# comparison with jemalloc (bench/accuracy.sh; ACC_REPS runs each, default 10).
#
# A missing tool (jemalloc, tcmalloc, heaptrack, valgrind, jeprof, go) skips
# its configurations with a message. SECTIONS=table,fullrec,scaling,callgrind,
# sample,accuracy selects sections (default all); CHURN_PAIRS, KV_OPS (per
# thread), DEEP_PAIRS set the op counts. Needs: awk, sort; the Debian
# packages libjemalloc-dev (or libjemalloc2), libgoogle-perftools4
# (google-perftools for HEAPPROFILE), heaptrack, valgrind, golang-go.
set -uo pipefail
build=${1:?usage: bench/field.sh BUILD_DIR [REPS]}
reps=${2:-5}
bin=$build/bench
sections=${SECTIONS:-table,fullrec,scaling,callgrind,sample,accuracy}
acc_reps=${ACC_REPS:-10}
churn_pairs=${CHURN_PAIRS:-10000000}
kv_ops=${KV_OPS:-300000}       # per thread
deep_pairs=${DEEP_PAIRS:-2000000}
slow=20                        # full-recording configurations run 1/slow of the ops

for b in churn malloc_churn kv deep; do
  for k in plain heapprof; do
    [[ -x $bin/bench_${b}_$k ]] || { echo "field.sh: $bin/bench_${b}_$k missing: build first (cmake --build $build)" >&2; exit 1; }
  done
done

tmp=$(mktemp -d /tmp/heapprof-field.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# A shared object by soname, from the loader's cache, else from dpkg.
find_lib() {
  local p
  p=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}')
  if [[ -z $p ]] && command -v dpkg >/dev/null; then
    p=$(dpkg -S "/$1" 2>/dev/null | awk '{print $2; exit}')
  fi
  [[ -n $p && -e $p ]] && echo "$p"
}
jemalloc=$(find_lib libjemalloc.so.2 || true)
tcmalloc=$(find_lib libtcmalloc.so.4 || true)
heaptrack=$(command -v heaptrack || true)
[[ -n $jemalloc ]] || echo "field.sh: libjemalloc.so.2 not found (apt-get install libjemalloc2): jemalloc configurations skipped"
[[ -n $tcmalloc ]] || echo "field.sh: libtcmalloc.so.4 not found (apt-get install libgoogle-perftools4): tcmalloc configurations skipped"
[[ -n $heaptrack ]] || echo "field.sh: heaptrack not found (apt-get install heaptrack): heaptrack skipped"

median() { sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
has() { [[ ,$sections, == *,$1,* ]]; }

# The figure a workload printed: "ns_per_op=X", or churn's bare number.
figure() {
  awk '/ns_per_op=/ {for (i = 1; i <= NF; i++) if ($i ~ /^ns_per_op=/) {sub(/^ns_per_op=/, "", $i); v = $i}}
       /^[0-9.]+$/ {v = $1}
       END {print v}'
}

# config: name|base|binary kind|rate|unwinder|allocator|tool|slow
#   base: the plain configuration its ratio is against; allocator: glibc,
#   jemalloc, tcmalloc; tool: none, jeprof512k, jeprof64k, heapprofile, heaptrack.
configs=(
  "glibc|glibc|plain|0||glibc|none|0"
  "heapprof rate 0|glibc|heapprof|0|table|glibc|none|0"
  "heapprof 524288 table|glibc|heapprof|524288|table|glibc|none|0"
  "heapprof 524288 fp|glibc|heapprof|524288|fp|glibc|none|0"
  "heapprof 65536 table|glibc|heapprof|65536|table|glibc|none|0"
  "heapprof 65536 fp|glibc|heapprof|65536|fp|glibc|none|0"
  "heapprof rate 1 table|glibc|heapprof|1|table|glibc|none|1"
  "heapprof rate 1 fp|glibc|heapprof|1|fp|glibc|none|1"
)
if [[ -n $heaptrack ]]; then configs+=("heaptrack|glibc|plain|0||glibc|heaptrack|1"); fi
if [[ -n $jemalloc ]]; then
  configs+=(
    "jemalloc|jemalloc|plain|0||jemalloc|none|0"
    "jemalloc prof 512 KiB|jemalloc|plain|0||jemalloc|jeprof512k|0"
    "jemalloc prof 64 KiB|jemalloc|plain|0||jemalloc|jeprof64k|0"
    "heapprof 524288 table on jemalloc|jemalloc|heapprof|524288|table|jemalloc|none|0"
  )
fi
if [[ -n $tcmalloc ]]; then
  configs+=(
    "tcmalloc|tcmalloc|plain|0||tcmalloc|none|0"
    "tcmalloc HEAPPROFILE|tcmalloc|plain|0||tcmalloc|heapprofile|1"
    "heapprof 524288 table on tcmalloc|tcmalloc|heapprof|524288|table|tcmalloc|none|0"
  )
fi

# run WORKLOAD CONFIG: prints the workload's ns/op, or "fail".
run() {
  local w=$1 name base kind rate uw alloc tool isslow
  IFS='|' read -r name base kind rate uw alloc tool isslow <<<"$2"
  local div=1
  [[ $isslow == 1 ]] && div=$slow
  local cmd
  case $w in
    churn) cmd=("$bin/bench_churn_$kind" "$rate" $((churn_pairs / div)) 24 sized) ;;
    churnu) cmd=("$bin/bench_churn_$kind" "$rate" $((churn_pairs / div)) 24 unsized) ;;
    malloc) cmd=("$bin/bench_malloc_churn_$kind" "$rate" $((churn_pairs / div)) 24) ;;
    kv) cmd=("$bin/bench_kv_$kind" 2 $((kv_ops / div)) 16) ;;
    deep) cmd=("$bin/bench_deep_$kind" $((deep_pairs / div))) ;;
  esac
  local env=()
  [[ $kind == heapprof ]] && env+=("HEAPPROF=rate=$rate,unwinder=$uw")
  case $alloc in
    jemalloc) env+=("LD_PRELOAD=$jemalloc") ;;
    tcmalloc) env+=("LD_PRELOAD=$tcmalloc") ;;
  esac
  case $tool in
    jeprof512k) env+=("MALLOC_CONF=prof:true,lg_prof_sample:19") ;;
    jeprof64k) env+=("MALLOC_CONF=prof:true,lg_prof_sample:16") ;;
    heapprofile) env+=("HEAPPROFILE=$tmp/gperf.$w") ;;
  esac
  local out v
  if [[ $tool == heaptrack ]]; then
    out=$(env "${env[@]}" "$heaptrack" -o "$tmp/heaptrack.$w" "${cmd[@]}" 2>&1)
    rm -f "$tmp"/heaptrack."$w"*
  else
    out=$(env "${env[@]}" "${cmd[@]}" 2>&1)
  fi
  rm -f "$tmp"/gperf."$w"*
  v=$(figure <<<"$out")
  if [[ -z $v ]]; then
    echo "field.sh: $w / $name failed: $(head -c 300 <<<"$out")" >&2
    echo fail
  else
    echo "$v"
  fi
}

if has table; then
  declare -A results
  workloads=(churn churnu malloc kv deep)
  n=${#configs[@]}
  echo "running ${n} configurations x ${#workloads[@]} workloads x $reps repetitions..." >&2
  for ((r = 0; r < reps; r++)); do
    for w in "${workloads[@]}"; do
      for ((i = 0; i < n; i++)); do
        c=${configs[$(((i + r * 3) % n))]}
        v=$(run "$w" "$c")
        [[ $v == fail ]] || results["$w|${c%%|*}"]+="$v "
      done
    done
  done

  echo "## Heap profilers side by side (median of $reps, thread CPU ns per op)"
  echo
  echo "churn: one new+delete pair, 16-256 B, stack depth 24, sized delete; churn[]:"
  echo "the same with unsized delete[]; malloc: one malloc+free pair (heapprof: compiled in"
  echo "with HEAPPROF_REPLACE_MALLOC). kv: one operation of the 2-thread"
  echo "unordered_map<string,string> store (45% insert, 35% lookup, 20% erase). deep: one"
  echo "new+delete pair at stack depth 64-128. Ratio: to the same allocator without a"
  echo "profiler. Rate 1, HEAPPROFILE and heaptrack record every allocation."
  echo
  echo "| configuration | churn ns | ratio | churn[] ns | ratio | malloc ns | ratio | kv ns | ratio | deep ns | ratio |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  declare -A med
  for c in "${configs[@]}"; do
    for w in "${workloads[@]}"; do
      med["$w|${c%%|*}"]=$(tr ' ' '\n' <<<"${results["$w|${c%%|*}"]:-}" | grep . | median)
    done
  done
  for c in "${configs[@]}"; do
    IFS='|' read -r name base _ <<<"$c"
    row="| $name"
    for w in "${workloads[@]}"; do
      m=${med["$w|$name"]}
      b=${med["$w|$base"]}
      if [[ -z $m ]]; then
        row+=" | failed | "
      elif [[ -z $b ]]; then
        row+=" | $(printf '%.2f' "$m") | "
      else
        row+=" | $(printf '%.2f' "$m") | $(awk -v m="$m" -v b="$b" 'BEGIN {printf "%.3f", m / b}')"
      fi
    done
    echo "$row |"
  done
  echo
  echo "Full recording on churn, per op: heaptrack / heapprof rate 1 (table) =" \
    "$(awk -v a="${med["churn|heaptrack"]:-0}" -v b="${med["churn|heapprof rate 1 table"]:-0}" 'BEGIN {if (a && b) printf "%.1fx", a / b; else print "n/a"}');" \
    "HEAPPROFILE / heapprof rate 1 (table) =" \
    "$(awk -v a="${med["churn|tcmalloc HEAPPROFILE"]:-0}" -v b="${med["churn|heapprof rate 1 table"]:-0}" 'BEGIN {if (a && b) printf "%.1fx", a / b; else print "n/a"}')"
  echo
fi

if has fullrec; then
  # The table above counts the benchmark thread's CPU only; heaptrack also
  # runs heaptrack_interpret in a second process (on the other core), and
  # every tool has start-up and exit work. Here: CPU time (user + sys) of the
  # whole process tree, marginal per pair between a long and a short run, so
  # start-up and exit cancel out.
  echo "## Full recording: whole-process-tree CPU per pair (median of $reps)"
  echo
  echo "CPU (user+sys of the run and its children) for N pairs minus the same for N/10,"
  echo "divided by the difference in pairs (the warm-up's tenth included). churn: depth 24;"
  echo "deep: depth 64-128."
  echo
  tree_cpu() {  # tree_cpu CMD...: user+sys seconds of CMD and everything it waited for
    local TIMEFORMAT='%U %S' t
    t=$( { time "$@" >/dev/null 2>&1; } 2>&1 )
    awk '{print $1 + $2}' <<<"$t"
  }
  # name|N churn|N deep|command, @W = churn or deep, @A = its arguments
  fr=("glibc|1000000|400000|$bin/bench_@W_plain @A"
      "heapprof rate 1 table|1000000|400000|env HEAPPROF=rate=1,unwinder=table $bin/bench_@W_heapprof @A"
      "heapprof rate 1 fp|1000000|400000|env HEAPPROF=rate=1,unwinder=fp $bin/bench_@W_heapprof @A")
  [[ -n $heaptrack ]] && fr+=("heaptrack|1000000|400000|$heaptrack -o $tmp/fr-heaptrack $bin/bench_@W_plain @A")
  [[ -n $tcmalloc ]] && fr+=("tcmalloc|1000000|400000|env LD_PRELOAD=$tcmalloc $bin/bench_@W_plain @A"
                             "tcmalloc HEAPPROFILE|200000|40000|env LD_PRELOAD=$tcmalloc HEAPPROFILE=$tmp/fr-gperf $bin/bench_@W_plain @A")
  declare -A frv
  for ((r = 0; r < reps; r++)); do
    for c in "${fr[@]}"; do
      IFS='|' read -r name nc nd cmd <<<"$c"
      for w in churn deep; do
        if [[ $w == churn ]]; then n=$nc; args_big="1 $n 24 sized"; args_small="1 $((n / 10)) 24 sized"
        else n=$nd; args_big=$n; args_small=$((n / 10)); fi
        c1=${cmd//@W/$w}
        # shellcheck disable=SC2086  # the command is a word list built above
        big=$(tree_cpu ${c1//@A/$args_big})
        # shellcheck disable=SC2086
        small=$(tree_cpu ${c1//@A/$args_small})
        rm -rf "$tmp"/fr-*
        frv["$w|$name"]+="$(awk -v b="$big" -v s="$small" -v n="$n" 'BEGIN {printf "%.1f", (b - s) * 1e9 / (1.1 * (n - n / 10))}') "
      done
    done
  done
  echo "| configuration | churn N | churn CPU ns/pair | vs heapprof rate 1 table | deep N | deep CPU ns/pair | vs heapprof rate 1 table |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  hpc=$(tr ' ' '\n' <<<"${frv["churn|heapprof rate 1 table"]}" | grep . | median)
  hpd=$(tr ' ' '\n' <<<"${frv["deep|heapprof rate 1 table"]}" | grep . | median)
  for c in "${fr[@]}"; do
    IFS='|' read -r name nc nd _ <<<"$c"
    mc=$(tr ' ' '\n' <<<"${frv["churn|$name"]}" | grep . | median)
    md=$(tr ' ' '\n' <<<"${frv["deep|$name"]}" | grep . | median)
    echo "| $name | $nc | $mc | $(awk -v m="$mc" -v h="$hpc" 'BEGIN {printf "%.2f", m / h}') | $nd | $md | $(awk -v m="$md" -v h="$hpd" 'BEGIN {printf "%.2f", m / h}') |"
  done
  echo
fi

if has scaling; then
  echo "## Scaling: 1 vs 2 threads (median of $reps, thread CPU ns per op; 2-thread / 1-thread = 1.00 when nothing is shared)"
  echo
  declare -A sc
  scfg=("plain|plain|0" "heapprof rate 0|heapprof|0" "heapprof 524288|heapprof|524288" "heapprof 65536|heapprof|65536")
  for ((r = 0; r < reps; r++)); do
    for c in "${scfg[@]}"; do
      IFS='|' read -r name kind rate <<<"$c"
      for t in 1 2; do
        sc["churn|$name|$t"]+="$(HEAPPROF=rate=$rate "$bin/bench_churn_$kind" "$rate" "$churn_pairs" 24 sized "$t") "
        sc["kv|$name|$t"]+="$(HEAPPROF=rate=$rate "$bin/bench_kv_$kind" "$t" "$kv_ops" 16 | figure) "
      done
    done
  done
  echo "| configuration | churn 1 thr | churn 2 thr | 2/1 | kv 1 thr | kv 2 thr | 2/1 |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for c in "${scfg[@]}"; do
    name=${c%%|*}
    row="| $name"
    for w in churn kv; do
      a=$(tr ' ' '\n' <<<"${sc["$w|$name|1"]}" | grep . | median)
      b=$(tr ' ' '\n' <<<"${sc["$w|$name|2"]}" | grep . | median)
      row+=" | $(printf '%.2f' "$a") | $(printf '%.2f' "$b") | $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')"
    done
    echo "$row |"
  done
  echo
  echo "load average while measuring: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
  echo
fi

if has callgrind; then
  if command -v valgrind >/dev/null; then
    echo "## Instructions per pair (callgrind, Churn() only, 1M pairs + 100k warm-up, heapprof at 524288)"
    echo
    echo "new+delete (sized delete, unsized delete[]) and malloc+free (heapprof compiled in with"
    echo "HEAPPROF_REPLACE_MALLOC, or the plain binary under LD_PRELOAD=libheapprof_preload.so)."
    echo
    echo "| allocator | new/delete | heapprof | new/delete[] | heapprof | malloc/free | compiled in | preloaded |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    cg() {  # cg ENV... -- CMD...: instructions per pair inside Churn()
      local o
      o=$(env "$@" 2>&1 >/dev/null | awk '/Collected/ {printf "%.1f", $4 / 1100000}')
      echo "${o:-fail}"
    }
    vg=(valgrind --tool=callgrind --callgrind-out-file=/dev/null "--toggle-collect=*Churn*")
    preload=$build/libheapprof_preload.so
    family_rows=""
    for c in "glibc|" "jemalloc|$jemalloc" "tcmalloc|$tcmalloc"; do
      IFS='|' read -r name pre <<<"$c"
      [[ $name != glibc && -z $pre ]] && continue
      # valgrind replaces malloc itself unless told to leave the preloaded one alone.
      extra=()
      [[ -n $pre ]] && extra=(--soname-synonyms=somalloc=NONE)
      row="| $name"
      for form in sized unsized; do
        for kind in plain heapprof; do
          row+=" | $(cg "LD_PRELOAD=$pre" "${vg[@]}" "${extra[@]}" "$bin/bench_churn_$kind" 524288 1000000 24 $form)"
        done
      done
      family="| $name"  # the second table's row: calloc and realloc modes
      for mode in calloc realloc; do
        family+=" | $(cg "LD_PRELOAD=$pre" "${vg[@]}" "${extra[@]}" "$bin/bench_malloc_churn_plain" 0 1000000 24 $mode)"
        family+=" | $(cg "LD_PRELOAD=$pre" "${vg[@]}" "${extra[@]}" "$bin/bench_malloc_churn_heapprof" 524288 1000000 24 $mode)"
      done
      family_rows+="$family |"$'\n'
      row+=" | $(cg "LD_PRELOAD=$pre" "${vg[@]}" "${extra[@]}" "$bin/bench_malloc_churn_plain" 0 1000000 24)"
      row+=" | $(cg "LD_PRELOAD=$pre" "${vg[@]}" "${extra[@]}" "$bin/bench_malloc_churn_heapprof" 524288 1000000 24)"
      if [[ -e $preload ]]; then
        row+=" | $(cg "LD_PRELOAD=$preload${pre:+:$pre}" HEAPPROF=rate=524288 "${vg[@]}" --soname-synonyms=somalloc=NONE \
                     "$bin/bench_malloc_churn_plain" 0 1000000 24)"
      else
        row+=" | n/a"
      fi
      echo "$row |"
    done
    echo
    echo "The rest of the malloc family (bench_malloc_churn's modes): calloc(n, 1) + free, and"
    echo "malloc(n) + realloc to 2n + free (one triple counted as one pair)."
    echo
    echo "| allocator | calloc/free | compiled in | malloc/realloc/free | compiled in |"
    echo "| --- | ---: | ---: | ---: | ---: |"
    printf '%s\n' "$family_rows"
  else
    echo "field.sh: valgrind not found (apt-get install valgrind): no instruction counts"
  fi
fi

if has sample; then
  echo "## One sample at depth 32 (unwind + record), bench_sample_cost"
  echo
  echo '```'
  "$bin/bench_sample_cost" 32
  echo '```'
  echo
  echo "## Writing a profile with 10,000 stacks, bench_write_profile"
  echo
  echo '```'
  "$bin/bench_write_profile" 10000
  echo '```'
  echo
  echo "## Starting a process, bench/startup.sh"
  echo
  echo '```'
  "$(dirname "$0")/startup.sh" "$build" 300 "$reps"
  echo '```'
  echo
fi

if has accuracy; then
  "$(dirname "$0")/accuracy.sh" "$build" "$acc_reps"
fi
