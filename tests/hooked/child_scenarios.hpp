// Scenarios that need a process of their own, run by re-executing the hooked
// test binary with HEAPPROF_TEST_CHILD=<name>. Each returns the exit status the
// parent test checks; a failure after main returns uses _exit with a code.
#pragma once

#include <heapprof.hpp>
#include "heapprof/detail/2_sampling/buckets.hpp"

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "dump_scenarios.hpp"
#include "hostile_scenarios.hpp"
#include "memory_scenarios.hpp"
#include "retention_scenarios.hpp"
#include "support/profile_io.hpp"

namespace heapprof_test {

inline void* volatile g_child_sink;

// ---- static_exit: allocations before main and in static destructors ----
inline char* g_early[10];
inline char* g_late[7];

__attribute__((noinline)) inline void EarlyAllocatorBeforeMain() {
  for (char*& p : g_early) p = new char[333];  // live until the very end
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) inline void LateAllocatorAtExit() {
  for (int i = 0; i < 7; ++i) {
    g_late[i] = new char[4444];
    if (i < 3) delete[] g_late[i];  // 4 stay live
  }
  asm volatile("" ::: "memory");
}

struct StaticLifetimeProbe {
  StaticLifetimeProbe() {
    if (std::getenv("HEAPPROF_TEST_CHILD") != nullptr &&
        std::strcmp(std::getenv("HEAPPROF_TEST_CHILD"), "static_exit") == 0) {
      active = true;
      EarlyAllocatorBeforeMain();
    }
  }
  ~StaticLifetimeProbe() {
    if (!active) return;
    const heapprof::Stats before = heapprof::GetStats();
    LateAllocatorAtExit();
    const heapprof::Stats after = heapprof::GetStats();
    if (after.alloc_objects - before.alloc_objects != 7) _exit(41);
    if (after.free_objects - before.free_objects != 3) _exit(42);
    const char* out = std::getenv("HEAPPROF_TEST_OUT");
    {
      std::ofstream f(std::string(out) + ".exit", std::ios::binary);
      if (!heapprof::WriteHeapProfile(f)) _exit(43);
    }
    for (int i = 3; i < 7; ++i) delete[] g_late[i];  // LeakSanitizer runs after us
    for (char* p : g_early) delete[] p;
  }
  bool active = false;
};
inline StaticLifetimeProbe g_static_lifetime_probe;

inline int RunStaticExit() {
  std::ofstream f(std::string(std::getenv("HEAPPROF_TEST_OUT")) + ".main", std::ios::binary);
  return heapprof::WriteHeapProfile(f) ? 0 : 1;
}

// ---- fork: fork while other threads allocate and one writes profiles ----
__attribute__((noinline)) inline void ChildSideAllocator() {
  for (int i = 0; i < 100; ++i) {
    std::string* s = new std::string(1000, 'x');
    g_child_sink = s;
    delete s;
  }
}

inline int RunFork() {
  heapprof::SetSampleRate(4096);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&stop] {
      while (!stop.load()) {
        std::vector<std::string> v(50, std::string(200, 'y'));
        asm volatile("" : : "r"(&v) : "memory");  // keep v; no shared write
      }
    });
  }
  threads.emplace_back([&stop] {
    while (!stop.load()) {
      std::ofstream devnull("/dev/null", std::ios::binary);
      heapprof::WriteHeapProfile(devnull);
    }
  });
  int failures = 0;
  for (int round = 0; round < 20; ++round) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(20);  // a deadlock becomes a SIGALRM death the parent sees
      heapprof::SetSampleRate(1);
      ChildSideAllocator();
      // The child's profile is whole: it decodes, validates, and has the
      // child's own allocations (all freed: in the alloc totals only).
      Profile p;
      std::string why;
      if (!CaptureProfile(p, false, nullptr, &why) || !Validate(p, &why)) {
        std::fprintf(stderr, "fork child: bad profile: %s\n", why.c_str());
        _exit(3);
      }
      if (SumForLeaf(p, "ChildSideAllocator", "alloc_objects") < 100) _exit(4);
      if (SumForLeaf(p, "ChildSideAllocator", "inuse_objects") != 0) _exit(5);
      _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
      std::fprintf(stderr, "fork round %d: child %s %d\n", round, WIFSIGNALED(status) ? "killed by signal" : "exited",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  return failures == 0 ? 0 : 10 + failures;
}

