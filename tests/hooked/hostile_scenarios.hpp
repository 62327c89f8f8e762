// Child-process scenarios of tests/hooked/test_hostile.cpp: what a hostile
// (but legal, or at least common) host does to the profiler. Each runs in its
// own process under a timeout, so a deadlock is a failed test, not a hung run.
#pragma once

#include <heapprof.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <pthread.h>
#include <string>
#include <unistd.h>
#include <vector>

#include "support/block_size.hpp"

namespace heapprof_test {

#define HEAPPROF_HOSTILE_CHECK(cond)                                                  \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);                   \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

// ---- a thread that sends signals to another until told to stop ----
struct SignalSender {
  pthread_t target;
  int sig;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> sent{0};
  pthread_t thread{};

  static void* Main(void* self) {
    auto* s = static_cast<SignalSender*>(self);
    while (!s->stop.load(std::memory_order_relaxed)) {
      if (pthread_kill(s->target, s->sig) != 0) break;
      s->sent.fetch_add(1, std::memory_order_relaxed);
    }
    return nullptr;
  }
  void Start() { pthread_create(&thread, nullptr, &Main, this); }
  void Stop() {
    stop.store(true);
    pthread_join(thread, nullptr);
  }
};

// ---- items 1 and 4: a handler allocating and freeing sampled objects ------
// while its thread allocates and frees at rate 1 (every free takes a live-map
// shard lock). The handler also frees objects allocated before, so some of its
// frees land on the shard its thread holds. Totals must then be exact.
constexpr int kPoolSize = 20000;
inline void* g_pool[kPoolSize];
inline volatile sig_atomic_t g_pool_next = 0;
inline volatile sig_atomic_t g_handler_runs = 0;

inline void AllocatingHandler(int) {
  const int saved_errno = errno;
  void* q = ::operator new(48);
  ::operator delete(q, 48);
  if (g_pool_next < kPoolSize) {
    ::operator delete(g_pool[g_pool_next], 64);
    g_pool_next = g_pool_next + 1;
  }
  g_handler_runs = g_handler_runs + 1;
  errno = saved_errno;
}

inline int RunSignalAllocInFree() {
  heapprof::SetSampleRate(1);
  const std::uint64_t u32 = heapprof_test::UsableFor(32), u48 = heapprof_test::UsableFor(48),
                      u64 = heapprof_test::UsableFor(64);
  const heapprof::Stats s_pool = heapprof::GetStats();
  for (void*& p : g_pool) p = ::operator new(64);
  struct sigaction sa {};
  sa.sa_handler = &AllocatingHandler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  const heapprof::Stats s0 = heapprof::GetStats();
  SignalSender sender{pthread_self(), SIGUSR1};
  sender.Start();
  // At least 300,000 loops and 1,000 handler runs (a deadlock is caught by
  // the parent's timeout).
  std::uint64_t kLoops = 0;
  while (kLoops < 300000 || g_handler_runs < 1000) {
    void* p = ::operator new(32);
    asm volatile("" ::"r"(p) : "memory");
    ::operator delete(p, 32);
    ++kLoops;
  }
  sender.Stop();
  // Stop the handler before reading: nothing may run between s1 and the checks.
  signal(SIGUSR1, SIG_IGN);
  const heapprof::Stats s1 = heapprof::GetStats();
  const std::uint64_t runs = static_cast<std::uint64_t>(g_handler_runs);
  const std::uint64_t pool_freed = static_cast<std::uint64_t>(g_pool_next);
  std::printf("signals sent %llu, handler runs %llu, pool objects freed by the handler %llu\n",
              static_cast<unsigned long long>(sender.sent.load()), static_cast<unsigned long long>(runs),
              static_cast<unsigned long long>(pool_freed));
  HEAPPROF_HOSTILE_CHECK(s1.alloc_objects - s0.alloc_objects == kLoops + runs);
  HEAPPROF_HOSTILE_CHECK(s1.alloc_bytes - s0.alloc_bytes == u32 * kLoops + u48 * runs);
  HEAPPROF_HOSTILE_CHECK(s1.free_objects - s0.free_objects == kLoops + runs + pool_freed);
  HEAPPROF_HOSTILE_CHECK(s1.free_bytes - s0.free_bytes == u32 * kLoops + u48 * runs + u64 * pool_freed);
  for (int i = static_cast<int>(pool_freed); i < kPoolSize; ++i) ::operator delete(g_pool[i], 64);
  const heapprof::Stats s2 = heapprof::GetStats();
  // Every sampled object, the handler's included, left the live map.
  HEAPPROF_HOSTILE_CHECK(s2.sampled_live_objects == s_pool.sampled_live_objects);
  HEAPPROF_HOSTILE_CHECK(s2.live_bytes == s_pool.live_bytes);
  std::printf("signal_alloc_in_free: ok\n");
  return 0;
}

// ---- item 2: GetStats in a loop, a handler allocating 1 MiB ---------------
inline void BigAllocHandler(int) {
  const int saved_errno = errno;
  void* q = ::operator new(1 << 20);
  ::operator delete(q, 1 << 20);
  g_handler_runs = g_handler_runs + 1;
  errno = saved_errno;
}

inline int RunSignalDuringGetStats() {
  struct sigaction sa {};
  sa.sa_handler = &BigAllocHandler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  SignalSender sender{pthread_self(), SIGUSR1};
  sender.Start();
  std::uint64_t sum = 0;
  while (g_handler_runs < 2000) sum += heapprof::GetStats().stacks;  // until 2,000 handler runs
  sender.Stop();
  signal(SIGUSR1, SIG_IGN);
  std::printf("handler runs %d (%llu)\n", static_cast<int>(g_handler_runs), static_cast<unsigned long long>(sum));
  std::printf("signal_getstats: ok\n");
  return 0;
}

// ---- item 3: exit() from a SIGTERM handler, leak report on, rate 1 --------
// The handler exits only when it interrupted its thread inside the profiler
// (the case that deadlocked: the exit actions needed a lock the thread held);
// elsewhere it returns and the next signal tries again. That keeps the test
// from also exiting while the thread is inside malloc, a hazard of the host
// (glibc's arena lock) that no profiler can remove.
inline void ExitHandler(int) {
  if (heapprof::detail::tls_thread_flags.guard != 0) std::exit(0);
}

inline int RunSignalExit() {
  struct sigaction sa {};
  sa.sa_handler = &ExitHandler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  SignalSender sender{pthread_self(), SIGTERM};
  std::vector<void*> keep;
  for (int i = 0;; ++i) {
    void* p = ::operator new(static_cast<std::size_t>(16 + i % 64));
    if (i % 7 == 0 && keep.size() < 1000) {
      keep.push_back(p);
    } else {
      ::operator delete(p);
    }
    if (i == 20000) sender.Start();  // first loops: tables built, then the signal comes
  }
}

// ---- item 5: pthread_cancel of a thread inside WriteHeapProfile(path) -----
struct Writer {
  std::string path;
  std::atomic<int> written{0};
  static void* Main(void* self) {
    auto* w = static_cast<Writer*>(self);
    for (;;) {
      if (heapprof::WriteHeapProfile(w->path)) w->written.fetch_add(1);
    }
    return nullptr;
  }
};

inline int RunCancelWrite() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr);
  std::vector<void*> live;
  for (int i = 0; i < 2000; ++i) live.push_back(::operator new(static_cast<std::size_t>(64 + i)));
  for (int round = 0; round < 30; ++round) {
    Writer w;
    w.path = std::string(dir) + "/cancel.pb.gz";
    pthread_t t;
    HEAPPROF_HOSTILE_CHECK(pthread_create(&t, nullptr, &Writer::Main, &w) == 0);
    // Wait for a few writes (a spin on the counter, not a sleep), then cancel
    // wherever the writer is: most of its time is inside WriteHeapProfile.
    const int target = 1 + round % 3;
    while (w.written.load() < target) sched_yield();
    HEAPPROF_HOSTILE_CHECK(pthread_cancel(t) == 0);
    void* result = nullptr;
    HEAPPROF_HOSTILE_CHECK(pthread_join(t, &result) == 0);
    HEAPPROF_HOSTILE_CHECK(result == PTHREAD_CANCELED);
  }
  // The profiler still works, and no temporary file was left behind.
  HEAPPROF_HOSTILE_CHECK(heapprof::WriteHeapProfile(std::string(dir) + "/after.pb.gz"));
  for (void* p : live) ::operator delete(p);
  std::printf("cancel_write: ok\n");
  return 0;
}

