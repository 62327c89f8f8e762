// The unit test program. This unit compiles heapprof's implementation (without
// the global operator new/delete hooks: these tests drive the internals and
// heapprof::allocator directly); the test files include only what they test.
#define HEAPPROF_IMPLEMENTATION
#include <heapprof.hpp>

#include <doctest/doctest.h>  // its implementation: tests/support/doctest_impl.cpp

int main(int argc, char** argv) { return doctest::Context(argc, argv).run(); }
