// Every replaceable operator new/delete form: counted once, behaviour unchanged.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <malloc.h>
#include <exception>
#include <memory_resource>
#include <stdexcept>
#include <new>
#include <string>
#include <vector>
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

// ---- heapprof::allocator's upstream and the global hooks ----------------------
// The allocator counts its own block and the hooks stay silent for that one
// (counted once); every other block its upstream allocates or frees during
// the call is the upstream's, which the hooks count as any. Before, the hooks
// were silent for all of them: a pmr resource's chunk, allocated inside an
// allocate and freed by the resource's destructor outside, was counted at the
// free only (a monotonic_buffer_resource per request drove live_bytes to 0),
// the exception an upstream threw at its catch only, and a block the upstream
// freed that was allocated elsewhere was never counted freed.
namespace {
using PmrInts = std::pmr::polymorphic_allocator<int>;
using ProfiledPmrInts = heapprof::allocator<int, PmrInts>;

// Allocates from the heap and, on its first allocate, frees a block it was
// handed beforehand (an emergency reserve, a cache it drops).
void* g_upstream_drops = nullptr;
template <class T>
struct DroppingUpstream {
  using value_type = T;
  DroppingUpstream() = default;
  template <class U>
  DroppingUpstream(const DroppingUpstream<U>&) noexcept {}  // NOLINT: implicit, as rebinding requires
  T* allocate(std::size_t n) {
    ::operator delete(g_upstream_drops);
    g_upstream_drops = nullptr;
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
  friend bool operator==(const DroppingUpstream&, const DroppingUpstream&) { return true; }
  friend bool operator!=(const DroppingUpstream&, const DroppingUpstream&) { return false; }
};

#if HEAPPROF_EXCEPTIONS
template <class T>
struct ThrowingUpstream {
  using value_type = T;
  ThrowingUpstream() = default;
  template <class U>
  ThrowingUpstream(const ThrowingUpstream<U>&) noexcept {}  // NOLINT: implicit, as rebinding requires
  T* allocate(std::size_t) { throw std::runtime_error(std::string(200, 'x')); }  // its message: operator new
  void deallocate(T*, std::size_t) noexcept {}
  friend bool operator==(const ThrowingUpstream&, const ThrowingUpstream&) { return true; }
  friend bool operator!=(const ThrowingUpstream&, const ThrowingUpstream&) { return false; }
};
#endif
}  // namespace

TEST_CASE("heapprof::allocator over an upstream that allocates for itself: Stats exact with the global hooks") {
  SUBCASE("a pass-through upstream's block is counted once, by the allocator") {
    heapprof_test::RateScope rate(1);
    Delta d;
    {
      std::vector<int, heapprof::allocator<int>> a;
      a.reserve(1000);
      std::vector<int, ProfiledPmrInts> b{ProfiledPmrInts(PmrInts(std::pmr::new_delete_resource()))};
      b.reserve(2000);
    }
    d.Stop();
    CHECK(d.allocs() == 2);
    CHECK(d.alloc_bytes() == 3000 * sizeof(int));
    CHECK(d.frees() == 2);
    CHECK(d.free_bytes() == 3000 * sizeof(int));
  }
  SUBCASE("a monotonic_buffer_resource per request: its chunks counted at both ends") {
    for (const std::size_t r : {std::size_t{1}, std::size_t{1} << 30}) {
      heapprof_test::RateScope rate(r);
      Delta d;
      for (int request = 0; request < 50; ++request) {
        std::pmr::monotonic_buffer_resource arena;
        std::vector<int, ProfiledPmrInts> v{ProfiledPmrInts(PmrInts(&arena))};
        for (int i = 0; i < 5000; ++i) v.push_back(i);
      }
      d.Stop();
      INFO("rate " << r);
      // The vector's 14 buffers a request (the allocator) and the arena's
      // chunks (the hooks): freed, all of them, by the end of each request.
      CHECK(d.allocs() > 50 * 14);
      CHECK(d.frees() == d.allocs());
      CHECK(d.free_bytes() == d.alloc_bytes());
    }
  }
  SUBCASE("an upstream freeing a block allocated elsewhere: counted freed") {
    heapprof_test::RateScope rate(std::size_t{1} << 30);  // unsampled: only the counters know it
    Delta d;
    g_upstream_drops = ::operator new(3000);
    const std::size_t dropped = malloc_usable_size(g_upstream_drops);
    {
      std::vector<int, heapprof::allocator<int, DroppingUpstream<int>>> v;
      v.reserve(10);
    }
    d.Stop();
    CHECK(g_upstream_drops == nullptr);
    CHECK(d.allocs() == 2);
    CHECK(d.frees() == 2);
    CHECK(d.alloc_bytes() == dropped + 10 * sizeof(int));
    CHECK(d.free_bytes() == d.alloc_bytes());
  }
#if HEAPPROF_EXCEPTIONS
  SUBCASE("an upstream that throws: what the exception holds is counted at both ends") {
    heapprof_test::RateScope rate(1);
    Delta d;
    int caught = 0;
    for (int i = 0; i < 10; ++i) {
      try {
        std::vector<int, heapprof::allocator<int, ThrowingUpstream<int>>> v;
        v.reserve(10);
      } catch (const std::runtime_error& e) {
        caught += e.what()[0] == 'x';
      }
    }
    d.Stop();
    CHECK(caught == 10);
    CHECK(d.allocs() >= 10);  // the messages' strings, at least
    CHECK(d.frees() == d.allocs());
    CHECK(d.free_bytes() == d.alloc_bytes());
  }
#endif
}
