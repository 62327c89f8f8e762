// The unit test program. This unit compiles heapprof's implementation (without
// the global operator new/delete hooks: these tests drive the internals and
// heapprof::allocator directly); the test files include only what they test.
#define HEAPPROF_IMPLEMENTATION
#include <heapprof.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
