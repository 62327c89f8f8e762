// bench/churn: ns per new+delete pair of mixed small sizes at stack depth ~24.
//
// Built twice from this file: `bench_churn_plain` (no heapprof at all) and
// `bench_churn_heapprof` (HEAPPROF_BENCH_HOOKED: the global operator new/delete
// replacement). bench/run.sh runs them interleaved and prints medians and
// ratios. Usage: bench_churn_{plain,heapprof} [rate] [pairs] [depth] [sized|unsized]
//   rate: heapprof sample rate (ignored by the plain build), default 524288
//   sized: `delete` of a complete type (GCC's default sized deallocation);
//   unsized: `delete[]` of chars, which calls the unsized operator delete[].
#if defined(HEAPPROF_BENCH_HOOKED)
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

void* volatile g_sink;

bool g_sized = true;

// Sizes cycle through 8 small classes, like typical C++ node/string churn.
__attribute__((noinline)) double Churn(long pairs) {
  static const std::size_t kSizes[8] = {16, 24, 32, 48, 64, 96, 128, 256};
  const auto t0 = std::chrono::steady_clock::now();
  if (g_sized) {
    for (long i = 0; i < pairs; ++i) {
      const std::size_t n = kSizes[i & 7];
      void* p = ::operator new(n);
      g_sink = p;
      ::operator delete(p, n);
    }
  } else {
    for (long i = 0; i < pairs; ++i) {
      char* p = new char[kSizes[i & 7]];
      g_sink = p;
      delete[] p;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(pairs);
}

// Recurse so allocations happen `depth` frames deep, as in a real service.
__attribute__((noinline)) double AtDepth(int depth, long pairs) {
  if (depth <= 1) return Churn(pairs);
  double r = AtDepth(depth - 1, pairs);
  asm volatile("" : "+m"(r));  // keeps this frame: no tail call
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const long rate = argc > 1 ? std::atol(argv[1]) : 524288;
  const long pairs = argc > 2 ? std::atol(argv[2]) : 20000000;
  const int depth = argc > 3 ? std::atoi(argv[3]) : 24;
  g_sized = !(argc > 4 && std::strcmp(argv[4], "unsized") == 0);
#if defined(HEAPPROF_BENCH_HOOKED)
  heapprof::SetSampleRate(static_cast<std::size_t>(rate));
#else
  (void)rate;
#endif
  AtDepth(depth, pairs / 10);  // warm up caches, tcache, branch predictors
  std::printf("%.3f\n", AtDepth(depth, pairs));
  return 0;
}
