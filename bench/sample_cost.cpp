// bench/sample_cost: what one sample costs, at stack depth 32.
//  - unwind: the frame-pointer walk alone (ns per stack, ns per frame)
//  - sampled pair: new+delete at rate 1 (every allocation unwound, interned,
//    inserted in and removed from the live map) minus the same at rate 0, with
//    each unwinder.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

void* volatile g_sink;
using Clock = std::chrono::steady_clock;

__attribute__((noinline)) double PairsHere(long pairs) {
  const auto t0 = Clock::now();
  for (long i = 0; i < pairs; ++i) {
    char* p = new char[64];
    g_sink = p;
    delete[] p;
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(pairs);
}

__attribute__((noinline)) double UnwindHere(long reps, int* depth_out) {
  heapprof::detail::CapturedStack stack;
  std::uintptr_t lo, hi;
  heapprof::detail::CurrentStackBounds(lo, hi);
  const auto t0 = Clock::now();
  for (long i = 0; i < reps; ++i) {
    heapprof::detail::UnwindFramePointers(__builtin_frame_address(0), __builtin_return_address(0), lo, hi, stack);
    g_sink = &stack;
  }
  *depth_out = stack.depth;
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(reps);
}

template <class F>
__attribute__((noinline)) double AtDepth(int depth, F&& f) {
  if (depth <= 1) return f();
  double r = AtDepth(depth - 1, f);
  asm volatile("" : "+m"(r));  // keeps this frame: no tail call
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int depth = argc > 1 ? std::atoi(argv[1]) : 32;
  // main + libc start frames sit below: recurse depth-3 to get ~depth frames.
  int frames = 0;
  const double unwind = AtDepth(depth - 3, [&] { return UnwindHere(2000000, &frames); });
  heapprof::SetSampleRate(0);
  const double off = AtDepth(depth - 3, [] { return PairsHere(2000000); });
  heapprof::SetSampleRate(1);
  heapprof::SetUnwinder(heapprof::Unwinder::kFramePointer);
  const double all_fp = AtDepth(depth - 3, [] { return PairsHere(1000000); });
  heapprof::SetUnwinder(heapprof::Unwinder::kTable);
  AtDepth(depth - 3, [] { return PairsHere(1000); });  // builds the tables once
  const double all_table = AtDepth(depth - 3, [] { return PairsHere(1000000); });
  std::printf("frames %d\nfp_unwind_only_ns %.1f (%.2f ns/frame)\npair_rate0_ns %.1f\n"
              "pair_rate1_fp_ns %.1f\nsample_fp_ns %.1f\npair_rate1_table_ns %.1f\nsample_table_ns %.1f\n",
              frames, unwind, unwind / frames, off, all_fp, all_fp - off, all_table, all_table - off);
  return 0;
}
