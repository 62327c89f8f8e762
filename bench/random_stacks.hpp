// Random stacks for bench_unwind and bench_sample_cost (GCC only: the
// optimize attribute): levels of two functions without frame pointers, each
// calling one or the other as a bit of a random shape says, `kLeaf` at the
// bottom. Each return address (Poly<0> or Poly<1> calling either) is
// followed by either of two at random, and every frame has the same size.
#pragma once

#include <cstdint>

namespace bench_stacks {

// Poly<0, L> and Poly<1, L>: one body, two functions. The result differs
// between them: identical functions are folded into one (GCC's -fipa-icf
// did, and both call sites then called the same function). depth + 1
// frames of Poly (depth random choices), then kLeaf.
template <int kWhich, void (*kLeaf)()>
__attribute__((noinline, optimize("omit-frame-pointer"))) int Poly(int depth, std::uint64_t shape) {
  if (depth <= 0) {
    kLeaf();
    return kWhich;
  }
  int r = (shape & 1) != 0 ? Poly<0, kLeaf>(depth - 1, shape >> 1) : Poly<1, kLeaf>(depth - 1, shape >> 1);
  asm volatile("" : "+r"(r));  // keeps this frame: no tail call
  return r + kWhich;
}

// Shapes from a fixed seed (xorshift64): the same stacks every run.
template <int kN>
void FillShapes(std::uint64_t (&shapes)[kN], std::uint64_t seed) {
  for (std::uint64_t& shape : shapes) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    shape = seed;
  }
}

}  // namespace bench_stacks
