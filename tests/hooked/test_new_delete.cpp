// Every replaceable operator new/delete form: counted once, behaviour unchanged.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <malloc.h>
#include <exception>
#include <new>
#include <sys/wait.h>
#include <unistd.h>

#include "support/profile_io.hpp"

namespace {

void* volatile g_sink;

struct Delta {
  heapprof::Stats before = heapprof::GetStats();
  heapprof::Stats after{};
  void Stop() { after = heapprof::GetStats(); }
  std::uint64_t allocs() const { return after.alloc_objects - before.alloc_objects; }
  std::uint64_t alloc_bytes() const { return after.alloc_bytes - before.alloc_bytes; }
  std::uint64_t frees() const { return after.free_objects - before.free_objects; }
  std::uint64_t free_bytes() const { return after.free_bytes - before.free_bytes; }
};

struct alignas(256) Aligned256 {
  char bytes[300];
};

template <class Alloc, class Free>
void CheckPair(std::size_t n, Alloc&& alloc, Free&& free_it, std::size_t align = alignof(std::max_align_t)) {
  Delta d;
  void* p = alloc(n);
  g_sink = p;
  const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(p);
  const std::size_t usable = malloc_usable_size(p);
  free_it(p, n);
  d.Stop();
  REQUIRE(address != 0);
  CHECK(address % align == 0);
  CHECK(usable >= n);
  CHECK(d.allocs() == 1);
  // Stats count the block's usable size at both ends, sized delete or not.
  CHECK(d.alloc_bytes() == usable);
  CHECK(d.frees() == 1);
  CHECK(d.free_bytes() == usable);
}

}  // namespace

TEST_CASE("every operator new/delete form is counted exactly once, at rate 1") {
  heapprof_test::RateScope rate(1);
  const std::size_t n = 777;
  const auto al = std::align_val_t{256};
  const std::nothrow_t& nt = std::nothrow;

  SUBCASE("plain") { CheckPair(n, [](std::size_t k) { return ::operator new(k); }, [](void* p, std::size_t) { ::operator delete(p); }); }
  SUBCASE("plain, sized delete") { CheckPair(n, [](std::size_t k) { return ::operator new(k); }, [](void* p, std::size_t k) { ::operator delete(p, k); }); }
  SUBCASE("array") { CheckPair(n, [](std::size_t k) { return ::operator new[](k); }, [](void* p, std::size_t) { ::operator delete[](p); }); }
  SUBCASE("array, sized delete") { CheckPair(n, [](std::size_t k) { return ::operator new[](k); }, [](void* p, std::size_t k) { ::operator delete[](p, k); }); }
  SUBCASE("nothrow") { CheckPair(n, [&](std::size_t k) { return ::operator new(k, nt); }, [&](void* p, std::size_t) { ::operator delete(p, nt); }); }
  SUBCASE("nothrow array") { CheckPair(n, [&](std::size_t k) { return ::operator new[](k, nt); }, [&](void* p, std::size_t) { ::operator delete[](p, nt); }); }
  SUBCASE("aligned") { CheckPair(n, [&](std::size_t k) { return ::operator new(k, al); }, [&](void* p, std::size_t) { ::operator delete(p, al); }, 256); }
  SUBCASE("aligned, sized delete") { CheckPair(n, [&](std::size_t k) { return ::operator new(k, al); }, [&](void* p, std::size_t k) { ::operator delete(p, k, al); }, 256); }
  SUBCASE("aligned array") { CheckPair(n, [&](std::size_t k) { return ::operator new[](k, al); }, [&](void* p, std::size_t) { ::operator delete[](p, al); }, 256); }
  SUBCASE("aligned array, sized delete") { CheckPair(n, [&](std::size_t k) { return ::operator new[](k, al); }, [&](void* p, std::size_t k) { ::operator delete[](p, k, al); }, 256); }
  SUBCASE("aligned nothrow") { CheckPair(n, [&](std::size_t k) { return ::operator new(k, al, nt); }, [&](void* p, std::size_t) { ::operator delete(p, al, nt); }, 256); }
  SUBCASE("aligned nothrow array") { CheckPair(n, [&](std::size_t k) { return ::operator new[](k, al, nt); }, [&](void* p, std::size_t) { ::operator delete[](p, al, nt); }, 256); }
  SUBCASE("zero bytes: a distinct non-null pointer, counted") {
    Delta d;
    void* a = ::operator new(0);
    void* b = ::operator new(0);
    d.Stop();
    CHECK(a != nullptr);
    CHECK(b != nullptr);
    CHECK(a != b);
    CHECK(d.allocs() == 2);
    ::operator delete(a, std::size_t{0});
    ::operator delete(b, std::size_t{0});
  }
}

