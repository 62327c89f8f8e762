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
#include <ctime>
#include <new>
#include <sstream>
#include <vector>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <link.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "support/block_size.hpp"
#include "support/profile_io.hpp"

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

// The same with the handler's frees through heapprof::allocator, whose
// upstream (std::allocator) releases the block: a free the profiler must hold
// back and release through that upstream. Before, such a free was counted at
// once and its sampled object stayed in the live map (sampled_live_objects
// above its baseline at the end).
using PoolAllocator = heapprof::allocator<std::uint64_t>;
constexpr std::size_t kPoolWords = 8;  // 64 bytes: Stats count what the allocator was asked for
inline std::uint64_t* g_apool[kPoolSize];

inline void AllocatorFreeingHandler(int) {
  const int saved_errno = errno;
  if (g_pool_next < kPoolSize) {
    PoolAllocator().deallocate(g_apool[g_pool_next], kPoolWords);
    g_pool_next = g_pool_next + 1;
  }
  g_handler_runs = g_handler_runs + 1;
  errno = saved_errno;
}

inline int RunSignalAllocatorFreeInFree() {
  heapprof::SetSampleRate(1);
  const std::uint64_t u32 = heapprof_test::UsableFor(32);
  const heapprof::Stats s_pool = heapprof::GetStats();
  for (std::uint64_t*& p : g_apool) p = PoolAllocator().allocate(kPoolWords);
  struct sigaction sa {};
  sa.sa_handler = &AllocatorFreeingHandler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  const heapprof::Stats s0 = heapprof::GetStats();
  SignalSender sender{pthread_self(), SIGUSR1};
  sender.Start();
  std::uint64_t kLoops = 0;
  while (kLoops < 300000 || g_handler_runs < 1000) {
    void* p = ::operator new(32);
    asm volatile("" ::"r"(p) : "memory");
    ::operator delete(p, 32);
    ++kLoops;
  }
  sender.Stop();
  signal(SIGUSR1, SIG_IGN);
  const heapprof::Stats s1 = heapprof::GetStats();
  const std::uint64_t pool_freed = static_cast<std::uint64_t>(g_pool_next);
  std::printf("signals sent %llu, handler runs %llu, pool objects freed by the handler %llu\n",
              static_cast<unsigned long long>(sender.sent.load()),
              static_cast<unsigned long long>(g_handler_runs), static_cast<unsigned long long>(pool_freed));
  HEAPPROF_HOSTILE_CHECK(s1.alloc_objects - s0.alloc_objects == kLoops);
  HEAPPROF_HOSTILE_CHECK(s1.free_objects - s0.free_objects == kLoops + pool_freed);
  HEAPPROF_HOSTILE_CHECK(s1.free_bytes - s0.free_bytes == u32 * kLoops + 8 * kPoolWords * pool_freed);
  // Every object the handler freed left the live map (the rest are live).
  HEAPPROF_HOSTILE_CHECK(s1.sampled_live_objects == s_pool.sampled_live_objects + (kPoolSize - pool_freed));
  for (int i = static_cast<int>(pool_freed); i < kPoolSize; ++i) PoolAllocator().deallocate(g_apool[i], kPoolWords);
  const heapprof::Stats s2 = heapprof::GetStats();
  HEAPPROF_HOSTILE_CHECK(s2.sampled_live_objects == s_pool.sampled_live_objects);
  HEAPPROF_HOSTILE_CHECK(s2.live_bytes == s_pool.live_bytes);
  std::printf("signal_allocator_free_in_free: ok\n");
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

// ---- item 6: the stack a sample needs from its caller ---------------------
// A thread on a stack we map and paint ourselves (HEAPPROF_TEST_STACK_KIB)
// recurses kStackDepth frames, then allocates at rate 1: the first sample of
// the process (unwind tables built then), a warm one, then an unsampled
// allocation. The bytes below the leaf's frame that changed are what each
// took from the caller's stack.
constexpr int kStackDepth = 140;
constexpr unsigned char kPaint = 0xa5;

struct StackProbe {
  unsigned char* lo = nullptr;       // the mapped stack
  std::uintptr_t leaf_sp = 0;        // the leaf's frame
  std::size_t used[3] = {0, 0, 0};   // first sample, warm sample, unsampled allocation
  void* objects[3] = {nullptr, nullptr, nullptr};
  std::size_t tiny_depth_reached = 0;
};

// Bytes changed below `sp` since the region was painted.
inline std::size_t TouchedBelow(const StackProbe& p, std::uintptr_t sp) {
  const auto* lo = p.lo;
  std::uintptr_t a = reinterpret_cast<std::uintptr_t>(lo);
  while (a < sp && *reinterpret_cast<const unsigned char*>(a) == kPaint) ++a;
  return sp - a;
}

__attribute__((noinline)) inline void PaintBelow(const StackProbe& p, std::uintptr_t sp) {
  // Below our own frame, leaving a margin for memset's.
  std::memset(p.lo, kPaint, sp - 512 - reinterpret_cast<std::uintptr_t>(p.lo));
}

__attribute__((noinline)) inline void StackProbeLeaf(StackProbe& p) {
  volatile char here = 0;
  p.leaf_sp = reinterpret_cast<std::uintptr_t>(&here) & ~std::uintptr_t{15};
  for (int i = 0; i < 3; ++i) {
    if (i == 2) heapprof::SetSampleRate(0);
    PaintBelow(p, p.leaf_sp);
    p.objects[i] = ::operator new(static_cast<std::size_t>(6601 + i));
    asm volatile("" ::"r"(p.objects[i]) : "memory");
    p.used[i] = TouchedBelow(p, p.leaf_sp);
  }
}

// Frames of ~64 bytes, each kept by the one below (no tail calls).
__attribute__((noinline)) inline std::size_t StackProbeDeep(StackProbe& p, int depth) {
  volatile char pad[32];
  pad[0] = static_cast<char>(depth);
  if (depth == 0) {
    StackProbeLeaf(p);
    return 1;
  }
  const std::size_t r = StackProbeDeep(p, depth - 1) + 1;
  asm volatile("" ::"r"(&pad[0]) : "memory");
  return r + static_cast<std::size_t>(pad[0] != static_cast<char>(depth));
}

inline void* StackProbeMain(void* arg) {
  auto& p = *static_cast<StackProbe*>(arg);
  heapprof::SetSampleRate(1);
  p.tiny_depth_reached = StackProbeDeep(p, kStackDepth);
  heapprof::SetSampleRate(0);
  return nullptr;
}

inline int RunSampleStackUse() {
  // HEAPPROF=rate=0 (the parent sets it): nothing is sampled, and no unwind
  // table is built, before this thread's first sample.
  StackProbe p;
  const std::size_t kPaintedStack = std::strtoul(std::getenv("HEAPPROF_TEST_STACK_KIB"), nullptr, 10) * 1024;
  void* mem = mmap(nullptr, kPaintedStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  HEAPPROF_HOSTILE_CHECK(mem != MAP_FAILED);
  p.lo = static_cast<unsigned char*>(mem);
  std::memset(mem, kPaint, kPaintedStack);
  pthread_attr_t attr;
  HEAPPROF_HOSTILE_CHECK(pthread_attr_init(&attr) == 0);
  HEAPPROF_HOSTILE_CHECK(pthread_attr_setstack(&attr, mem, kPaintedStack) == 0);
  pthread_t t;
  HEAPPROF_HOSTILE_CHECK(pthread_create(&t, &attr, &StackProbeMain, &p) == 0);
  HEAPPROF_HOSTILE_CHECK(pthread_join(t, nullptr) == 0);
  pthread_attr_destroy(&attr);
  const heapprof::Stats s = heapprof::GetStats();
  std::printf("%zu KiB stack, depth %zu: stack used below the allocating function: first sample %zu bytes, warm sample %zu, "
              "unsampled allocation %zu; samples %llu\n",
              kPaintedStack / 1024, p.tiny_depth_reached, p.used[0], p.used[1], p.used[2],
              static_cast<unsigned long long>(s.sampled_live_objects));
  const long bound = std::strtol(std::getenv("HEAPPROF_TEST_STACK_BOUND"), nullptr, 10);
  HEAPPROF_HOSTILE_CHECK(p.used[0] <= static_cast<std::size_t>(bound));
  HEAPPROF_HOSTILE_CHECK(p.used[1] <= static_cast<std::size_t>(bound));
  HEAPPROF_HOSTILE_CHECK(s.sampled_live_objects >= 2);
  for (void* o : p.objects) ::operator delete(o);
  munmap(mem, kPaintedStack);
  std::printf("sample_stack_use: ok\n");
  return 0;
}

// ---- item 7: dlopen/dlclose churn ----------------------------------------
// A library loaded, used (its allocations sampled, a profile written while it
// is loaded) and unloaded, HEAPPROF_TEST_CYCLES times. The profiler's memory
// must level off: checked between the first tenth of the cycles and the end.
inline int RunDlopenChurn() {
#ifdef HEAPPROF_HOOKED_DSO_PATH
  const int cycles = std::atoi(std::getenv("HEAPPROF_TEST_CYCLES"));
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr && cycles >= 20);
  const std::string path = std::string(dir) + "/churn.pb.gz";
  heapprof::SetSampleRate(1);
  // Every object builds its table at once (by default one FDE at a time
  // until its lookups have cost a build): the objects that stay loaded then
  // have theirs before the baseline, and one built later, when its lookups
  // ran out, is not taken for a table the churn left behind.
  heapprof::detail::unwind_table::g_lazy_min_fdes.store(~std::uint64_t{0});
  // Two threads unwinding all along (their samples read the snapshots and
  // tables being retired and freed: TSan checks the reclamation's ordering).
  struct Busy {
    std::atomic<bool> stop{false};
    static void* Main(void* self) {
      auto* b = static_cast<Busy*>(self);
      while (!b->stop.load(std::memory_order_relaxed)) {
        void* q = ::operator new(40);
        asm volatile("" ::"r"(q) : "memory");
        ::operator delete(q, 40);
      }
      return nullptr;
    }
  } busy;
  pthread_t busy_threads[2];
  for (pthread_t& t : busy_threads) HEAPPROF_HOSTILE_CHECK(pthread_create(&t, nullptr, &Busy::Main, &busy) == 0);
  heapprof::Stats warm{};
  for (int i = 0; i < cycles; ++i) {
    void* h = dlopen(HEAPPROF_HOOKED_DSO_PATH, RTLD_NOW | RTLD_LOCAL);
    HEAPPROF_HOSTILE_CHECK(h != nullptr);
    auto* alloc = reinterpret_cast<void* (*)(std::size_t)>(dlsym(h, "heapprof_hooked_dso_alloc"));
    auto* release = reinterpret_cast<void (*)(void*)>(dlsym(h, "heapprof_hooked_dso_free"));
    HEAPPROF_HOSTILE_CHECK(alloc != nullptr && release != nullptr);
    void* objs[16];
    for (int k = 0; k < 16; ++k) objs[k] = alloc(static_cast<std::size_t>(100 + k));
    if (i % 10 == 0) HEAPPROF_HOSTILE_CHECK(heapprof::WriteHeapProfile(path));
    // The baseline is read while the library is loaded, its table built (its
    // allocations above were sampled through it). Read after the dlclose, it
    // counted the library's object or not, by timing: a dlclosed object
    // stays in the current snapshot until a sample refreshes it, and a
    // retired one until no reader holds it. So 2 objects at the baseline and
    // 3 at the end (the library's, still in the snapshot) failed the level
    // check below (1 run in ~22 with the child pinned to one core).
    if (i + 1 == cycles / 10) warm = heapprof::GetStats();
    for (void* o : objs) release(o);
    HEAPPROF_HOSTILE_CHECK(dlclose(h) == 0);
    // A sample while the library is gone: the profiler sees it unloaded.
    void* between = ::operator new(64);
    asm volatile("" ::"r"(between) : "memory");
    ::operator delete(between, 64);
  }
  busy.stop.store(true);
  for (pthread_t t : busy_threads) pthread_join(t, nullptr);
  // One sample with no other reader about: it frees everything retired.
  void* last = ::operator new(64);
  asm volatile("" ::"r"(last) : "memory");
  ::operator delete(last, 64);
  const heapprof::Stats end = heapprof::GetStats();
  std::printf("after %d cycles: profiler_bytes %llu, unwind_table_bytes %llu, unwind_objects %llu; "
              "after %d: %llu, %llu, %llu\n",
              cycles / 10, static_cast<unsigned long long>(warm.profiler_bytes),
              static_cast<unsigned long long>(warm.unwind_table_bytes),
              static_cast<unsigned long long>(warm.unwind_objects), cycles,
              static_cast<unsigned long long>(end.profiler_bytes),
              static_cast<unsigned long long>(end.unwind_table_bytes),
              static_cast<unsigned long long>(end.unwind_objects));
  // Level over the remaining nine tenths (warm is read while the busy
  // threads hold some retired tables back, end once everything retired is
  // free); the arena maps 1 MiB chunks.
  HEAPPROF_HOSTILE_CHECK(end.unwind_objects <= warm.unwind_objects);
  HEAPPROF_HOSTILE_CHECK(end.unwind_table_bytes <= warm.unwind_table_bytes + 16 * 1024);
  HEAPPROF_HOSTILE_CHECK(end.profiler_bytes <= warm.profiler_bytes + (1u << 20));
  std::printf("dlopen_churn: ok\n");
  return 0;
#else
  std::printf("dlopen_churn: no test library\n");
  return 0;
#endif
}

// ---- item 16: after daemon(), the daemon profiles, dumps and reports -------
// HEAPPROF (set by the parent test): dump_prefix=DIR/d, dump_signal=USR2,
// dump_at_exit=1, leak_report=1. This process forks; the child calls
// daemon(), whose child (the daemon, reparented away from us) allocates,
// asks for a signal dump, waits for it, and exits. A pipe tells us its pid
// and, at EOF, that it has exited (its exit actions ran before).
inline bool FileExists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

inline int RunDaemonDumps() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr);
  int fds[2];
  HEAPPROF_HOSTILE_CHECK(pipe(fds) == 0);
  const pid_t child = fork();
  HEAPPROF_HOSTILE_CHECK(child >= 0);
  if (child == 0) {
    close(fds[0]);
    if (daemon(1, 1) != 0) _exit(20);
    // The daemon.
    const long me = static_cast<long>(getpid());
    if (write(fds[1], &me, sizeof me) != static_cast<ssize_t>(sizeof me)) _exit(21);
    heapprof::SetSampleRate(1);
    static std::vector<void*> kept;
    for (int i = 0; i < 100; ++i) kept.push_back(::operator new(static_cast<std::size_t>(5000 + i)));
    raise(SIGUSR2);
    char name[64];
    std::snprintf(name, sizeof name, "/d.%ld.0001.heap.pb.gz", me);
    const std::string signal_dump = std::string(dir) + name;
    // The dump thread writes it; give up after 30 s (the failure before).
    for (int i = 0; i < 3000 && !FileExists(signal_dump); ++i) usleep(10000);
    std::exit(FileExists(signal_dump) ? 0 : 22);  // exit(): the exit dump and leak report
  }
  close(fds[1]);
  long daemon_pid = 0;
  HEAPPROF_HOSTILE_CHECK(read(fds[0], &daemon_pid, sizeof daemon_pid) == static_cast<ssize_t>(sizeof daemon_pid));
  int status = 0;
  HEAPPROF_HOSTILE_CHECK(waitpid(child, &status, 0) == child);  // daemon()'s parent, gone at once
  char byte;
  while (read(fds[0], &byte, 1) > 0) {
  }  // EOF: the daemon has exited
  const std::string base = std::string(dir) + "/d." + std::to_string(daemon_pid);
  std::printf("daemon %ld: signal dump %d, exit dump %d, leak report %d\n", daemon_pid,
              FileExists(base + ".0001.heap.pb.gz"), FileExists(base + ".0002.heap.pb.gz"),
              FileExists(base + ".leaks.pb.gz"));
  HEAPPROF_HOSTILE_CHECK(FileExists(base + ".0001.heap.pb.gz"));
  HEAPPROF_HOSTILE_CHECK(FileExists(base + ".0002.heap.pb.gz"));
  HEAPPROF_HOSTILE_CHECK(FileExists(base + ".leaks.pb.gz"));
  std::printf("daemon_dumps: ok\n");
  return 0;
}

