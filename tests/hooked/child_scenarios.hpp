// Scenarios that need a process of their own, run by re-executing the hooked
// test binary with HEAPPROF_TEST_CHILD=<name>. Each returns the exit status the
// parent test checks; a failure after main returns uses _exit with a code.
#pragma once

#include <heapprof.hpp>

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
      ChildSideAllocator();
      std::ofstream f("/dev/null", std::ios::binary);
      _exit(heapprof::WriteHeapProfile(f) ? 0 : 3);
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

inline int RunChild(const char* name) {
  if (std::strcmp(name, "scope_misuse") == 0) return RunScopeMisuse();
  if (std::strcmp(name, "label_cap") == 0) return RunLabelCap();
  if (std::strcmp(name, "print_rate") == 0) {
    std::printf("rate=%zu\n", heapprof::GetSampleRate());
    return 0;
  }
  if (std::strcmp(name, "static_exit") == 0) return RunStaticExit();
  if (std::strcmp(name, "fork") == 0) return RunFork();
  bool known = false;
  const int rc = RunDumpScenario(name, known);
  if (known) return rc;
  std::fprintf(stderr, "unknown HEAPPROF_TEST_CHILD %s\n", name);
  return 2;
}

}  // namespace heapprof_test
