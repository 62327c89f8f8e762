// bench/churn: ns per new+delete pair of mixed small sizes at stack depth ~24.
//
// Built twice from this file: `bench_churn_plain` (no heapprof at all) and
// `bench_churn_heapprof` (HEAPPROF_BENCH_HOOKED: the global operator new/delete
// replacement). bench/run.sh runs them interleaved and prints medians and
// ratios. Usage: bench_churn_{plain,heapprof} [rate] [pairs] [depth] [sized|unsized] [threads]
//   rate: heapprof sample rate (ignored by the plain build), default 524288
//   sized: `delete` of a complete type (GCC's default sized deallocation);
//   unsized: `delete[]` of chars, which calls the unsized operator delete[].
//   threads: run the same loop in that many threads at once (default 1) and
//   print the mean of their ns/pair: about the one-thread figure when nothing
//   is shared between threads, much more when they write to a common cache
//   line (bench/field.sh's scaling check).
// Prints ns per pair in thread CPU time, so that time the noisy machine spent
// running someone else is not counted.
#if defined(HEAPPROF_BENCH_HOOKED)
#include <heapprof.hpp>  // the light API; the hooks: bench/hooks/new_delete.cpp
#endif

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// Each thread's own: a global written by every thread on every pair would be
// a shared cache line in the measurement itself (the scaling check measured
// that line, not the allocator: 2 threads at 1.6x with heapprof, whose extra
// stores queue behind the contended one, ~1.05x plain).
thread_local void* volatile g_sink;

// Sized operator delete, as GCC calls it by default. Clang < 19 does not
// declare it without -fsized-deallocation (heapprof's replacement defines it,
// so the hooked build always has it): the plain build then deletes unsized.
inline void DeleteSized(void* p, std::size_t n) {
#if defined(__cpp_sized_deallocation) || defined(HEAPPROF_BENCH_HOOKED)
  ::operator delete(p, n);
#else
  (void)n;
  ::operator delete(p);
#endif
}


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
      DeleteSized(p, n);
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

double ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// The calling thread's CPU time per pair, not wall time: on a busy machine a
// thread that is descheduled does not count the wait (Churn's own wall-clock
// figure would).
double CpuNsPerPair(int depth, long pairs) {
  const double t0 = ThreadCpuNs();
  AtDepth(depth, pairs);
  return (ThreadCpuNs() - t0) / static_cast<double>(pairs);
}

}  // namespace

int main(int argc, char** argv) {
  const long rate = argc > 1 ? std::atol(argv[1]) : 524288;
  const long pairs = argc > 2 ? std::atol(argv[2]) : 20000000;
  const int depth = argc > 3 ? std::atoi(argv[3]) : 24;
  g_sized = !(argc > 4 && std::strcmp(argv[4], "unsized") == 0);
#if defined(HEAPPROF_BENCH_HOOKED)
  heapprof::SetSampleRate(static_cast<std::size_t>(rate));
  if (rate > 0) {
    // A sure sample first (8 MiB at any rate): the unwinder meets this program
    // and libc here (their first rules found one FDE at a time, or the table
    // of an object of at most 256 FDEs), not inside Churn (callgrind counts Churn).
    char* volatile w = new char[std::size_t{8} << 20];
    delete[] w;
  }
#else
  (void)rate;
#endif
  const int threads = argc > 5 ? std::atoi(argv[5]) : 1;
  if (threads <= 1) {
    AtDepth(depth, pairs / 10);  // warm up caches, tcache, branch predictors
    std::printf("%.3f\n", CpuNsPerPair(depth, pairs));
    return 0;
  }
  std::vector<double> ns(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&ns, t, depth, pairs] {
      AtDepth(depth, pairs / 10);
      ns[static_cast<std::size_t>(t)] = CpuNsPerPair(depth, pairs);
    });
  }
  double sum = 0;
  for (int t = 0; t < threads; ++t) {
    pool[static_cast<std::size_t>(t)].join();
    sum += ns[static_cast<std::size_t>(t)];
  }
  std::printf("%.3f\n", sum / threads);
  return 0;
}
