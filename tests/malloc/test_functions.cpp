// Each function of the malloc family, at rate 1: counted once, exact in Stats
// (usable bytes) and in the profile (requested bytes), with the allocator's
// own semantics (errno, overflow, zero sizes, alignment).
#include "common.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <new>
#include <thread>
#include <vector>

#if HEAPPROF_MALLOC_HOOKS

extern "C" void free_sized(void* p, std::size_t n) noexcept;
extern "C" void free_aligned_sized(void* p, std::size_t alignment, std::size_t n) noexcept;

namespace {

using malloc_test::Delta;
using malloc_test::g_sink;
using malloc_test::ProfileTotals;
using malloc_test::RateScope;
using malloc_test::Totals;

// One leaf per function: noinline, and a store after the call (no tail call),
// so each is the sample's leaf frame.
__attribute__((noinline)) void* LeafMalloc(std::size_t n) {
  void* p = std::malloc(n);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafCalloc(std::size_t c, std::size_t s) {
  void* p = std::calloc(c, s);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafRealloc(void* old, std::size_t n) {
  void* p = std::realloc(old, n);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafReallocarray(void* old, std::size_t c, std::size_t s) {
  void* p = reallocarray(old, c, s);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafPosixMemalign(std::size_t a, std::size_t n, int* err) {
  void* p = nullptr;
  *err = posix_memalign(&p, a, n);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafAlignedAlloc(std::size_t a, std::size_t n) {
  void* p = aligned_alloc(a, n);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafMemalign(std::size_t a, std::size_t n) {
  void* p = memalign(a, n);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafValloc(std::size_t n) {
  void* p = valloc(n);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafPvalloc(std::size_t n) {
  void* p = pvalloc(n);
  g_sink = p;
  return p;
}
__attribute__((noinline)) void* LeafNew(std::size_t n) {
  void* p = ::operator new(n);
  g_sink = p;
  return p;
}

// Allocates with `alloc` (which must use `leaf`), frees with `release`; checks
// Stats and the profile.
template <class Alloc, class Release>
void CheckOne(const char* leaf, std::size_t requested, Alloc alloc, Release release) {
  RateScope rate(1);
  const Totals t0 = ProfileTotals(leaf);
  Delta d;
  void* p = alloc();
  REQUIRE(p != nullptr);
  const std::size_t usable = malloc_usable_size(p);
  CHECK(usable >= requested);
  Delta live;
  const Totals t1 = ProfileTotals(leaf) - t0;
  CHECK(t1.alloc_objects == 1);
  CHECK(t1.alloc_space == static_cast<std::int64_t>(requested));
  CHECK(t1.inuse_objects == 1);
  CHECK(t1.inuse_space == static_cast<std::int64_t>(requested));
  Delta f;
  release(p);
  f.Stop();
  d.Stop();
  CHECK(f.frees() == 1);
  CHECK(f.free_bytes() == usable);
  CHECK(d.allocs() >= 1);
  CHECK(d.live_bytes() == 0);
  CHECK(d.live_objects() == 0);
  const Totals t2 = ProfileTotals(leaf) - t0;
  CHECK(t2.alloc_objects == 1);
  CHECK(t2.inuse_objects == 0);
  CHECK(t2.inuse_space == 0);
}

void Free(void* p) { std::free(p); }

}  // namespace

TEST_CASE("malloc family: each function is counted once, Stats in usable bytes, the profile in requested bytes") {
  RateScope rate(1);
  SUBCASE("malloc + free: exactly one allocation and one free in Stats") {
    Delta d;
    void* p = LeafMalloc(100);
    const std::size_t u = malloc_usable_size(p);
    std::free(p);
    d.Stop();
    CHECK(d.allocs() == 1);
    CHECK(d.frees() == 1);
    CHECK(d.alloc_bytes() == u);
    CHECK(d.free_bytes() == u);
  }
  SUBCASE("malloc") { CheckOne("LeafMalloc", 1000, [] { return LeafMalloc(1000); }, &Free); }
  SUBCASE("calloc") {
    CheckOne("LeafCalloc", 3000, [] {
      auto* p = static_cast<unsigned char*>(LeafCalloc(30, 100));
      for (int i = 0; i < 3000; ++i) REQUIRE(p[i] == 0);
      return static_cast<void*>(p);
    }, &Free);
  }
  SUBCASE("realloc from null") { CheckOne("LeafRealloc", 500, [] { return LeafRealloc(nullptr, 500); }, &Free); }
  SUBCASE("reallocarray from null") {
    CheckOne("LeafReallocarray", 700, [] { return LeafReallocarray(nullptr, 7, 100); }, &Free);
  }
  SUBCASE("posix_memalign") {
    CheckOne("LeafPosixMemalign", 300, [] {
      int err = -1;
      void* p = LeafPosixMemalign(64, 300, &err);
      CHECK(err == 0);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
      return p;
    }, &Free);
  }
  SUBCASE("aligned_alloc") { CheckOne("LeafAlignedAlloc", 512, [] { return LeafAlignedAlloc(256, 512); }, &Free); }
  SUBCASE("memalign") { CheckOne("LeafMemalign", 100, [] { return LeafMemalign(128, 100); }, &Free); }
  SUBCASE("valloc") { CheckOne("LeafValloc", 100, [] { return LeafValloc(100); }, &Free); }
  SUBCASE("pvalloc") { CheckOne("LeafPvalloc", 100, [] { return LeafPvalloc(100); }, &Free); }
  SUBCASE("free_sized") {
    CheckOne("LeafMalloc", 222, [] { return LeafMalloc(222); }, [](void* p) { free_sized(p, 222); });
  }
  SUBCASE("free_aligned_sized") {
    CheckOne("LeafAlignedAlloc", 1024, [] { return LeafAlignedAlloc(512, 1024); },
             [](void* p) { free_aligned_sized(p, 512, 1024); });
  }
  SUBCASE("operator new counts once although it allocates with the real malloc") {
    CheckOne("LeafNew", 777, [] { return LeafNew(777); }, [](void* p) { ::operator delete(p); });
  }
  SUBCASE("new, then free(); malloc, then operator delete: Stats still balance") {
    Delta d;
    void* a = LeafNew(300);
    void* b = LeafMalloc(300);
    std::free(a);  // not allowed by the standard, but it works with glibc: counts must too
    ::operator delete(b);
    d.Stop();
    CHECK(d.live_bytes() == 0);
    CHECK(d.live_objects() == 0);
  }
}

TEST_CASE("malloc family: allocator semantics are the real allocator's") {
  RateScope rate(1);
  SUBCASE("malloc(0): a distinct, freeable pointer, counted") {
    Delta d;
    void* a = LeafMalloc(0);
    void* b = LeafMalloc(0);
    CHECK(a != nullptr);
    CHECK(a != b);
    std::free(a);
    std::free(b);
    d.Stop();
    CHECK(d.allocs() == 2);
    CHECK(d.frees() == 2);
    CHECK(d.live_bytes() == 0);
  }
  SUBCASE("free(nullptr) and realloc(nullptr, n)") {
    Delta d;
    std::free(nullptr);
    d.Stop();
    CHECK(d.frees() == 0);
    CHECK(malloc_usable_size(nullptr) == 0);
  }
  SUBCASE("calloc overflow: nullptr and ENOMEM, nothing counted") {
    if (!malloc_test::RealMallocIsGlibc()) return;  // glibc's failure semantics
    Delta d;
    errno = 0;
    CHECK(LeafCalloc(SIZE_MAX / 2, 3) == nullptr);
    CHECK(errno == ENOMEM);
    errno = 0;
    CHECK(LeafCalloc(std::size_t{1} << 33, std::size_t{1} << 33) == nullptr);
    CHECK(errno == ENOMEM);
    d.Stop();
    CHECK(d.allocs() == 0);
  }
  SUBCASE("reallocarray overflow: nullptr, ENOMEM, the block untouched") {
    if (!malloc_test::RealMallocIsGlibc()) return;  // glibc's failure semantics
    void* p = LeafMalloc(64);
    std::memset(p, 0x5a, 64);
    Delta d;
    errno = 0;
    CHECK(LeafReallocarray(p, SIZE_MAX / 2, 3) == nullptr);
    CHECK(errno == ENOMEM);
    d.Stop();
    CHECK(d.allocs() == 0);
    CHECK(d.frees() == 0);
    CHECK(static_cast<unsigned char*>(p)[63] == 0x5a);
    std::free(p);
  }
  SUBCASE("malloc of an absurd size: nullptr, ENOMEM, nothing counted") {
    if (!malloc_test::RealMallocIsGlibc()) return;  // glibc's failure semantics
    Delta d;
    errno = 0;
    CHECK(LeafMalloc(SIZE_MAX - 4096) == nullptr);
    CHECK(errno == ENOMEM);
    d.Stop();
    CHECK(d.allocs() == 0);
  }
  SUBCASE("a failed realloc keeps the block, and the counts balance") {
    if (!malloc_test::RealMallocIsGlibc()) return;  // glibc's failure semantics
    void* p = LeafMalloc(64);
    std::memset(p, 0x33, 64);
    const std::size_t usable = malloc_usable_size(p);
    Delta d;
    errno = 0;
    CHECK(LeafRealloc(p, SIZE_MAX - 4096) == nullptr);
    CHECK(errno == ENOMEM);
    CHECK(static_cast<unsigned char*>(p)[0] == 0x33);
    std::free(p);
    d.Stop();
    CHECK(d.live_bytes() == -static_cast<std::int64_t>(usable));  // the block allocated before `d`, freed
    CHECK(d.live_objects() == -1);
  }
  SUBCASE("posix_memalign: EINVAL for a bad alignment, errno and *out untouched") {
    Delta d;
    void* out = &d;
    errno = 1234;
    CHECK(posix_memalign(&out, 24, 100) == EINVAL);
    CHECK(posix_memalign(&out, 0, 100) == EINVAL);
    CHECK(out == static_cast<void*>(&d));
    CHECK(errno == 1234);
    d.Stop();
    CHECK(d.allocs() == 0);
  }
  SUBCASE("free keeps errno") {
    void* p = LeafMalloc(10);
    void* q = LeafMalloc(100000);
    errno = 4321;
    std::free(p);
    std::free(q);
    CHECK(errno == 4321);
  }
}

TEST_CASE("malloc family: realloc chains are a free of the old block and an allocation of the new") {
  RateScope rate(1);
  const Totals t0 = ProfileTotals("LeafRealloc");
  Delta d;
  // From null, grow within the heap, grow into an mmapped chunk, shrink back,
  // shrink in place, and to zero (glibc frees and returns nullptr).
  const std::size_t sizes[] = {16, 200, 4000, 100000, 300000, 1 << 20, 5000, 4990, 24, 1};
  void* p = nullptr;
  std::size_t allocations = 0;
  std::size_t last = 0;
  for (std::size_t n : sizes) {
    p = LeafRealloc(p, n);
    REQUIRE(p != nullptr);
    ++allocations;
    last = n;
    static_cast<unsigned char*>(p)[n - 1] = 7;  // writable to its end
    Delta now;
    now.before = d.before;
    now.Stop();
    CHECK(now.live_objects() == 1);
    CHECK(now.live_bytes() == static_cast<std::int64_t>(malloc_usable_size(p)));
  }
  const Totals mid = ProfileTotals("LeafRealloc") - t0;
  CHECK(mid.alloc_objects == static_cast<std::int64_t>(allocations));
  std::int64_t want_space = 0;
  for (std::size_t n : sizes) want_space += static_cast<std::int64_t>(n);
  CHECK(mid.alloc_space == want_space);
  CHECK(mid.inuse_objects == 1);
  CHECK(mid.inuse_space == static_cast<std::int64_t>(last));
  void* gone = LeafRealloc(p, 0);
  d.Stop();
  if (gone == nullptr) {  // glibc: realloc(p, 0) frees p
    CHECK(d.live_objects() == 0);
    CHECK(d.live_bytes() == 0);
  } else {  // an allocator that returns a minimal block (jemalloc, tcmalloc)
    CHECK(d.live_objects() == 1);
    std::free(gone);
    d.Stop();
    CHECK(d.live_objects() == 0);
    CHECK(d.live_bytes() == 0);
  }
  const Totals end = ProfileTotals("LeafRealloc") - t0;
  CHECK(end.inuse_objects == 0);
  CHECK(end.inuse_space == 0);
}

TEST_CASE("malloc family: alignments from 16 B to 1 MiB") {
  RateScope rate(1);
  Delta d;
  std::size_t count = 0;
  for (std::size_t a = 16; a <= (std::size_t{1} << 20); a *= 2) {
    int err = -1;
    void* p1 = LeafPosixMemalign(a, 100, &err);
    REQUIRE(err == 0);
    void* p2 = LeafAlignedAlloc(a, a);
    void* p3 = LeafMemalign(a, 3 * a);
    void* p4 = ::operator new(a + 1, std::align_val_t{a});
    for (void* p : {p1, p2, p3, p4}) {
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % a == 0);
    }
    std::free(p1);
    free_aligned_sized(p2, a, a);
    std::free(p3);
    ::operator delete(p4, std::align_val_t{a});
    count += 4;
  }
  d.Stop();
  CHECK(d.allocs() == count);
  CHECK(d.frees() == count);
  CHECK(d.live_bytes() == 0);
  const Totals t = ProfileTotals("LeafPosixMemalign");
  CHECK(t.inuse_objects == 0);
}

TEST_CASE("malloc family: threads allocate and free each other's blocks; Stats balance") {
  RateScope rate(1);
  constexpr int kPerThread = 20000;
  std::vector<void*> blocks(4 * kPerThread);
  {  // glibc caches exited threads' stacks with their (calloc'd) TLS vectors: fill that cache first
    std::vector<std::thread> warm;
    for (int t = 0; t < 4; ++t) warm.emplace_back([] {});
    for (auto& th : warm) th.join();
  }
  Delta d;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &blocks] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::size_t n = static_cast<std::size_t>((i * 37 + t) % 3000 + 1);
        blocks[static_cast<std::size_t>(t * kPerThread + i)] = (i % 3 == 0)   ? std::malloc(n)
                                                               : (i % 3 == 1) ? std::calloc(1, n)
                                                                              : std::realloc(nullptr, n);
      }
    });
  }
  for (auto& th : threads) th.join();
  threads.clear();
  for (int t = 0; t < 4; ++t) {  // each thread frees another thread's blocks
    threads.emplace_back([t, &blocks] {
      const int from = (t + 1) % 4;
      for (int i = 0; i < kPerThread; ++i) std::free(blocks[static_cast<std::size_t>(from * kPerThread + i)]);
    });
  }
  for (auto& th : threads) th.join();
  threads.clear();
  decltype(threads)().swap(threads);  // frees the buffer (allocated after `d`); shrink_to_fit does nothing without exceptions
  d.Stop();
  CHECK(d.live_objects() == 0);
  CHECK(d.live_bytes() == 0);
}

#else

TEST_CASE("malloc family: not replaced under AddressSanitizer/ThreadSanitizer" * doctest::skip()) {}

#endif  // HEAPPROF_MALLOC_HOOKS
