// The unwinder test program. This unit compiles heapprof's implementation
// (no global hooks: the tests call the unwinders themselves).
#define HEAPPROF_IMPLEMENTATION
#include <heapprof.hpp>

#include <doctest/doctest.h>  // its implementation: tests/support/doctest_impl.cpp

#include <cstdlib>

int main(int argc, char** argv) {
  // ctest's unwind_tests_lazy: every walk with every object answering one
  // FDE at a time, never building its table (table.hpp: LazyRuleAt). The
  // other runs take the default: one FDE at a time, then the table.
  if (std::getenv("HEAPPROF_TEST_LAZY_FDES") != nullptr) {
    heapprof::detail::unwind_table::g_lazy_min_fdes.store(0);
    heapprof::detail::unwind_table::g_lazy_budget_min.store(1u << 30);
  }
  return doctest::Context(argc, argv).run();
}