TEST_CASE("new/delete expressions with over-aligned types honour the alignment") {
  Delta d;
  auto* one = new Aligned256;
  auto* many = new Aligned256[3];
  g_sink = one;
  g_sink = many;
  CHECK(reinterpret_cast<std::uintptr_t>(one) % 256 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(many) % 256 == 0);
  delete one;
  delete[] many;
  d.Stop();
  CHECK(d.allocs() == 2);
  CHECK(d.frees() == 2);
}

TEST_CASE("unsized delete of an unsampled object counts malloc's usable size, as its allocation did") {
  heapprof_test::RateScope rate(0);  // nothing sampled: the live map cannot help
  void* p = ::operator new(100);
  g_sink = p;
  const std::size_t usable = malloc_usable_size(p);
  Delta d;
  ::operator delete(p);
  d.Stop();
  CHECK(d.frees() == 1);
  CHECK(d.free_bytes() == usable);
  CHECK(usable >= 100);
}

namespace {
int g_new_handler_calls = 0;
void CountingHandler() {
  // Second call: give up the way the standard allows, by removing ourselves.
  if (++g_new_handler_calls >= 2) std::set_new_handler(nullptr);
}
volatile std::size_t g_absurd = ~std::size_t{0} / 4;
}  // namespace

#if HEAPPROF_EXCEPTIONS
template <class F>
bool Throws(F&& f) {
  try {
    f();
  } catch (const std::bad_alloc&) {
    return true;
  }
  return false;
}
#else
// Built with -fno-exceptions: the replacement still throws std::bad_alloc the
// standard way (through the library), which nothing here can catch, so the
// throwing forms run in a forked child that must end in std::terminate, not
// return. The child's terminate handler reports how often the new_handler ran.
template <class F>
bool Throws(F&& f) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::set_terminate([] { ::_exit(100 + g_new_handler_calls); });
    f();
    ::_exit(0);  // returned: nothing was thrown
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) < 100) return false;
  g_new_handler_calls = WEXITSTATUS(status) - 100;
  return true;
}
#endif

TEST_CASE("new_handler loop, bad_alloc and nothrow null are unchanged") {
  // Results are gathered first and checked after, so the only allocations
  // inside the measured window are the ones under test.
  Delta d;
  g_new_handler_calls = 0;
  std::set_new_handler(&CountingHandler);
  const bool plain_throws = Throws([] { g_sink = ::operator new(g_absurd); });
  const int plain_calls = g_new_handler_calls;

  g_new_handler_calls = 0;
  std::set_new_handler(&CountingHandler);
  void* const nothrow_result = ::operator new(g_absurd, std::nothrow);
  const int nothrow_calls = g_new_handler_calls;

  g_new_handler_calls = 0;
  std::set_new_handler(&CountingHandler);
  const bool aligned_throws = Throws([] { g_sink = ::operator new[](g_absurd, std::align_val_t{64}); });
  const int aligned_calls = g_new_handler_calls;

  std::set_new_handler(nullptr);
  void* const aligned_nothrow_result = ::operator new[](g_absurd, std::align_val_t{64}, std::nothrow);
  const bool array_throws = Throws([] { g_sink = ::operator new[](g_absurd); });
  d.Stop();

  CHECK(plain_throws);
  CHECK(plain_calls == 2);  // called until it uninstalled itself
  CHECK(nothrow_result == nullptr);
  CHECK(nothrow_calls == 2);
  CHECK(aligned_throws);
  CHECK(aligned_calls == 2);
  CHECK(aligned_nothrow_result == nullptr);
  CHECK(array_throws);
  CHECK(d.allocs() == 0);  // failures are not allocations
}