// ---- label_cap: a million distinct request ids under max_label_sets=1000 ----
inline int RunLabelCap() {
  const heapprof::Stats s0 = heapprof::GetStats();
  for (int i = 0; i < 1000000; ++i) {
    char id[32];
    const int n = std::snprintf(id, sizeof id, "req-%d", i);
    heapprof::ScopedLabels req{{"request_id", std::string_view(id, static_cast<std::size_t>(n))}};
  }
  heapprof::ScopedLabels late{{"request_id", "one-more"}};
  const heapprof::Stats s1 = heapprof::GetStats();
  std::printf("label_sets=%llu\noverflows=%llu\nprofiler_bytes_before=%llu\nprofiler_bytes_after=%llu\n",
              static_cast<unsigned long long>(s1.label_sets), static_cast<unsigned long long>(s1.label_set_overflows),
              static_cast<unsigned long long>(s0.profiler_bytes), static_cast<unsigned long long>(s1.profiler_bytes));
  std::printf("overflow_label=%s\n", std::string(heapprof::CurrentLabels().Get("heapprof")).c_str());
  // Every set past the cap was counted, and memory stayed bounded: 1000 sets
  // of one short label plus the table fit well inside 1 MiB.
  if (s1.label_set_overflows < 1000000 - 1000) return 3;
  if (s1.profiler_bytes - s0.profiler_bytes > (std::uint64_t{1} << 20)) return 4;
  return 0;
}

// ---- scope_misuse: scopes destroyed out of order ----
inline int RunScopeMisuse() {
  auto* outer = new heapprof::ScopedLabels{{"a", "1"}};
  auto* inner = new heapprof::ScopedLabels{{"b", "2"}};
  delete outer;  // wrong: inner is still open (debug builds abort here)
  delete inner;
  std::printf("survived\n");
  return 0;
}

// ---- tiny_stack_first: a 16 KiB thread takes the process's first samples ----

// 16 KiB, or the system's minimum if larger; the sanitizers' runtimes need
// more of their own (and their frames are bigger), so 128 KiB under them.
inline std::size_t TinyStackSize() {
#if defined(HEAPPROF_ASAN) || defined(HEAPPROF_TSAN)
  std::size_t size = 128 * 1024;
#else
  std::size_t size = 16 * 1024;
#endif
  const long min = sysconf(_SC_THREAD_STACK_MIN);
  if (min > 0 && static_cast<std::size_t>(min) > size) size = static_cast<std::size_t>(min);
  return size;
}

inline void* g_tiny_kept[4];
inline void* (*g_tiny_dso_alloc)(std::size_t) = nullptr;

__attribute__((noinline)) inline void TinyFirstLeaf(int slot, std::size_t size) {
  g_tiny_kept[slot] = ::operator new(size);
  asm volatile("" ::: "memory");
}

inline void* TinyFirstMain(void* arg) {
  const int round = static_cast<int>(reinterpret_cast<std::uintptr_t>(arg));
  heapprof::SetSampleRate(1);
  if (round == 0) {
    heapprof::SetUnwinder(heapprof::Unwinder::kTable);  // builds the unwind tables here
    TinyFirstLeaf(0, 7701);
    heapprof::SetUnwinder(heapprof::Unwinder::kFramePointer);
    TinyFirstLeaf(1, 7702);
  } else {
    heapprof::SetUnwinder(heapprof::Unwinder::kTable);  // the new object's table, built here
    g_tiny_kept[2] = g_tiny_dso_alloc(7703);
  }
  heapprof::SetSampleRate(0);
  return nullptr;
}

inline bool RunOnTinyStack(int round) {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return false;
  if (pthread_attr_setstacksize(&attr, TinyStackSize()) != 0) return false;
  pthread_t t;
  if (pthread_create(&t, &attr, &TinyFirstMain, reinterpret_cast<void*>(static_cast<std::uintptr_t>(round))) != 0)
    return false;
  pthread_attr_destroy(&attr);
  return pthread_join(t, nullptr) == 0;
}

