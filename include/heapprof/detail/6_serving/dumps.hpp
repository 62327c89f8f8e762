// heapprof: automatic heap profile dumps.
//
// What gperftools' HEAPPROFILE and jemalloc's prof_prefix give, driven by
// HEAPPROF keys (env_config.hpp):
//   dump_prefix=PATH      files PATH.<pid>.<seq>.heap.pb.gz (default prefix "heapprof")
//   dump_interval=SIZE    a dump each time SIZE more bytes have been allocated
//   inuse_interval=SIZE   a dump each time the in-use high-water mark grows by SIZE
//   dump_time=SECONDS     a dump every SECONDS
//   dump_signal=SIGNAME   a dump when the process receives SIGNAME
//   dump_at_exit=1        a last dump at exit (startup.hpp)
//   peak_at_exit=1        the peak profile at exit: PATH.<pid>.peak.pb.gz
//   dump_near_oom=F       a dump when memory use first reaches F of the limit
//                         (memory_limit.hpp), again at each halving of the
//                         headroom left, down to 1 MiB
//   rss_interval=SIZE     a dump each time RSS reaches a new high SIZE above the
//                         last such dump (the first: SIZE above RSS at start)
//   oom_dump=1            PATH.<pid>.oom.pb.gz when an allocation first fails,
//                         written on the failing thread after releasing a
//                         reserve mapped at start-up (oom_reserve; default
//                         64 MiB, less under RLIMIT_AS: DefaultOomReserve)
//
// A forked child gets a dump thread of its own (pthread_atfork): its dumps
// carry its pid, and it runs the exit actions when it exits.
//
// Dumps are written by one background thread, never from inside an allocation
// (but oom_dump's, on the failing thread: there is no later):
// it sleeps on a futex word (the signal handler bumps it and wakes the thread) with a
// timeout that is the next dump_time deadline, or 10 ms while a byte or memory
// trigger is set, when it reads Stats (a walk of the thread slots) and the
// memory use (one small /proc or cgroup file; the limit once a second). Each file is written
// to a temporary name and renamed (WriteFileAtomic). A failed write prints one
// line and the program runs on.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <string>
#include <unistd.h>
#include <vector>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/0_base/host_threads.hpp"
#include "heapprof/api.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/0_base/self_exe.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"
#include "heapprof/detail/3_unwinding/loader_lock.hpp"
#include "heapprof/detail/6_serving/files.hpp"
#include "heapprof/detail/6_serving/memory_limit.hpp"

namespace heapprof {
namespace detail {

// Dump numbers passed over because a file of that name is there (Dump):
// past them the next number is written over.
constexpr unsigned kMaxDumpNamesSkipped = 100000;
// How often the dumper thread reads Stats while a byte trigger is set.
constexpr int kDumpPollMillis = 10;
// The longest the dump thread sleeps: it also looks, once a second, whether
// the program's threads have all ended (host_threads.hpp).
constexpr int kProgramThreadsCheckMillis = 1000;
// Set on the dump thread (startup.hpp: EndWithProgramThreads ends the process from it).
inline thread_local bool tls_dump_thread = false;
// dump_near_oom halves the headroom left until it is below this.
constexpr std::uint64_t kNearOomMinHeadroom = std::uint64_t{1} << 20;
// How often the memory limit is looked up again (a cgroup's can change).
constexpr std::int64_t kLimitRefreshMillis = 1000;

// dump_near_oom's progress (thresholds dumped for) by limit. The limit
// watched is the one with the least room left, and two with nearly the same
// room (a cgroup's and RLIMIT_AS, say) can take turns from one read to the
// next. Each change of limit restarted the thresholds, so every turn dumped
// again: a dump a second for as long as memory stayed high. Now the limits
// left keep their progress (the last kEntries of them): a turn back to one
// already dumped for goes on from there, and only a limit not seen before (a
// cgroup resized) starts from the first threshold.
struct NearOomProgress {
  struct Entry {
    MemoryLimit::Source source = MemoryLimit::kNone;
    std::uint64_t limit = 0;
    unsigned halvings = 0;
    bool done = false;
  };
  static constexpr int kEntries = 4;
  Entry left[kEntries];  // the limits left, the most recent first
  int count = 0;

