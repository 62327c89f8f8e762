// The malloc family's failure path (HEAPPROF=oom_dump, README "Memory
// events"): every function that returns null (or ENOMEM) for a request it
// cannot meet calls the failure hook once, with the size, and then fails
// exactly as the real allocator did: same result, same errno. The dump itself
// is tested end to end through operator new (tests/hooked, oom_dump).
#include "common.hpp"

#include "heapprof/detail/1_hooks/block_hooks.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

#if HEAPPROF_MALLOC_HOOKS

namespace {

std::vector<std::size_t> g_failures;

void RecordFailure(std::size_t n) {
  if (g_failures.size() < 16) g_failures.push_back(n);
  errno = 0;  // the hook's own errno must not leak out
}

struct FailureHook {
  FailureHook() {
    g_failures.clear();
    g_failures.reserve(16);
    heapprof::detail::g_alloc_failure_hook.store(
        [](std::size_t n) noexcept {
          RecordFailure(n);
          return false;  // nothing given back: fail as the allocator did
        },
        std::memory_order_release);
  }
  ~FailureHook() { heapprof::detail::g_alloc_failure_hook.store(nullptr, std::memory_order_release); }
};

// More than any machine has: the real allocator refuses it at once. Read
// through a volatile: the compiler must not see (and warn about) the size.
volatile std::size_t g_huge = std::size_t{1} << 60;

// An address-space limit `headroom` bytes above what the process maps now,
// read before the test's Delta starts (the read allocates); Apply and Restore
// around the calls that must fail.
struct AddressSpaceLimit {
  rlimit saved{};
  rlimit tight{};
  explicit AddressSpaceLimit(std::size_t headroom) {
    std::size_t pages = 0;
    {
      std::ifstream statm("/proc/self/statm");
      statm >> pages;
    }
    REQUIRE(pages > 0);
    REQUIRE(getrlimit(RLIMIT_AS, &saved) == 0);
    tight = saved;
    tight.rlim_cur = pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) + headroom;
  }
  void Apply() { REQUIRE(setrlimit(RLIMIT_AS, &tight) == 0); }
  void Restore() { REQUIRE(setrlimit(RLIMIT_AS, &saved) == 0); }
};

// errno just after a call, read after a compiler barrier: clang takes malloc
// and calloc not to write errno, and would otherwise give back a value
// stored before the call.
inline int ErrnoAfterCall() {
  asm volatile("" ::: "memory");
  return errno;
}

}  // namespace

TEST_CASE("malloc family: a failed allocation calls the failure hook once, then fails as before") {
  if (!malloc_test::RealMallocIsGlibc()) return;  // glibc's documented errno on each failure
  const std::size_t kHuge = g_huge;
  FailureHook hook;
  errno = 0;
  CHECK(std::malloc(kHuge) == nullptr);
  CHECK(errno == ENOMEM);
  errno = 0;
  CHECK(std::calloc(kHuge / 8, 8) == nullptr);
  CHECK(errno == ENOMEM);
  errno = 0;
  void* p = std::malloc(16);
  REQUIRE(p != nullptr);
  CHECK(std::realloc(p, kHuge) == nullptr);  // p is still the caller's
  CHECK(errno == ENOMEM);
  std::free(p);
  void* out = nullptr;
  CHECK(posix_memalign(&out, 64, kHuge) == ENOMEM);
  errno = 0;
  CHECK(aligned_alloc(64, kHuge) == nullptr);
  CHECK(errno == ENOMEM);
  errno = 0;
  CHECK(memalign(64, kHuge) == nullptr);
  CHECK(errno == ENOMEM);
  REQUIRE(g_failures.size() == 6);
  CHECK(g_failures[0] == kHuge);
  CHECK(g_failures[1] == kHuge);
  CHECK(g_failures[2] == kHuge);
  CHECK(g_failures[3] == kHuge);
  // Not failures: malloc(0) and calloc's overflow check (ENOMEM without a request).
  malloc_test::g_sink = std::malloc(0);
  std::free(malloc_test::g_sink);
  errno = 0;
  CHECK(std::calloc(kHuge, kHuge) == nullptr);
  CHECK(errno == ENOMEM);
  CHECK(g_failures.size() == 6);
}

// realloc's hot path (block_hooks: HotRealloc: an unsampled block, no sample
// due) counts the old block's free before the call; when the allocator then
// fails, the block is the caller's again and must be counted back. Only the
// allocator failing gets there: under an address-space limit a 256 MiB realloc
// fails while the countdown, at the largest rate (~1 TiB), is far above it.
// glibc only: jemalloc serves such a request from address space it retains.
TEST_CASE("malloc family: a realloc that fails on its hot path keeps the block, calls the hook once, Stats balance") {
  if (!malloc_test::RealMallocIsGlibc()) return;
  constexpr std::size_t kGrow = std::size_t{256} << 20;
  malloc_test::RateScope rate(std::size_t{1} << 40);
  FailureHook hook;
  void* p = std::malloc(64);
  REQUIRE(p != nullptr);
  std::memset(p, 0x33, 64);
  const std::size_t usable = malloc_usable_size(p);
  AddressSpaceLimit limit(std::size_t{64} << 20);
  malloc_test::Delta d;
  limit.Apply();
  errno = 0;
  void* q = std::realloc(p, kGrow);
  const int err = errno;
  limit.Restore();
  CHECK(q == nullptr);
  CHECK(err == ENOMEM);
  CHECK(static_cast<unsigned char*>(p)[0] == 0x33);
  CHECK(static_cast<unsigned char*>(p)[63] == 0x33);
  std::free(p);
  d.Stop();
  CHECK(d.live_bytes() == -static_cast<std::int64_t>(usable));  // the block allocated before `d`, freed
  CHECK(d.live_objects() == -1);
  REQUIRE(g_failures.size() == 1);
  CHECK(g_failures[0] == kGrow);
}

