// Child processes for the automatic-dump tests (test_dumps.cpp). Each runs
// with its own HEAPPROF; HEAPPROF_TEST_DIR is where the dumps go.
#pragma once

#include <heapprof.hpp>
#include "heapprof/detail/6_serving/startup.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <cstring>
#include <string>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <thread>
#include <chrono>
#include <vector>

#include "support/http_client.hpp"
#include "support/inflate.hpp"
#include "support/profile_decoder.hpp"
#include "internals.hpp"

namespace heapprof_test {

inline void* volatile g_dump_sink;

// True once `path` exists; waits for the dump thread (a condition with a
// deadline, not a fixed sleep).
inline bool WaitForFile(const std::string& path, int seconds = 20) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  struct stat st {};
  while (::stat(path.c_str(), &st) != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

inline std::string DumpPath(unsigned seq) {
  char name[96];
  std::snprintf(name, sizeof name, "/p.%ld.%04u.heap.pb.gz", static_cast<long>(getpid()), seq);
  return std::string(std::getenv("HEAPPROF_TEST_DIR")) + name;
}

__attribute__((noinline)) inline char* LeakedByTest(std::size_t n) {
  char* p = new char[n];
  g_dump_sink = p;
  return p;
}

// dump_interval / inuse_interval: allocate (and keep) 1 MiB + 64 KiB at a time
// and wait for the dump each step must trigger. The extra 64 KiB absorbs the
// few hundred bytes by which in-use bytes read low after each dump (unsized
// deletes inside libstdc++ count malloc_usable_size, see README).
inline int RunDumpBytes() {
  std::vector<char*> keep;
  for (unsigned i = 1; i <= 3; ++i) {
    keep.push_back(LeakedByTest((std::size_t{1} << 20) + (64 << 10)));
    if (!WaitForFile(DumpPath(i))) return 10 + static_cast<int>(i);
  }
  for (char* p : keep) delete[] p;
  return 0;
}

// dump_time=1: one dump within a few seconds, unprompted.
inline int RunDumpTime() { return WaitForFile(DumpPath(1)) && WaitForFile(DumpPath(2)) ? 0 : 10; }

// dump_signal=USR1: each signal gives one dump.
inline int RunDumpSignal() {
  for (unsigned i = 1; i <= 2; ++i) {
    std::raise(SIGUSR1);
    if (!WaitForFile(DumpPath(i))) return 10 + static_cast<int>(i);
  }
  return 0;
}

// dump_signal=USR1 in a program that closes every descriptor it did not
// open (a daemon: closefrom(3), python-daemon, os.closerange) and then opens
// files of its own, which get the lowest numbers again: the signals still
// dump, nothing is written into the program's files, and the dump thread
// sleeps. (It used to poll a pipe whose numbers were now those files:
// the handler wrote its byte into one, and poll() returned at once, always.)
inline int RunDumpSignalClosedFds() {
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  const std::string dir = std::getenv("HEAPPROF_TEST_DIR");
  int files[4];
  for (int i = 0; i < 4; ++i) {
    files[i] = ::open((dir + "/program." + std::to_string(i)).c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
    if (files[i] < 0) return 9;
  }
  for (unsigned i = 1; i <= 2; ++i) {
    std::raise(SIGUSR1);
    if (!WaitForFile(DumpPath(i))) return 10 + static_cast<int>(i);
  }
  for (int fd : files) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size != 0) return 20;
  }
  // CPU time over half a second of waiting (a measurement window, not a
  // synchronisation): a thread spinning on poll() takes nearly all of it.
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  getrusage(RUSAGE_SELF, &after);
  const auto micros = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000L + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
  };
  std::printf("cpu while waiting: %ld us\n", micros(after) - micros(before));
  if (micros(after) - micros(before) > 150000) return 30;
  for (int fd : files) ::close(fd);
  return 0;
}