// ---- a library's frames named after its dlclose ------------------------
// Loaded, three objects of 7411 bytes allocated in it and kept (a fourth
// freed), unloaded, then one more sample (the table unwinder's snapshot drops
// it) and a profile written: no profile was written while it was loaded.
inline int RunDlcloseNames() {
#ifdef HEAPPROF_HOOKED_DSO_PATH
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr);
  void* h = dlopen(HEAPPROF_HOOKED_DSO_PATH, RTLD_NOW | RTLD_LOCAL);
  HEAPPROF_HOSTILE_CHECK(h != nullptr);
  auto* alloc = reinterpret_cast<void* (*)(std::size_t)>(dlsym(h, "heapprof_hooked_dso_alloc"));
  auto* release = reinterpret_cast<void (*)(void*)>(dlsym(h, "heapprof_hooked_dso_free"));
  HEAPPROF_HOSTILE_CHECK(alloc != nullptr && release != nullptr);
  void* kept[3];
  for (void*& k : kept) k = alloc(7411);
  release(alloc(7411));
  HEAPPROF_HOSTILE_CHECK(dlclose(h) == 0);
  void* after = ::operator new(64);
  asm volatile("" ::"r"(after) : "memory");
  ::operator delete(after, 64);
  HEAPPROF_HOSTILE_CHECK(heapprof::WriteHeapProfile(std::string(dir) + "/closed.pb.gz"));
  for (void* k : kept) delete[] static_cast<char*>(k);
  std::printf("dlclose_names: ok\n");
  return 0;