// The hooks' hot paths call the allocator once the countdown allows it; when
// that call fails, the cold function gets the request back from the hook's
// frame (block_hooks: HotAlloc's `kept`), retries, and reports it. Only the
// allocator failing gets there (a request above the countdown goes cold
// before the call): under an address-space limit, with the largest rate.
TEST_CASE("malloc family: malloc, calloc and realloc(nullptr) that fail after the hot path's call report their size") {
  if (!malloc_test::RealMallocIsGlibc()) return;
  constexpr std::size_t kBig = std::size_t{256} << 20;
  malloc_test::RateScope rate(std::size_t{1} << 40);
  FailureHook hook;
  AddressSpaceLimit limit(std::size_t{64} << 20);
  malloc_test::Delta d;
  limit.Apply();
  errno = 0;
  void* a = std::malloc(kBig);
  const int err_a = ErrnoAfterCall();
  errno = 0;
  void* b = std::calloc(1, kBig + 16);
  const int err_b = ErrnoAfterCall();
  errno = 0;
  void* c = std::realloc(nullptr, kBig + 32);
  const int err_c = ErrnoAfterCall();
  limit.Restore();
  d.Stop();
  CHECK(a == nullptr);
  CHECK(b == nullptr);
  CHECK(c == nullptr);
  CHECK(err_a == ENOMEM);
  CHECK(err_b == ENOMEM);
  CHECK(err_c == ENOMEM);
  CHECK(d.live_bytes() == 0);
  CHECK(d.live_objects() == 0);
  REQUIRE(g_failures.size() == 3);
  CHECK(g_failures[0] == kBig);
  CHECK(g_failures[1] == kBig + 16);
  CHECK(g_failures[2] == kBig + 32);
}

// oom_dump's hook releases its reserve (dumps.hpp: OnAllocFailed returns
// true): the failed call is made once more, as without heapprof the
// reserve's address space would have been there for it. This hook stands in
// for it: a 128 MiB mapping, released at the first failure. Under a limit
// 64 MiB above the address space (the reserve mapped), a 96 MiB request
// fails, the hook releases the reserve, the call succeeds. Before, only
// operator new (its new_handler loop) tried again: every function of the
// malloc family returned null with the released room unused.
namespace {

void* g_reserve = nullptr;
constexpr std::size_t kReserve = std::size_t{128} << 20;

struct ReleasingHook {
  ReleasingHook() {
    g_failures.clear();
    g_failures.reserve(16);
    g_reserve = ::mmap(nullptr, kReserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(g_reserve != MAP_FAILED);
    heapprof::detail::g_alloc_failure_hook.store(
        [](std::size_t n) noexcept {
          RecordFailure(n);
          if (g_reserve == nullptr) return false;
          ::munmap(g_reserve, kReserve);
          g_reserve = nullptr;
          return true;
        },
        std::memory_order_release);
  }
  ~ReleasingHook() {
    heapprof::detail::g_alloc_failure_hook.store(nullptr, std::memory_order_release);
    if (g_reserve != nullptr) ::munmap(g_reserve, kReserve);
    g_reserve = nullptr;
  }
};

}  // namespace

TEST_CASE("malloc family: a failure whose hook released memory (oom_dump's reserve) is tried once more") {
  if (!malloc_test::RealMallocIsGlibc()) return;  // glibc: 96 MiB is an mmap of its own, refused under the limit
  constexpr std::size_t kAsk = std::size_t{96} << 20;
  malloc_test::RateScope rate(std::size_t{1} << 40);  // no sample: the hot paths
  for (int f = 0; f < 9; ++f) {
    CAPTURE(f);
    // realloc's hot path (an unsampled block under 1 KiB), and its cold one (1 KiB or more).
    const bool moves = f == 2 || f == 8;
    void* old = f == 2 ? std::malloc(64) : f == 8 ? std::malloc(4096) : nullptr;
    const std::size_t old_usable = old != nullptr ? malloc_usable_size(old) : 0;
    ReleasingHook hook;
    AddressSpaceLimit limit(std::size_t{64} << 20);
    malloc_test::Delta d;
    limit.Apply();
    void* p = nullptr;
    int rc = 0;
    switch (f) {
      case 0: p = std::malloc(kAsk); break;
      case 1: p = std::calloc(1, kAsk); break;
      case 2: p = std::realloc(old, kAsk); break;
      case 3: p = std::realloc(nullptr, kAsk); break;
      case 4: rc = posix_memalign(&p, 64, kAsk); break;
      case 5: p = aligned_alloc(64, kAsk); break;
      case 6: p = memalign(64, kAsk); break;
      case 7: p = valloc(kAsk); break;
      default: p = std::realloc(old, kAsk); break;
    }
    limit.Restore();
    CHECK(rc == 0);
    REQUIRE(p != nullptr);
    CHECK(g_failures.size() == 1);  // one failure, one try more
    if (!g_failures.empty()) CHECK(g_failures[0] == kAsk);
    const std::size_t usable = malloc_usable_size(p);
    CHECK(usable >= kAsk);
    std::free(p);
    d.Stop();
    // Balanced: the new block counted once, and freed (realloc: the old
    // block, allocated before `d`, freed too).
    CHECK(d.live_objects() == (moves ? -1 : 0));
    CHECK(d.live_bytes() == -static_cast<std::int64_t>(old_usable));
  }
}

#endif  // HEAPPROF_MALLOC_HOOKS
