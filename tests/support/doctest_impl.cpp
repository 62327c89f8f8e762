// doctest's implementation, compiled once per build directory and linked into
// every suite (the suites' main.cpp files have the main functions). Each suite
// compiling it again cost 4-7 s of CPU per suite and build.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
