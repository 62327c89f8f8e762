// What startup_lib.cpp's constructor left: its blocks still live (null where
// it freed one) and heapprof's Stats around its work.
#pragma once

#include <heapprof.hpp>

#include <cstdlib>
#include <new>

namespace startup_lib {
constexpr int kBlocks = 200;
extern void* g_blocks[kBlocks];  // g_blocks[i], i % 5 == 4: from operator new
extern heapprof::Stats g_before, g_after;

// Releases g_blocks[i] the way it was allocated, and forgets it.
inline void Release(int i) {
  if (i % 5 == 4) {
    ::operator delete(g_blocks[i]);
  } else {
    std::free(g_blocks[i]);
  }
  g_blocks[i] = nullptr;
}
}  // namespace startup_lib
