// heapprof: what the HEAPPROF variable starts when the program starts (the
// dump thread, the HTTP server) and what runs at exit (the last dump, the
// leak report).
//
// StartFromEnv runs during static initialisation of the implementation unit
// (detail/implementation.hpp); without HEAPPROF in the environment it does
// nothing at all, so the profiler still starts only at its first use.
#pragma once

#include <atomic>
#include <cstdio>
#include <unistd.h>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/http.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"
#include "heapprof/detail/6_serving/dumps.hpp"
#include "heapprof/detail/6_serving/leak_report.hpp"

namespace heapprof {
namespace detail {

// HEAPPROF=http=host:port: a server for the life of the process, stopped by
// the exit actions before the exit dump and the leak report.
inline HttpServer* g_env_http_server = nullptr;

inline void StopEnvHttpServer() noexcept {
  ReentrancyGuard guard;
  HttpServer* server = g_env_http_server;
  g_env_http_server = nullptr;
  ArenaDeleter<HttpServer>()(server);
}

// atexit (see engine.hpp): stop the server and the dump thread, then the
// last dump and the leak report.
inline void RunExitActions() {
  if (g_env_http_server != nullptr) StopEnvHttpServer();
  g_dumper.Stop();
  const EnvConfig& cfg = g_env_config;
  // On a stack with room (files.hpp): exit() may be called on a thread of
  // 16 KiB, deep in the exit machinery already.
  auto dumps = [&]() noexcept {
    if (cfg.dump_at_exit) g_dumper.Dump("dump_at_exit");
    if (cfg.peak_at_exit) g_dumper.DumpNamed("peak", true, "peak_at_exit");
  };
  RunWithBuildStack(dumps);
  if (cfg.leak_report && LeakReport(g_dumper.Prefix(), g_dumper.FromStartDir(cfg.leak_suppressions)) &&
      cfg.leak_exit_code >= 0) {
    // LeakSanitizer's exitcode: the status says that unreachable objects remain.
    std::fflush(nullptr);
    _exit(cfg.leak_exit_code);
  }
}

// The program's threads have all ended (host_threads.hpp): called on the
// dump thread or an HTTP server's. The process ends as glibc ends one whose
// last thread ends, with exit(0), so the exit actions run (here, as on any
// exiting thread: the profiler's guard is dropped, or RunExitHook would take
// this for an exit from inside the profiler and skip them). On a server's
// thread, RunExitActions leaves HEAPPROF=http's server running (stopping it
// would join and free the thread it runs on); the exit ends it. The thread is
// the program's last one from here on: the program's exit handlers and
// static destructors run on it, and what they allocate is the program's,
// from its allocator, sampled and in the exit dump and the leak report (it
// was served from the profiler's arena, unrecorded: tls_profiler_thread).
inline void EndWithProgramThreads() noexcept {
  static std::atomic<bool> ending{false};
  if (ending.exchange(true, std::memory_order_acq_rel)) return;  // another of our threads ends it
  if (!tls_dump_thread) g_env_http_server = nullptr;
  tls_profiler_thread = false;
  tls_thread_flags.guard = 0;
  std::exit(0);
}

inline void StartHttpFromEnv() noexcept {
  const char* listen = g_env_config.http;
  if (listen[0] == '\0') return;
  ReentrancyGuard guard;
  void* memory = g_arena.AllocateUninitialized(sizeof(HttpServer));  // never the host's heap
  if (memory == nullptr) return;
  HttpServer* server = new (memory) HttpServer(listen, std::nothrow);
  if (!server->serving()) {
    HEAPPROF_TRY { ReportLine(ArenaString("HEAPPROF http=") + listen + ": " + server->error() + "; not serving"); }
    HEAPPROF_CATCH_ALL_NOEXCEPT {}
    ArenaDeleter<HttpServer>()(server);
    return;
  }
  g_env_http_server = server;
  HEAPPROF_TRY {
    ArenaString host(listen, static_cast<std::size_t>(std::strrchr(listen, ':') - listen));
    if (host.empty() || host == "localhost") host = "127.0.0.1";
    const ArenaString url = "http://" + host + ":" + ArenaDecimal(server->port()) + "/debug/pprof/";
    ReportLine("serving " + url + " (go tool pprof " + url + "heap)");
  }
  HEAPPROF_CATCH_ALL_NOEXCEPT {}
}

inline bool StartFromEnv() noexcept {
  if (secure_getenv("HEAPPROF") == nullptr) return false;  // see engine.hpp: not in setuid programs
  EnsureInit();  // parses HEAPPROF unless the first allocation already did
  const EnvConfig& cfg = g_env_config;
  // These only shape the leak report: without it they did nothing, silently
  // (a CI job with leak_exit_code=23 and no leak_report=1 never failed).
  if (!cfg.leak_report && (cfg.leak_exit_code >= 0 || cfg.leak_suppressions[0] != '\0' || cfg.leak_frames != 0)) {
    ReportRaw("heapprof: HEAPPROF: leak_exit_code, leak_suppressions and leak_frames have no effect without "
              "leak_report=1\n");
  }
  // Before the threads start: they end the process once the program's
  // threads have all ended (a main() that calls pthread_exit()).
  g_end_with_program.store(&EndWithProgramThreads, std::memory_order_release);
  g_dumper.Start(cfg);
  StartHttpFromEnv();
  if (cfg.dump_at_exit || cfg.peak_at_exit || cfg.leak_report || cfg.WantsDumper() || g_env_http_server != nullptr) {
    g_exit_hook.store(&RunExitActions);
  }
  return true;
}

}  // namespace detail
}  // namespace heapprof
