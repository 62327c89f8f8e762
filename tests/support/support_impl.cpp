// The test helpers' out-of-line functions (profile decoder, inflater, files,
// child processes, HTTP client), compiled once per build directory and linked
// into every suite, like doctest_impl.cpp. In each test unit that used them,
// their inline copies cost 5-10 s of CPU at -O2 -g (std::regex among them).
// The headers declare them; HEAPPROF_TEST_SUPPORT_IMPLEMENTATION compiles the
// definitions here. A stand-alone program (a fuzz target) defines it itself.
#define HEAPPROF_TEST_SUPPORT_IMPLEMENTATION
#include "support/child_files.hpp"
#include "support/http_client.hpp"
#include "support/inflate.hpp"
#include "support/profile_decoder.hpp"
#include "support/profile_io.hpp"
