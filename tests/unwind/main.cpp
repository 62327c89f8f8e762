// The unwinder test program. This unit compiles heapprof's implementation
// (no global hooks: the tests call the unwinders themselves).
#define HEAPPROF_IMPLEMENTATION
#include <heapprof.hpp>

#include <doctest/doctest.h>  // its implementation: tests/support/doctest_impl.cpp

int main(int argc, char** argv) { return doctest::Context(argc, argv).run(); }
