// Child processes for the memory-event tests (test_memory_events.cpp): the
// peak profile of a known workload, dump_near_oom under RLIMIT_AS,
// rss_interval on a growing heap, oom_dump under RLIMIT_AS. Each runs with its
// own HEAPPROF; HEAPPROF_TEST_DIR is where the files go.
#pragma once

#include <heapprof.hpp>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "dump_scenarios.hpp"
#include "support/profile_io.hpp"

namespace heapprof_test {

// The peak workload: PeakWorkloadSmall keeps kPeakSmallCount objects of
// kPeakSmallBytes, then PeakWorkloadBig one block of kPeakBigBytes (the step
// past 10% that takes the snapshot at the top); all freed; then
// SettleWorkload keeps less, elsewhere.
constexpr std::size_t kPeakSmallCount = 4096, kPeakSmallBytes = 4000;
constexpr std::size_t kPeakBigBytes = std::size_t{64} << 20;
constexpr std::size_t kSettleCount = 2048, kSettleBytes = 4000;
inline char* g_peak_small[kPeakSmallCount];
inline char* g_settle[kSettleCount];
inline char* g_peak_big;

__attribute__((noinline)) inline void PeakWorkloadSmall() {
  HEAPPROF_TEST_NO_UNROLL
  for (std::size_t i = 0; i < kPeakSmallCount; ++i) g_peak_small[i] = new char[kPeakSmallBytes];
  asm volatile("# PeakWorkloadSmall" ::: "memory");
}
__attribute__((noinline)) inline void PeakWorkloadBig() {
  g_peak_big = new char[kPeakBigBytes];
  asm volatile("# PeakWorkloadBig" ::: "memory");
}
__attribute__((noinline)) inline void SettleWorkload() {
  HEAPPROF_TEST_NO_UNROLL
  for (std::size_t i = 0; i < kSettleCount; ++i) g_settle[i] = new char[kSettleBytes];
  asm volatile("# SettleWorkload" ::: "memory");
}

// The dump thread's writer warm-up (dumps.hpp) allocates: it must be done
// before the test limits memory, so that the dumps under the limit need only
// what a warm write needs.
inline bool WaitForWarmDumper(int seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!heapprof::detail::g_dumper.Warm()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

inline std::string TestFile(const char* name) { return std::string(std::getenv("HEAPPROF_TEST_DIR")) + "/" + name; }

// Writes peak.pb.gz (WritePeakHeapProfile) and heap.pb.gz (now) into the test
// directory; peak_at_exit adds p.<pid>.peak.pb.gz at exit.
inline int RunPeakWorkload() {
  PeakWorkloadSmall();
  PeakWorkloadBig();
  for (char* p : g_peak_small) delete[] p;
  delete[] g_peak_big;
  SettleWorkload();
  if (!heapprof::WritePeakHeapProfile(TestFile("peak.pb.gz"))) return 10;
  if (!heapprof::WriteHeapProfile(TestFile("heap.pb.gz"))) return 11;
  std::printf("pid=%ld\n", static_cast<long>(getpid()));
  return 0;
}

// /proc/self/statm's first field: the address space RLIMIT_AS limits.
inline std::uint64_t AddressSpaceBytes() {
  unsigned long long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

inline bool SetAddressSpaceLimit(std::uint64_t bytes) {
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) != 0) return false;
  rl.rlim_cur = bytes;
  return setrlimit(RLIMIT_AS, &rl) == 0;
}

// dump_near_oom=0.8 under RLIMIT_AS = address space now + 512 MiB: the heap
// grows by 4 MiB blocks (mmapped, never touched: address space, no RSS) until
// the address space passes 80% of the limit, then 90% (the headroom halved).
// Each crossing must give its dump.
inline int RunNearOom() {
  // A first profile maps the ELF and debug files (tens of MiB of address
  // space, kept): the dump thread does it at start, concurrently; done here
  // too, so the limit is set above it and the dumps need only a warm write's
  // memory (a write short of memory fails: RunTightWrite).
  if (!WaitForWarmDumper()) return 8;
  if (!heapprof::WriteHeapProfile(TestFile("warm.pb.gz"))) return 9;
  // 2 GiB of headroom (untouched mallocs: address space, not memory): a
  // thread's first malloc can reserve a 64 MiB glibc arena between two of
  // the dump thread's polls, which with 512 MiB jumped the whole 80%-90% band
  // once in CI (one dump, at 92.6%).
  const std::uint64_t limit = AddressSpaceBytes() + (std::uint64_t{2048} << 20);
  if (!SetAddressSpaceLimit(limit)) return 10;
  std::printf("limit=%llu\n", static_cast<unsigned long long>(limit));
  const std::uint64_t thresholds[2] = {limit - limit / 5, limit - limit / 10};
  std::vector<void*> kept;
  kept.reserve(1024);
  int rc = 0;
  // Until each dump appears: 4 MiB more whenever the address space is below
  // the threshold, read again each round. One reading is not enough: a
  // thread's first malloc maps 128 MiB and gives 64 back (glibc aligns its
  // arenas), and when the dump thread's came after the limit, the loop saw the
  // 128, stopped, and the address space settled below 80%: no dump (1 run in
  // ~20 here, and once in CI).
  for (unsigned k = 0; k < 2 && rc == 0; ++k) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    struct stat st {};
    while (rc == 0 && ::stat(DumpPath(k + 1).c_str(), &st) != 0) {
      if (AddressSpaceBytes() < thresholds[k]) {
        void* p = kept.size() < kept.capacity() ? std::malloc(std::size_t{4} << 20) : nullptr;
        if (p == nullptr) rc = 20 + static_cast<int>(k);
        kept.push_back(p);
      } else if (std::chrono::steady_clock::now() > deadline) {
        rc = 30 + static_cast<int>(k);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }
  for (void* p : kept) std::free(p);
  return rc;
}

// dump_near_oom=0.8, then one step from below 80% of the limit to 95.5%:
// one dump stands for the 80%, 90% and 95% thresholds.
inline int RunNearOomJump() {
  if (!WaitForWarmDumper()) return 8;
  if (!heapprof::WriteHeapProfile(TestFile("warm.pb.gz"))) return 9;
  const std::uint64_t limit = AddressSpaceBytes() + (std::uint64_t{2048} << 20);
  if (!SetAddressSpaceLimit(limit)) return 10;
  const std::uint64_t now = AddressSpaceBytes();
  const std::uint64_t target = limit - limit / 1000 * 45;  // 95.5%
  if (now >= limit - limit / 5) return 11;                 // already past 80%
  // One mapping, untouched: address space only. MAP_NORESERVE: a host with
  // little memory refuses a single 2 GiB request under the overcommit
  // heuristic (mode 0); steps small enough for it could straddle a poll.
  const auto bytes = static_cast<std::size_t>(target - now);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return 12;
  const int rc = WaitForFile(DumpPath(1)) ? 0 : 13;
  ::munmap(p, bytes);
  return rc;
}

// /proc/self/statm's data field: what RLIMIT_DATA limits (+ the main stack).
inline std::uint64_t DataBytes() {
  unsigned long long f[6] = {};
  if (FILE* file = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(file, "%llu %llu %llu %llu %llu %llu", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]) != 6) f[5] = 0;
    std::fclose(file);
  }
  return f[5] * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

// dump_near_oom=0.8 under RLIMIT_DATA (ulimit -d) = the data now + 2 GiB
// and a looser RLIMIT_AS (address space now + 8 GiB), then one private
// writable mapping, untouched, to 85% of RLIMIT_DATA: one dump, naming
// RLIMIT_DATA, the limit with less room left. Before, RLIMIT_DATA was not
// read: the limit was RLIMIT_AS (without it, physical memory), and no dump
// came before allocations failed.
inline int RunNearOomData() {
  if (!WaitForWarmDumper()) return 8;
  if (!heapprof::WriteHeapProfile(TestFile("warm.pb.gz"))) return 9;
  rlimit rl{};
  if (getrlimit(RLIMIT_DATA, &rl) != 0) return 10;
  const std::uint64_t limit = DataBytes() + (std::uint64_t{2048} << 20);
  rl.rlim_cur = limit;
  if (setrlimit(RLIMIT_DATA, &rl) != 0) return 11;
  if (!SetAddressSpaceLimit(AddressSpaceBytes() + (std::uint64_t{8192} << 20))) return 15;
  const std::uint64_t now = DataBytes();
  const std::uint64_t target = limit - limit / 100 * 15;  // 85%
  if (now >= limit - limit / 5) return 12;                 // already past 80%
  const auto bytes = static_cast<std::size_t>(target - now);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return 13;
  const int rc = WaitForFile(DumpPath(1)) ? 0 : 14;
  ::munmap(p, bytes);
  return rc;
}

// rss_interval=16m: 20 MiB more touched each step; each step is a new RSS
// high 16 MiB above the last dump's, so each gives (at least) one dump.
inline int RunRssInterval() {
  // The first mark is SIZE above RSS when the dump thread starts: wait for it
  // to have started, or on a busy machine the first 20 MiB can be touched
  // before it reads RSS (then no step is 16 MiB above its mark; seen in CI).
  if (!WaitForWarmDumper()) return 8;
  char* kept[3] = {};
  int rc = 0;
  for (unsigned i = 1; i <= 3 && rc == 0; ++i) {
    char* p = kept[i - 1] = LeakedByTest(std::size_t{20} << 20);
    std::memset(p, 1, std::size_t{20} << 20);
    if (!WaitForFile(DumpPath(i))) rc = 10 + static_cast<int>(i);
  }
  for (char* p : kept) delete[] p;  // LeakSanitizer (ASan builds) checks at exit
  return rc;
}

// dump_near_oom=0.99 and rss_interval=1g on a process whose memory stays
// flat: the dump thread checks both every 10 ms, and the only checks that
// may allocate (and so, built without exceptions, map a write's headroom)
// are the limit's reading, once a second, and a check that fires (none
// here). Before: every check mapped and unmapped the headroom.
inline int RunQuietWatch() {
  if (!WaitForWarmDumper()) return 8;
  const heapprof::detail::Dumper& d = heapprof::detail::g_dumper;
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t polls0 = d.MemoryPolls(), allocating0 = d.MemoryPollsAllocating();
  constexpr std::uint64_t kPolls = 100;  // ~1 s at 10 ms a poll
  while (d.MemoryPolls() < polls0 + kPolls) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) return 9;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::uint64_t allocating = d.MemoryPollsAllocating() - allocating0;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("polls=%llu allocating=%llu seconds=%.2f\n",
              static_cast<unsigned long long>(d.MemoryPolls() - polls0), static_cast<unsigned long long>(allocating),
              seconds);
  // One reading of the limit per second begun, and one more for the poll
  // that was under way when the count was first read.
  if (static_cast<double>(allocating) > seconds + 2) return 10;
  return 0;
}

