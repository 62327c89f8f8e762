// A shared library of a user's program built with -fvisibility=hidden (CMake's
// CXX_VISIBILITY_PRESET hidden): it includes the light API only, and the
// program's implementation unit (dso_main.cpp) serves it. Built twice, as
// libheapprof_check_a.so and _b.so (HEAPPROF_CHECK_LIB=a, b). check.sh's `dsos`.
#include <heapprof.hpp>

#include <string_view>

#define HEAPPROF_CHECK_STR2(x) #x
#define HEAPPROF_CHECK_STR(x) HEAPPROF_CHECK_STR2(x)
#define HEAPPROF_CHECK_FN2(lib, name) lib_##lib##_##name
#define HEAPPROF_CHECK_FN(lib, name) HEAPPROF_CHECK_FN2(lib, name)

// `count` allocations of `bytes` through heapprof::allocator, each freed, under
// the label lib=<this library>; calls `seen` (in the program) inside the scope
// so the program can read the current labels as its own code sees them.
extern "C" __attribute__((visibility("default"))) void HEAPPROF_CHECK_FN(HEAPPROF_CHECK_LIB, work)(
    int count, std::size_t bytes, void (*seen)()) {
  heapprof::ScopedLabels scope{{"lib", HEAPPROF_CHECK_STR(HEAPPROF_CHECK_LIB)}};
  heapprof::allocator<char> alloc;
  for (int i = 0; i < count; ++i) {
    char* p = alloc.allocate(bytes);
    p[0] = 1;
    asm volatile("" ::"r"(p) : "memory");
    alloc.deallocate(p, bytes);
  }
  seen();
}

// The value of `key` in the current labels, as this library sees them.
extern "C" __attribute__((visibility("default"))) std::size_t HEAPPROF_CHECK_FN(HEAPPROF_CHECK_LIB, label)(
    const char* key, char* out, std::size_t cap) {
  const std::string_view v = heapprof::CurrentLabels().Get(key);
  std::size_t n = 0;
  for (; n < v.size() && n + 1 < cap; ++n) out[n] = v[n];
  out[n] = '\0';
  return n;
}