inline int RunTinyStackFirst() {
  // HEAPPROF=rate=0: nothing sampled before the tiny thread turns it on.
  if (!RunOnTinyStack(0)) return 3;
  int expected = 2;
#ifdef HEAPPROF_HOOKED_DSO_PATH
  void* h = dlopen(HEAPPROF_HOOKED_DSO_PATH, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 4;
  g_tiny_dso_alloc = reinterpret_cast<void* (*)(std::size_t)>(dlsym(h, "heapprof_hooked_dso_alloc"));
  if (g_tiny_dso_alloc == nullptr) return 5;
  if (!RunOnTinyStack(1)) return 6;
  expected = 3;
#endif
  Profile p;
  std::string why;
  if (!CaptureProfile(p, false, nullptr, &why) || !Validate(p, &why)) {
    std::printf("bad profile: %s\n", why.c_str());
    return 7;
  }
  int found = 0;
  for (const Sample& s : p.samples) {
    const std::vector<std::string> names = FunctionNames(p, s);
    for (std::size_t i = 0; i < names.size(); ++i) std::printf("%s%s", i ? " <- " : "sample: ", names[i].c_str());
    std::printf("\n");
    if (names.size() >= 2 && names[0].find("TinyFirstLeaf") != std::string::npos &&
        names[1].find("TinyFirstMain") != std::string::npos)
      ++found;
    if (names.size() >= 4 && names[0].find("DsoInner") != std::string::npos &&
        names[3].find("TinyFirstMain") != std::string::npos)
      ++found;
  }
  std::printf("found=%d expected=%d\n", found, expected);
  return found == expected ? 0 : 8;
}

// ---- stack_cap: a million distinct stacks (HEAPPROF=rate=1, default cap) ----

inline void* volatile g_cap_sink;

__attribute__((noinline)) inline void* CapLeaf(std::size_t size) {
  void* p = ::operator new(size);
  asm volatile("" ::"r"(p) : "memory");
  return p;
}
// Level by level, bit `level - 1` of `path` picks A or B: 2^levels distinct
// call paths. No tail calls (the asm after each call). Static members: they
// call each other without a forward declaration.
struct CapPath {
  __attribute__((noinline)) static void* A(unsigned path, int level, std::size_t size) {
    if (level == 0) return CapLeaf(size);
    void* p = ((path >> (level - 1)) & 1) ? A(path, level - 1, size) : B(path, level - 1, size);
    asm volatile("" ::"r"(p) : "memory");
    return p;
  }
  __attribute__((noinline)) static void* B(unsigned path, int level, std::size_t size) {
    if (level == 0) return CapLeaf(size);
    void* p = ((path >> (level - 1)) & 1) ? A(path, level - 1, size) : B(path, level - 1, size);
    asm volatile("" ::"r"(p) : "memory");
    return p;
  }
};
// A varying extra depth on top of the path.
__attribute__((noinline)) inline void* CapDeep(unsigned path, int extra, int levels, std::size_t size) {
  void* p = extra == 0 ? CapPath::A(path, levels, size) : CapDeep(path, extra - 1, levels, size);
  asm volatile("" ::"r"(p) : "memory");
  return p;
}

// The documented bound (README "Limits"): per allowed stack, a stack record
// of at most 2 KiB (128 frames, power-of-two arena class) plus 64 B of table
// slots, and kBucketsPerStack + 1 buckets of 64 B with 64 B of slots each.
inline std::uint64_t StackTablesBound(std::uint64_t max_stacks) {
  return max_stacks * (2048 + 64 + (heapprof::detail::kBucketsPerStack + 1) * 128);
}

struct CapCounters {
  std::uint64_t allocs = 0;
  std::uint64_t bytes = 0;
};

// Allocates through `paths` distinct stacks (plus a varying extra depth);
// keeps every `keep_every`-th object.
inline void CapWorkload(unsigned paths, int levels, std::size_t size, unsigned keep_every,
                        std::vector<std::pair<void*, std::size_t>>& kept, CapCounters& c) {
  for (unsigned path = 0; path < paths; ++path) {
    const int extra = static_cast<int>((path * 2654435761u) >> 29);  // 0..7
    void* p = CapDeep(path, extra, levels, size);
    ++c.allocs;
    c.bytes += size;
    if (path % keep_every == 0) {
      kept.emplace_back(p, size);
    } else {
      ::operator delete(p, size);
    }
  }
}

// Sums `type` over samples of object size `size`; split by whether the
// sample is the overflow stack's.
inline void SumBySize(const Profile& p, std::int64_t size, const char* type, std::int64_t& normal,
                      std::int64_t& overflow) {
  const int idx = SampleTypeIndex(p, type);
  normal = overflow = 0;
  for (const Sample& s : p.samples) {
    bool match = false;
    for (const Label& l : s.labels) match = match || (l.key == "bytes" && l.num == size);
    if (!match) continue;
    const std::vector<std::string> names = FunctionNames(p, s);
    if (names.size() == 1 && names[0] == "[heapprof: stack table full]") {
      overflow += s.values.at(idx);
    } else {
      normal += s.values.at(idx);
    }
  }
}

#define HEAPPROF_CHILD_CHECK(cond)                                   \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::printf("check failed, line %d: %s\n", __LINE__, #cond);   \
      return 1;                                                      \
    }                                                                \
  } while (0)

