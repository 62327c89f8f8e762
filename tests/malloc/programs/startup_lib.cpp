// A library whose constructor allocates: it runs before the program's own
// initializers and, under LD_PRELOAD, before the preloaded allocator's own
// start-up too (a preloaded object is initialized after every library it
// was loaded ahead of). Used by startup_blocks.cpp. Calls the program's
// heapprof (the program exports what this library uses).
#include <heapprof.hpp>

#include <cstdlib>
#include <new>

#include "startup_lib.hpp"

namespace startup_lib {

void* g_blocks[kBlocks];
heapprof::Stats g_before, g_after;

namespace {

__attribute__((constructor)) void AllocateAtStartup() {
  g_before = heapprof::GetStats();
  // Small and large (tcmalloc: above its 256 KiB classes), calloc, realloc
  // grown and shrunk (tcmalloc keeps a shrunk block in place), operator new.
  static constexpr std::size_t kSizes[] = {1, 8, 24, 100, 1000, 4096, 5000, 70000, 300000};
  for (int i = 0; i < kBlocks; ++i) {
    const std::size_t n = kSizes[static_cast<std::size_t>(i) % (sizeof kSizes / sizeof kSizes[0])] + i;
    void* p = nullptr;
    switch (i % 5) {
      case 0: p = std::malloc(n); break;
      case 1: p = std::calloc(1, n); break;
      case 2: p = std::realloc(std::malloc(n / 2 + 1), n); break;
      case 3: p = std::realloc(std::malloc(n + n / 4), n); break;
      default: p = ::operator new(n); break;
    }
    g_blocks[i] = p;
  }
  // Some freed before the allocator's start-up as well.
  for (int i = 0; i < kBlocks; i += 4) Release(i);
  g_after = heapprof::GetStats();
}

}  // namespace
}  // namespace startup_lib
