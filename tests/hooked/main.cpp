// The hooked test program: the global operator new/delete replacement is
// defined here, in exactly one translation unit, as a user program would.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <doctest/doctest.h>  // its implementation: tests/support/doctest_impl.cpp

#include <cstdlib>
#include <cstring>

#include "child_scenarios.hpp"

// The new_handler tests ask malloc for absurd sizes and expect it to say no,
// as glibc does; the sanitizers' allocators must say no too, not abort.
#if defined(HEAPPROF_ASAN)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif
#if defined(HEAPPROF_TSAN)
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#endif

int main(int argc, char** argv) {
  // Some scenarios (allocation in static destructors, fork) need a process of
  // their own: the tests re-run this binary with HEAPPROF_TEST_CHILD set.
  if (const char* child = std::getenv("HEAPPROF_TEST_CHILD")) return heapprof_test::RunChild(child);
  doctest::Context context(argc, argv);
  return context.run();
}