  // Leaving `from` (its progress) for the limit `source`/`limit`: the
  // progress to go on with under it.
  Entry Switch(const Entry& from, MemoryLimit::Source source, std::uint64_t limit) noexcept {
    Entry to{source, limit, 0, false};
    int kept = 0;  // the others, in order: `from` goes in front, `to` is current now
    for (int i = 0; i < count; ++i) {
      const Entry& e = left[i];
      if (e.source == source && e.limit == limit) to = e;
      else if (!(e.source == from.source && e.limit == from.limit)) left[kept++] = e;
    }
    count = kept;
    if (from.source != MemoryLimit::kNone) {
      const int keep = count < kEntries ? count : kEntries - 1;
      for (int i = keep; i > 0; --i) left[i] = left[i - 1];
      left[0] = from;
      count = keep + 1;
    }
    return to;
  }
};

// How long a thread whose allocation failed while another writes the oom
// dump waits for it (OnAllocFailed). A warm write takes milliseconds; this
// bounds the stall if the waiting thread holds a lock the write needs.
constexpr std::int64_t kOomDumpWaitMillis = 30000;
// oom_dump's reserve when oom_reserve is not given and no RLIMIT_AS applies.
constexpr std::uint64_t kDefaultOomReserve = std::uint64_t{64} << 20;
// Under RLIMIT_AS the default reserve stays 64 MiB while the address space
// left at start-up is at least this many times that.
constexpr std::uint64_t kOomReserveHeadroomShare = 8;
// Added to the largest loaded file for the default under a tighter limit:
// the snapshot, the encoder's buffers and a stripped library's debug file
// (libc's is 4 MiB on Debian 12). Measured (README "A dump on allocation
// failure"): a 7.9 MB program's dump had no names from a 6 MiB reserve,
// names from 8 MiB; a 31 MB one's from its 39 MiB. Built without
// exceptions a write first maps its headroom (write_headroom.hpp: at least
// kMinWriteHeadroom) out of the released reserve: that much more.
constexpr std::uint64_t kOomReserveMargin =
    (std::uint64_t{8} << 20) + (HEAPPROF_EXCEPTIONS ? 0 : std::uint64_t{kMinWriteHeadroom});

// The reserve that oom_reserve does not set. Without RLIMIT_AS (`limit` 0),
// or with 512 MiB or more left (`limit` - `used`): 64 MiB, as always
// (address space only: no RSS, no cgroup charge). Under a tighter RLIMIT_AS
// the reserve is address space the program no longer has (64 MiB of 128
// made its first failure come half way): `floor`, what a dump with names
// needs (the largest file a write maps, plus the margin above), at most
// half of what is left; that dump reads no DWARF it has not read before
// (symbolizer.hpp: tls_symbolize_cached_debug_only). Reading it cold needs
// far more, and a reserve short of it lost every name, not only the lines
// (the 31 MB program: no names from any reserve up to 64 MiB).
inline std::uint64_t DefaultOomReserve(std::uint64_t limit, std::uint64_t used, std::uint64_t floor) noexcept {
  if (limit == 0) return kDefaultOomReserve;
  const std::uint64_t left = limit > used ? limit - used : 0;
  if (left / kOomReserveHeadroomShare >= kDefaultOomReserve) return kDefaultOomReserve;
  const std::uint64_t r = std::min(std::min(floor, kDefaultOomReserve), left / 2);
  return r & ~std::uint64_t{4095};  // whole pages
}

// The size of the largest file of the loaded objects: a write with names
// maps each object's file whole, one at a time, to read its symbol table
// (SymbolTable::Load). Static initialisation: not inside a hook.
inline std::uint64_t LargestLoadedFileBytes() noexcept {
  struct Walk {
    static int Visit(dl_phdr_info* info, std::size_t, void* data) noexcept {
      const char* name = info->dlpi_name;
      if (name == nullptr || name[0] == '\0') name = SelfExeFile();  // the program
      struct stat st {};
      if (name != nullptr && ::stat(name, &st) == 0 && S_ISREG(st.st_mode)) {
        auto& largest = *static_cast<std::uint64_t*>(data);
        largest = std::max(largest, static_cast<std::uint64_t>(st.st_size));
      }
      return 0;
    }
  };
  std::uint64_t largest = 0;
  IterateLoadedObjects(&Walk::Visit, &largest);
  return largest;
}

// RLIMIT_AS's soft limit, 0 when there is none.
inline std::uint64_t AddressSpaceLimit() noexcept {
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
  return rl.rlim_cur;  // (rlim_t: unsigned long; a cast is a useless one, -Wuseless-cast)
}

// "943.2 MiB"
inline ArenaString MiBText(std::uint64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

class Dumper {
 public:
  constexpr Dumper() noexcept = default;

  // Starts the thread if a trigger is configured. Called once, at start-up.
  void Start(const EnvConfig& cfg) noexcept {
    cfg_ = &cfg;
    if (::getcwd(start_dir_, sizeof start_dir_) == nullptr) start_dir_[0] = '\0';
    if (cfg.oom_dump) ArmOomDump(cfg.oom_reserve);
    if (!cfg.WantsDumper()) return;
    if (cfg.dump_signal != 0) InstallSignalHandler(cfg.dump_signal);
    if (!StartThread()) return;
    // A forked child (daemon(), a pre-forking server's workers) is a process
    // of its own: it gets a dump thread, dumps under its own pid and runs the
    // exit actions (engine.hpp). Registered after the engine's handlers, so
    // its locks are free again when ours runs.
    pthread_atfork(nullptr, nullptr, &Dumper::ForkChild);
  }

  // Stops and joins the thread (exit path); later Dump() calls still work.
  //
  // A dump_signal the thread had not taken yet is done here: a TERM that came
  // just before the program's own exit() was dropped with the thread, and the
  // process ended with the program's status, not the signal's (python3 -c
  // 'os.kill(os.getpid(), signal.SIGTERM)' under dump_signal=TERM: 0, not
  // 143). From here on the handler forwards a terminating signal itself
  // (ForwardSignalAtExit).
  void Stop() noexcept {
    if (!running_.exchange(false, std::memory_order_acq_rel)) return;
    stop_.store(true, std::memory_order_release);
    Wake();
    pthread_join(thread_, nullptr);
    exiting_.store(true, std::memory_order_seq_cst);
    if (signal_pending_.exchange(false, std::memory_order_seq_cst)) {
      Dump("dump_signal");
      ForwardSignal();
    }
  }

  // A dump refused for want of memory (WriteHeadroom), said without allocating.
  static bool NoRoom(const char* kind, std::string_view why) noexcept {
    char line[256];
    std::snprintf(line, sizeof line, "cannot write %s profile (%.*s): out of memory building the profile", kind,
                  static_cast<int>(why.size() < 160 ? why.size() : 160), why.data());
    ReportLine(line);
    return false;
  }

  // Writes the next <prefix>.<pid>.<seq>.heap.pb.gz; `why` goes in the log line.
  bool Dump(const char* why) noexcept {
    ReentrancyGuard guard;
    WriteHeadroom headroom;  // built without exceptions: the memory first, or no dump
    if (!headroom.ok()) return NoRoom("heap", why);
    pthread_mutex_lock(&write_mutex_);
    bool ok = false;
    HEAPPROF_TRY {
      // A name already taken moves on to the next number, never replaces
      // that file: a program that exec()s keeps its pid, and the new image,
      // numbering from 0001 again, overwrote the dumps the old one wrote
      // (python3 dumping at dump_interval, then os.execv: its 0001 became
      // the new image's dump_at_exit). An earlier process of the same pid
      // (pids are reused) keeps its files the same way.
      ArenaString path;
      for (unsigned skipped = 0;; ++skipped) {
        char name[64];
        std::snprintf(name, sizeof name, ".%ld.%04u.heap.pb.gz", static_cast<long>(getpid()), ++seq_);
        path = Prefix() + name;
        struct stat st {};
        if (skipped >= kMaxDumpNamesSkipped || ::lstat(path.c_str(), &st) != 0) break;
      }
      ArenaString error;
      ok = WriteProfileFile(path, false, &error);
      if (ok) {
        ReportLine("wrote " + path + " (" + why + ")");
      } else {
        ReportLine("cannot write heap profile (" + ArenaString(why) + "): " + error);
      }
    }
    HEAPPROF_CATCH_ALL_NOEXCEPT { ok = false; }
    pthread_mutex_unlock(&write_mutex_);
    return ok;
  }

  // Writes <prefix>.<pid>.<kind>.pb.gz (the peak profile when `peak`), or
  // <prefix>.<pid>.<n>.<kind>.pb.gz past an earlier process's (UnusedExitFileBase).
  bool DumpNamed(const char* kind, bool peak, std::string_view why) noexcept {
    ReentrancyGuard guard;
    WriteHeadroom headroom;  // built without exceptions: the memory first, or no dump
    if (!headroom.ok()) return NoRoom(kind, why);
    pthread_mutex_lock(&write_mutex_);
    bool ok = false;
    HEAPPROF_TRY {
      ArenaString path = UnusedExitFileBase(Prefix(), {kind});
      path += ".";
      path += kind;
      path += ".pb.gz";
      ArenaString error;
      ok = peak ? WritePeakProfileFile(path, &error) : WriteProfileFile(path, false, &error);
      if (ok) {
        ArenaString line = "wrote ";
        line += path;
        line += " (";
        line += why;
        line += ")";
        ReportLine(line);
      } else {
        ArenaString line = "cannot write ";
        line += kind;
        line += " profile (";
        line += why;
        line += "): ";
        line += error;
        ReportLine(line);
      }
    }
    HEAPPROF_CATCH_ALL_NOEXCEPT { ok = false; }
    pthread_mutex_unlock(&write_mutex_);
    return ok;
  }

  // oom_dump: the first failed allocation (1_hooks: OnAllocFailure) writes
  // <prefix>.<pid>.oom.pb.gz right there, on the failing thread, before the
  // allocation fails as it would have (new_handler loop, bad_alloc, null).
  // Building a profile takes memory (the snapshot, the symbolizer's maps of
  // the ELF files, the encoder's buffers: a few MiB): the reserve mapped at
  // start-up is released first, which gives back that much address space
  // (RLIMIT_AS) and commit charge (vm.overcommit_memory=2). Untouched, the
  // reserve costs no RSS and no cgroup charge.
  // True when it released the reserve (the failed allocation is worth one
  // more try: block_hooks.hpp, OnAllocFailure).
  //
  // Another thread whose allocation fails while the dump is being written
  // waits for it (up to kOomDumpWaitMillis), then fails as it would have:
  // a service's threads run out of memory together, and one that went on to
  // an uncaught bad_alloc (std::terminate) or a null it could not handle
  // ended the process in the middle of the dump. Measured: 4 threads
  // allocating 1 MiB blocks under RLIMIT_AS got no oom profile in 5 runs of
  // 5 (2 threads: none in 2), 1 thread got it every time. The wait is
  // bounded in case the waiting thread holds a lock the write needs (the
  // loader's, inside a dl_iterate_phdr callback). The hook stays set until
  // the dump is written, for those threads to find; later failures cost
  // nothing.
  bool OnAllocFailed(std::size_t n) noexcept {
    if (tls_thread_flags.guard != 0) return false;  // the profiler's own allocation (or a handler inside it)
    if (oom_dumped_.exchange(true, std::memory_order_acq_rel)) {
      WaitForOomDump();
      return false;
    }
    ReleaseOomReserve();
    char why[256];
    if (oom_reserve_bytes_released_ != 0) {
      std::snprintf(why, sizeof why, "oom_dump: an allocation of %zu bytes failed; released the %llu-byte reserve%s", n,
                    static_cast<unsigned long long>(oom_reserve_bytes_released_),
                    oom_cached_debug_only_ ? " (sized for RLIMIT_AS: lines only from debug info already read)" : "");
    } else {  // (it said "released the 0-byte reserve")
      std::snprintf(why, sizeof why, "oom_dump: an allocation of %zu bytes failed; no reserve (it could not be mapped)",
                    n);
    }
    tls_symbolize_cached_debug_only = oom_cached_debug_only_;
    DumpNamed("oom", false, why);
    tls_symbolize_cached_debug_only = false;
    g_alloc_failure_hook.store(nullptr, std::memory_order_release);
    oom_dump_written_.store(1, std::memory_order_release);
    FutexWake(oom_dump_written_, INT_MAX);
    return oom_reserve_bytes_released_ != 0;
  }

  // True from the first failed allocation until its oom dump is written.
  bool OomDumpInProgress() const noexcept {
    return oom_dumped_.load(std::memory_order_acquire) && oom_dump_written_.load(std::memory_order_acquire) == 0;
  }

  // The threads that failed while the oom dump was written, until it is.
  std::uint64_t OomDumpWaiters() const noexcept { return oom_dump_waiters_.load(std::memory_order_relaxed); }

  // True once the dump thread is past its start-up (and the writer warm-up
  // of dump_near_oom / oom_dump); tests wait for it before limiting memory.
  bool Warm() const noexcept { return writer_warm_.load(std::memory_order_acquire); }

  // The dump thread's polls that checked dump_near_oom / rss_interval, and
  // those of them that allocated (tests: only a few should).
  std::uint64_t MemoryPolls() const noexcept { return memory_polls_.load(std::memory_order_relaxed); }
  std::uint64_t MemoryPollsAllocating() const noexcept {
    return memory_polls_allocating_.load(std::memory_order_relaxed);
  }

  // A relative prefix (the default "heapprof" too) is relative to the
  // directory the program started in, where HEAPPROF was written: resolved
  // against the working directory of the moment, a program that chdir()s
  // (daemon() moves to /) lost every dump and its leak report ("cannot create
  // sub/p.<pid>.0001.heap.pb.gz.tmp...") or wrote them into "/". While the
  // working directory is the start-up one, the prefix stays as written, and
  // so do the names the "wrote" lines print.
  // A prefix ending in '/' names a directory: the files in it are
  // "heapprof.<pid>...." (before: ".<pid>....", hidden from ls and from
  // globs such as *.pb.gz).
  ArenaString Prefix() const {
    ArenaString prefix =
        FromStartDir(cfg_ != nullptr && cfg_->dump_prefix[0] != '\0' ? cfg_->dump_prefix : "heapprof");
    if (!prefix.empty() && prefix.back() == '/') prefix += "heapprof";
    return prefix;
  }
  // Any other path of HEAPPROF read after start-up (leak_suppressions, read
  // at exit), resolved the same way; empty stays empty.
  ArenaString FromStartDir(const char* given) const {
    const ArenaString path = given;
    if (path.empty() || path[0] == '/' || start_dir_[0] == '\0') return path;
    char now[sizeof start_dir_];
    if (::getcwd(now, sizeof now) != nullptr && std::strcmp(now, start_dir_) == 0) return path;
    ArenaString resolved = start_dir_;
    if (resolved.back() != '/') resolved += '/';
    return resolved + path;
  }

  // The signal handler's wake-up (async-signal-safe: an atomic add and a futex call).
  void OnSignal() noexcept {
    signal_pending_.store(true, std::memory_order_seq_cst);
    Wake();
    ForwardSignalAtExit();
  }

 private:
  // A futex word, not a pipe: the program owns every file descriptor. A
  // daemon that closes the ones it did not open (closefrom, python-daemon,
  // os.closerange) closed the pipe, its numbers went to the program's next
  // files, and the signal handler wrote its byte into one of them while the
  // thread spun on poll() (POLLIN or POLLNVAL at once, every time).
  void Wake() noexcept {
    wake_seq_.fetch_add(1, std::memory_order_release);
    FutexWake(wake_seq_, 1);
  }
  // Sleeps until Wake() has run since wake_seq_ was `seen`, or `timeout_ms`
  // (-1: no limit) has passed.
  void WaitForWake(std::uint32_t seen, int timeout_ms) noexcept { FutexWait(wake_seq_, seen, timeout_ms); }

  // The futex calls of Wake/WaitForWake and of the oom dump's waiters
  // (OnAllocFailed, WaitForOomDump). Both keep errno: a signal handler
  // (Wake) and a failed allocation's caller must see their own.
  static void FutexWake(std::atomic<std::uint32_t>& word, int count) noexcept {
    const int saved = errno;
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
    errno = saved;
  }
  // Sleeps while `word` is `expected`, at most `timeout_ms` (-1: no limit).
  static void FutexWait(std::atomic<std::uint32_t>& word, std::uint32_t expected, int timeout_ms) noexcept {
    timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000L};
    const int saved = errno;
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
              timeout_ms < 0 ? nullptr : &ts, nullptr, 0);
    errno = saved;
  }

