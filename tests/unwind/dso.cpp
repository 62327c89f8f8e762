// The shared object of the dlopen test (BUILD.md: -O2 -fomit-frame-pointer
// -fPIC -shared). Samples are taken inside it: a recursion of its own, then
// libc's qsort (a PLT call from this object) calling a comparator in here that
// allocates through the test's fake hook.
#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace {

using AllocFn = void* (*)(std::size_t);
AllocFn g_alloc = nullptr;
// Atomic: several test threads write it (a plain global would be a data race).
std::atomic<void*> g_sink{nullptr};

int Compare(const void* a, const void* b) {
  void* p = g_alloc(16);
  g_sink.store(p, std::memory_order_relaxed);
  std::free(p);
  const int x = *static_cast<const int*>(a), y = *static_cast<const int*>(b);
  return (x > y) - (x < y);
}

__attribute__((noinline)) int Down(int levels) {
  if (levels <= 0) {
    int v[16];
    for (int i = 0; i < 16; ++i) v[i] = (i * 7) % 16;
    std::qsort(v, 16, sizeof v[0], &Compare);
    return v[0] + v[15];
  }
  volatile char pad[40];
  pad[levels % 40] = static_cast<char>(levels);
  int r = Down(levels - 1);
  asm volatile("" : "+r"(r));
  return r + pad[levels % 40];
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int unwind_test_dso_entry(int levels, AllocFn alloc) {
  g_alloc = alloc;
  int r = Down(levels);
  asm volatile("" : "+r"(r));
  return r;
}
