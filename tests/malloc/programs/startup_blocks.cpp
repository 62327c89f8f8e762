// A program whose library (startup_lib.cpp) allocated in its constructor,
// which the malloc suite runs under each allocator (test_exact_stats.cpp):
// Stats must count those blocks at the same size when allocated and when
// freed. gperftools' malloc_usable_size answered 0 before its own start-up
// (block_hooks.hpp: FinishAllocatorStartup). Prints one line of numbers.
#define HEAPPROF_REPLACE_NEW_DELETE
#define HEAPPROF_REPLACE_MALLOC
#include <heapprof.hpp>

#include <malloc.h>

#include <cstdio>

#include "startup_lib.hpp"

int main() {
  using startup_lib::g_after;
  using startup_lib::g_before;
  using startup_lib::g_blocks;
  unsigned long long usable = 0, live = 0;
  for (void* p : g_blocks) {
    if (p == nullptr) continue;
    usable += malloc_usable_size(p);  // the allocator's answer, now that it has started
    ++live;
  }
  const heapprof::Stats before = heapprof::GetStats();
  for (int i = 0; i < startup_lib::kBlocks; ++i) {
    if (g_blocks[i] != nullptr) startup_lib::Release(i);
  }
  const heapprof::Stats after = heapprof::GetStats();
  std::printf("startup_blocks: constructor allocs %llu frees %llu live_bytes %llu; usable %llu in %llu blocks; "
              "main frees %llu free_bytes %llu\n",
              static_cast<unsigned long long>(g_after.alloc_objects - g_before.alloc_objects),
              static_cast<unsigned long long>(g_after.free_objects - g_before.free_objects),
              static_cast<unsigned long long>((g_after.alloc_bytes - g_before.alloc_bytes) -
                                              (g_after.free_bytes - g_before.free_bytes)),
              usable, live, static_cast<unsigned long long>(after.free_objects - before.free_objects),
              static_cast<unsigned long long>(after.free_bytes - before.free_bytes));
  return 0;
}
