// The shared object the hooked tests dlopen and dlclose (test_extremes.cpp).
// Not linked in: CMake/meson build it as a module and pass its path as
// HEAPPROF_HOOKED_DSO_PATH. Its operator new calls bind to the test program's
// replacement (the program exports them), so its allocations go through the
// heapprof hook like any third-party library's.
#include <cstddef>

namespace {

__attribute__((noinline)) void* DsoInner(std::size_t n) {
  char* p = new char[n];
  asm volatile("" ::"r"(p) : "memory");
  return p;
}

__attribute__((noinline)) void* DsoMiddle(std::size_t n) {
  void* p = DsoInner(n);
  asm volatile("" ::"r"(p) : "memory");
  return p;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void* heapprof_hooked_dso_alloc(std::size_t n) {
  void* p = DsoMiddle(n);
  asm volatile("" ::"r"(p) : "memory");
  return p;
}

extern "C" __attribute__((visibility("default"))) void heapprof_hooked_dso_free(void* p) {
  delete[] static_cast<char*>(p);
}