#else
  std::printf("dlclose_names: no test library\n");
  return 0;
#endif
}

// ---- a coroutine's sample under a seccomp filter --------------------------
// A filter that kills the process on process_vm_readv (as systemd's
// SystemCallFilter= without @ipc does), then a sample on a makecontext
// stack: the walk must not probe that stack's extent with the call.
struct SeccompCoroutine {
  ucontext_t caller, coroutine;
  void* object = nullptr;
};
inline SeccompCoroutine* g_seccomp_coroutine = nullptr;
__attribute__((noinline)) inline void SeccompCoroutineEntry() {
  g_seccomp_coroutine->object = ::operator new(7421);
  asm volatile("" ::: "memory");
}

inline int RunSeccompCoroutine() {
  heapprof::SetSampleRate(1);
  void* warm = ::operator new(64);  // the profiler's start-up before the filter
  ::operator delete(warm, 64);
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog {};
  prog.len = static_cast<unsigned short>(sizeof filter / sizeof filter[0]);
  prog.filter = filter;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    std::printf("seccomp_coroutine: no seccomp here (%s)\n", std::strerror(errno));
    return 0;
  }
  SeccompCoroutine st;
  g_seccomp_coroutine = &st;
  std::vector<char> stack(64 * 1024);
  HEAPPROF_HOSTILE_CHECK(getcontext(&st.coroutine) == 0);
  st.coroutine.uc_stack.ss_sp = stack.data();
  st.coroutine.uc_stack.ss_size = stack.size();
  st.coroutine.uc_link = &st.caller;
  makecontext(&st.coroutine, &SeccompCoroutineEntry, 0);
  HEAPPROF_HOSTILE_CHECK(swapcontext(&st.caller, &st.coroutine) == 0);
  HEAPPROF_HOSTILE_CHECK(st.object != nullptr);
  HEAPPROF_HOSTILE_CHECK(heapprof::GetStats().sampled_live_objects >= 1);
  // The retention scan reads memory the same way: /proc/self/mem here.
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr);
  HEAPPROF_HOSTILE_CHECK(heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz"));
  ::operator delete(st.object, 7421);
  std::printf("seccomp_coroutine: ok\n");
  return 0;
}

// ---- a seccomp filter that arrives after the profiler looked for one -----
// A filter returning `action` for system call `nr` on this thread (and, with
// `tsync`, on every thread of the process: the profiler's too).
inline bool InstallSyscallFilter(long nr, unsigned action, bool tsync) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, action),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog {};
  prog.len = static_cast<unsigned short>(sizeof filter / sizeof filter[0]);
  prog.filter = filter;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
  return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, tsync ? SECCOMP_FILTER_FLAG_TSYNC : 0, &prog) == 0;
}

// One sample at rate 1 on a makecontext stack (SeccompCoroutineEntry).
inline bool SampleOnCoroutine() {
  SeccompCoroutine st;
  g_seccomp_coroutine = &st;
  std::vector<char> stack(64 * 1024);
  if (getcontext(&st.coroutine) != 0) return false;
  st.coroutine.uc_stack.ss_sp = stack.data();
  st.coroutine.uc_stack.ss_size = stack.size();
  st.coroutine.uc_link = &st.caller;
  makecontext(&st.coroutine, &SeccompCoroutineEntry, 0);
  if (swapcontext(&st.caller, &st.coroutine) != 0 || st.object == nullptr) return false;
  ::operator delete(st.object, 7421);
  return true;
}