  static void SignalHandler(int sig, siginfo_t* info, void* context) noexcept;
  static void ForkChild() noexcept;
  static bool AllocFailed(std::size_t n) noexcept;

  // `given`: oom_reserve, 0 when not given (DefaultOomReserve).
  void ArmOomDump(std::uint64_t given) noexcept {
    const std::uint64_t limit = AddressSpaceLimit();
    const std::uint64_t used = limit != 0 ? StatmBytes(0) : 0;
    const std::uint64_t left = limit > used ? limit - used : 0;
    std::uint64_t bytes = given;
    if (given == 0) {
      const std::uint64_t floor = limit != 0 ? LargestLoadedFileBytes() + kOomReserveMargin : 0;
      bytes = DefaultOomReserve(limit, used, floor);
      // Sized for names, not for reading DWARF cold: the dump reads none
      // that it has not read before (symbolizer.hpp).
      oom_cached_debug_only_ = bytes < kDefaultOomReserve;
      if (limit != 0 && bytes < (floor & ~std::uint64_t{4095})) {
        ReportLine("oom_dump: RLIMIT_AS leaves " + MiBText(left) + " of address space: a reserve of " +
                   MiBText(bytes) + ", less than the " + MiBText(floor) +
                   " a dump with function names needs here (oom_reserve=SIZE sets it)");
      }
    }
    void* p = bytes != 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                         : MAP_FAILED;
    if (p == MAP_FAILED) {
      const int err = bytes != 0 ? errno : ENOMEM;
      // Say which limit refused it: oom_reserve above what RLIMIT_AS leaves
      // was reported as a bare ENOMEM, and the dump, written without it, can
      // end the process (no exceptions) or lose its names.
      ArenaString line = "oom_dump: cannot map the ";
      line += MiBText(bytes);
      line += given != 0 ? " reserve (oom_reserve): " : " reserve: ";
      line += std::strerror(err);
      if (limit != 0) {
        line += " (RLIMIT_AS ";
        line += MiBText(limit);
        line += ", ";
        line += MiBText(left);
        line += " left)";
      }
      line += "; the dump will be written without it";
      ReportLine(line);
    } else {
      oom_reserve_ = p;
      oom_reserve_bytes_ = bytes;
    }
    g_alloc_failure_hook.store(&Dumper::AllocFailed, std::memory_order_release);
  }

