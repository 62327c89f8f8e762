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

// A thread_local of a dlopen'ed library: dynamic TLS, whose block glibc
// mallocs for each thread at its first use (the retention tests: the main
// thread's block is found through its DTV). Exported: a variable only this
// file writes would be optimised away.
extern "C" {
__attribute__((visibility("default"))) thread_local char* heapprof_hooked_dso_tls_buffer = nullptr;
}

namespace {
__attribute__((noinline)) char* DsoTlsBuffer(std::size_t n) {
  char* p = new char[n];
  p[0] = 'T';  // not DsoInner's code: not folded into it
  asm volatile("" ::"r"(p) : "memory");
  return p;
}
}  // namespace

// Keeps a new n-byte buffer in this thread's thread_local (the first call on
// a thread also allocates the thread's TLS block of this library).
extern "C" __attribute__((visibility("default"))) void heapprof_hooked_dso_tls_keep(std::size_t n) {
  heapprof_hooked_dso_tls_buffer = DsoTlsBuffer(n);
  asm volatile("" ::: "memory");
}

// A global of the library holding a buffer (the retention tests: a root named
// after the library's symbol).
extern "C" {
__attribute__((visibility("default"))) char* heapprof_hooked_dso_global = nullptr;
}

extern "C" __attribute__((visibility("default"))) void heapprof_hooked_dso_global_keep(std::size_t n) {
  heapprof_hooked_dso_global = static_cast<char*>(DsoMiddle(n));
  asm volatile("" ::: "memory");
}