// oom_dump=1 under RLIMIT_AS = address space now + 256 MiB. OomHolder keeps
// 32 MiB (sampled at any rate); nothrow news of 16 MiB fail once the limit
// is reached. The dump must be written before the new_handler is called,
// then the allocation behaves as without heapprof: the handler is called,
// and when it gives up, nothrow new returns null and new throws bad_alloc.
inline char* g_oom_holder;
inline int g_handler_calls = 0;
inline bool g_dump_before_handler = false;

__attribute__((noinline)) inline void OomHolder() {
  g_oom_holder = new char[std::size_t{32} << 20];
  asm volatile("# OomHolder" ::: "memory");
}

inline void OomNewHandler() {
  ++g_handler_calls;
  struct stat st {};
  char name[64];
  std::snprintf(name, sizeof name, "p.%ld.oom.pb.gz", static_cast<long>(getpid()));
  g_dump_before_handler = ::stat(TestFile(name).c_str(), &st) == 0;
  std::set_new_handler(nullptr);  // give up: the next failure is final
}

inline int RunOomDump() {
  OomHolder();
  if (!WaitForWarmDumper()) return 9;
  if (!SetAddressSpaceLimit(AddressSpaceBytes() + (std::uint64_t{256} << 20))) return 10;
  std::set_new_handler(&OomNewHandler);
  int blocks = 0;
  for (;; ++blocks) {
    void* p = ::operator new(std::size_t{16} << 20, std::nothrow);
    if (p == nullptr) break;
    g_dump_sink = p;  // kept: the limit is reached after ~16 blocks
    if (blocks > 1000) return 11;
  }
  std::printf("blocks=%d handler_calls=%d dump_before_handler=%d\n", blocks, g_handler_calls,
              g_dump_before_handler ? 1 : 0);
  if (g_handler_calls != 1 || !g_dump_before_handler) return 12;
  // Once only: a second failure writes nothing more (the parent counts files).
  // The reserve's 64 MiB is free address space now: ask for more than that.
#if HEAPPROF_EXCEPTIONS
  bool threw = false;
  try {
    g_dump_sink = ::operator new(std::size_t{512} << 20);
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  if (!threw) return 13;
#endif
  if (::operator new(std::size_t{512} << 20, std::nothrow) != nullptr) return 14;
  return 0;
}

// A profile write under an address-space limit too tight for it fails and
// the program goes on; once the limit is lifted the next write succeeds.
// Built without exceptions, the write used to end the process (std::bad_alloc
// from the writer's containers, with nothing to catch it); it now maps its
// headroom first and fails at once (0_base/arena.hpp: WriteHeadroom).
constexpr std::size_t kTightCount = 1000, kTightBytes = 200;
inline char* g_tight[kTightCount];

__attribute__((noinline)) inline void TightHolder() {
  HEAPPROF_TEST_NO_UNROLL
  for (std::size_t i = 0; i < kTightCount; ++i) g_tight[i] = new char[kTightBytes];
  asm volatile("# TightHolder" ::: "memory");
}

inline int RunTightWrite() {
  // Every object builds its unwind table at its first sample (by default
  // they answer one FDE at a time first): the tables then fill the arena's
  // first chunk, and the snapshot needs a new one, which the limit refuses.
  heapprof::detail::unwind_table::g_lazy_min_fdes.store(~std::uint64_t{0});
  TightHolder();
  if (!SetAddressSpaceLimit(AddressSpaceBytes() + (std::uint64_t{1} << 20))) return 10;
  // 1 MiB of room: less than the snapshot's first chunk and the ELF file's
  // mapping need, so the write cannot succeed; it must fail, not abort.
  const bool tight_ok = heapprof::WriteHeapProfile(TestFile("tight.pb.gz"));
  if (!SetAddressSpaceLimit(RLIM_INFINITY)) return 11;
  std::printf("tight_write=%d\n", tight_ok ? 1 : 0);
  if (tight_ok) return 12;
  if (!heapprof::WriteHeapProfile(TestFile("tight.pb.gz"))) return 13;
  std::printf("wrote after the limit was lifted\n");
  return 0;
}

// oom_first_failure: started under an RLIMIT_AS (the parent's ulimit -v,
// set before this process started, as a container or a shell sets it),
// 1 MiB nothrow news (OomFillBlocks) until one fails. Prints the address
// space at start and the bytes obtained; with oom_dump the dump was written
// at the first failure, before the reserve's address space came back.
__attribute__((noinline)) inline std::size_t OomFillBlocks(void** blocks, std::size_t max) {
  std::size_t n = 0;
  HEAPPROF_TEST_NO_UNROLL
  for (; n < max; ++n) {
    void* p = ::operator new(std::size_t{1} << 20, std::nothrow);
    if (p == nullptr) break;
    blocks[n] = p;
  }
  asm volatile("# OomFillBlocks" ::: "memory");
  return n;
}

inline int RunOomFirstFailure() {
  if (std::getenv("HEAPPROF") != nullptr && std::strstr(std::getenv("HEAPPROF"), "oom_dump") != nullptr &&
      !WaitForWarmDumper()) {
    return 9;
  }
  std::printf("address_space=%llu\n", static_cast<unsigned long long>(AddressSpaceBytes()));
  if (std::getenv("HEAPPROF_TEST_ONLY_SIZE") != nullptr) return 0;
  constexpr std::size_t kMax = 4096;  // 4 GiB: the limit ends it long before
  void** blocks = static_cast<void**>(std::calloc(kMax, sizeof(void*)));
  if (blocks == nullptr) return 10;
  const std::size_t n = OomFillBlocks(blocks, kMax);
  std::printf("obtained=%zu\n", n);
  std::fflush(stdout);
  for (std::size_t i = 0; i < n; ++i) ::operator delete(blocks[i]);
  std::free(blocks);
  return n < kMax ? 0 : 11;
}

// tight_names: the first profile of the process written with
// HEAPPROF_TEST_ROOM_MIB MiB of address space left: room for the snapshot
// and the encoder, not for mapping this test binary (31 MB) to read its
// symbols. The profile must say why it has no names.
inline int RunTightNames() {
  TightHolder();
  const char* room = std::getenv("HEAPPROF_TEST_ROOM_MIB");
  if (room == nullptr) return 9;
  if (!SetAddressSpaceLimit(AddressSpaceBytes() + (std::strtoull(room, nullptr, 10) << 20))) return 10;
  const bool ok = heapprof::WriteHeapProfile(TestFile("names.pb.gz"));
  if (!SetAddressSpaceLimit(RLIM_INFINITY)) return 11;
  std::printf("tight_names=%d\n", ok ? 1 : 0);
  return 0;
}

// tight_after_warm: a first write with names caches this program's DWARF
// (tens of MB); then, with HEAPPROF_TEST_ROOM_MIB of address space left, a
// second write, whose encoding with names runs out of memory. Prints
// tight_after_warm=1 when the second write succeeded.
inline int RunTightAfterWarm() {
  TightHolder();
  const char* room = std::getenv("HEAPPROF_TEST_ROOM_MIB");
  if (room == nullptr) return 9;
  if (!heapprof::WriteHeapProfile(TestFile("warm.pb.gz"))) return 10;
  // The encoding with names runs out of memory at once (its symbolizer has
  // read nothing yet), as one that loads a large debug file does.
  heapprof::detail::g_symbolize_oom_thread.store(pthread_self());
  heapprof::detail::g_symbolize_oom_for_tests.store(1);
  if (!SetAddressSpaceLimit(AddressSpaceBytes() + (std::strtoull(room, nullptr, 10) << 20))) return 11;
  const bool ok = heapprof::WriteHeapProfile(TestFile("tight.pb.gz"));
  if (!SetAddressSpaceLimit(RLIM_INFINITY)) return 12;
  std::printf("tight_after_warm=%d\n", ok ? 1 : 0);
  std::fflush(stdout);
  return 0;
}

// oom_dump=1 with kOomThreads threads whose allocations fail at the same
// moment (a 1 GiB nothrow new under RLIMIT_AS = address space + 256 MiB),
// each of which then ends the process at once (_exit, as an uncaught
// bad_alloc's std::terminate does). One of them writes the dump; the others
// must wait for it: before, the first to give up ended the process in the
// middle of the dump (no oom profile, 0 runs of 7).
constexpr int kOomThreads = 4;
inline std::atomic<int> g_oom_ready{0};

__attribute__((noinline)) inline void OomThreadFails() {
  g_oom_ready.fetch_add(1);
  while (g_oom_ready.load() < kOomThreads + 1) {
  }
  void* p = ::operator new(std::size_t{1} << 30, std::nothrow);
  if (p != nullptr) _exit(20);
  std::fflush(stdout);
  _exit(0);
}

inline int RunOomDumpThreads() {
  OomHolder();
  if (!WaitForWarmDumper()) return 9;
  std::vector<std::thread> threads;
  for (int i = 0; i < kOomThreads; ++i) threads.emplace_back(&OomThreadFails);
  while (g_oom_ready.load() < kOomThreads) {
  }
  if (!SetAddressSpaceLimit(AddressSpaceBytes() + (std::uint64_t{256} << 20))) return 10;
  g_oom_ready.fetch_add(1);
  for (std::thread& t : threads) t.join();  // never returns: a thread ends the process
  return 11;
}

// oom_dump=1, and a fork while another thread writes the oom dump (a
// service whose threads run out of memory while one of them forks). The
// child's first failed allocation must fail at once: before, it waited the
// whole 30 s for the parent's writer, which is not in the child.
inline std::atomic<int> g_oom_fork_go{0};

__attribute__((noinline)) inline void OomForkWriter() {
  g_oom_fork_go.store(1);
  // Fails at once, without any limit: the first failure writes the dump here.
  void* p = ::operator new(std::size_t{1} << 62, std::nothrow);
  if (p != nullptr) _exit(20);
}

inline int RunOomDumpFork() {
  OomHolder();
  if (!WaitForWarmDumper()) return 9;
  std::thread writer(&OomForkWriter);
  while (g_oom_fork_go.load() == 0) {
  }
  // The dump reads this binary's symbols cold: tens of milliseconds to fork in.
  const std::int64_t deadline = heapprof::detail::MonotonicMillis() + 60000;
  while (!heapprof::detail::g_dumper.OomDumpInProgress()) {
    if (heapprof::detail::MonotonicMillis() > deadline) return 10;
  }
  const pid_t child = fork();
  if (child < 0) return 11;
  if (child == 0) {
    const std::int64_t start = heapprof::detail::MonotonicMillis();
    void* p = ::operator new(std::size_t{1} << 62, std::nothrow);
    if (p != nullptr) _exit(20);
    _exit(heapprof::detail::MonotonicMillis() - start < 5000 ? 0 : 21);
  }
  // Still in progress after the fork: the fork came in the middle of the dump.
  const bool mid_dump = heapprof::detail::g_dumper.OomDumpInProgress();
  int status = 0;
  if (waitpid(child, &status, 0) != child) return 12;
  writer.join();
  std::printf("fork_mid_dump=%d child_exit=%d\n", mid_dump ? 1 : 0, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  std::fflush(stdout);
  return 0;
}

inline int RunMemoryScenario(const char* name, bool& known) {
  known = true;
  if (std::strcmp(name, "peak_workload") == 0) return RunPeakWorkload();
  if (std::strcmp(name, "near_oom") == 0) return RunNearOom();
  if (std::strcmp(name, "near_oom_jump") == 0) return RunNearOomJump();
  if (std::strcmp(name, "near_oom_data") == 0) return RunNearOomData();
  if (std::strcmp(name, "rss_interval") == 0) return RunRssInterval();
  if (std::strcmp(name, "quiet_watch") == 0) return RunQuietWatch();
  if (std::strcmp(name, "oom_dump") == 0) return RunOomDump();
  if (std::strcmp(name, "oom_dump_threads") == 0) return RunOomDumpThreads();
  if (std::strcmp(name, "oom_dump_fork") == 0) return RunOomDumpFork();
  if (std::strcmp(name, "tight_write") == 0) return RunTightWrite();
  if (std::strcmp(name, "oom_first_failure") == 0) return RunOomFirstFailure();
  if (std::strcmp(name, "tight_names") == 0) return RunTightNames();
  if (std::strcmp(name, "tight_after_warm") == 0) return RunTightAfterWarm();
  known = false;
  return 2;
}

}  // namespace heapprof_test
