// A library that compiles heapprof in (the API and its implementation, no
// hooks), loaded with dlopen by plain_c.c under libheapprof_preload.so. Its
// copy is the first to start, so it hands the library its label functions
// (implementation.hpp: heapprof_detail_engine_role), and pins itself so that
// the library can keep calling them after the program's dlclose.
#define HEAPPROF_IMPLEMENTATION
#include <heapprof.hpp>

#include <cstdlib>

namespace {
void* g_kept[100];
}

// Not a tail call: this function is the leaf of its blocks.
extern "C" __attribute__((noinline, visibility("default"))) void* labels_plugin_alloc(std::size_t n) {
  void* p = std::malloc(n);
  asm volatile("" : "+r"(p));
  return p;
}

// 100 blocks of 300 bytes under the label plugin=labels, kept.
extern "C" __attribute__((visibility("default"))) int labels_plugin_run() {
  heapprof::ScopedLabels scope{{"plugin", "labels"}};
  int kept = 0;
  for (void*& p : g_kept) kept += (p = labels_plugin_alloc(300)) != nullptr;
  return kept;
}
