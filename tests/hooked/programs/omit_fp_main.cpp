// A program built with frame pointers whose heapprof implementation unit
// (omit_fp_impl.cpp) is built without them, sampling every allocation with
// the frame-pointer unwinder through each kind of hook. Writes the heap
// profile to argv[1]; the hooked suite checks every stack (test_extremes.cpp).
// Object sizes 9001 + k, k = the hook below.
#include <heapprof.hpp>

#include <malloc.h>
#include <stdlib.h>

#include <cstdio>
#include <new>

namespace {

constexpr int kHooks = 10;
void* g_objects[kHooks];

__attribute__((noinline)) void* OmitFpLeaf(int how, std::size_t n) {
  void* p = nullptr;
  switch (how) {
    case 0: p = ::operator new(n); break;
    case 1: p = new char[n]; break;
    case 2: p = ::operator new(n, std::nothrow); break;
    case 3: p = ::operator new(n, std::align_val_t(64)); break;
    case 4: p = std::malloc(n); break;
    case 5: p = std::calloc(1, n); break;
    case 6: p = std::realloc(g_objects[4], n); g_objects[4] = nullptr; break;
    case 7: if (posix_memalign(&p, 64, n) != 0) p = nullptr; break;
    case 8: p = aligned_alloc(64, n); break;
    case 9: p = memalign(64, n); break;
  }
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays
  return p;
}

__attribute__((noinline)) void* OmitFpMiddle(int how, std::size_t n) {
  void* p = OmitFpLeaf(how, n);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* OmitFpOuter(int how, std::size_t n) {
  void* p = OmitFpMiddle(how, n);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  heapprof::SetUnwinder(heapprof::Unwinder::kFramePointer);
  heapprof::SetSampleRate(1);
  for (int k = 0; k < kHooks; ++k) {
    g_objects[k] = OmitFpOuter(k, 9001 + static_cast<std::size_t>(k));
    if (g_objects[k] == nullptr) return 3;
  }
  if (!heapprof::WriteHeapProfile(argv[1])) return 4;
  std::printf("omit_fp: %d objects, profile %s\n", kHooks, argv[1]);
  return 0;
}