  void WaitForOomDump() noexcept {
    if (oom_dump_written_.load(std::memory_order_acquire) != 0) return;
    oom_dump_waiters_.fetch_add(1, std::memory_order_relaxed);
    const std::int64_t deadline = MonotonicMillis() + kOomDumpWaitMillis;
    for (;;) {
      if (oom_dump_written_.load(std::memory_order_acquire) != 0) return;
      const std::int64_t left = deadline - MonotonicMillis();  // (at most kOomDumpWaitMillis)
      if (left <= 0) return;
      FutexWait(oom_dump_written_, 0, static_cast<int>(left));
    }
  }

  void ReleaseOomReserve() noexcept {
    if (oom_reserve_ == nullptr) return;
    ::munmap(oom_reserve_, oom_reserve_bytes_);
    oom_reserve_ = nullptr;
    oom_reserve_bytes_released_ = oom_reserve_bytes_;
  }

  bool StartThread() noexcept {
    // The thread takes no signals, and its stack is not the program's
    // default size (host_threads.hpp).
    const int rc = StartOwnThread(&thread_, &Dumper::Main, this);
    if (rc != 0) {
      ReportLine(ArenaString("cannot start the dump thread: ") + std::strerror(rc));
      return false;
    }
    running_.store(true, std::memory_order_release);
    return true;
  }

