// Child processes for the retention tests (test_retention.cpp): known object
// graphs, then the retention profile to $HEAPPROF_TEST_DIR/retention.pb.gz.
//  - retention_paths (rate 1): a global vector of owners each owning a
//    buffer; a buffer held only by a local of another thread blocked in
//    read(2); a buffer leaked; a cycle of two nodes dropped. Prints the
//    holding thread's tid.
//  - retention_leaks (rate 1, leak_report=1): a leak, a cycle, and a buffer a
//    plain global pointer keeps, then exit (the leak report's split, its exit
//    code and suppressions).
//  - retention_sampled (default rate): a global array of small (unsampled)
//    holders, each holding a big (sampled) buffer.
//  - retention_nested (rate 1): a buffer held from inside an asm-defined
//    global that has a smaller symbol nested in it (test_retention.cpp).
//  - retention_zero_size (rate 1): zero-size objects a global keeps; the
//    retention and the heap profiles.
//  - retention_reservation (rate 1): an untouched MAP_NORESERVE reservation
//    ($HEAPPROF_TEST_RESERVE_MIB, 1024 by default) whose one touched page
//    holds the only pointer to a buffer. Prints the write's time and the
//    page tables' growth (VmPTE).
//  - retention_heap_stack (rate 1, MALLOC_ARENA_MAX=1): a thread running on
//    a 64 KiB stack allocated with new (in the brk heap), blocked in read(2),
//    and dropped cycles allocated above that block. Prints the thread's tid.
//  - retention_main_tls (rate 1): a buffer held only by a thread_local of the
//    main thread, the profile written by another thread. Prints the pid.
//  - retention_main_tls_exit (rate 1, leak_report=1): the same buffer, and a
//    worker thread calls exit() while the main thread waits for it.
//  - retention_main_dso_tls (rate 1): a buffer held only by a thread_local
//    of a dlopen'ed library (tests/hooked/dso.cpp) on the main thread, the
//    profile written by another thread. Prints the pid.
//  - retention_relative_dso (rate 1): a buffer held by a global of that
//    library, dlopen'ed by a relative path; the profile written after a
//    chdir("/").
//  - retention_busy_holder (rate 1): a buffer held only by a local of a
//    thread that is still running (spinning) when the profile's write starts
//    and blocks in read(2) 5 ms later. Prints the thread's tid.
//  - retention_coroutine (rate 1, leak_report=1): main() holds a buffer in
//    a local and switches to a coroutine on a 16 KiB stack (mmapped, a guard
//    page below), which leaks three and holds another, writes the heap,
//    peak and retention profiles (to files and to a stream) and calls
//    exit(). Prints the tid.
#pragma once

#include <heapprof.hpp>

#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/profile_io.hpp"

