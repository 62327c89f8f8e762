#!/usr/bin/env bash
# bench/accuracy.sh BUILD_DIR [REPS]: heapprof's in-use estimates per stack
# against the truth and against jemalloc's at the same rate (512 KiB).
#
# bench/accuracy.cpp allocates a heap with known totals per stack (small 32 B,
# medium 4 KiB, large 256 KiB objects, and one stack with two sizes). Each of
# REPS runs (default 10) is profiled (a) by heapprof at rate 524288, read with
# `go tool pprof -top`, and (b) by jemalloc with
# MALLOC_CONF=prof:true,lg_prof_sample:19, dumped with mallctl("prof.dump")
# and read with jeprof: `go tool pprof` does not read jemalloc's heap_v2 text
# format ("parsing profile: unrecognized profile format"). Both readers scale
# the samples back to totals; the table shows per stack the mean error over
# the runs (the bias, with its standard error) and the spread of one run's
# error (sigma), next to the sigma Poisson sampling predicts for heapprof.
# Called by bench/field.sh; runs alone as well.
set -uo pipefail
build=${1:?usage: bench/accuracy.sh BUILD_DIR [REPS]}
reps=${2:-10}
bin=$build/bench
rate=524288
export GOCACHE=${GOCACHE:-/tmp/heapprof-gocache}

tmp=$(mktemp -d /tmp/heapprof-accuracy.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

jemalloc=$(ldconfig -p 2>/dev/null | awk '$1 == "libjemalloc.so.2" {print $NF; exit}')
have_go=1
command -v go >/dev/null || { echo "accuracy.sh: go not found (apt-get install golang-go): cannot read heapprof's profiles"; have_go=0; }
have_je=1
[[ -n $jemalloc ]] || { echo "accuracy.sh: libjemalloc.so.2 not found (apt-get install libjemalloc2): no jemalloc column"; have_je=0; }
command -v jeprof >/dev/null || { echo "accuracy.sh: jeprof not found (apt-get install libjemalloc-dev): no jemalloc column"; have_je=0; }
[[ $have_go == 1 ]] || exit 0

sites="SmallSite MediumSite LargeSite MixedSite"
: >"$tmp/est"   # lines: tool rep site bytes
for ((r = 0; r < reps; r++)); do
  HEAPPROF=rate=$rate "$bin/bench_accuracy_heapprof" "$tmp/hp.pb.gz" >"$tmp/truth" || { echo "accuracy.sh: heapprof run failed"; exit 1; }
  go tool pprof -top -unit=B -nodecount=100 -sample_index=inuse_space "$bin/bench_accuracy_heapprof" "$tmp/hp.pb.gz" 2>/dev/null |
    awk -v r="$r" -v s="$sites" 'BEGIN {n = split(s, a, " ")} {for (i = 1; i <= n; i++) if ($6 == "::" a[i]) {v = $4; sub(/B$/, "", v); print "heapprof", r, a[i], v}}' >>"$tmp/est"
  if [[ $have_je == 1 ]]; then
    if LD_PRELOAD=$jemalloc MALLOC_CONF=prof:true,lg_prof_sample:19 "$bin/bench_accuracy_plain" "$tmp/je.heap" >/dev/null 2>"$tmp/je.err"; then
      jeprof --text --show_bytes --inuse_space "$bin/bench_accuracy_plain" "$tmp/je.heap" 2>/dev/null |
        awk -v r="$r" -v s="$sites" 'BEGIN {n = split(s, a, " ")} {for (i = 1; i <= n; i++) if ($6 == "::" a[i]) print "jemalloc", r, a[i], $4}' >>"$tmp/est"
    else
      echo "accuracy.sh: jemalloc run failed: $(head -c 300 "$tmp/je.err")"
      have_je=0
    fi
  fi
done

echo "## Accuracy: in-use bytes per stack, estimate vs truth, rate 512 KiB, $reps runs each"
echo
echo "error = estimate / truth - 1. bias: mean error over the runs ± its standard error."
echo "sigma: standard deviation of one run's error. expected: Poisson sampling's sigma"
echo "for heapprof, sqrt(sum n s^2 (1-p)/p) / truth with p = 1 - exp(-s/rate)."
echo
echo "| stack | objects x size | true bytes | heapprof mean | bias | sigma | expected | jemalloc mean | bias | sigma |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
awk -v reps="$reps" -v rate="$rate" -v sites="$sites" '
  FILENAME ~ /truth$/ {split($3, o, "="); split($4, b, "="); tob[$2] = o[2]; tbytes[$2] = b[2]; next}
  {est[$1, $3, $2] = $4; seen[$1, $2] = 1}
  function stats(tool, site, truth,    r, n, e, s, s2, m, sd, mest) {
    n = 0; s = 0; s2 = 0; mest = 0
    for (r = 0; r < reps; r++) if ((tool, site, r) in est) {
      e = est[tool, site, r] / truth - 1; n++; s += e; s2 += e * e; mest += est[tool, site, r]
    }
    if (n == 0) return "| n/a | | "
    m = s / n; sd = n > 1 ? sqrt((s2 - n * m * m) / (n - 1)) : 0
    return sprintf("| %.0f | %+.2f%% ± %.2f%% | %.2f%% ", mest / n, 100 * m, 100 * sd / sqrt(n), 100 * sd)
  }
  function var1(n, sz,    p) { if (n == 0) return 0; p = 1 - exp(-sz / rate); return n * sz * sz * (1 - p) / p }
  END {
    desc["SmallSite"] = "2,000,000 x 32 B"; desc["MediumSite"] = "16,384 x 4 KiB"
    desc["LargeSite"] = "256 x 256 KiB"; desc["MixedSite"] = "500,000 x 64 B + 512 x 64 KiB"
    v["SmallSite"] = var1(2000000, 32); v["MediumSite"] = var1(16384, 4096)
    v["LargeSite"] = var1(256, 262144); v["MixedSite"] = var1(500000, 64) + var1(512, 65536)
    n = split(sites, a, " ")
    for (i = 1; i <= n; i++) {
      t = tbytes[a[i]]; total += t; vtot += v[a[i]]
      printf "| %s | %s | %d %s| %.2f%% %s|\n", a[i], desc[a[i]], t, stats("heapprof", a[i], t), 100 * sqrt(v[a[i]]) / t, stats("jemalloc", a[i], t)
    }
    for (r = 0; r < reps; r++) for (i = 1; i <= n; i++) for (tl = 1; tl <= 2; tl++) {
      tool = tl == 1 ? "heapprof" : "jemalloc"
      if ((tool, a[i], r) in est) est[tool, "all", r] += est[tool, a[i], r]
    }
    printf "| all four | | %d %s| %.2f%% %s|\n", total, stats("heapprof", "all", total), 100 * sqrt(vtot) / total, stats("jemalloc", "all", total)
  }' "$tmp/truth" "$tmp/est"
echo
