// bench/sample_cost: what one sample costs, at stack depth 32 (argv[1]).
//  - unwind: the frame-pointer walk alone (ns per stack, ns per frame)
//  - sampled pair: new+delete at rate 1 (every allocation unwound, interned,
//    inserted in and removed from the live map) minus the same at rate 0, with
//    each unwinder; the table unwinder also with replay off (every sample
//    here has the same stack, which a walk replays from the thread's last). Best of 15 batches of 40,000 pairs (many short batches:
//    on a shared machine the best one is the one nobody else disturbed).
//  - (GCC) the sampled pair on random stacks without frame pointers, a
//    different stack every pair (ReportRandomStacks): replay and the
//    rule cache's guesses mostly miss; every stack is interned beforehand.
//  - the hidden costs: the first sample of the process (the objects on its
//    stack answer one FDE at a time: their tables are built later, if the
//    process keeps sampling them) and its first-touch page faults, and the
//    stack a sample takes below the allocating function (painted and
//    scanned): the first, the same stack again (warm), and a stack with a
//    return address new to the rule cache (its rule found one FDE at a time).
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__)
#include "random_stacks.hpp"  // GCC only: the optimize attribute
#endif

namespace {

void* volatile g_sink;
using Clock = std::chrono::steady_clock;

constexpr int kBatches = 15;
constexpr long kPairsPerBatch = 40000;

// ns per call of body(i), i in [0, reps): the best of kBatches batches.
// Inlined: the caller's frame is the one at the measured depth.
template <class Body>
__attribute__((always_inline)) inline double BestNsPer(long reps, Body&& body) {
  double best = 1e300;
  for (int b = 0; b < kBatches; ++b) {
    const auto t0 = Clock::now();
    for (long i = 0; i < reps; ++i) body(i);
    best = std::min(best, std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(reps));
  }
  return best;
}

__attribute__((noinline)) double PairsHere(long pairs) {
  return BestNsPer(pairs, [](long) {
    char* p = new char[64];
    g_sink = p;
    delete[] p;
  });
}

__attribute__((noinline)) double UnwindHere(long reps, int* depth_out) {
  heapprof::detail::CapturedStack stack;
  std::uintptr_t lo, hi;
  heapprof::detail::CurrentStackBounds(lo, hi);
  double best = 1e300;
  for (int b = 0; b < kBatches; ++b) {
    const auto t0 = Clock::now();
    for (long i = 0; i < reps; ++i) {
      heapprof::detail::UnwindFramePointers(__builtin_frame_address(0), __builtin_return_address(0), lo, hi, stack);
      g_sink = &stack;
    }
    best = std::min(best, std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(reps));
  }
  *depth_out = stack.depth;
  return best;
}

// One allocation with the stack below this frame painted first: the bytes
// below our frame that changed are what the allocation (and its sample) took.
constexpr std::size_t kPainted = 32 * 1024;
constexpr unsigned char kPaint = 0xa5;

struct StackUse {
  std::size_t bytes = 0;
  double ns = 0;
  long page_faults = 0;  // minor faults during the allocation (first touches)
};

long MinorFaults() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

__attribute__((noinline)) void Paint(unsigned char* lo, std::size_t n) { std::memset(lo, kPaint, n); }

__attribute__((noinline)) StackUse AllocPainted() {
  volatile char here = 0;
  const auto sp = reinterpret_cast<std::uintptr_t>(&here) & ~std::uintptr_t{15};
  auto* lo = reinterpret_cast<unsigned char*>(sp - kPainted);
  Paint(lo, kPainted - 512);  // memset's own frame stays in the margin
  const long f0 = MinorFaults();
  const auto t0 = Clock::now();
  char* p = new char[64];
  const auto t1 = Clock::now();
  const long f1 = MinorFaults();
  g_sink = p;
  const unsigned char* a = lo;
  while (a < reinterpret_cast<const unsigned char*>(sp) && *a == kPaint) ++a;
  delete[] p;
  return {static_cast<std::size_t>(reinterpret_cast<const unsigned char*>(sp) - a),
          std::chrono::duration<double, std::nano>(t1 - t0).count(), f1 - f0};
}

template <class F>
__attribute__((noinline)) auto AtDepth(int depth, F&& f) -> decltype(f()) {
  if (depth <= 1) return f();
  auto r = AtDepth(depth - 1, f);
  asm volatile("" : "+m"(r));  // keeps this frame: no tail call
  return r;
}

#if defined(__GNUC__) && !defined(__clang__)
// Random stacks (GCC: optimize attribute): levels of two functions without
// frame pointers, each calling one or the other as a random shape says, a
// different shape for every pair (kShapes of them, each its own stack:
// interned on the first pass, looked up after). So each sample's stack
// differs from the thread's last one, as when a thread's samples come from
// many call paths: replay rarely applies and a guess is right half the time.
constexpr int kShapes = 4096;
std::uint64_t g_shapes[kShapes];

__attribute__((noinline)) void RandomLeafPair() {
  char* p = new char[64];
  g_sink = p;
  delete[] p;
}

__attribute__((noinline)) double RandomPairs(int levels, long pairs) {
  return BestNsPer(pairs, [levels](long i) { bench_stacks::Poly<0, RandomLeafPair>(levels, g_shapes[i % kShapes]); });
}

__attribute__((noinline)) void ReportRandomStacks(int depth) {
  bench_stacks::FillShapes(g_shapes, 0x9e3779b97f4a7c15u);
  // + Poly(0), RandomLeafPair, RandomPairs, this, main and 3 of libc's start: depth
  const int levels = depth - 8;
  heapprof::SetUnwinder(heapprof::Unwinder::kTable);
  heapprof::SetSampleRate(0);
  const double off = RandomPairs(levels, kPairsPerBatch);
  heapprof::SetSampleRate(1);
  RandomPairs(levels, kShapes);  // every stack interned before the timed batches
  const double on = RandomPairs(levels, kPairsPerBatch);
  heapprof::detail::unwind_table::g_replay_walks.store(false);
  const double stepped = RandomPairs(levels, kPairsPerBatch);
  heapprof::detail::unwind_table::g_replay_walks.store(true);
  heapprof::SetSampleRate(0);
  const double off2 = RandomPairs(levels, kPairsPerBatch);
  const double base = std::min(off, off2);
  std::printf("random_stacks_pair_rate0_ns %.1f (%d levels of two functions without frame pointers, %d shapes)\n"
              "random_stacks_sample_table_ns %.1f (a sample whose stack differs from the thread's last)\n"
              "random_stacks_sample_stepped_ns %.1f (replay off)\n",
              base, levels, kShapes, on - base, stepped - base);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const int depth = argc > 1 ? std::atoi(argv[1]) : 32;
#if defined(__GNUC__) && !defined(__clang__)
  if (argc > 2 && std::strcmp(argv[2], "random") == 0) {  // that section alone (for callgrind, perf)
    ReportRandomStacks(depth);
    return 0;
  }
#endif
  // main + libc start frames sit below: recurse depth-3 to get ~depth frames.
  // First, before anything was sampled: the process's first sample (table
  // unwinder, the default), then the same stack again (warm: every rule in
  // the cache), with their stack use; then a stack with new return addresses
  // (another instantiation of AtDepth, another call site in main) in an
  // object whose rules are still found one FDE at a time.
  heapprof::SetSampleRate(1);
  const auto painted = [] { return AllocPainted(); };
  StackUse twice[2];
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+r"(i));  // not unrolled: one call site, the same return addresses
    twice[i] = AtDepth(depth - 3, painted);
  }
  // (The warm sample finds every rule in the cache: the counts are the first's.)
  const heapprof::detail::UnwindTableStats st = heapprof::detail::GetUnwindTableStats();
  const StackUse& first = twice[0];
  const StackUse& warm = twice[1];
  const StackUse new_pcs = AtDepth(depth - 3, [] { return AllocPainted(); });
  const std::uint64_t lazy_new = heapprof::detail::GetUnwindTableStats().lazy_lookups - st.lazy_lookups;
  int frames = 0;
  const double unwind = AtDepth(depth - 3, [&] { return UnwindHere(kPairsPerBatch, &frames); });
  heapprof::SetSampleRate(0);
  const double off = AtDepth(depth - 3, [] { return PairsHere(kPairsPerBatch); });
  heapprof::SetSampleRate(1);
  heapprof::SetUnwinder(heapprof::Unwinder::kFramePointer);
  const double all_fp = AtDepth(depth - 3, [] { return PairsHere(kPairsPerBatch); });
  heapprof::SetUnwinder(heapprof::Unwinder::kTable);
  const double all_table = AtDepth(depth - 3, [] { return PairsHere(kPairsPerBatch); });
  // The same with replay off: every frame derived from the tables and every
  // stack hashed and looked up, as for a stack unlike the thread's last one.
  heapprof::detail::unwind_table::g_replay_walks.store(false);
  const double all_stepped = AtDepth(depth - 3, [] { return PairsHere(kPairsPerBatch); });
  heapprof::detail::unwind_table::g_replay_walks.store(true);
  std::printf("frames %d\nfp_unwind_only_ns %.1f (%.2f ns/frame)\npair_rate0_ns %.1f\n"
              "pair_rate1_fp_ns %.1f\nsample_fp_ns %.1f\npair_rate1_table_ns %.1f\nsample_table_ns %.1f"
              " (the same stack as the thread's last sample: replayed)\n"
              "sample_table_stepped_ns %.1f (replay off: every frame stepped, the stack hashed)\n",
              frames, unwind, unwind / frames, off, all_fp, all_fp - off, all_table, all_table - off,
              all_stepped - off);
  std::printf("first_sample_us %.1f (%llu rules found one FDE at a time; tables built: %llu objects, %llu rows,"
              " %.2f ms of it)\nfirst_sample_page_faults %ld\nfirst_sample_stack_bytes %zu\n"
              "warm_sample_stack_bytes %zu (the same stack again: every rule cached)\n"
              "new_pc_sample_stack_bytes %zu (%llu rules found one FDE at a time: return addresses new to the cache)\n",
              first.ns / 1000.0, static_cast<unsigned long long>(st.lazy_lookups),
              static_cast<unsigned long long>(st.objects), static_cast<unsigned long long>(st.rows), st.build_ms,
              first.page_faults, first.bytes, warm.bytes, new_pcs.bytes, static_cast<unsigned long long>(lazy_new));
#if defined(__GNUC__) && !defined(__clang__)
  ReportRandomStacks(depth);
#endif
  return 0;
}