namespace heapprof_test {

constexpr std::size_t kRetentionOwners = 64;
constexpr std::size_t kOwnedBufferBytes = 3000;
constexpr std::size_t kStackHeldBytes = 5000;
constexpr std::size_t kLeakedBytes = 7000;
constexpr std::size_t kBusyHeldBytes = 5100;
constexpr std::size_t kLeakedCount = 3;
constexpr std::size_t kCycleNodeBytes = 96;
constexpr std::size_t kSampledHolders = 64;
constexpr std::size_t kSampledBufferBytes = 256 * 1024;
constexpr std::size_t kMainTlsBytes = 2345;
constexpr std::size_t kReservedHeldBytes = 3456;
constexpr std::size_t kHeapStackBytes = 64 * 1024;  // under malloc's mmap threshold: in the brk heap

struct RetentionOwner {
  char* buffer;
  std::size_t id;
};
struct CycleNode {
  CycleNode* next;
  char pad[kCycleNodeBytes - sizeof(CycleNode*)];
};
struct SampledHolder {
  char* big;
  char pad[56];
};

inline std::vector<RetentionOwner*> g_retention_owners;
inline char* g_retention_kept;  // a plain pointer: no destructor, still holds at exit
inline SampledHolder* g_sampled_holders[kSampledHolders];
// Defined in test_retention.cpp's asm: 64 bytes, with the 8-byte
// heapprof_test_retention_inner at offset 8, and symbols after them.
extern "C" char* heapprof_test_retention_outer[8];
constexpr std::size_t kNestedHeldBytes = 1234;
constexpr std::size_t kZeroSizeCount = 3;
inline char* g_retention_zero[kZeroSizeCount];
inline char* g_heap_stack;
// The main thread's: static TLS. Initialised (not null), so that it lies in
// .tdata, in the 8 bytes of padding after the one other initialised
// thread_local and before .tbss's 16-byte alignment: this binary's static TLS
// keeps its size. A zero-initialised one grew it by 16 bytes, and then
// libheapprof_hooks_plugin.so's initial-exec TLS (1672 bytes) no longer fit
// in what glibc 2.36 leaves for dlopen'ed objects' static TLS: its dlopen
// failed with "cannot allocate memory in static TLS block" (the plugin test
// in test_own_memory.cpp; it passes with a larger glibc.rtld.optional_static_tls).
inline char g_retention_main_cache_unset;
inline thread_local char* t_retention_main_cache = &g_retention_main_cache_unset;
inline char* volatile g_retention_sink;

__attribute__((noinline)) inline char* MakeOwnedBuffer() {
  char* p = new char[kOwnedBufferBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline RetentionOwner* MakeRetentionOwner(std::size_t id) {
  auto* o = new RetentionOwner{nullptr, id};
  o->buffer = MakeOwnedBuffer();
  asm volatile("" : : "r"(o) : "memory");
  return o;
}
__attribute__((noinline)) inline char* MakeStackHeldBuffer() {
  char* p = new char[kStackHeldBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeBusyHeldBuffer() {
  char* p = new char[kBusyHeldBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeLeakedBuffer() {
  char* p = new char[kLeakedBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline CycleNode* MakeCycleNode() {
  CycleNode* p = new CycleNode{};
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeKeptBuffer() {
  char* p = new char[4321];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeSampledBuffer() {
  char* p = new char[kSampledBufferBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline SampledHolder* MakeSampledHolder() {
  SampledHolder* p = new SampledHolder{};
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeMainTlsBuffer() {
  char* p = new char[kMainTlsBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeNestedHeldBuffer() {
  char* p = new char[kNestedHeldBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeReservedHeldBuffer() {
  char* p = new char[kReservedHeldBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeBssHeldBuffer() {
  char* p = new char[kReservedHeldBytes + 8];  // not the same body as the one above (GCC folds those)
  asm volatile("" : : "r"(p) : "memory");
  return p;
}
// 256 MiB of .bss, untouched but for its last page, whose last word holds the
// only pointer to a buffer (retention_bss).
inline char* g_retention_big_bss[(std::size_t{256} << 20) / sizeof(char*)];
__attribute__((noinline)) inline char* MakeZeroSizeBuffer() {
  char* p = new char[0];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}

// Leaks and a dropped cycle, made on a thread that then exits: no stale copy
// of their addresses stays in this thread's registers or dead stack slots.
inline void MakeGarbageOnAnotherThread() {
  std::thread([] {
    HEAPPROF_TEST_NO_UNROLL
    for (std::size_t i = 0; i < kLeakedCount; ++i) {
      g_retention_sink = MakeLeakedBuffer();
      g_retention_sink = nullptr;
    }
    CycleNode* a = MakeCycleNode();
    CycleNode* b = MakeCycleNode();
    a->next = b;
    b->next = a;
    g_retention_sink = reinterpret_cast<char*>(a);
    g_retention_sink = nullptr;
  }).join();
}

// Waits until thread `tid` is blocked in the kernel (its syscall file no
// longer says "running"): then its stack pointer can be read.
inline bool WaitBlocked(long tid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
  for (long i = 0; i < 200000000; ++i) {
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) return false;
    char line[256] = {};
    const bool got = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    if (got && std::strncmp(line, "running", 7) != 0) return true;
    std::this_thread::yield();
  }
  return false;
}

inline int RunRetentionPaths() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  HEAPPROF_TEST_NO_UNROLL
  for (std::size_t i = 0; i < kRetentionOwners; ++i) g_retention_owners.push_back(MakeRetentionOwner(i));
  MakeGarbageOnAnotherThread();

  int fds[2];
  if (pipe(fds) != 0) return 4;
  std::atomic<long> tid{0};
  std::thread holder([&] {
    char* volatile held = MakeStackHeldBuffer();  // on this thread's stack only
    tid.store(static_cast<long>(syscall(SYS_gettid)));
    char c;
    while (read(fds[0], &c, 1) < 0) {
    }
    delete[] held;
  });
  while (tid.load() == 0) std::this_thread::yield();
  if (!WaitBlocked(tid.load())) return 5;
  const std::string path = std::string(dir) + "/retention.pb.gz";
  const bool ok = heapprof::WriteRetentionProfile(path);
  if (write(fds[1], "x", 1) != 1) return 6;
  holder.join();
  std::printf("holder_tid=%ld\n", tid.load());
  return ok ? 0 : 7;
}

// A thread the kernel still says is "running" when the scan first looks at
// it, blocked in read(2) a few milliseconds later: the scan looks again.
inline int RunRetentionBusyHolder() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  const std::string path = std::string(dir) + "/retention.pb.gz";
  if (!heapprof::WriteRetentionProfile(path)) return 8;  // a first write's set-up out of the way
  int fds[2];
  if (pipe(fds) != 0) return 4;
  std::atomic<long> tid{0};
  std::atomic<bool> go{false};
  std::thread holder([&] {
    char* volatile held = MakeBusyHeldBuffer();  // on this thread's stack only
    tid.store(static_cast<long>(syscall(SYS_gettid)));
    while (!go.load()) {
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
    while (std::chrono::steady_clock::now() < until) {
    }
    char c;
    while (read(fds[0], &c, 1) < 0) {
    }
    delete[] held;
  });
  while (tid.load() == 0) std::this_thread::yield();
  go.store(true);
  const bool ok = heapprof::WriteRetentionProfile(path);
  if (write(fds[1], "x", 1) != 1) return 6;
  holder.join();
  std::printf("holder_tid=%ld\n", tid.load());
  return ok ? 0 : 7;
}

inline int RunRetentionLeaks() {
  g_retention_kept = MakeKeptBuffer();
  MakeGarbageOnAnotherThread();
  return 0;  // the leak report runs at exit
}

inline int RunRetentionSampled() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  HEAPPROF_TEST_NO_UNROLL
  for (std::size_t i = 0; i < kSampledHolders; ++i) {
    g_sampled_holders[i] = MakeSampledHolder();
    g_sampled_holders[i]->big = MakeSampledBuffer();
  }
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}

inline int RunRetentionNested() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  heapprof_test_retention_outer[5] = MakeNestedHeldBuffer();  // past the nested symbol
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}

inline int RunRetentionZeroSize() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  HEAPPROF_TEST_NO_UNROLL
  for (std::size_t i = 0; i < kZeroSizeCount; ++i) g_retention_zero[i] = MakeZeroSizeBuffer();
  if (!heapprof::WriteHeapProfile(std::string(dir) + "/heap.pb.gz")) return 6;
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}

// A stack that is a block of the brk heap: only the block is that thread's
// stack, not the heap above it.
struct HeapStackThread {
  int fd;
  std::atomic<long> tid{0};
};
inline void* HeapStackThreadMain(void* arg) {
  auto* t = static_cast<HeapStackThread*>(arg);
  t->tid.store(static_cast<long>(syscall(SYS_gettid)));
  char c;
  while (read(t->fd, &c, 1) < 0) {
  }
  return nullptr;
}

inline int RunRetentionHeapStack() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  g_heap_stack = new char[kHeapStackBytes];
  // Dropped cycles above the block (one arena: the brk heap), made on a
  // thread that then exits (no copies left here).
  const auto block_end = reinterpret_cast<std::uintptr_t>(g_heap_stack) + kHeapStackBytes;
  std::size_t above = 0;
  std::thread([&] {
    for (int i = 0; i < 1000 && above < 4; ++i) {
      CycleNode* a = MakeCycleNode();
      CycleNode* b = MakeCycleNode();
      a->next = b;
      b->next = a;
      if (reinterpret_cast<std::uintptr_t>(a) > block_end && reinterpret_cast<std::uintptr_t>(b) > block_end) ++above;
    }
  }).join();
  if (above == 0) return 10;

  int fds[2];
  if (pipe(fds) != 0) return 4;
  HeapStackThread t;
  t.fd = fds[0];
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (pthread_attr_setstack(&attr, g_heap_stack, kHeapStackBytes) != 0) return 11;
  pthread_t thread;
  if (pthread_create(&thread, &attr, &HeapStackThreadMain, &t) != 0) return 12;
  pthread_attr_destroy(&attr);
  while (t.tid.load() == 0) std::this_thread::yield();
  if (!WaitBlocked(t.tid.load())) return 5;
  const bool ok = heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz");
  if (write(fds[1], "x", 1) != 1) return 6;
  pthread_join(thread, nullptr);
  std::printf("heap_stack_tid=%ld cycles_above=%zu\n", t.tid.load(), above);
  return ok ? 0 : 7;
}

// This process's page tables, in kB (VmPTE of /proc/self/status).
inline long PageTableKb() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmPTE:", 6) == 0) kb = std::strtol(line + 6, nullptr, 10);
  }
  std::fclose(f);
  return kb;
}

inline int RunRetentionReservation() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  const char* mib = std::getenv("HEAPPROF_TEST_RESERVE_MIB");
  const std::size_t size = (mib != nullptr ? std::strtoul(mib, nullptr, 10) : 1024) << 20;
  void* reserved = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) {
    std::printf("mmap of %zu bytes failed\n", size);
    return 9;
  }
  // One page touched, in the middle; the pointer put there from a thread that
  // then exits (no copy left in this thread's registers or stack).
  char** slot = reinterpret_cast<char**>(static_cast<char*>(reserved) + size / 2);
  std::thread([slot] { *slot = MakeReservedHeldBuffer(); }).join();
  const long pte0 = PageTableKb();
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz");
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("write_ms=%lld pte_growth_kb=%ld\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(t1 - t0).count()),
              PageTableKb() - pte0);
  return ok ? 0 : 7;
}

// retention_bss: a global root of 256 MiB (g_retention_big_bss) of which one
// page was ever touched: the scan reads that page, not the 256 MiB.
inline int RunRetentionBss() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  constexpr std::size_t kSlots = sizeof g_retention_big_bss / sizeof g_retention_big_bss[0];
  std::thread([] { g_retention_big_bss[kSlots - 1] = MakeBssHeldBuffer(); }).join();
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}

// The main thread's TLS is not in its stack mapping (see retention.hpp): a
// scan from another thread must still find it.
inline int RunRetentionMainTls() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  t_retention_main_cache = MakeMainTlsBuffer();
  bool ok = false;
  std::thread([&] { ok = heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz"); }).join();
  std::printf("main_tid=%ld\n", static_cast<long>(getpid()));
  return ok ? 0 : 7;
}

#ifdef HEAPPROF_HOOKED_DSO_PATH
// The same from a dlopen'ed library's thread_local (dynamic TLS: its block
// is malloc'ed, and only the main thread's DTV points at it).
constexpr std::size_t kDsoTlsBytes = 3210;
inline int RunRetentionMainDsoTls() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  void* h = dlopen(HEAPPROF_HOOKED_DSO_PATH, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 4;
  auto keep = reinterpret_cast<void (*)(std::size_t)>(dlsym(h, "heapprof_hooked_dso_tls_keep"));
  if (keep == nullptr) return 5;
  keep(kDsoTlsBytes);
  bool ok = false;
  std::thread([&] { ok = heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz"); }).join();
  std::printf("main_tid=%ld\n", static_cast<long>(getpid()));
  return ok ? 0 : 7;
}

// A global of a library dlopen'ed by a relative path, the profile written
// after a chdir("/").
constexpr std::size_t kDsoGlobalBytes = 2109;
inline int RunRetentionRelativeDso() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  const std::string dso = HEAPPROF_HOOKED_DSO_PATH;
  const std::size_t slash = dso.rfind('/');
  if (slash == std::string::npos || chdir(dso.substr(0, slash + 1).c_str()) != 0) return 4;
  void* h = dlopen(("./" + dso.substr(slash + 1)).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 5;
  auto keep = reinterpret_cast<void (*)(std::size_t)>(dlsym(h, "heapprof_hooked_dso_global_keep"));
  if (keep == nullptr) return 6;
  keep(kDsoGlobalBytes);
  if (chdir("/") != 0) return 8;
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}
#endif

inline int RunRetentionMainTlsExit() {
  t_retention_main_cache = MakeMainTlsBuffer();
  std::printf("main_tid=%ld\n", static_cast<long>(getpid()));
  std::fflush(stdout);
  // The leak report runs on the worker, in exit(); this thread waits in join.
  std::thread([] { std::exit(0); }).join();
  return 8;
}

// A leak made on the thread that then writes the profile, by a call that
// leaves copies of its address all over its dead frames (as printf-family
// calls and deep helpers do), then dropped. WriteRetentionProfile, called
// from the same depth, builds its frames over those copies.
__attribute__((noinline)) inline void SprayDeadStack() {
  volatile std::uintptr_t slots[2048];
  for (auto& slot : slots) slot = reinterpret_cast<std::uintptr_t>(g_retention_sink);
}
inline int RunRetentionStaleStack() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  g_retention_sink = MakeLeakedBuffer();
  SprayDeadStack();
  g_retention_sink = nullptr;
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}

// The same leak, made by a call from main, which then returns: exit()'s
// frames, built where that call's frames were, are on the stack the leak
// report (HEAPPROF=leak_report=1) scans.
__attribute__((noinline)) inline int RunRetentionStaleStackMain() {
  g_retention_sink = MakeLeakedBuffer();
  SprayDeadStack();
  g_retention_sink = nullptr;
  return 0;
}

#if defined(__x86_64__)
// exit() called with the only pointer to a buffer in a callee-saved
// register (rbx) of its caller: libc's exit frames may save rbx and reuse
// it, and the leak report, which skips those frames, must still see it.
__attribute__((noinline)) inline int RunRetentionExitRegister() {
  char* held = MakeKeptBuffer();
  asm volatile(
      "mov %0, %%rbx\n\t"
      "and $-16, %%rsp\n\t"
      "xor %%edi, %%edi\n\t"
      "call exit"
      :
      : "r"(held)
      : "rbx", "rdi", "memory");
  return 1;  // not reached
}
#endif

// A program whose work runs on coroutines of 16 KiB (folly's fibers' size)
// writes profiles from one and ends there with exit(). The writes and the
// leak report took 30-60 KiB of that stack: SIGSEGV. They run on the
// profiler's stack now, and the scan, started at the coroutine's frame,
// also reads the thread's own stack, where main()'s frames wait.
constexpr std::size_t kCoroutineBytes = 6543, kCoroutineMainBytes = 5432;
__attribute__((noinline)) inline char* MakeCoroutineBuffer() {
  char* p = new char[kCoroutineBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
__attribute__((noinline)) inline char* MakeCoroutineMainBuffer() {
  char* p = new char[kCoroutineMainBytes];
  asm volatile("" : : "r"(p) : "memory");  // no tail call: this frame stays in the stack
  return p;
}
// Leaked: each one's sample ran on the profiler's stack (the coroutine's is
// short), whose dead frames then held its address: "[unsampled heap]", the
// profiler's stack read as the program's memory.
constexpr std::size_t kCoroutineLeakBytes = 3333;
__attribute__((noinline)) inline void MakeCoroutineLeak() {
  char* p = new char[kCoroutineLeakBytes];
  asm volatile("" : : "r"(p) : "memory");
}
inline ucontext_t g_coroutine_caller, g_coroutine;
inline void RetentionCoroutineBody() {
  for (int i = 0; i < 3; ++i) MakeCoroutineLeak();
  char* volatile held = MakeCoroutineBuffer();  // on the coroutine's stack only
  const std::string dir = std::getenv("HEAPPROF_TEST_DIR");
  const bool heap = heapprof::WriteHeapProfile(dir + "/heap.pb.gz");
  const bool peak = heapprof::WritePeakHeapProfile(dir + "/peak.pb.gz");
  const bool retention = heapprof::WriteRetentionProfile(dir + "/retention.pb.gz");
  std::ostringstream stream;
  const bool streamed = heapprof::WriteRetentionProfile(stream) && !stream.str().empty();
  std::printf("coroutine_tid=%ld heap=%d peak=%d retention=%d stream=%d\n", static_cast<long>(syscall(SYS_gettid)),
              heap ? 1 : 0, peak ? 1 : 0, retention ? 1 : 0, streamed ? 1 : 0);
  std::fflush(stdout);
  std::exit(held != nullptr ? 0 : 9);  // the leak report, on this coroutine
}
inline int RunRetentionCoroutine() {
  if (std::getenv("HEAPPROF_TEST_DIR") == nullptr) return 3;
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t pg = page > 0 ? static_cast<std::size_t>(page) : 4096;
  constexpr std::size_t kStack = 16 * 1024;
  void* mem = mmap(nullptr, pg + kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED || mprotect(mem, pg, PROT_NONE) != 0) return 4;
  if (getcontext(&g_coroutine) != 0) return 5;
  g_coroutine.uc_stack.ss_sp = static_cast<char*>(mem) + pg;
  g_coroutine.uc_stack.ss_size = kStack;
  g_coroutine.uc_link = &g_coroutine_caller;
  makecontext(&g_coroutine, &RetentionCoroutineBody, 0);
  char* volatile held = MakeCoroutineMainBuffer();  // on this thread's own stack only
  swapcontext(&g_coroutine_caller, &g_coroutine);
  delete[] held;
  return 6;  // (the coroutine's exit() ends the process)
}

inline int RunRetentionScenario(const char* name, bool& known) {
  known = true;
  if (std::strcmp(name, "retention_paths") == 0) return RunRetentionPaths();
  if (std::strcmp(name, "retention_coroutine") == 0) return RunRetentionCoroutine();
  if (std::strcmp(name, "retention_stale_stack") == 0) return RunRetentionStaleStack();
#if defined(__x86_64__)
  if (std::strcmp(name, "retention_exit_register") == 0) return RunRetentionExitRegister();
#endif
  if (std::strcmp(name, "retention_leaks") == 0) return RunRetentionLeaks();
  if (std::strcmp(name, "retention_busy_holder") == 0) return RunRetentionBusyHolder();
  if (std::strcmp(name, "retention_sampled") == 0) return RunRetentionSampled();
  if (std::strcmp(name, "retention_nested") == 0) return RunRetentionNested();
  if (std::strcmp(name, "retention_zero_size") == 0) return RunRetentionZeroSize();
  if (std::strcmp(name, "retention_reservation") == 0) return RunRetentionReservation();
  if (std::strcmp(name, "retention_bss") == 0) return RunRetentionBss();
  if (std::strcmp(name, "retention_heap_stack") == 0) return RunRetentionHeapStack();
  if (std::strcmp(name, "retention_main_tls") == 0) return RunRetentionMainTls();
  if (std::strcmp(name, "retention_main_tls_exit") == 0) return RunRetentionMainTlsExit();
#ifdef HEAPPROF_HOOKED_DSO_PATH
  if (std::strcmp(name, "retention_main_dso_tls") == 0) return RunRetentionMainDsoTls();
  if (std::strcmp(name, "retention_relative_dso") == 0) return RunRetentionRelativeDso();
#endif
  known = false;
  return 2;
}

}  // namespace heapprof_test