inline void* SeccompLateThread(void*) {
  // This thread's own filter (no TSYNC): the main thread, which looked just
  // before, has none.
  if (!InstallSyscallFilter(__NR_process_vm_readv, SECCOMP_RET_KILL_PROCESS, false)) return nullptr;
  return SampleOnCoroutine() ? reinterpret_cast<void*>(1) : nullptr;
}

// Samples on a coroutine's stack (and a retention profile) before a filter
// that kills process_vm_readv, then right after it: on the thread that
// installed it, and on a thread with a filter of its own. The profiler
// looked for a filter at most once a second, in the process's status when
// asked from any thread: the sample after, within that second, killed the
// process (SIGSYS, status 159).
inline int RunSeccompLateFilter() {
  heapprof::SetSampleRate(1);
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr);
  HEAPPROF_HOSTILE_CHECK(SampleOnCoroutine());  // looks: no filter
  pthread_t thread;
  HEAPPROF_HOSTILE_CHECK(pthread_create(&thread, nullptr, &SeccompLateThread, nullptr) == 0);
  void* thread_ok = nullptr;
  pthread_join(thread, &thread_ok);
  if (thread_ok == nullptr) {
    std::printf("seccomp_late_filter: no seccomp here (%s)\n", std::strerror(errno));
    return 0;
  }
  HEAPPROF_HOSTILE_CHECK(heapprof::WriteRetentionProfile(std::string(dir) + "/before.pb.gz"));  // looks again
  HEAPPROF_HOSTILE_CHECK(InstallSyscallFilter(__NR_process_vm_readv, SECCOMP_RET_KILL_PROCESS, false));
  HEAPPROF_HOSTILE_CHECK(SampleOnCoroutine());
  HEAPPROF_HOSTILE_CHECK(heapprof::WriteRetentionProfile(std::string(dir) + "/after.pb.gz"));
  std::printf("seccomp_late_filter: ok\n");
  return 0;
}

// ---- an HTTP server whose poll or accept4 a later filter refuses ----------
// A heapprof::HttpServer, then a filter (TSYNC: the server's thread too)
// that fails `nr` with EPERM; a client connects and reads with a kernel
// timeout (no poll of its own). Before, a refused poll ended the server's
// thread without a word and a refused accept4 spun it on a core: the client,
// connected through the backlog, waited for its whole timeout. Now the
// connection ends at once, with one line, and serving() is false.
//
// With `trap`, the filter traps the call instead (SECCOMP_RET_TRAP) and a
// SIGSYS handler makes it fail with EPERM, as Chrome's and Firefox's sandboxes
// answer calls. The profiler's threads blocked every signal, SIGSYS too:
// the kernel then reset it to its default action and the process died
// (status 159) at the server's first poll after the filter.
inline void SigsysFailsWithEperm(int, siginfo_t*, void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
#elif defined(__aarch64__)
  uc->uc_mcontext.regs[0] = static_cast<unsigned long long>(-EPERM);
#else
  (void)uc;
#endif
}

inline int RunSeccompHttp(long nr, const char* name, bool trap = false) {
  heapprof::HttpServer server("127.0.0.1:0", std::nothrow);
  HEAPPROF_HOSTILE_CHECK(server.serving());
  if (trap) {
    struct sigaction sa {};
    sa.sa_sigaction = &SigsysFailsWithEperm;
    sa.sa_flags = SA_SIGINFO;
    HEAPPROF_HOSTILE_CHECK(sigaction(SIGSYS, &sa, nullptr) == 0);
  }
  if (!InstallSyscallFilter(nr, trap ? SECCOMP_RET_TRAP : SECCOMP_RET_ERRNO | EPERM, true)) {
    std::printf("seccomp_http_%s: no seccomp here (%s)\n", name, std::strerror(errno));
    return 0;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  HEAPPROF_HOSTILE_CHECK(fd >= 0);
  timeval tv{20, 0};
  HEAPPROF_HOSTILE_CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server.port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const timespec t0 = [] { timespec t{}; clock_gettime(CLOCK_MONOTONIC, &t); return t; }();
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
    static const char kRequest[] = "GET /debug/pprof/heap HTTP/1.0\r\n\r\n";
    (void)!::write(fd, kRequest, sizeof kRequest - 1);
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) {
    }
    HEAPPROF_HOSTILE_CHECK(n == 0 || errno != EAGAIN);  // not the client's own timeout
  }
  timespec t1{};
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ::close(fd);
  HEAPPROF_HOSTILE_CHECK(t1.tv_sec - t0.tv_sec < 10);
  HEAPPROF_HOSTILE_CHECK(!server.serving());
  std::printf("seccomp_http_%s: ok (%s)\n", name, server.error());
  return 0;
}

// ---- a filter refusing fsync ------------------------------------------------
// The bytes are written; only their sync is refused. Before, every profile
// was lost ("cannot fsync ...: Function not implemented").
inline int RunSeccompFsync() {
  heapprof::SetSampleRate(1);
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr);
  void* kept = ::operator new(4000);
  for (const unsigned err : {ENOSYS, EPERM}) {
    if (!InstallSyscallFilter(__NR_fsync, SECCOMP_RET_ERRNO | err, false)) {
      std::printf("seccomp_fsync: no seccomp here (%s)\n", std::strerror(errno));
      return 0;
    }
    HEAPPROF_HOSTILE_CHECK(heapprof::WriteHeapProfile(std::string(dir) + "/fsync" + std::to_string(err) + ".pb.gz"));
  }
  ::operator delete(kept, 4000);
  std::printf("seccomp_fsync: ok\n");
  return 0;
}

// ---- a process whose memory the retention scan cannot read ----------------
// Not dumpable (as after a daemon's setuid to its user), not root, and a
// filter refusing process_vm_readv (Docker's default without CAP_SYS_PTRACE):
// /proc/self/mem, the reader's other way, is then root's file, closed to us.
// The scan read nothing, so the leak report at exit called every object a
// leak (and exited with leak_exit_code's status). Run as root, the child
// becomes nobody first.
inline void* g_unreadable_keep[20];
inline int RunSeccompUnreadableMemory() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr);
  for (void*& p : g_unreadable_keep) p = ::operator new(5000);
  if (::geteuid() == 0) {
    HEAPPROF_HOSTILE_CHECK(::chmod(dir, 0777) == 0);
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
      std::printf("seccomp_unreadable_memory: cannot become nobody (%s)\n", std::strerror(errno));
      return 0;
    }
  }
  HEAPPROF_HOSTILE_CHECK(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
  if (!InstallSyscallFilter(__NR_process_vm_readv, SECCOMP_RET_ERRNO | EPERM, false)) {
    std::printf("seccomp_unreadable_memory: no seccomp here (%s)\n", std::strerror(errno));
    return 0;
  }
  const int fd = ::open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {  // (a kernel or LSM that lets us: nothing to test)
    ::close(fd);
    std::printf("seccomp_unreadable_memory: /proc/self/mem opens here\n");
    return 0;
  }
  std::printf("seccomp_unreadable_memory: exiting\n");
  std::fflush(stdout);
  return 0;  // exit(): the leak report
}

