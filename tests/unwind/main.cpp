// The unwinder test program. This unit compiles heapprof's implementation
// (no global hooks: the tests call the unwinders themselves).
#define HEAPPROF_IMPLEMENTATION
#include <heapprof.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
