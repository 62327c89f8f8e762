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
#include <malloc.h>
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
    g_failures.reserve(16);
    heapprof::detail::g_alloc_failure_hook.store(
        [](std::size_t n) noexcept { RecordFailure(n); }, std::memory_order_release);
  }
  ~FailureHook() { heapprof::detail::g_alloc_failure_hook.store(nullptr, std::memory_order_release); }
};

// More than any machine has: the real allocator refuses it at once. Read
// through a volatile: the compiler must not see (and warn about) the size.
volatile std::size_t g_huge = std::size_t{1} << 60;

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

#endif  // HEAPPROF_MALLOC_HOOKS