  // In the child, single-threaded: the parent's dump thread did not come
  // along. A fresh mutex (the parent's dumper may have held it; the futex
  // word is the child's own copy, private to its memory), numbering
  // from 1 under the new pid, and a thread of the child's own.
  void RestartInChild() noexcept {
    write_mutex_ = PTHREAD_MUTEX_INITIALIZER;
    seq_ = 0;
    // Forked while a thread of the parent wrote the oom dump: that thread is
    // not in the child, and the child's first failed allocation waited the
    // whole kOomDumpWaitMillis (30 s) for it. The child counts it as written,
    // as it does when the fork comes after the dump (no oom dump of its own).
    if (oom_dumped_.load(std::memory_order_acquire)) oom_dump_written_.store(1, std::memory_order_release);
    if (!running_.load(std::memory_order_acquire)) return;
    running_.store(false, std::memory_order_relaxed);
    stop_.store(false, std::memory_order_relaxed);
    signal_pending_.store(false, std::memory_order_relaxed);
    exiting_.store(false, std::memory_order_relaxed);
    if (cfg_->dump_interval != 0 || cfg_->inuse_interval != 0) {
      const Stats s = GetStats();
      const std::uint64_t di = cfg_->dump_interval, ii = cfg_->inuse_interval;
      if (di != 0) first_alloc_mark_ = (s.alloc_bytes / di + 1) * di;
      if (ii != 0) first_inuse_mark_ = (s.live_bytes / ii + 1) * ii;
    }
    StartThread();
  }

  // TERM, INT, HUP and QUIT ask the process to end: for them the dump comes
  // first, then the signal does what it did before (the previous handler, or
  // the default action: the process ends). Any other signal only dumps.
  static bool Terminating(int sig) noexcept {
    return sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT;
  }

  // A signal ignored at start-up (nohup's HUP; INT and QUIT in a shell
  // script's background job; a `trap '' TERM`) stays ignored, and takes no
  // dumps: a handler of ours in its place is reset to SIG_DFL by every
  // exec, so the programs this one runs lost nohup's protection (`nohup sh
  // -c 'sleep 9'` under dump_signal=HUP: the sleep ended at a HUP), and
  // programs that catch a signal only when it is not ignored (GNU make and
  // sort, the JVM for HUP, INT and TERM) saw ours and installed theirs.
  void InstallSignalHandler(int sig) noexcept {
    struct sigaction now {};
    if (sigaction(sig, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) == 0 && now.sa_handler == SIG_IGN) {
      ReportLine(ArenaString("dump_signal=") + DumpSignalName(sig) +
                 ": the signal is ignored (as under nohup), and stays so: it takes no dumps");
      return;
    }
    struct sigaction sa {};
    sa.sa_sigaction = &Dumper::SignalHandler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    if (sigaction(sig, &sa, &previous_) != 0) {
      ReportLine(ArenaString("cannot install the dump_signal handler: ") + std::strerror(errno));
    }
  }

  // After the dump of a terminating signal, what the previous disposition
  // did, every time: SIG_IGN nothing; SIG_DFL the default action (the
  // previous disposition back and the signal again: the process ends); a
  // handler: the signal again, which our handler passes to it, on one of the
  // program's threads (this one blocks every signal). Our handler stays:
  // putting the previous disposition back for good made only the first
  // signal dump when it did not end the process (nohup's SIG_IGN, a
  // program's own handler).
  //
  // A handler installed with SA_RESETHAND ran once: the disposition it asked
  // for after that is SIG_DFL, so the next signal ends the process.
  void ForwardSignal() noexcept {
    const int sig = cfg_->dump_signal;
    if (!Terminating(sig)) return;
    const bool reset = handler_reset_.load(std::memory_order_acquire);
    const bool siginfo = !reset && (previous_.sa_flags & SA_SIGINFO) != 0;
    if (!siginfo && !reset && previous_.sa_handler == SIG_IGN) return;
    if (!siginfo && (reset || previous_.sa_handler == SIG_DFL)) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(sig, &dfl, nullptr);
    } else {
      forwarding_.fetch_add(1, std::memory_order_acq_rel);
    }
    ::kill(getpid(), sig);
  }