// Dispatch: `known` is set when `name` is one of these scenarios.
// ---- a handler's allocations inside heapprof::allocator::allocate ----------
// The thread single-steps (x86-64 trap flag) through one allocate and one
// deallocate of a labeled heapprof::allocator at rate 1. At each step whose
// interrupted PC is in this executable (never inside libc's malloc, which is
// not reentrant), the SIGTRAP handler allocates through its own labeled
// allocator and with operator new (phase 1), or frees one of those objects
// each way (phase 2). So every window of those two calls is hit: between the
// allocator setting its labels and its sample, and inside its upstream call
// (SuppressHooks). The profiles after each phase say what was recorded; the
// handler counts what should have been, from the thread's flags at each step
// (under the profiler's guard nothing is sampled; an operator new inside the
// upstream call is taken for the upstream's own and not recorded).
struct TrapMain {
  unsigned char bytes[1117];
};
struct TrapHandlerObj {
  unsigned char bytes[1213];
};
struct TrapHandlerNew {
  unsigned char bytes[1319];
};
constexpr int kTrapPool = 16384;
struct TrapState {
  std::uintptr_t exe_lo = 0, exe_hi = 0;
  int phase = 0;  // 1: allocate, 2: free
  heapprof::allocator<TrapHandlerObj>* alloc = nullptr;
  TrapHandlerObj* objs[kTrapPool];
  bool obj_sampled[kTrapPool];
  TrapHandlerNew* news[kTrapPool];
  bool new_sampled[kTrapPool];
  int made = 0, freed = 0, steps = 0;
};
inline TrapState g_trap;

inline void TrapHandler(int, siginfo_t*, void* uc) {
  const auto pc = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(uc)->uc_mcontext.gregs[REG_RIP]);
  ++g_trap.steps;
  if (pc < g_trap.exe_lo || pc >= g_trap.exe_hi) return;
  const heapprof::detail::ThreadFlags& flags = heapprof::detail::tls_thread_flags;
  if (g_trap.phase == 1 && g_trap.made < kTrapPool) {
    const int i = g_trap.made++;
    g_trap.obj_sampled[i] = flags.guard == 0;
    g_trap.new_sampled[i] = flags.guard == 0 && !flags.suppress;
    g_trap.news[i] = new TrapHandlerNew;  // first: the interrupted allocator's labels still set
    g_trap.objs[i] = g_trap.alloc->allocate(1);
  } else if (g_trap.phase == 2 && g_trap.freed < g_trap.made) {
    const int i = g_trap.freed++;
    g_trap.alloc->deallocate(g_trap.objs[i], 1);
    delete g_trap.news[i];
  }
}

inline int PhdrExecutable(dl_phdr_info* info, std::size_t, void* data) {
  auto* t = static_cast<TrapState*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (t->exe_lo == 0 || lo < t->exe_lo) t->exe_lo = lo;
    if (lo + ph.p_memsz > t->exe_hi) t->exe_hi = lo + ph.p_memsz;
  }
  return 1;  // the first object is the executable
}

HEAPPROF_NOINLINE inline void SetTrapFlag() { asm volatile("pushfq; orq $0x100, (%%rsp); popfq" ::: "memory", "cc"); }
HEAPPROF_NOINLINE inline void ClearTrapFlag() {
  asm volatile("pushfq; andq $-257, (%%rsp); popfq" ::: "memory", "cc");
}

inline int RunTrapAllocatorLabels() {
#if defined(__x86_64__)
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  HEAPPROF_HOSTILE_CHECK(dir != nullptr);
  dl_iterate_phdr(&PhdrExecutable, &g_trap);
  HEAPPROF_HOSTILE_CHECK(g_trap.exe_lo != 0);
  struct sigaction sa {};
  sa.sa_sigaction = &TrapHandler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  HEAPPROF_HOSTILE_CHECK(sigaction(SIGTRAP, &sa, nullptr) == 0);
  heapprof::allocator<TrapHandlerObj> handler_alloc(heapprof::LabelSet({{"who", "handler"}}));
  heapprof::allocator<TrapMain> main_alloc(heapprof::LabelSet({{"who", "main"}}));
  g_trap.alloc = &handler_alloc;
  // Warm: the thread's slot, the unwind tables, these stacks interned.
  for (int i = 0; i < 2; ++i) {
    main_alloc.deallocate(main_alloc.allocate(1), 1);
    handler_alloc.deallocate(handler_alloc.allocate(1), 1);
    delete new TrapHandlerNew;
  }
  g_trap.phase = 1;
  SetTrapFlag();
  TrapMain* kept = main_alloc.allocate(1);
  ClearTrapFlag();
  g_trap.phase = 0;
  int obj_sampled = 0, new_sampled = 0;
  for (int i = 0; i < g_trap.made; ++i) obj_sampled += g_trap.obj_sampled[i], new_sampled += g_trap.new_sampled[i];
  std::printf("phase 1: %d steps, %d handler runs, %d + %d sampled\n", g_trap.steps, g_trap.made, obj_sampled,
              new_sampled);
  HEAPPROF_HOSTILE_CHECK(heapprof::WriteHeapProfile(std::string(dir) + "/allocated.pb.gz"));
  g_trap.phase = 2;
  SetTrapFlag();
  main_alloc.deallocate(kept, 1);
  ClearTrapFlag();
  g_trap.phase = 0;
  // Still live: those the handler did not free, sampled ones as counted.
  int obj_left = 0, new_left = 0;
  for (int i = g_trap.freed; i < g_trap.made; ++i) obj_left += g_trap.obj_sampled[i], new_left += g_trap.new_sampled[i];
  std::printf("phase 2: %d handler frees\n", g_trap.freed);
  HEAPPROF_HOSTILE_CHECK(heapprof::WriteHeapProfile(std::string(dir) + "/freed.pb.gz"));
  for (int i = g_trap.freed; i < g_trap.made; ++i) {
    handler_alloc.deallocate(g_trap.objs[i], 1);
    delete g_trap.news[i];
  }
  std::printf("expect %d %d %d %d %d\n", obj_sampled, new_sampled, obj_left, new_left, g_trap.made);
  std::printf("trap_allocator_labels: ok\n");
  return 0;
#else
  std::printf("trap_allocator_labels: x86-64 only\n");
  return 0;
#endif
}

// ---- a profile written while the process is out of file descriptors ------
// A fresh process (no DWARF read yet) writes a profile with every descriptor
// taken: the object files cannot be opened, so it has no names and no lines.
// Once descriptors are back, the next profile must have both again. Before,
// the object's DWARF stayed marked read (without any): every later profile of
// the process had names but no file:line.
inline char* g_fd_leaf_kept[8];
__attribute__((noinline)) inline void FdExhaustionLeaf() {
  HEAPPROF_TEST_NO_UNROLL
  for (char*& p : g_fd_leaf_kept) p = new char[9001];
  asm volatile("" ::: "memory");
}