// dump_signal=TERM where TERM did not end the process before heapprof came:
// each of three signals gives a dump, and then what the disposition before
// heapprof's did. "dump_signal_handler": the program's handler, installed
// before heapprof's start-up (InstallEarlyTermHandler), runs once per signal.
inline volatile std::sig_atomic_t g_term_handled = 0;
inline void CountTerm(int) { g_term_handled = g_term_handled + 1; }
// "dump_signal_resethand": the program's handler asked for SA_RESETHAND and
// for SIGUSR2 blocked while it runs (sa_mask): the first TERM dumps and runs
// it, with SIGUSR2 blocked; the second dumps and ends the process (SIG_DFL).
inline volatile std::sig_atomic_t g_term_mask_ok = 0;
inline void CountTermMasked(int) {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  g_term_mask_ok = sigismember(&now, SIGUSR2) == 1 && sigismember(&now, SIGTERM) == 1;
  g_term_handled = g_term_handled + 1;
}
inline void InstallEarlyTermHandler() {
  const char* child = std::getenv("HEAPPROF_TEST_CHILD");
  if (child == nullptr) return;
  const bool resethand = std::strcmp(child, "dump_signal_resethand") == 0;
  if (std::strcmp(child, "dump_signal_handler") != 0 && !resethand) return;
  struct sigaction sa {};
  sa.sa_handler = resethand ? &CountTermMasked : &CountTerm;
  sigemptyset(&sa.sa_mask);
  if (resethand) {
    sigaddset(&sa.sa_mask, SIGUSR2);
    sa.sa_flags = SA_RESETHAND;
  }
  sigaction(SIGTERM, &sa, nullptr);
}
inline int RunDumpSignalResetHand() {
  std::raise(SIGTERM);
  if (!WaitForFile(DumpPath(1))) return 11;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (g_term_handled < 1) {  // forwarded by the dump thread after the dump
    if (std::chrono::steady_clock::now() > deadline) return 12;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!g_term_mask_ok) return 13;
  std::printf("handled once, mask kept\n");
  std::fflush(stdout);
  std::raise(SIGTERM);  // dumps, then the default action ends the process
  if (!WaitForFile(DumpPath(2))) return 14;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return g_term_handled > 1 ? 15 : 16;  // still alive: the handler ran again (15) or nothing ended us (16)
}
// dump_signal=TERM arriving while the program exits, TERM's default
// disposition: the process still ends by the signal (status 128 + 15 in the
// shell), not with the status it was exiting with. "dump_signal_term_exiting":
// raised by the program's atexit handler, which runs just before heapprof's
// exit actions (the dump thread may not have taken it yet): dumped once.
// "dump_signal_term_exited": raised by a destructor function, which runs after
// them (no dump thread left): ends the process without a dump.
inline volatile std::sig_atomic_t g_term_in_destructor = 0;
inline void RaiseTermAtExit() { std::raise(SIGTERM); }
inline int RunDumpSignalTermExiting() {
  std::atexit(&RaiseTermAtExit);
  return 0;
}
inline int RunDumpSignalTermExited() {
  g_term_in_destructor = 1;
  return 0;
}
__attribute__((destructor)) inline void RaiseTermInDestructor() {
  if (g_term_in_destructor) std::raise(SIGTERM);
}
// exec() keeps the pid: "dump_then_exec" dumps once (dump_signal=USR1),
// then execs this program again as "exec_image", which only exits (its
// dump_at_exit is the pid's second dump, not a new 0001 over the first).
// HEAPPROF_TEST_STALE_TMP=1: before the exec, the temporaries an exec in
// the middle of the next dump would have left (numbers 0-3 of this pid): the
// new image's first write must pass over them, not fail with EEXIST.
inline int RunDumpThenExec() {
  std::raise(SIGUSR1);
  if (!WaitForFile(DumpPath(1))) return 11;
  if (std::getenv("HEAPPROF_TEST_STALE_TMP") != nullptr) {
    for (int i = 0; i < 4; ++i) {
      const std::string stale = DumpPath(2) + ".tmp." + std::to_string(getpid()) + "." + std::to_string(i);
      FILE* f = std::fopen(stale.c_str(), "wx");
      if (f == nullptr) return 14;
      std::fclose(f);
    }
  }
  if (::setenv("HEAPPROF_TEST_CHILD", "exec_image", 1) != 0) return 12;
  ::execl("/proc/self/exe", "hooked_tests", static_cast<char*>(nullptr));
  return 13;
}
inline int RunDumpSignalTerm(bool handler) {
  for (int i = 1; i <= 3; ++i) {
    std::raise(SIGTERM);
    if (!WaitForFile(DumpPath(static_cast<unsigned>(i)))) return 10 + i;
    if (handler) {  // forwarded by the dump thread after the dump: wait for it
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (g_term_handled < i) {
        if (std::chrono::steady_clock::now() > deadline) return 20 + i;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }
  return handler && g_term_handled != 3 ? 30 : 0;
}

// "dump_signal_ignored": started with TERM ignored (`trap '' TERM`, as nohup
// does for HUP) under dump_signal=TERM. The signal stays ignored: what the
// program sees (it may install its own handler only over SIG_IGN's absence,
// as GNU make and the JVM do), what a program it runs inherits (exec resets a
// handler to SIG_DFL, keeps SIG_IGN: a shell that sends itself TERM lives
// on), and what a TERM does here (nothing, no dump).
inline int RunDumpSignalIgnored() {
  const int status = std::system("kill -TERM $$ && echo 'a child shell survived its TERM'");
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 13;
  struct sigaction now {};
  if (sigaction(SIGTERM, nullptr, &now) != 0) return 11;
  if ((now.sa_flags & SA_SIGINFO) != 0 || now.sa_handler != SIG_IGN) return 12;
  std::raise(SIGTERM);
  return 0;
}

// dump_at_exit / leak_report: leave 5 x 3000 B from LeakedByTest live. Held
// by a global, so LeakSanitizer (ASan builds) counts them reachable.
inline char* g_left_at_exit[5];
// And a vector whose buffer comes from inside the standard library
// (std::__new_allocator::allocate and friends, inlined or not): the leak
// report's row must still start at the function that made the vector.
inline std::vector<int>* g_left_vector = nullptr;
__attribute__((noinline)) inline void LeakedVectorByTest() {
  g_left_vector = new std::vector<int>(1000);
  asm volatile("" : : "r"(g_left_vector) : "memory");
}
inline int RunDumpExit() {
  for (char*& p : g_left_at_exit) p = LeakedByTest(3000);
  LeakedVectorByTest();
  for (int i = 0; i < 50; ++i) delete[] LeakedByTest(100);
  return 0;
}

// An earlier process of this pid (a container's pid 1 restarted, pids
// reused) left its exit files under the names this one would take: they are
// made here, each holding "earlier", then RunDumpExit.
inline int RunDumpExitPidReused() {
  for (const char* kind : {"leaks", "retention", "peak"}) {
    char name[96];
    std::snprintf(name, sizeof name, "/p.%ld.%s.pb.gz", static_cast<long>(getpid()), kind);
    std::FILE* f = std::fopen((std::string(std::getenv("HEAPPROF_TEST_DIR")) + name).c_str(), "w");
    if (f == nullptr) return 9;
    std::fputs("earlier", f);
    std::fclose(f);
  }
  return RunDumpExit();
}

// A program that closed stderr after start-up (a daemon) and whose next
// descriptor took number 2 (HEAPPROF_TEST_STDERR says which):
// - "file": its own data file, opened for reading and writing: heapprof's
//   lines at exit (the dump's "wrote", the leak table) must not land in it;
// - "append": a log file opened for appending (a redirection of stderr):
//   they go there;
// - "socket": an accepted client's socket (a socketpair here): a line must
//   not reach the peer (exit 21 if it did);
// - "pipe": stderr moved to a logger's pipe with dup2: the line reaches it
//   (exit 22 if not).
inline int RunStderrReused() {
  const char* mode = std::getenv("HEAPPROF_TEST_STDERR");
  const std::string dir = std::getenv("HEAPPROF_TEST_DIR");
  if (mode == nullptr) return 10;
  const std::string m = mode;
  if (m != "pipe") ::close(2);  // (the pipe replaces stderr with dup2)
  if (m == "file" || m == "append") {
    const int fd = m == "file" ? ::open((dir + "/data.db").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644)
                               : ::open((dir + "/app.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd != 2) return 11;
    if (::write(fd, "DATA\n", 5) != 5) return 12;
    return RunDumpExit();
  }
  int sv[2];
  if (m == "socket") {
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0 || sv[0] != 2) return 13;
  } else if (m == "pipe") {
    if (::pipe(sv) != 0 || ::dup2(sv[1], 2) != 2) return 14;
    sv[1] = sv[0];  // read the line from here
  } else {
    return 16;
  }
  ReportLine("a line for the program's stderr");
  char buf[128];
  if (::fcntl(sv[1], F_SETFL, O_NONBLOCK) != 0) return 17;  // nothing written: no wait
  const ssize_t n = ::read(sv[1], buf, sizeof buf);
  if (m == "socket") return n < 0 && errno == EAGAIN ? 0 : 21;
  return n > 0 && std::string(buf, static_cast<std::size_t>(n)).find("heapprof: a line for") == 0 ? 0 : 22;
}

// HEAPPROF=http=127.0.0.1:0: the server started from the environment answers
// its own process, and the leak report at exit runs after it is stopped.
inline int RunHttpEnv() {
  heapprof::HttpServer* server = heapprof::detail::g_env_http_server;
  if (server == nullptr) return 10;
  const HttpResponse r = HttpGet(server->port(), "/debug/pprof/heap");
  if (r.status != 200) return 11;
  std::string raw;
  Profile p;
  if (!Gunzip(r.body, raw) || !DecodeProfile(raw, p) || !Validate(p)) return 12;
  for (char*& q : g_left_at_exit) q = LeakedByTest(3000);
  return 0;
}

// HEAPPROF=http=127.0.0.1:0 in a program that, once served, closes every
// descriptor it did not open (a daemon: closefrom(3), os.closerange) and
// opens 4 files of its own under HEAPPROF_TEST_DIR, which get the numbers of
// the server's socket and eventfd, and leaves them open: the test checks
// that they stay empty (Stop at exit wrote 8 bytes into one) and that the
// exit does not hang (the server thread's poll() on the closed descriptors
// never returned, and Stop joined it).
inline int RunHttpEnvClosedFds() {
  heapprof::HttpServer* server = heapprof::detail::g_env_http_server;
  if (server == nullptr) return 10;
  if (HttpGet(server->port(), "/debug/pprof/heap").status != 200) return 11;
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  const std::string dir = std::getenv("HEAPPROF_TEST_DIR");
  for (int i = 0; i < 4; ++i) {
    if (::open((dir + "/program." + std::to_string(i)).c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600) < 0) {
      return 12;
    }
  }
  // Once the server has seen it (it checks at least once a second), it no
  // longer says it serves.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (server->serving() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (server->serving() || std::strstr(server->error(), "closed its socket") == nullptr) return 13;
  return 0;
}

// debug_retry: 16 profile writes in which every load that finds DWARF runs
// out of memory at its end (FailDebugLoads). A write stops at the first such
// object, so were a failed object left marked loaded, each write would leave
// one more so, and the later ones would have names. Each failed load must
// give back all it took: the debug-info cache holds as much after the 16th
// failing write as after the first. Then one write without the failures
// must load the DWARF again. Writes HEAPPROF_TEST_DIR/first.pb.gz (the last
// failing write) and second.pb.gz.
__attribute__((noinline)) inline char* DebugRetryLeaf(std::size_t n) {
  char* p = new char[n];
  g_dump_sink = p;
  return p;
}
inline int RunDebugRetry() {
  const std::string dir = std::getenv("HEAPPROF_TEST_DIR");
  std::vector<char*> keep;
  for (int i = 0; i < 3; ++i) keep.push_back(DebugRetryLeaf(4000));
  FailDebugLoads(true);
  bool first = heapprof::WriteHeapProfile(dir + "/first.pb.gz");
  const std::size_t after_one = DebugInfoBytes();  // the cache's own tables, the objects' records
  for (int i = 1; i < 16; ++i) first &= heapprof::WriteHeapProfile(dir + "/first.pb.gz");
  const std::size_t after_all = DebugInfoBytes();  // the same: each failed load gave back what it took
  FailDebugLoads(false);
  std::printf("debug_bytes after_one=%zu after_all=%zu\n", after_one, after_all);
  const bool second = heapprof::WriteHeapProfile(dir + "/second.pb.gz");
  for (char* p : keep) delete[] p;
  return first && second ? 0 : 3;
}

// Under RLIMIT_FSIZE (`ulimit -f`) a profile larger than the limit: the
// write past it raised SIGXFSZ, whose default action ended the process (and
// left the temporary file). Now WriteHeapProfile returns false, no SIGXFSZ is
// left pending, and the exit dump (HEAPPROF=dump_at_exit=1, on this thread,
// at exit) fails with one line too.
inline int RunFileSizeLimit() {
  const std::string dir = std::getenv("HEAPPROF_TEST_DIR");
  for (char*& p : g_left_at_exit) p = LeakedByTest(3000);
  const rlimit limit{64, 64};
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
  if (heapprof::WriteHeapProfile(dir + "/heap.pb.gz")) return 11;  // a profile is more than 64 bytes
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) != 0 || sigismember(&pending, SIGXFSZ) != 0) return 12;
  std::printf("still running after the write\n");
  std::fflush(stdout);
  return 0;
}

// A daemon's chdir("/") after start-up, with a relative dump_prefix: the exit
// dump and the leak profile still go under the directory it started in.
inline int RunDumpAfterChdir() {
  for (char*& p : g_left_at_exit) p = LeakedByTest(3000);
  return ::chdir("/") == 0 ? 0 : 10;
}

// Objects live at exit at HEAPPROF's rate, then more after SetSampleRate(the
// rate in HEAPPROF_TEST_RATE_AFTER): the leak report's first line says how
// its figures were obtained.
// Kept reachable: LeakSanitizer (ASan builds) checks at exit.
inline char* g_rate_change_kept[105];
inline int RunLeakRateChange() {
  for (int i = 0; i < 100; ++i) g_rate_change_kept[i] = LeakedByTest(10000);
  const char* after = std::getenv("HEAPPROF_TEST_RATE_AFTER");
  heapprof::SetSampleRate(after != nullptr ? std::strtoull(after, nullptr, 10) : 1);
  for (int i = 100; i < 105; ++i) g_rate_change_kept[i] = LeakedByTest(3000);
  return 0;
}

// A thread still running (never in a system call) when the process exits,
// holding a buffer only on its stack.
inline std::atomic<bool> g_spinner_started{false};
inline int RunLeakRunningThread() {
  std::thread([] {
    char* volatile mine = new char[4096];
    g_spinner_started.store(true);
    for (;;) mine[0] = static_cast<char>(mine[0] + 1);
  }).detach();
  while (!g_spinner_started.load()) {
  }
  return 0;
}

// dump_signal=USR1 in a program whose default thread stack is small
// (pthread_setattr_default_np, as `ulimit -s` sets it at start-up): the
// profiler's threads made after it (the dump thread of a forked child, an
// HttpServer's) took that size, and a profile's build overflowed it (SIGSEGV).
inline int RunSmallDefaultStack() {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, 16384) != 0 ||
      pthread_setattr_default_np(&attr) != 0) {
    return 10;
  }
  pthread_attr_destroy(&attr);
  const pid_t child = ::fork();
  if (child < 0) return 11;
  if (child == 0) {  // a dump thread restarted under the small default
    std::raise(SIGUSR1);
    ::_exit(WaitForFile(DumpPath(1), 60) ? 0 : 1);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child) return 12;
  if (!WIFEXITED(status)) return 13;  // killed by SIGSEGV before
  if (WEXITSTATUS(status) != 0) return 14;
  heapprof::HttpServer server("127.0.0.1:0");  // its threads under the small default
  if (!server.serving()) return 15;
  const HttpResponse r = HttpGet(server.port(), "/debug/pprof/heap");
  std::string raw;
  Profile p;
  return r.status == 200 && Gunzip(r.body, raw) && DecodeProfile(raw, p) && Validate(p) ? 0 : 16;
}