// ---- item 18: dump_signal=TERM dumps, then the process ends by SIGTERM ----
inline int RunDumpSignalTerm() {
  std::vector<void*> live;
  for (int i = 0; i < 1000; ++i) live.push_back(::operator new(static_cast<std::size_t>(100 + i)));
  ::kill(getpid(), SIGTERM);
  // The dump thread dumps, then sends SIGTERM again with the default action
  // back: the process ends here. Not ending is the failure (exit 3).
  for (int i = 0; i < 3000; ++i) usleep(10000);
  std::printf("still running 30 s after SIGTERM\n");
  return 3;
}

// Dispatch: `known` is set when `name` is one of these scenarios.
inline int RunHostileScenario(const char* name, bool& known) {
  known = true;
  if (std::strcmp(name, "signal_alloc_in_free") == 0) return RunSignalAllocInFree();
  if (std::strcmp(name, "signal_getstats") == 0) return RunSignalDuringGetStats();
  if (std::strcmp(name, "signal_exit") == 0) return RunSignalExit();
  if (std::strcmp(name, "cancel_write") == 0) return RunCancelWrite();
  if (std::strcmp(name, "dump_signal_term") == 0) return RunDumpSignalTerm();
  known = false;
  return 2;
}

#undef HEAPPROF_HOSTILE_CHECK

}  // namespace heapprof_test