  // Once Stop() has joined the thread (the exit actions are running, or
  // are over: a destructor of the program's), no thread is left to take a
  // dump_signal: a terminating one does now what it did before heapprof,
  // without a dump (a handler cannot write one). It was dropped, and the
  // process exited with its own status. Stop() sets exiting_ and then takes
  // the pending flag; this sets the flag and then reads exiting_ (both
  // sequentially consistent): one of the two sees the other, and the exchange
  // lets only one of them act. Async-signal-safe.
  void ForwardSignalAtExit() noexcept {
    if (!exiting_.load(std::memory_order_seq_cst)) return;
    if (!signal_pending_.exchange(false, std::memory_order_seq_cst)) return;
    ForwardSignal();
  }

  // Runs the previous handler as the kernel would have: with its sa_mask
  // (and the signal itself unless SA_NODEFER) blocked, once only under
  // SA_RESETHAND. Async-signal-safe.
  void CallPrevious(int sig, siginfo_t* info, void* context) noexcept {
    const auto flags = static_cast<unsigned>(previous_.sa_flags);  // SA_RESETHAND is 0x80000000u
    const bool handler = (flags & SA_SIGINFO) != 0 ||
                         (previous_.sa_handler != SIG_IGN && previous_.sa_handler != SIG_DFL);
    if (!handler || handler_reset_.load(std::memory_order_acquire)) return;
    if ((flags & SA_RESETHAND) != 0) handler_reset_.store(true, std::memory_order_release);
    sigset_t mask = previous_.sa_mask, saved;
    if ((flags & SA_NODEFER) == 0) sigaddset(&mask, sig);
    pthread_sigmask(SIG_BLOCK, &mask, &saved);
    if ((flags & SA_NODEFER) != 0) {
      sigset_t self;
      sigemptyset(&self);
      sigaddset(&self, sig);
      pthread_sigmask(SIG_UNBLOCK, &self, nullptr);
    }
    if ((flags & SA_SIGINFO) != 0) previous_.sa_sigaction(sig, info, context);
    else previous_.sa_handler(sig);
    pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  }

  // The signal handler: a signal we sent to forward (ForwardSignal) goes to
  // the previous handler, any other asks for a dump. Async-signal-safe.
  void OnSignalInfo(int sig, siginfo_t* info, void* context) noexcept {
    if (info != nullptr && info->si_code == SI_USER && info->si_pid == ::getpid()) {
      unsigned pending = forwarding_.load(std::memory_order_acquire);
      while (pending != 0 &&
             !forwarding_.compare_exchange_weak(pending, pending - 1, std::memory_order_acq_rel)) {
      }
      if (pending != 0) {
        CallPrevious(sig, info, context);
        return;
      }
    }
    OnSignal();
  }

  // dump_near_oom and oom_dump write when memory is short. The first profile
  // a process writes maps the ELF and debug files and indexes their units
  // (measured: +64 MiB of address space kept, +128 MiB at the peak of that
  // first write, ~1 MiB of RSS): done here, at start, in the background, so
  // that those dumps need only what a warm write needs. Under RLIMIT_AS that
  // decides whether the dump fits.
  static void WarmUpWriter() noexcept {
    WriteHeadroom headroom;  // built without exceptions: the memory first, or no warm-up
    if (!headroom.ok()) return;
    HEAPPROF_TRY {  // BuildProfileBytes, less its no-allocation-seen warning: it may be too early for one
      const ProfileData data = SnapshotProfile(false);
      const ArenaVector<LoadedObject> objects = CollectProfileObjects();
      Symbolizer symbolizer(objects);
      const ArenaString gz = EncodeGzipped(data, objects, symbolizer);
      (void)gz;
    }
    HEAPPROF_CATCH_ALL_NOEXCEPT {}
  }

  static void* Main(void* self) noexcept {
    ReentrancyGuard guard;  // libc calls that malloc here are never sampled (its own memory is the arena)
    tls_profiler_thread = true;  // and, through the malloc hooks, served from it (malloc.hpp: OwnAlloc)
    tls_dump_thread = true;
    OwnThreadMark mark;  // not one of the program's threads (host_threads.hpp)
    static_cast<Dumper*>(self)->Loop();
    return nullptr;
  }

