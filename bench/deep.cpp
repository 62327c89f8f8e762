// bench/deep: allocations at stack depth 64-128, the workload where unwinding
// costs most (for a sampler per sample, for heaptrack and gperftools per
// allocation). Each round recurses to a depth between 64 and 128 through two
// alternating functions chosen by the round's bits (512 distinct call paths
// times 65 depths), then does 4 new+delete pairs of mixed sizes at the bottom.
//
// Built twice from this file, like churn: bench_deep_plain and
// bench_deep_heapprof (HEAPPROF_BENCH_HOOKED; rate from the HEAPPROF
// environment variable). Usage: bench_deep_{plain,heapprof} [pairs]
// Prints one line: deep pairs=N ns_per_op=X (thread CPU time per new+delete
// pair, the recursion included) mean_depth=D
#if defined(HEAPPROF_BENCH_HOOKED)
#include <heapprof.hpp>  // the light API; the hooks: bench/hooks/new_delete.cpp
#endif

#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

void* volatile g_sink;

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

constexpr int kPairsPerRound = 4;

__attribute__((noinline)) void Leaf(unsigned round) {
  static const std::size_t kSizes[8] = {16, 24, 32, 48, 64, 96, 128, 256};
  for (int i = 0; i < kPairsPerRound; ++i) {
    const std::size_t n = kSizes[(round + static_cast<unsigned>(i)) & 7];
    void* p = ::operator new(n);
    g_sink = p;
    DeleteSized(p, n);
  }
}

__attribute__((noinline)) void RecurseB(int depth, unsigned path, unsigned round);

__attribute__((noinline)) void RecurseA(int depth, unsigned path, unsigned round) {
  if (depth <= 1) return Leaf(round);
  if (path & 1) {
    RecurseB(depth - 1, path >> 1 | (path << 8 & 0x100), round);
  } else {
    RecurseA(depth - 1, path >> 1 | (path << 8 & 0x100), round);
  }
  asm volatile("" ::: "memory");  // keeps this frame: no tail call
}

__attribute__((noinline)) void RecurseB(int depth, unsigned path, unsigned round) {
  if (depth <= 1) return Leaf(round);
  if (path & 1) {
    RecurseA(depth - 1, path >> 1 | (path << 8 & 0x100), round);
  } else {
    RecurseB(depth - 1, path >> 1 | (path << 8 & 0x100), round);
  }
  asm volatile("" ::: "memory");
}

double ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

__attribute__((noinline)) double Run(long rounds, double* mean_depth) {
  long depth_sum = 0;
  const double t0 = ThreadCpuNs();
  for (long r = 0; r < rounds; ++r) {
    const unsigned round = static_cast<unsigned>(r);
    const int depth = 64 + static_cast<int>((round * 2654435761u >> 16) % 65);
    depth_sum += depth;
    RecurseA(depth, (round * 40503u) & 0x1ff, round);
  }
  const double t1 = ThreadCpuNs();
  *mean_depth = static_cast<double>(depth_sum) / static_cast<double>(rounds);
  return (t1 - t0) / static_cast<double>(rounds * kPairsPerRound);
}

}  // namespace

int main(int argc, char** argv) {
  const long pairs = argc > 1 ? std::atol(argv[1]) : 4000000;
  const long rounds = pairs / kPairsPerRound;
  double mean_depth = 0;
  Run(rounds / 10 + 1, &mean_depth);  // warm-up (and heapprof's unwind tables)
  const double ns = Run(rounds, &mean_depth);
  std::printf("deep pairs=%ld ns_per_op=%.3f mean_depth=%.1f\n", rounds * kPairsPerRound, ns, mean_depth);
  return 0;
}
