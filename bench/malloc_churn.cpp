// bench/malloc_churn: ns per malloc+free pair of mixed small sizes at stack
// depth ~24: the churn of a C program (the loop is plain C: malloc and free).
//
// Built twice from this file: `bench_malloc_churn_plain` (no heapprof) and
// `bench_malloc_churn_heapprof` (HEAPPROF_BENCH_HOOKED: HEAPPROF_REPLACE_MALLOC).
// The plain build also runs under LD_PRELOAD=libheapprof_preload.so, and both
// under a preloaded jemalloc or tcmalloc (bench/run.sh).
// Usage: bench_malloc_churn_{plain,heapprof} [rate] [pairs] [depth] [calloc|realloc]
//   rate: heapprof sample rate (the hooked build; the preloaded library reads
//   HEAPPROF=rate=...), default 524288. `calloc`: calloc(n, 1) + free pairs
//   instead of malloc(n) + free. `realloc`: malloc(n), realloc to 2n, free
//   (a triple counts as one pair).
// Prints ns per pair in thread CPU time.
#if defined(HEAPPROF_BENCH_HOOKED)
#include <heapprof.hpp>  // the light API; the hooks: bench/hooks/malloc.cpp
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace {

void* volatile g_sink;

enum Mode { kMalloc, kCalloc, kRealloc };

template <Mode kMode>
__attribute__((noinline)) void Churn(long pairs) {
  static const size_t kSizes[8] = {16, 24, 32, 48, 64, 96, 128, 256};
  for (long i = 0; i < pairs; ++i) {
    void* p = kMode == kCalloc ? calloc(kSizes[i & 7], 1) : malloc(kSizes[i & 7]);
    if (kMode == kRealloc) {
      g_sink = p;
      p = realloc(p, 2 * kSizes[i & 7]);
    }
    g_sink = p;
    free(p);
  }
}

__attribute__((noinline)) void AtDepth(int depth, long pairs, Mode mode) {
  if (depth <= 1) {
    if (mode == kCalloc) {
      Churn<kCalloc>(pairs);
    } else if (mode == kRealloc) {
      Churn<kRealloc>(pairs);
    } else {
      Churn<kMalloc>(pairs);
    }
    return;
  }
  AtDepth(depth - 1, pairs, mode);
  asm volatile("" ::: "memory");  // keeps this frame: no tail call
}

double ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const long rate = argc > 1 ? atol(argv[1]) : 524288;
  const long pairs = argc > 2 ? atol(argv[2]) : 20000000;
  const int depth = argc > 3 ? atoi(argv[3]) : 24;
  Mode mode = kMalloc;
  if (argc > 4 && strcmp(argv[4], "calloc") == 0) {
    mode = kCalloc;
  } else if (argc > 4 && strcmp(argv[4], "realloc") == 0) {
    mode = kRealloc;
  } else if (argc > 4) {
    fprintf(stderr, "bench_malloc_churn: unknown mode %s (calloc or realloc)\n", argv[4]);
    return 2;
  }
#if defined(HEAPPROF_BENCH_HOOKED)
  heapprof::SetSampleRate(static_cast<size_t>(rate));
#else
  (void)rate;
#endif
  // A sure sample first (8 MiB at any rate): the unwinder meets this program
  // and libc here (their first rules found one FDE at a time, or the table
  // of an object of at most 256 FDEs), not inside Churn (callgrind counts Churn).
  // In the plain build too: under LD_PRELOAD=libheapprof_preload.so it is the
  // same sample; without a profiler, one mmap and munmap outside the count.
  char* volatile w = static_cast<char*>(malloc(8ul << 20));
  free(w);
  AtDepth(depth, pairs / 10, mode);  // warm up
  const double t0 = ThreadCpuNs();
  AtDepth(depth, pairs, mode);
  printf("%.3f\n", (ThreadCpuNs() - t0) / static_cast<double>(pairs));
  return 0;
}