inline int RunStackCap() {
#if defined(HEAPPROF_TSAN) || defined(HEAPPROF_ASAN)
  const int levels = 16;  // 65,536 distinct stacks: still four times the cap
#else
  const int levels = 20;  // 1,048,576 distinct stacks
#endif
  const unsigned paths = 1u << levels;
  const std::uint64_t cap = heapprof::detail::g_buckets.MaxStacks();
  std::vector<std::pair<void*, std::size_t>> kept;
  kept.reserve(paths / 1024 + 1);
  const heapprof::Stats s0 = heapprof::GetStats();
  CapCounters c;
  CapWorkload(paths, levels, 7501, 1024, kept, c);
  const heapprof::Stats s1 = heapprof::GetStats();
  std::printf("paths=%u cap=%llu stacks %llu -> %llu, overflows %llu, dropped %llu, profiler_bytes %llu -> %llu (bound %llu)\n",
              paths, static_cast<unsigned long long>(cap), static_cast<unsigned long long>(s0.stacks),
              static_cast<unsigned long long>(s1.stacks),
              static_cast<unsigned long long>(s1.stack_overflows - s0.stack_overflows),
              static_cast<unsigned long long>(s1.samples_dropped),
              static_cast<unsigned long long>(s0.profiler_bytes), static_cast<unsigned long long>(s1.profiler_bytes),
              static_cast<unsigned long long>(StackTablesBound(cap)));
  HEAPPROF_CHILD_CHECK(cap == heapprof::detail::kDefaultMaxStacks);
  HEAPPROF_CHILD_CHECK(s0.stacks < cap);
  HEAPPROF_CHILD_CHECK(s1.stacks == cap);
  // Every path is a new stack: those that found the table full, exactly, went
  // to the overflow stack; none was dropped.
  HEAPPROF_CHILD_CHECK(s1.stack_overflows - s0.stack_overflows == paths - (cap - s0.stacks));
  HEAPPROF_CHILD_CHECK(s1.samples_dropped == 0);
  HEAPPROF_CHILD_CHECK(s1.sampled_live_objects - s0.sampled_live_objects == kept.size());
  // Bounded: the tables, plus 2 MiB for the arena's chunk granularity and the
  // live map of the kept objects.
  HEAPPROF_CHILD_CHECK(s1.profiler_bytes - s0.profiler_bytes <= StackTablesBound(cap) + (std::uint64_t{2} << 20));

  std::int64_t normal = 0, overflow = 0;
  {
  Profile p;
  std::string why;
  if (!CaptureProfile(p, false, nullptr, &why) || !Validate(p, &why)) {
    std::printf("bad profile: %s\n", why.c_str());
    return 1;
  }
  SumBySize(p, 7501, "alloc_objects", normal, overflow);
  std::printf("profile: %zu samples; alloc_objects normal %lld overflow %lld\n", p.samples.size(),
              static_cast<long long>(normal), static_cast<long long>(overflow));
  HEAPPROF_CHILD_CHECK(static_cast<std::uint64_t>(overflow) == s1.stack_overflows - s0.stack_overflows);
  HEAPPROF_CHILD_CHECK(static_cast<std::uint64_t>(normal + overflow) == c.allocs);
  SumBySize(p, 7501, "inuse_space", normal, overflow);
  HEAPPROF_CHILD_CHECK(static_cast<std::uint64_t>(normal + overflow) == kept.size() * 7501);
  HEAPPROF_CHILD_CHECK(p.samples.size() <= cap + 8);
  }

  for (const auto& k : kept) ::operator delete(k.first, k.second);
  const heapprof::Stats s2 = heapprof::GetStats();
  HEAPPROF_CHILD_CHECK(s2.sampled_live_objects - s0.sampled_live_objects == 0);
  Profile after;
  HEAPPROF_CHILD_CHECK(CaptureProfile(after));
  SumBySize(after, 7501, "inuse_objects", normal, overflow);
  HEAPPROF_CHILD_CHECK(normal == 0 && overflow == 0);
  std::printf("stack_cap: ok\n");
  return 0;
}