// The leaf's function: its file and line ("" and 0 when none); `said`:
// a comment says descriptors were short.
inline bool LeafSourceLine(std::string& file, std::int64_t& line, bool& named, bool& said) {
  Profile p;
  if (!CaptureProfile(p)) return false;
  file.clear();
  line = 0;
  named = false;
  said = false;
  for (std::int64_t i : p.comment_indices) {
    said |= p.string_table.at(static_cast<std::size_t>(i)).find("out of file descriptors") != std::string::npos;
  }
  for (const Location& loc : p.locations) {
    for (const Line& l : loc.lines) {
      for (const Function& f : p.functions) {
        if (f.id != l.function_id || f.name.find("FdExhaustionLeaf") == std::string::npos) continue;
        named = true;
        file = f.filename;
        line = l.line;
      }
    }
  }
  return true;
}

inline int RunFdExhaustionLines() {
  heapprof::SetSampleRate(1);
  FdExhaustionLeaf();
  rlimit files{};  // a small table, quick to fill
  HEAPPROF_HOSTILE_CHECK(::getrlimit(RLIMIT_NOFILE, &files) == 0);
  if (files.rlim_cur > 512) files.rlim_cur = 512;
  HEAPPROF_HOSTILE_CHECK(::setrlimit(RLIMIT_NOFILE, &files) == 0);
  std::vector<int> taken;
  taken.reserve(1 << 16);
  for (;;) {
    const int fd = ::dup(0);
    if (fd < 0) break;
    taken.push_back(fd);
  }
  HEAPPROF_HOSTILE_CHECK(errno == EMFILE);
  std::string file;
  std::int64_t line = 0;
  bool named = false, said = false;
  const bool written = LeafSourceLine(file, line, named, said);
  for (int fd : taken) ::close(fd);
  HEAPPROF_HOSTILE_CHECK(written);
  std::printf("without descriptors: named %d, %s:%lld\n", named ? 1 : 0, file.c_str(), static_cast<long long>(line));
  HEAPPROF_HOSTILE_CHECK(!named && said);  // and it says why
  HEAPPROF_HOSTILE_CHECK(LeafSourceLine(file, line, named, said));
  std::printf("descriptors back: named %d, %s:%lld\n", named ? 1 : 0, file.c_str(), static_cast<long long>(line));
  HEAPPROF_HOSTILE_CHECK(named);
  HEAPPROF_HOSTILE_CHECK(file.find("hostile_scenarios.hpp") != std::string::npos);
  HEAPPROF_HOSTILE_CHECK(line > 0);
  HEAPPROF_HOSTILE_CHECK(!said);
  for (char* p : g_fd_leaf_kept) delete[] p;
  std::printf("fd_exhaustion_lines: ok\n");
  return 0;
}

// An object file opened for its symbol table only once the encoding meets a
// PC of it (the symbolizer reads tables on first use), and refused then: the
// profile already encoded had no comment, so it is encoded again with one.
// Without that second encoding the profile said nothing of the missing names.
inline int RunLateTableLoadComment() {
  heapprof::SetSampleRate(1);
  FdExhaustionLeaf();
  heapprof_test::FailTableLoads(1);
  std::string file;
  std::int64_t line = 0;
  bool named = false, said = false;
  HEAPPROF_HOSTILE_CHECK(LeafSourceLine(file, line, named, said));
  std::printf("a table refused during the encoding: said %d\n", said ? 1 : 0);
  HEAPPROF_HOSTILE_CHECK(said);
  HEAPPROF_HOSTILE_CHECK(LeafSourceLine(file, line, named, said));  // the next write reads it
  std::printf("next write: said %d, named %d, %s:%lld\n", said ? 1 : 0, named ? 1 : 0, file.c_str(),
              static_cast<long long>(line));
  HEAPPROF_HOSTILE_CHECK(!said && named && line > 0);
  for (char* p : g_fd_leaf_kept) delete[] p;
  std::printf("late_table_comment: ok\n");
  return 0;
}

// ---- a stderr that is a pipe whose reader has gone ----------------------
// The program never writes to stderr itself: heapprof's lines at exit (the
// exit dump's "wrote", the leak table) went into the pipe and SIGPIPE ended
// the program, status 141 instead of its own 0.
inline int RunDeadStderrPipe() {
  std::signal(SIGPIPE, SIG_DFL);  // as a shell starts a program (a test runner may ignore it)
  int fds[2];
  HEAPPROF_HOSTILE_CHECK(::pipe(fds) == 0);
  ::close(fds[0]);
  HEAPPROF_HOSTILE_CHECK(::dup2(fds[1], 2) == 2);
  ::close(fds[1]);
  std::vector<void*> live;
  for (int i = 0; i < 1000; ++i) live.push_back(::operator new(static_cast<std::size_t>(100 + i)));
  std::printf("dead_stderr_pipe: ok\n");
  std::fflush(stdout);
  return 0;  // the exit actions write their lines into the pipe
}

