// The malloc test program: both hook families are replaced here, in one
// translation unit, as a program that wants its C allocations profiled does.
// Under ASan/TSan the malloc family is not replaced (HEAPPROF_MALLOC_HOOKS is
// 0) and the tests that need it are skipped.
#define HEAPPROF_REPLACE_MALLOC
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#if defined(HEAPPROF_ASAN)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif
#if defined(HEAPPROF_TSAN)
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#endif

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return context.run();
}