  void Loop() noexcept {
    const EnvConfig& cfg = *cfg_;
    const bool byte_triggers = cfg.dump_interval != 0 || cfg.inuse_interval != 0;
    const bool memory_triggers = cfg.dump_near_oom != 0 || cfg.rss_interval != 0;
    MemoryWatch watch;
    if (memory_triggers) watch.Begin(cfg);
    // For an oom_dump whose reserve was sized down under RLIMIT_AS (and no
    // dump_near_oom), the warm-up reads no DWARF either, as its dump will
    // not: one that had samples to symbolize (rate=1: the start-up's own)
    // kept the program's DWARF, 130 MB of a 256 MiB limit for the 31 MB test
    // binary. It still runs: built without exceptions, a write maps what the
    // last one needed (write_headroom.hpp), and without a first write the
    // oom dump asked for 64 MiB out of a 10 MiB reserve and was refused.
    if (cfg.dump_near_oom != 0 || cfg.oom_dump) {
      tls_symbolize_cached_debug_only = cfg.dump_near_oom == 0 && oom_cached_debug_only_;
      WarmUpWriter();
      tls_symbolize_cached_debug_only = false;
    }
    writer_warm_.store(true, std::memory_order_release);
    // The first marks: SIZE at start-up; in a forked child, the next
    // multiples above the counts it inherited (taken in the fork handler).
    std::uint64_t next_alloc_mark = first_alloc_mark_ != 0 ? first_alloc_mark_ : cfg.dump_interval;
    std::uint64_t next_inuse_mark = first_inuse_mark_ != 0 ? first_inuse_mark_ : cfg.inuse_interval;
    const std::int64_t period_ms = static_cast<std::int64_t>(cfg.dump_time) * 1000;
    std::int64_t next_time = period_ms != 0 ? MonotonicMillis() + period_ms : 0;
    // Wake() bumps wake_seq_ after setting its flag: a flag set before
    // `seen` is read (after each wait) is handled right after it, one set
    // after it ends the next wait at once. The first wait returns at once,
    // for a Wake() that came before this thread ran.
    std::uint32_t seen = wake_seq_.load(std::memory_order_acquire) - 1;
    std::int64_t last_threads_check = MonotonicMillis();
    while (!stop_.load(std::memory_order_acquire)) {
      int timeout = -1;
      if (byte_triggers || memory_triggers) timeout = kDumpPollMillis;
      if (next_time != 0) {
        const std::int64_t left = std::max<std::int64_t>(0, next_time - MonotonicMillis());
        if (timeout < 0 || left < timeout) timeout = static_cast<int>(std::min<std::int64_t>(left, 1 << 30));
      }
      // Once a second: have the program's threads all ended (host_threads.hpp)?
      if (timeout < 0 || timeout > kProgramThreadsCheckMillis) timeout = kProgramThreadsCheckMillis;
      WaitForWake(seen, timeout);
      seen = wake_seq_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_acquire)) break;
      EndIfProgramThreadsGone(MonotonicMillis(), last_threads_check);
      if (signal_pending_.exchange(false, std::memory_order_relaxed)) {
        Dump("dump_signal");
        ForwardSignal();
      }
      if (next_time != 0) {
        const std::int64_t now = MonotonicMillis();
        if (now >= next_time) {
          while (next_time <= now) next_time += period_ms;  // missed periods are not replayed
          Dump("dump_time");
        }
      }
      if (byte_triggers) {
        const Stats s = GetStats();
        if (cfg.dump_interval != 0 && s.alloc_bytes >= next_alloc_mark) {
          next_alloc_mark = (s.alloc_bytes / cfg.dump_interval + 1) * cfg.dump_interval;
          Dump("dump_interval");
        }
        if (cfg.inuse_interval != 0 && s.live_bytes >= next_inuse_mark) {
          next_inuse_mark = s.live_bytes + cfg.inuse_interval;
          Dump("inuse_interval");
        }
      }
      if (memory_triggers) {
        memory_polls_.fetch_add(1, std::memory_order_relaxed);
        // Most polls only read a number and compare it: no memory. A poll
        // that reads the limit again or builds a message allocates, and
        // built without exceptions it maps a write's headroom first (refused:
        // the checks run at the next poll). Mapping it at every poll cost an
        // mmap and an munmap (of up to 1 GiB, each taking the host's mmap
        // lock) 100 times a second.
        if (watch.MayAllocate(cfg)) {
          memory_polls_allocating_.fetch_add(1, std::memory_order_relaxed);
          WriteHeadroom headroom(false);
          if (headroom.ok()) {
            // With exceptions, a bad_alloc (the limit's path, a message)
            // skips this poll's checks: this function is noexcept, and near
            // the limit is where memory runs out.
            HEAPPROF_TRY {
              ArenaString why;
              if (watch.NearOom(cfg, why)) Dump(why.c_str());
              if (watch.RssHigh(cfg, why)) Dump(why.c_str());
            }
            HEAPPROF_CATCH_ALL_NOEXCEPT {}
          }
        }
      }
    }
  }

  // dump_near_oom and rss_interval: the dump thread's state (a forked child's
  // thread starts its own).
  struct MemoryWatch {
    MemoryLimit limit;
    std::int64_t next_limit_read = 0;
    unsigned halvings = 0;        // dump_near_oom: headroom halvings already dumped for
    bool near_oom_done = false;   // the headroom left is below kNearOomMinHeadroom
    std::uint64_t limit_seen = 0; // a new limit starts the thresholds again (one seen before goes on: progress)
    MemoryLimit::Source source_seen = MemoryLimit::kNone;
    NearOomProgress progress;
    std::uint64_t rss_mark = 0;   // rss_interval: the RSS that dumps next (the last such dump's, or start-up's, + interval)
    bool rss_dumped = false;      // an rss_interval dump was written: the base is its RSS, not start-up's

    void Begin(const EnvConfig& cfg) {
      const std::uint64_t rss = ResidentBytes();
      if (rss == 0) {  // no /proc (a chroot, a minimal container): before, nothing said these never dump
        const char* keys = cfg.dump_near_oom == 0 ? "rss_interval"
                           : cfg.rss_interval == 0 ? "dump_near_oom"
                                                   : "dump_near_oom and rss_interval";
        ReportLine(ArenaString(keys) +
                   ": /proc/self/statm cannot be read (is /proc mounted?): memory use is unknown, so no such "
                   "dump is written until it can be read");
      }
      if (cfg.rss_interval != 0) rss_mark = rss + cfg.rss_interval;
    }

    // The headroom F leaves under the limit last read: limit * (1 - F)
    // without overflow (and without __int128, which -Wpedantic rejects):
    // split limit at 10^6; exact, floor included.
    std::uint64_t Headroom(const EnvConfig& cfg) const noexcept {
      const std::uint64_t f = 1000000 - cfg.dump_near_oom;
      return limit.limit / 1000000 * f + limit.limit % 1000000 * f / 1000000;
    }
    // The usage at which the dump for `k` halvings is due.
    std::uint64_t Threshold(const EnvConfig& cfg, unsigned k) const noexcept {
      return limit.limit - (k < 64 ? Headroom(cfg) >> k : 0);
    }
    // Whether a threshold is left to reach under the limit last read.
    bool NearOomArmed() const noexcept {
      return limit.source != MemoryLimit::kNone && limit.limit != 0 && !near_oom_done;
    }
    // Whether `usage` reaches the next threshold under the limit last read.
    bool NearOomDue(const EnvConfig& cfg, std::uint64_t usage) const noexcept {
      return NearOomArmed() && usage != 0 && usage >= Threshold(cfg, halvings);
    }

    // Whether this poll's checks may allocate: the limit is due to be read
    // again (a cgroup's counter is a path, a string), or a check is about to
    // fire (its message). Reads what the checks read; allocates nothing.
    bool MayAllocate(const EnvConfig& cfg) const noexcept {
      if (cfg.dump_near_oom != 0 && (MonotonicMillis() >= next_limit_read ||
                                     (NearOomArmed() && NearOomDue(cfg, limit.Usage())))) {
        return true;
      }
      return cfg.rss_interval != 0 && ResidentBytes() >= rss_mark;
    }

    // The first time usage reaches F of the limit, and again each time it
    // passes the next halving of the headroom that F left.
    bool NearOom(const EnvConfig& cfg, ArenaString& why) {
      if (cfg.dump_near_oom == 0) return false;
      const std::int64_t now = MonotonicMillis();
      if (now >= next_limit_read) {
        limit = FindMemoryLimit();
        next_limit_read = now + kLimitRefreshMillis;
        if (limit.limit != limit_seen || limit.source != source_seen) {
          const NearOomProgress::Entry to =
              progress.Switch({source_seen, limit_seen, halvings, near_oom_done}, limit.source, limit.limit);
          limit_seen = limit.limit;
          source_seen = limit.source;
          halvings = to.halvings;
          near_oom_done = to.done;
        }
      }
      if (!NearOomArmed()) return false;  // (no usage to read)
      const std::uint64_t usage = limit.Usage();
      if (!NearOomDue(cfg, usage)) return false;
      const std::uint64_t headroom = Headroom(cfg);
      auto threshold = [&](unsigned k) { return Threshold(cfg, k); };
      const unsigned first = halvings;
      while (halvings < 64 && usage >= threshold(halvings)) ++halvings;
      if (halvings >= 64 || (headroom >> halvings) < kNearOomMinHeadroom) near_oom_done = true;
      // Every threshold this dump stands for: growth faster than the polls
      // passes several at once, and naming only the first ("95.1%,
      // threshold 90.0%", then "threshold 97.5%") read as if 95% had no dump.
      const unsigned last = halvings - 1;
      char range[48] = "";
      if (last != first) {
        std::snprintf(range, sizeof range, " to %.1f%%",
                      100.0 * static_cast<double>(threshold(last)) / static_cast<double>(limit.limit));
      }
      char buf[288];
      std::snprintf(buf, sizeof buf, "dump_near_oom: %s %s of %s %s (%.1f%%), %s %.1f%%%s%s", limit.UsageName(),
                    MiBText(usage).c_str(), limit.Name(), MiBText(limit.limit).c_str(),
                    100.0 * static_cast<double>(usage) / static_cast<double>(limit.limit),
                    last != first ? "thresholds" : "threshold",
                    100.0 * static_cast<double>(threshold(first)) / static_cast<double>(limit.limit), range,
                    first == 0 ? "" : " (headroom halved)");
      why = buf;
      return true;
    }

    bool RssHigh(const EnvConfig& cfg, ArenaString& why) {
      if (cfg.rss_interval == 0) return false;
      const std::uint64_t rss = ResidentBytes();
      if (rss < rss_mark) return false;
      why = "rss_interval: RSS " + MiBText(rss) + ", " + MiBText(rss - (rss_mark - cfg.rss_interval)) +
            (rss_dumped ? " above the last rss_interval dump's" : " above the RSS at start-up");
      rss_mark = rss + cfg.rss_interval;
      rss_dumped = true;
      return true;
    }
  };

  const EnvConfig* cfg_ = nullptr;
  char start_dir_[PATH_MAX] = {};  // the working directory at Start(): where relative prefixes point
  std::atomic<std::uint32_t> wake_seq_{0};  // Wake()'s futex word
  pthread_t thread_{};
  std::atomic<bool> running_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> signal_pending_{false};
  std::atomic<bool> exiting_{false};  // Stop() has joined the thread: the handler forwards a terminating signal itself
  pthread_mutex_t write_mutex_ = PTHREAD_MUTEX_INITIALIZER;
  struct sigaction previous_ {};  // dump_signal's disposition before ours
  std::atomic<unsigned> forwarding_{0};  // signals ForwardSignal sent for the previous handler
  std::atomic<bool> handler_reset_{false};  // the previous handler had SA_RESETHAND and has run
  unsigned seq_ = 0;  // under write_mutex_
  std::uint64_t first_alloc_mark_ = 0;  // a forked child's first byte-trigger marks (0: SIZE)
  std::uint64_t first_inuse_mark_ = 0;
  void* oom_reserve_ = nullptr;  // oom_dump's reserve, released by the first failure
  std::uint64_t oom_reserve_bytes_ = 0;
  std::uint64_t oom_reserve_bytes_released_ = 0;
  bool oom_cached_debug_only_ = false;  // the default reserve was sized down under RLIMIT_AS
  std::atomic<bool> oom_dumped_{false};
  std::atomic<std::uint32_t> oom_dump_written_{0};  // futex word: 1 once the oom dump is written (or failed)
  std::atomic<std::uint64_t> oom_dump_waiters_{0};
  std::atomic<bool> writer_warm_{false};
  std::atomic<std::uint64_t> memory_polls_{0};
  std::atomic<std::uint64_t> memory_polls_allocating_{0};
};

inline Dumper g_dumper;

inline void Dumper::SignalHandler(int sig, siginfo_t* info, void* context) noexcept {
  g_dumper.OnSignalInfo(sig, info, context);
}
inline void Dumper::ForkChild() noexcept { g_dumper.RestartInChild(); }
inline bool Dumper::AllocFailed(std::size_t n) noexcept { return g_dumper.OnAllocFailed(n); }

}  // namespace detail
}  // namespace heapprof