// ---- a SIGPIPE of the program's own while heapprof writes a line ---------
// heapprof holds SIGPIPE off on its writing thread (WriteSignalsHeld) and
// takes back the one its write raised. One that came from elsewhere in the
// meantime (here kill(), process-directed, while every thread blocks it) is
// the program's: its handler must run once the line is written. It was taken
// back too (the check looked only at what was pending), and never ran.
inline std::atomic<int> g_sigpipe_seen{0};
inline void CountSigpipe(int) { g_sigpipe_seen.fetch_add(1); }
struct ForeignSigpipe {
  long writer_tid = 0;
  int read_fd = -1;
  std::atomic<bool> sent{false};
};
inline void* ForeignSigpipeSender(void* arg) {
  auto* f = static_cast<ForeignSigpipe*>(arg);
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, nullptr);  // not for this thread either: it stays pending
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", f->writer_tid);
  bool blocked = false;
  for (;;) {  // until the writer is blocked in its writev to the full pipe
    char text[64] = {};
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;  // (no such file: "sent 0", and the pipe is drained all the same)
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n > 0 && std::atol(text) == SYS_writev) {
      blocked = true;
      break;
    }
    sched_yield();
  }
  if (blocked) {
    ::kill(::getpid(), SIGPIPE);
    f->sent.store(true);
  }
  char buf[4096];
  while (::read(f->read_fd, buf, sizeof buf) > 0) {  // room: the line goes through (non-blocking: to EAGAIN)
  }
  return nullptr;
}
inline int RunForeignSigpipeDuringLine() {
  struct sigaction sa {};
  sa.sa_handler = &CountSigpipe;
  sigemptyset(&sa.sa_mask);
  HEAPPROF_HOSTILE_CHECK(sigaction(SIGPIPE, &sa, nullptr) == 0);
  int fds[2];
  HEAPPROF_HOSTILE_CHECK(::pipe(fds) == 0);
  const int saved_stderr = ::dup(2);
  HEAPPROF_HOSTILE_CHECK(saved_stderr >= 0 && ::dup2(fds[1], 2) == 2);
  // Fill the pipe through a non-blocking description of its own.
  char self[64];
  std::snprintf(self, sizeof self, "/proc/self/fd/%d", fds[1]);
  const int filler = ::open(self, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  HEAPPROF_HOSTILE_CHECK(filler >= 0);
  static char chunk[4096];
  while (::write(filler, chunk, sizeof chunk) > 0) {
  }
  while (::write(filler, chunk, 1) > 0) {
  }
  ::close(filler);
  HEAPPROF_HOSTILE_CHECK(::fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0);
  ForeignSigpipe f;
  f.writer_tid = static_cast<long>(syscall(SYS_gettid));
  f.read_fd = fds[0];
  pthread_t sender;
  HEAPPROF_HOSTILE_CHECK(pthread_create(&sender, nullptr, &ForeignSigpipeSender, &f) == 0);
  heapprof::detail::ReportLine("a line while the program gets a SIGPIPE of its own");  // blocks until drained
  const int seen = g_sigpipe_seen.load();
  pthread_join(sender, nullptr);
  ::dup2(saved_stderr, 2);
  std::printf("foreign_sigpipe: sent %d, handler ran %d\n", f.sent.load() ? 1 : 0, seen);
  std::fflush(stdout);
  return seen == 1 ? 0 : 1;
}

// ---- main() ends with pthread_exit() -------------------------------------
// glibc ends the process with exit(0) once its last thread has ended; the dump
// thread and HEAPPROF=http's server never ended, so the process never did
// (and, its main thread gone and theirs blocking every signal, no SIGTERM
// reached it). The worker allocates and says so; then the process ends.
inline void* PthreadExitWorker(void*) {
  std::vector<void*> live;
  for (int i = 0; i < 100; ++i) live.push_back(::operator new(static_cast<std::size_t>(100 + i)));
  for (void* p : live) ::operator delete(p);
  std::printf("pthread_exit_main: worker done\n");
  std::fflush(stdout);
  return nullptr;
}
inline int RunPthreadExitMain() {
  pthread_t worker;
  HEAPPROF_HOSTILE_CHECK(pthread_create(&worker, nullptr, &PthreadExitWorker, nullptr) == 0);
  pthread_exit(nullptr);
}

// ---- profiles written after main() ended with pthread_exit() ---------------
// /proc/self then names the exited main thread: its maps read empty and its
// memory reads nothing, so the retention scan and the leak report saw no
// memory at all ("not scanned: /proc/self/maps cannot be read"). The worker
// waits for main() to have ended (a join, not a sleep), keeps objects from a
// global array (no destructor: they stay reachable through the exit's leak
// report), writes a retention profile and prints its scan comment; the
// process ends with exit(), whose leak report scans too.
inline pthread_t g_exited_main;
inline void* g_after_main_keep[64];
inline void* AfterMainWorker(void*) {
  if (pthread_join(g_exited_main, nullptr) != 0) std::_Exit(3);
  for (void*& p : g_after_main_keep) p = ::operator new(4096);
  std::ostringstream out;
  if (!heapprof::WriteRetentionProfile(out)) std::_Exit(4);
  std::string raw;
  if (!Gunzip(out.str(), raw)) std::_Exit(5);
  const bool scanned = raw.find("reached from roots") != std::string::npos;
  const bool not_scanned = raw.find("not scanned: /proc") != std::string::npos;
  std::printf("after_main_profiles: retention scanned %d, not scanned %d\n", scanned ? 1 : 0, not_scanned ? 1 : 0);
  std::fflush(stdout);
  std::exit(0);
}
inline int RunAfterMainProfiles() {
  g_exited_main = pthread_self();
  pthread_t worker;
  HEAPPROF_HOSTILE_CHECK(pthread_create(&worker, nullptr, &AfterMainWorker, nullptr) == 0);
  pthread_exit(nullptr);
}

// ---- main() ends with pthread_exit() while a chain of threads runs ---------
// main() ends with pthread_exit() while a chain of threads runs, each
// starting the next and returning (a program's last thread may hand on to a
// new one). A thread marked as the profiler's asks ProgramThreadsGone (what
// the dump thread and the HTTP server ask once a second) over and over while
// the chain runs: it must never say that the program's threads are gone
// while a link still runs (it said so when it listed the tasks and then read
// each one's state: a link that had started the next and returned in
// between hid the new one); once the last link has returned, it must.
struct ThreadChain {
  std::atomic<long> started{0};
  std::atomic<bool> running{true};
  long links = 2000;
};
inline ThreadChain g_thread_chain;
inline void* ThreadChainLink(void*) {
  if (g_thread_chain.started.fetch_add(1) + 1 >= g_thread_chain.links) {
    g_thread_chain.running.store(false);  // before it returns: after this, "gone" is right
    return nullptr;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t next;
  if (pthread_create(&next, &attr, &ThreadChainLink, nullptr) != 0) std::_Exit(4);
  pthread_attr_destroy(&attr);
  return nullptr;
}
inline void* ThreadChainChecker(void*) {
  heapprof::detail::OwnThreadMark mark;  // as the dump thread's
  long asked = 0, wrong = 0;
  while (g_thread_chain.running.load()) {
    const bool gone = heapprof::detail::ProgramThreadsGone();
    ++asked;
    if (gone && g_thread_chain.running.load()) ++wrong;
  }
  bool seen_gone = false;
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (timespec now = start; !seen_gone && now.tv_sec - start.tv_sec < 20; clock_gettime(CLOCK_MONOTONIC, &now)) {
    seen_gone = heapprof::detail::ProgramThreadsGone();  // (the last link may still be returning)
  }
  std::printf("pthread_exit_thread_chain: %ld links, asked %ld times, %ld wrong, gone at the end: %d\n",
              g_thread_chain.started.load(), asked, wrong, seen_gone ? 1 : 0);
  std::fflush(stdout);
  std::_Exit(wrong == 0 && seen_gone ? 0 : 1);
}
inline int RunPthreadExitThreadChain() {
  pthread_t thread;
  HEAPPROF_HOSTILE_CHECK(pthread_create(&thread, nullptr, &ThreadChainChecker, nullptr) == 0);
  HEAPPROF_HOSTILE_CHECK(pthread_create(&thread, nullptr, &ThreadChainLink, nullptr) == 0);
  pthread_detach(thread);
  pthread_exit(nullptr);
}

// ---- exit() and a profile write on a thread of 16 KiB ---------------------
// A worker with a 16 KiB stack (a program's many small threads) writes a heap
// profile to HEAPPROF_TEST_DIR/small.pb.gz, keeps 50 blocks and calls
// exit(): the exit dump, the peak profile and the leak report run on it, below
// libc's exit machinery. They took 30-60 KiB of its stack: SIGSEGV.
inline void* g_small_exit_keep[50];
inline void* SmallStackExitWorker(void*) {
  for (void*& p : g_small_exit_keep) p = ::operator new(1000);
  const std::string path = std::string(std::getenv("HEAPPROF_TEST_DIR")) + "/small.pb.gz";
  const bool written = heapprof::WriteHeapProfile(path.c_str());
  std::printf("small_stack_exit: written %d\n", written ? 1 : 0);
  std::fflush(stdout);
  std::exit(0);
}
inline int RunSmallStackExit() {
  pthread_attr_t attr;
  HEAPPROF_HOSTILE_CHECK(pthread_attr_init(&attr) == 0);
  HEAPPROF_HOSTILE_CHECK(pthread_attr_setstacksize(&attr, 16384) == 0);
  pthread_t worker;
  HEAPPROF_HOSTILE_CHECK(pthread_create(&worker, &attr, &SmallStackExitWorker, nullptr) == 0);
  pthread_join(worker, nullptr);
  return 3;  // (the worker's exit() ends the process)
}

// ---- a profile written by a handler on its alternate stack ---------------
// A SIGUSR1 handler on a 16 KiB sigaltstack writes a heap profile (as a
// crash or status handler may). The build runs on the profiler's stack (the
// alternate stack is short); meanwhile another thread sends SIGUSR2, whose
// handler is SA_ONSTACK too, over and over. Delivered during the build, the
// kernel (the stack pointer off the alternate stack) would run it from the
// top of the alternate stack, over the live frames of the first handler:
// asynchronous signals wait until the build is back. Prints how many SIGUSR2
// handlers ran above the first handler's frame, over it (0), and in all
// (> 0: those held off came after).
inline std::atomic<int> g_altstack_usr2{0}, g_altstack_over{0};
inline std::atomic<bool> g_altstack_writing{false}, g_altstack_done{false};
inline std::atomic<std::uintptr_t> g_altstack_outer{0};
inline int g_altstack_written = -1;
inline void AltstackUsr2(int) {
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  const std::uintptr_t outer = g_altstack_outer.load();
  if (outer != 0 && here > outer) g_altstack_over.fetch_add(1);
  g_altstack_usr2.fetch_add(1);
}
__attribute__((noinline)) inline void AltstackUsr1(int) {
  const std::string path = std::string(std::getenv("HEAPPROF_TEST_DIR")) + "/altstack.pb.gz";
  g_altstack_outer.store(reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0)));
  g_altstack_writing.store(true);
  const bool written = heapprof::WriteHeapProfile(path);
  g_altstack_written = written ? 1 : 0;
  g_altstack_outer.store(0);
}
inline int RunAltstackWrite() {
  std::vector<void*> keep;
  for (int i = 0; i < 50; ++i) keep.push_back(::operator new(1000));
  static char alternate[16384];
  stack_t ss{};
  ss.ss_sp = alternate;
  ss.ss_size = sizeof alternate;
  HEAPPROF_HOSTILE_CHECK(sigaltstack(&ss, nullptr) == 0);
  struct sigaction sa {};
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = &AltstackUsr2;
  HEAPPROF_HOSTILE_CHECK(sigaction(SIGUSR2, &sa, nullptr) == 0);
  sa.sa_handler = &AltstackUsr1;
  HEAPPROF_HOSTILE_CHECK(sigaction(SIGUSR1, &sa, nullptr) == 0);
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  std::atomic<long> sent{0};
  std::thread sender([&] {
    while (!g_altstack_writing.load()) {
    }
    while (!g_altstack_done.load()) {
      syscall(SYS_tgkill, getpid(), self, SIGUSR2);
      sent.fetch_add(1);
    }
  });
  raise(SIGUSR1);
  g_altstack_done.store(true);
  sender.join();
  for (void* p : keep) ::operator delete(p);
  std::printf("altstack_write: written %d, over %d, handled %d, sent %ld\n", g_altstack_written,
              g_altstack_over.load(), g_altstack_usr2.load(), sent.load());
  return 0;
}

