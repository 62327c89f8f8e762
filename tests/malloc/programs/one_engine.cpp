// A program that compiles heapprof in (operator new/delete only) and that the
// malloc suite also runs under libheapprof_preload.so: one engine must record,
// counting each allocation once. Prints the Stats delta of 1000 new char[100]
// and 1000 malloc(50), all kept live, and writes the heap profile to argv[1].
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cstdio>
#include <cstdlib>

static void* volatile g_sink;
static void* g_kept[2000];

__attribute__((noinline)) void OneEngineNew(int i) {
  g_kept[i] = new char[100];
  g_sink = g_kept[i];
}
__attribute__((noinline)) void OneEngineMalloc(int i) {
  g_kept[1000 + i] = std::malloc(50);
  g_sink = g_kept[1000 + i];
}

int main(int argc, char** argv) {
  heapprof::SetSampleRate(1);
  const heapprof::Stats s0 = heapprof::GetStats();
  for (int i = 0; i < 1000; ++i) OneEngineNew(i);
  for (int i = 0; i < 1000; ++i) OneEngineMalloc(i);
  const heapprof::Stats s1 = heapprof::GetStats();
  std::printf("one_engine: allocs %llu live_objects %llu rate %zu\n",
              static_cast<unsigned long long>(s1.alloc_objects - s0.alloc_objects),
              static_cast<unsigned long long>(s1.live_objects - s0.live_objects), heapprof::GetSampleRate());
  const bool ok = argc > 1 && heapprof::WriteHeapProfile(argv[1]);
  for (int i = 0; i < 1000; ++i) delete[] static_cast<char*>(g_kept[i]);
  for (int i = 1000; i < 2000; ++i) std::free(g_kept[i]);
  return ok ? 0 : 1;
}