// ---- stack_cap_deep: the worst case of the stack tables ----
// Stacks deeper than HEAPPROF_MAX_FRAMES (the largest records), more distinct
// ones than the cap, each with kBucketsPerStack + 1 sizes (the bucket cap and
// the overflow reserve filled too), nothing kept: profiler_bytes must stay
// under the README's bound.
inline int RunStackCapDeep() {
#if defined(HEAPPROF_TSAN) || defined(HEAPPROF_ASAN)
  const int levels = 12;
#else
  const int levels = 15;
#endif
  const unsigned paths = 1u << levels;
  const std::uint64_t cap = heapprof::detail::g_buckets.MaxStacks();
  const heapprof::Stats s0 = heapprof::GetStats();
  const int extra = HEAPPROF_MAX_FRAMES;
  for (unsigned size = 0; size <= heapprof::detail::kBucketsPerStack; ++size) {
    for (unsigned path = 0; path < paths; ++path) {
      void* p = CapDeep(path, extra, levels, 7501 + size);
      ::operator delete(p, 7501 + size);
    }
  }
  const heapprof::Stats s1 = heapprof::GetStats();
  std::printf("paths=%u cap=%llu depth>%d stacks %llu, overflows %llu, dropped %llu, profiler_bytes %llu -> %llu "
              "(+%.1f MiB; bound %.1f MiB)\n",
              paths, static_cast<unsigned long long>(cap), extra, static_cast<unsigned long long>(s1.stacks),
              static_cast<unsigned long long>(s1.stack_overflows - s0.stack_overflows),
              static_cast<unsigned long long>(s1.samples_dropped),
              static_cast<unsigned long long>(s0.profiler_bytes), static_cast<unsigned long long>(s1.profiler_bytes),
              static_cast<double>(s1.profiler_bytes - s0.profiler_bytes) / 1048576.0,
              static_cast<double>(StackTablesBound(cap)) / 1048576.0);
  HEAPPROF_CHILD_CHECK(s1.profiler_bytes - s0.profiler_bytes <= StackTablesBound(cap) + (std::uint64_t{2} << 20));
  std::printf("stack_cap_deep: ok\n");
  return 0;
}

// ---- label_budget: the largest label sets, as many as the cap allows ----
// 4096 distinct sets of 32 labels with 256-byte keys and values (17 KiB
// each, 32 KiB arena blocks): the byte budget stops them at 16 MiB.
inline int RunLabelBudget() {
  const heapprof::Stats s0 = heapprof::GetStats();
  std::string keys[32], value(256, 'v');
  for (int k = 0; k < 32; ++k) keys[k] = std::string(250, 'k') + std::to_string(100000 + k);
  for (int i = 0; i < 4096; ++i) {
    std::snprintf(&value[0], 16, "%015d", i);
    heapprof::Label labels[32];
    for (int k = 0; k < 32; ++k) labels[k] = heapprof::Label{keys[k], value};
    heapprof::ScopedLabels scope(heapprof::LabelSet::FromData(heapprof::detail::InternLabels(nullptr, labels, 32)));
  }
  const heapprof::Stats s1 = heapprof::GetStats();
  std::printf("label_sets=%llu overflows=%llu profiler_bytes +%.1f MiB\n",
              static_cast<unsigned long long>(s1.label_sets), static_cast<unsigned long long>(s1.label_set_overflows),
              static_cast<double>(s1.profiler_bytes - s0.profiler_bytes) / 1048576.0);
  // 16 MiB of sets, plus the table and the arena's 1 MiB chunks.
  HEAPPROF_CHILD_CHECK(s1.profiler_bytes - s0.profiler_bytes <= (std::uint64_t{18} << 20));
  HEAPPROF_CHILD_CHECK(s1.label_sets == 512);  // 16 MiB / 32 KiB
  HEAPPROF_CHILD_CHECK(s1.label_set_overflows == 4096 - 512);
  std::printf("label_budget: ok\n");
  return 0;
}

// ---- stack_cap_small: HEAPPROF=max_stacks=1000; the bucket cap and the reserve too ----

__attribute__((noinline)) inline void* OneSiteManySizes(std::size_t size) {
  void* p = ::operator new(size);
  asm volatile("" ::"r"(p) : "memory");
  return p;
}

