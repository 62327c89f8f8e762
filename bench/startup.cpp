// bench/startup: the smallest C++ program that allocates, for the cost of
// starting a process with heapprof compiled in (bench/startup.sh).
//
// Built twice from this file: `bench_startup_plain` (no heapprof) and
// `bench_startup_heapprof` (HEAPPROF_BENCH_HOOKED: HEAPPROF_REPLACE_NEW_DELETE
// and HEAPPROF_REPLACE_MALLOC, as a program that wants every byte seen).
// It makes one std::string of 40 bytes a command-line argument and exits.
#if defined(HEAPPROF_BENCH_HOOKED)
#include <heapprof.hpp>  // the light API; the hooks: bench/hooks/malloc.cpp
#endif

#include <string>

int main(int argc, char**) {
  const std::string s(static_cast<std::size_t>(argc) * 40, 'x');
  return s.empty() ? 1 : 0;
}
