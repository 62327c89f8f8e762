// The hooked test program: the global operator new/delete replacement is
// defined here, in exactly one translation unit, as a user program would.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <doctest/doctest.h>  // its implementation: tests/support/doctest_impl.cpp

#include <cstdlib>
#include <cstring>
#include <new>

#include "child_scenarios.hpp"
#include "internals.hpp"

// ---------------------------------------------------------------- internals.hpp
namespace heapprof_test {
namespace hd = heapprof::detail;

ServerLimits DefaultServerLimits() {
  const hd::http::Limits d;
  return ServerLimits{d.max_connections, d.head_timeout_ms, d.write_timeout_ms, d.max_delta_windows, d.evict_grace_ms};
}

static_assert(sizeof(hd::http::Server) <= 1024 && alignof(hd::http::Server) <= 64, "LimitedServer: storage_ too small");
LimitedServer::LimitedServer(const char* listen, const ServerLimits& limits) {
  hd::http::Limits l;
  l.max_connections = limits.max_connections;
  l.head_timeout_ms = limits.head_timeout_ms;
  l.write_timeout_ms = limits.write_timeout_ms;
  l.max_delta_windows = limits.max_delta_windows;
  l.evict_grace_ms = limits.evict_grace_ms;
  new (storage_) hd::http::Server(listen, l);
}
LimitedServer::~LimitedServer() { std::launder(reinterpret_cast<hd::http::Server*>(storage_))->~Server(); }
std::uint16_t LimitedServer::port() const { return std::launder(reinterpret_cast<const hd::http::Server*>(storage_))->port(); }

std::size_t HttpMaxConnections() { return hd::http::kMaxConnections; }
std::size_t HttpMaxDeltaWindows() { return hd::http::kMaxDeltaWindows; }
std::size_t HttpStreamPieceBytes() { return hd::http::kStreamPieceBytes; }
std::uint64_t HttpDeltaWindowsStarted() { return hd::http::g_delta_windows_started.load(); }
std::uint64_t HttpJobsQueued() { return hd::http::g_jobs_queued.load(); }
std::uint64_t HttpJobsBuilt() { return hd::http::g_jobs_built.load(); }
void SetHttpListeningHook(void (*hook)(int)) { hd::http::g_listening_hook = hook; }
void SetHttpRetentionBuildHook(void (*hook)()) { hd::http::g_retention_build_hook = hook; }
std::string HttpDateHeader(std::int64_t unix_seconds) {
  hd::ArenaString out;
  hd::http::AppendDateHeader(out, unix_seconds);
  return std::string(out.data(), out.size());
}

bool WriteFileAtomically(const std::string& path, const std::string& bytes, std::string& error) {
  hd::ArenaString e;
  const bool ok = hd::WriteFileAtomic(hd::ArenaString(path.data(), path.size()),
                                      hd::ArenaString(bytes.data(), bytes.size()), &e);
  error.assign(e.data(), e.size());
  return ok;
}

namespace {
const char* g_extra_comment = nullptr;
void AppendExtraComment(hd::ArenaString& s) { s += g_extra_comment; }
}  // namespace

bool BuildTextProfile(std::string& out, const char* extra_comment) {
  hd::ArenaString built;
  g_extra_comment = extra_comment;
  const bool ok = hd::BuildTextHeapProfile(built, extra_comment != nullptr ? &AppendExtraComment : nullptr);
  if (ok) out.assign(built.data(), built.size());
  return ok;
}

static_assert(sizeof(hd::ProfileBaseline) <= 128 && alignof(hd::ProfileBaseline) <= 64, "Baseline: storage_ too small");
Baseline::Baseline() { new (storage_) hd::ProfileBaseline(hd::TakeBaseline()); }
Baseline::~Baseline() { std::launder(reinterpret_cast<hd::ProfileBaseline*>(storage_))->~ProfileBaseline(); }
std::int64_t Baseline::time_nanos() const { return std::launder(reinterpret_cast<const hd::ProfileBaseline*>(storage_))->time_nanos; }
bool Baseline::BuildDeltaProfile(std::string& gz) const {
  hd::ArenaString built;
  const bool ok = hd::BuildProfileBytes(true, built, std::launder(reinterpret_cast<const hd::ProfileBaseline*>(storage_)));
  if (ok) gz.assign(built.data(), built.size());
  return ok;
}

std::uint64_t MonotonicNanos() { return hd::MonotonicNanos(); }
void ReportLine(const std::string& line) { hd::ReportLine(line); }
// Both encodings with names of the next write (with lines, then names only).
void FailNextSymbolization() {
  hd::g_symbolize_oom_thread.store(pthread_self());
  hd::g_symbolize_oom_for_tests.store(2);
}
void FailDebugLoads(bool on) { hd::g_fail_debug_loads_for_tests.store(on); }
void FailTableLoads(int n) { hd::g_fail_table_loads_for_tests.store(n); }
std::size_t DebugInfoBytes() { return hd::g_debug_info_bytes.load(); }

}  // namespace heapprof_test

// The new_handler tests ask malloc for absurd sizes and expect it to say no,
// as glibc does; the sanitizers' allocators must say no too, not abort.
#if defined(HEAPPROF_ASAN)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif
#if defined(HEAPPROF_TSAN)
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#endif

// A program's own SIGTERM handler, in place before heapprof's start-up (this
// unit's static initialisation) installs dump_signal's (dump_signal_handler).
__attribute__((constructor(101))) static void InstallEarlyHandlers() { heapprof_test::InstallEarlyTermHandler(); }

// Out of main, so that main's own frame stays small (see below).
__attribute__((noinline)) static int RunDoctest(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return context.run();
}

int main(int argc, char** argv) {
  // Some scenarios (allocation in static destructors, fork) need a process of
  // their own: the tests re-run this binary with HEAPPROF_TEST_CHILD set.
  if (const char* child = std::getenv("HEAPPROF_TEST_CHILD")) {
    // Called from main itself: its dead frame is where exit()'s frames go
    // once main returns (test_retention.cpp).
    if (std::strcmp(child, "retention_stale_stack_main") == 0) return heapprof_test::RunRetentionStaleStackMain();
    return heapprof_test::RunChild(child);
  }
  int rc = RunDoctest(argc, argv);
  asm volatile("" : "+r"(rc));  // no tail call: main stays in every test's stack (test_extremes looks for it)
  return rc;
}