inline int RunStackCapSmall() {
  const std::uint64_t cap = heapprof::detail::g_buckets.MaxStacks();
  HEAPPROF_CHILD_CHECK(cap == 1000);
  std::vector<std::pair<void*, std::size_t>> kept;
  kept.reserve(4096);
  const heapprof::Stats s0 = heapprof::GetStats();
  std::printf("stacks at start: %llu\n", static_cast<unsigned long long>(s0.stacks));
  HEAPPROF_CHILD_CHECK(s0.stacks < cap);
  // One call site, 6000 distinct sizes: past kBucketsPerStack * cap buckets
  // they go to the overflow stack (cap of its own), and past that they are
  // dropped. Whatever happens, each sample is in the profile or counted.
  std::uint64_t allocs = 0;
  for (std::size_t size = 20000; size < 26000; ++size) {
    void* p = OneSiteManySizes(size);
    ++allocs;
    if (size % 3 == 0) {
      kept.emplace_back(p, size);
    } else {
      ::operator delete(p, size);
    }
  }
  // Then more distinct stacks than the cap, of one more size.
  CapCounters c;
  CapWorkload(1024, 10, 7601, 4, kept, c);
  const heapprof::Stats s1 = heapprof::GetStats();
  std::printf("stacks %llu, overflows %llu, dropped %llu, profiler_bytes %llu -> %llu\n",
              static_cast<unsigned long long>(s1.stacks),
              static_cast<unsigned long long>(s1.stack_overflows - s0.stack_overflows),
              static_cast<unsigned long long>(s1.samples_dropped - s0.samples_dropped),
              static_cast<unsigned long long>(s0.profiler_bytes), static_cast<unsigned long long>(s1.profiler_bytes));
  HEAPPROF_CHILD_CHECK(s1.stacks == cap);
  HEAPPROF_CHILD_CHECK(s1.stack_overflows > s0.stack_overflows);
  HEAPPROF_CHILD_CHECK(s1.samples_dropped > s0.samples_dropped);
  HEAPPROF_CHILD_CHECK(s1.profiler_bytes - s0.profiler_bytes <= StackTablesBound(cap) + (std::uint64_t{2} << 20));

  Profile p;
  std::string why;
  if (!CaptureProfile(p, false, nullptr, &why) || !Validate(p, &why)) {
    std::printf("bad profile: %s\n", why.c_str());
    return 1;
  }
  // Every sample is either in the profile (under its stack or the overflow
  // stack) or counted as dropped; the live map holds exactly the kept
  // objects that were recorded.
  std::int64_t recorded = 0, recorded_overflow = 0, live = 0, live_bytes = 0;
  std::uint64_t expected_live_bytes = 0;
  for (std::size_t size = 20000; size < 26000; ++size) {
    std::int64_t n = 0, o = 0;
    SumBySize(p, static_cast<std::int64_t>(size), "alloc_objects", n, o);
    recorded += n + o;
    recorded_overflow += o;
    SumBySize(p, static_cast<std::int64_t>(size), "inuse_objects", n, o);
    const std::int64_t objects = n + o;
    live += objects;
    // At most the one kept object of this size; freed sizes have none.
    if (objects > (size % 3 == 0 ? 1 : 0)) return 2;
    expected_live_bytes += size * static_cast<std::uint64_t>(objects);
    SumBySize(p, static_cast<std::int64_t>(size), "inuse_space", n, o);
    live_bytes += n + o;
  }
  std::int64_t n = 0, o = 0;
  SumBySize(p, 7601, "alloc_objects", n, o);
  recorded += n + o;
  recorded_overflow += o;
  SumBySize(p, 7601, "inuse_objects", n, o);
  live += n + o;
  std::printf("recorded %lld (overflow stack %lld), live %lld\n", static_cast<long long>(recorded),
              static_cast<long long>(recorded_overflow), static_cast<long long>(live));
  HEAPPROF_CHILD_CHECK(static_cast<std::uint64_t>(recorded) + (s1.samples_dropped - s0.samples_dropped) ==
                       allocs + c.allocs);
  HEAPPROF_CHILD_CHECK(static_cast<std::uint64_t>(recorded_overflow) == s1.stack_overflows - s0.stack_overflows);
  HEAPPROF_CHILD_CHECK(static_cast<std::uint64_t>(live_bytes) == expected_live_bytes);
  HEAPPROF_CHILD_CHECK(s1.sampled_live_objects - s0.sampled_live_objects == static_cast<std::uint64_t>(live));
  // Freeing everything, recorded or dropped, balances the live map.
  for (const auto& k : kept) ::operator delete(k.first, k.second);
  const heapprof::Stats s2 = heapprof::GetStats();
  HEAPPROF_CHILD_CHECK(s2.sampled_live_objects == s0.sampled_live_objects);
  std::printf("stack_cap_small: ok\n");
  return 0;
}