inline int RunDumpScenario(const char* name, bool& known) {
  known = true;
  if (std::strcmp(name, "dump_bytes") == 0) return RunDumpBytes();
  if (std::strcmp(name, "dump_time") == 0) return RunDumpTime();
  if (std::strcmp(name, "dump_signal") == 0) return RunDumpSignal();
  if (std::strcmp(name, "dump_signal_closed_fds") == 0) return RunDumpSignalClosedFds();
  if (std::strcmp(name, "dump_signal_ignored") == 0) return RunDumpSignalIgnored();
  if (std::strcmp(name, "dump_signal_handler") == 0) return RunDumpSignalTerm(true);
  if (std::strcmp(name, "dump_signal_resethand") == 0) return RunDumpSignalResetHand();
  if (std::strcmp(name, "dump_signal_term_exiting") == 0) return RunDumpSignalTermExiting();
  if (std::strcmp(name, "dump_signal_term_exited") == 0) return RunDumpSignalTermExited();
  if (std::strcmp(name, "dump_then_exec") == 0) return RunDumpThenExec();
  if (std::strcmp(name, "exec_image") == 0) return 0;
  if (std::strcmp(name, "dump_exit") == 0) return RunDumpExit();
  if (std::strcmp(name, "dump_exit_pid_reused") == 0) return RunDumpExitPidReused();
  if (std::strcmp(name, "stderr_reused") == 0) return RunStderrReused();
  if (std::strcmp(name, "http_env") == 0) return RunHttpEnv();
  if (std::strcmp(name, "http_env_closed_fds") == 0) return RunHttpEnvClosedFds();
  if (std::strcmp(name, "debug_retry") == 0) return RunDebugRetry();
  if (std::strcmp(name, "file_size_limit") == 0) return RunFileSizeLimit();
  if (std::strcmp(name, "dump_after_chdir") == 0) return RunDumpAfterChdir();
  if (std::strcmp(name, "leak_rate_change") == 0) return RunLeakRateChange();
  if (std::strcmp(name, "leak_running_thread") == 0) return RunLeakRunningThread();
  if (std::strcmp(name, "small_default_stack") == 0) return RunSmallDefaultStack();
  known = false;
  return 2;
}

}  // namespace heapprof_test
