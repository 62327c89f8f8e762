// The malloc test program: both hook families are replaced here, in one
// translation unit, as a program that wants its C allocations profiled does.
// Under ASan/TSan the malloc family is not replaced (HEAPPROF_MALLOC_HOOKS is
// 0) and the tests that need it are skipped.
#define HEAPPROF_REPLACE_MALLOC
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <doctest/doctest.h>  // its implementation: tests/support/doctest_impl.cpp

#if defined(HEAPPROF_ASAN)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif
#if defined(HEAPPROF_TSAN)
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#endif

#include <cstdlib>
#include <cstring>
#include <malloc.h>

#if HEAPPROF_MALLOC_HOOKS
// Blocks of the bootstrap buffer (served while dlsym resolves the real malloc)
// must never reach the real free. Their header's size word is all ones, so
// free's hot path (block_hooks.hpp: HotFree), which reads a glibc chunk's size
// there, hands them to the cold function, which knows them. Here, in the unit
// that defines the hooks, after start-up (the chunk formula on).
TEST_CASE("malloc family: a bootstrap block's free, realloc and usable size stay ours") {
  namespace real = heapprof::detail::real;
  void* warm = std::malloc(8);  // start-up done: the hooks' hot paths are on
  std::free(warm);
  void* p = real::BootstrapAlloc(40, 16);
  REQUIRE(p != nullptr);
  CHECK(real::IsBootstrap(p));
  CHECK(malloc_usable_size(p) == 40);
  std::memset(p, 0x5a, 40);
  void* q = std::realloc(p, 100);  // moves to the real heap, the contents kept
  REQUIRE(q != nullptr);
  CHECK(!real::IsBootstrap(q));
  CHECK(static_cast<unsigned char*>(q)[39] == 0x5a);
  std::free(q);
  void* r = real::BootstrapAlloc(24, 16);
  REQUIRE(r != nullptr);
  void* s = real::BootstrapAlloc(24, 64);
  REQUIRE(s != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(s) % 64 == 0);
  const heapprof::Stats before = heapprof::GetStats();
  std::free(r);          // glibc's free would abort on it ("free(): invalid pointer")
  ::operator delete(s);  // the delete hooks share the hot free
  const heapprof::Stats after = heapprof::GetStats();
  CHECK(after.free_objects == before.free_objects);  // never counted: never counted in
  CHECK(after.free_bytes == before.free_bytes);
}
#endif

// Scenarios that need a process of their own (at rate 1 from its start, so
// that heapprof knows every object): the tests re-run this binary with
// HEAPPROF_TEST_CHILD set (support/child_files.hpp). test_retention.cpp;
// -1: no such scenario.
int RunMallocChildScenario(const char* name);

int main(int argc, char** argv) {
  if (const char* child = std::getenv("HEAPPROF_TEST_CHILD")) return RunMallocChildScenario(child);
  doctest::Context context(argc, argv);
  return context.run();
}
