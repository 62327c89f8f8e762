// What startup_lib.cpp's constructor left: its blocks still live (null where
// it freed one) and heapprof's Stats around its work.
#pragma once

#include <heapprof.hpp>

namespace startup_lib {
constexpr int kBlocks = 200;
extern void* g_blocks[kBlocks];  // g_blocks[i] % 5 == 4: from operator new
extern heapprof::Stats g_before, g_after;
}  // namespace startup_lib