inline int RunHostileScenario(const char* name, bool& known) {
  known = true;
  if (std::strcmp(name, "signal_alloc_in_free") == 0) return RunSignalAllocInFree();
  if (std::strcmp(name, "signal_allocator_free_in_free") == 0) return RunSignalAllocatorFreeInFree();
  if (std::strcmp(name, "signal_getstats") == 0) return RunSignalDuringGetStats();
  if (std::strcmp(name, "signal_exit") == 0) return RunSignalExit();
  if (std::strcmp(name, "cancel_write") == 0) return RunCancelWrite();
  if (std::strcmp(name, "dump_signal_term") == 0) return RunDumpSignalTerm();
  if (std::strcmp(name, "sample_stack_use") == 0) return RunSampleStackUse();
  if (std::strcmp(name, "dlopen_churn") == 0) return RunDlopenChurn();
  if (std::strcmp(name, "dlclose_names") == 0) return RunDlcloseNames();
  if (std::strcmp(name, "seccomp_coroutine") == 0) return RunSeccompCoroutine();
  if (std::strcmp(name, "seccomp_late_filter") == 0) return RunSeccompLateFilter();
  if (std::strcmp(name, "seccomp_fsync") == 0) return RunSeccompFsync();
  if (std::strcmp(name, "seccomp_unreadable_memory") == 0) return RunSeccompUnreadableMemory();
#if defined(__NR_poll)
  if (std::strcmp(name, "seccomp_http_poll") == 0) return RunSeccompHttp(__NR_poll, "poll");
#else  // (aarch64: glibc's poll is ppoll)
  if (std::strcmp(name, "seccomp_http_poll") == 0) return RunSeccompHttp(__NR_ppoll, "poll");
#endif
  if (std::strcmp(name, "seccomp_http_accept4") == 0) return RunSeccompHttp(__NR_accept4, "accept4");
#if defined(__NR_poll)
  if (std::strcmp(name, "seccomp_http_trap_poll") == 0) return RunSeccompHttp(__NR_poll, "trap_poll", true);
#else
  if (std::strcmp(name, "seccomp_http_trap_poll") == 0) return RunSeccompHttp(__NR_ppoll, "trap_poll", true);
#endif
  if (std::strcmp(name, "daemon_dumps") == 0) return RunDaemonDumps();
  if (std::strcmp(name, "trap_allocator_labels") == 0) return RunTrapAllocatorLabels();
  if (std::strcmp(name, "fd_exhaustion_lines") == 0) return RunFdExhaustionLines();
  if (std::strcmp(name, "late_table_comment") == 0) return RunLateTableLoadComment();
  if (std::strcmp(name, "dead_stderr_pipe") == 0) return RunDeadStderrPipe();
  if (std::strcmp(name, "pthread_exit_main") == 0) return RunPthreadExitMain();
  if (std::strcmp(name, "after_main_profiles") == 0) return RunAfterMainProfiles();
  if (std::strcmp(name, "pthread_exit_thread_chain") == 0) return RunPthreadExitThreadChain();
  if (std::strcmp(name, "small_stack_exit") == 0) return RunSmallStackExit();
  if (std::strcmp(name, "altstack_write") == 0) return RunAltstackWrite();
  if (std::strcmp(name, "foreign_sigpipe_during_line") == 0) return RunForeignSigpipeDuringLine();
  known = false;
  return 2;
}

#undef HEAPPROF_HOSTILE_CHECK

}  // namespace heapprof_test