// ---- plugin_hooks: a dlopen'ed plugin that defines the hooks says they never run ----
inline int RunPluginHooks() {
#if defined(HEAPPROF_HOOKS_PLUGIN_PATH)
  void* plugin = dlopen(HEAPPROF_HOOKS_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  if (plugin == nullptr) {
    std::fprintf(stderr, "plugin_hooks: dlopen: %s\n", dlerror());
    return 3;
  }
  auto alloc = reinterpret_cast<int (*)()>(dlsym(plugin, "heapprof_hooks_plugin_alloc"));
  if (alloc == nullptr || alloc() != 42) return 4;
  std::printf("plugin_hooks: loaded\n");
  return 0;
#else
  std::printf("plugin_hooks: no plugin built\n");
  return 0;
#endif
}

// ---- dump_no_host_heap: a dump (dump thread, HEAPPROF=dump_signal) takes
// nothing from the host's heap. No allocation here between the two readings.
// The first dump is read whole, to its end: the dump thread writes one dump
// at a time, so once the second dump's file exists the first one's work
// after its rename (its line, its frees) is done. (A fixed 200 ms sleep after
// the first file stood for that, and a dump thread slower than that, under
// TSan on a loaded machine, had its tail counted after the second reading.)
inline int RunDumpNoHostHeap() {
  std::vector<char*> keep;
  for (int i = 0; i < 2000; ++i) keep.push_back(new char[100 + i % 300]);
  char path[512], second[512];
  std::snprintf(path, sizeof path, "%s/p.%ld.0001.heap.pb.gz", std::getenv("HEAPPROF_TEST_DIR"),
                static_cast<long>(getpid()));
  std::snprintf(second, sizeof second, "%s/p.%ld.0002.heap.pb.gz", std::getenv("HEAPPROF_TEST_DIR"),
                static_cast<long>(getpid()));
  const heapprof::Stats before = heapprof::GetStats();
  raise(SIGUSR1);
  for (int i = 0; i < 3000 && access(path, F_OK) != 0; ++i) usleep(10000);
  raise(SIGUSR1);
  for (int i = 0; i < 3000 && access(second, F_OK) != 0; ++i) usleep(10000);
  const heapprof::Stats after = heapprof::GetStats();
  const bool written = access(path, F_OK) == 0 && access(second, F_OK) == 0;
  std::printf("dump_no_host_heap: written=%d alloc_objects %llu -> %llu, alloc_bytes %llu -> %llu\n", written ? 1 : 0,
              static_cast<unsigned long long>(before.alloc_objects), static_cast<unsigned long long>(after.alloc_objects),
              static_cast<unsigned long long>(before.alloc_bytes), static_cast<unsigned long long>(after.alloc_bytes));
  for (char* p : keep) delete[] p;
  return written && after.alloc_objects == before.alloc_objects && after.alloc_bytes == before.alloc_bytes ? 0 : 1;
}

// ---- padded_samples: a small block the countdown samples is asked of the
// allocator as 1 KiB (block_hooks.hpp: SampledRequest), so that a free of a
// block under 1 KiB never reads the free filter; every such free is still
// found. Run at HEAPPROF=rate=65536 (padding on from the start).
struct PaddedSmall {
  char bytes[40];
};
inline std::vector<char*> g_padded_arrays;
inline std::vector<PaddedSmall*> g_padded_objects;

__attribute__((noinline)) inline void PaddedArrayAlloc(int n) {
  for (int i = 0; i < n; ++i) g_padded_arrays.push_back(new char[32]);  // freed by unsized delete[]
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) inline void PaddedObjectAlloc(int n) {
  for (int i = 0; i < n; ++i) g_padded_objects.push_back(new PaddedSmall);  // freed by sized delete
  asm volatile("" ::: "memory");
}

inline int RunPaddedSamples() {
  const int n = 100000;
  g_padded_arrays.reserve(n);  // the vectors' own blocks: allocated before the baseline
  g_padded_objects.reserve(n);
  const std::string path = std::string(std::getenv("HEAPPROF_TEST_OUT"));
  const heapprof::Stats before = heapprof::GetStats();
  PaddedArrayAlloc(n);
  PaddedObjectAlloc(n);
  std::size_t padded = 0, usable_sum = 0;
  for (char* p : g_padded_arrays) {
    usable_sum += malloc_usable_size(p);
    padded += malloc_usable_size(p) >= 1024;
  }
  for (PaddedSmall* p : g_padded_objects) {
    usable_sum += malloc_usable_size(p);
    padded += malloc_usable_size(p) >= 1024;
  }
  const heapprof::Stats held = heapprof::GetStats();
  if (!heapprof::WriteHeapProfile(path.c_str())) return 10;
  std::int64_t sampled = 0;
  {
    Profile live;  // gone before the last Stats reading
    if (!ReadProfileFile(path, live)) return 11;
    sampled = SumForLeaf(live, "PaddedArrayAlloc", "inuse_objects") + SumForLeaf(live, "PaddedObjectAlloc", "inuse_objects");
  }
  for (char* p : g_padded_arrays) delete[] p;
  for (PaddedSmall* p : g_padded_objects) delete p;
  const heapprof::Stats after = heapprof::GetStats();
  if (!heapprof::WriteHeapProfile(path.c_str())) return 12;
  Profile freed;
  if (!ReadProfileFile(path, freed)) return 13;
  const std::int64_t left = SumForLeaf(freed, "PaddedArrayAlloc", "inuse_objects") +
                            SumForLeaf(freed, "PaddedObjectAlloc", "inuse_objects");
  const std::int64_t allocated = SumForLeaf(freed, "PaddedArrayAlloc", "alloc_objects") +
                                 SumForLeaf(freed, "PaddedObjectAlloc", "alloc_objects");
  std::printf("padded_samples: %zu of %d blocks padded; profile in use %lld objects, after the frees %lld (allocated %lld); "
              "Stats held %llu bytes (usable sum %zu), after %lld\n",
              padded, 2 * n, static_cast<long long>(sampled), static_cast<long long>(left),
              static_cast<long long>(allocated),
              static_cast<unsigned long long>(held.live_bytes - before.live_bytes), usable_sum,
              static_cast<long long>(after.live_bytes) - static_cast<long long>(before.live_bytes));
  // 6.4 MB at 64 KiB: ~98 samples (sigma ~10): 40..200 is far outside chance.
  if (padded < 40 || padded > 200) return 20;
  if (sampled <= 0) return 21;  // the samples are in the profile
  if (left != 0) return 22;     // every padded sample's free was found
  if (allocated <= 0) return 23;
  if (held.live_bytes - before.live_bytes != usable_sum) return 24;  // Stats count the padded blocks' size
  if (after.live_bytes != before.live_bytes) return 25;
  return 0;
}

// ---- padding_off: below 64 KiB the padding stops for good (rate 1 records
// every block at its own size) and every free reads the filter again.
__attribute__((noinline)) inline int RunPaddingOff() {
  heapprof::SetSampleRate(1);
  const std::string path = std::string(std::getenv("HEAPPROF_TEST_OUT"));
  std::vector<char*> keep;
  keep.reserve(2000);
  const heapprof::Stats before = heapprof::GetStats();
  for (int i = 0; i < 1000; ++i) keep.push_back(new char[48]);
  std::size_t padded = 0;
  for (char* p : keep) padded += malloc_usable_size(p) >= 1024;
  heapprof::SetSampleRate(524288);  // back up: the padding stays off
  for (int i = 0; i < 1000; ++i) keep.push_back(new char[48]);
  for (char* p : keep) padded += malloc_usable_size(p) >= 1024;
  for (char* p : keep) delete[] p;
  const heapprof::Stats after = heapprof::GetStats();
  if (!heapprof::WriteHeapProfile(path.c_str())) return 10;
  Profile prof;
  if (!ReadProfileFile(path, prof)) return 11;
  const std::int64_t live = SumForLeaf(prof, "RunPaddingOff", "inuse_objects");
  std::printf("padding_off: padded %zu, in use after the frees %lld, live bytes %lld\n", padded,
              static_cast<long long>(live), static_cast<long long>(after.live_bytes) - static_cast<long long>(before.live_bytes));
  if (padded != 0) return 20;
  if (live != 0) return 21;
  if (after.live_bytes != before.live_bytes) return 22;
  return 0;
}

inline int RunChild(const char* name) {
  if (std::strcmp(name, "plugin_hooks") == 0) return RunPluginHooks();
  if (std::strcmp(name, "dump_no_host_heap") == 0) return RunDumpNoHostHeap();
  if (std::strcmp(name, "tiny_stack_first") == 0) return RunTinyStackFirst();
  if (std::strcmp(name, "stack_cap") == 0) return RunStackCap();
  if (std::strcmp(name, "stack_cap_small") == 0) return RunStackCapSmall();
  if (std::strcmp(name, "stack_cap_deep") == 0) return RunStackCapDeep();
  if (std::strcmp(name, "label_budget") == 0) return RunLabelBudget();
  if (std::strcmp(name, "scope_misuse") == 0) return RunScopeMisuse();
  if (std::strcmp(name, "label_cap") == 0) return RunLabelCap();
  if (std::strcmp(name, "print_rate") == 0) {
    std::printf("rate=%zu\n", heapprof::GetSampleRate());
    return 0;
  }
  if (std::strcmp(name, "static_exit") == 0) return RunStaticExit();
  if (std::strcmp(name, "fork") == 0) return RunFork();
  if (std::strcmp(name, "padded_samples") == 0) return RunPaddedSamples();
  if (std::strcmp(name, "padding_off") == 0) return RunPaddingOff();
  bool known = false;
  int rc = RunDumpScenario(name, known);
  if (known) return rc;
  rc = RunHostileScenario(name, known);
  if (known) return rc;
  rc = RunMemoryScenario(name, known);
  if (known) return rc;
  rc = RunRetentionScenario(name, known);
  if (known) return rc;
  std::fprintf(stderr, "unknown HEAPPROF_TEST_CHILD %s\n", name);
  return 2;
}

}  // namespace heapprof_test
