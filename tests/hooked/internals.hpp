// Test-only access to the engine's internals, for the hooked test files.
// Declared here and defined once, in main.cpp (the suite's implementation
// unit, which compiles the whole engine anyway), so that a test file does not
// compile the implementation's headers a second time: test_http.cpp and
// test_dumps.cpp did, at 32-39 s of CPU each per build (gcc -O2 -g), where a
// test file that includes only the light API compiles in 3-7 s.
// The objects below keep the engine's objects in their own storage: no
// allocation of theirs reaches the hooks (a sample would show up in the
// tests' profiles).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace heapprof_test {

// ---- the HTTP server with limits of the test's choosing (6_serving/http_server.hpp)
struct ServerLimits {
  std::size_t max_connections;
  std::int64_t head_timeout_ms;
  std::int64_t write_timeout_ms;
  std::size_t max_delta_windows;
  std::int64_t evict_grace_ms;  // kEvictGraceMs
};
ServerLimits DefaultServerLimits();

class LimitedServer {
 public:
  // Listens and starts the server's thread; if it cannot listen, port() is 0
  // (the engine's server keeps the reason; these tests listen on port 0).
  LimitedServer(const char* listen, const ServerLimits& limits);
  ~LimitedServer();
  LimitedServer(const LimitedServer&) = delete;
  LimitedServer& operator=(const LimitedServer&) = delete;
  std::uint16_t port() const;

 private:
  alignas(64) unsigned char storage_[1024];
};

std::size_t HttpMaxConnections();     // kMaxConnections
std::size_t HttpMaxDeltaWindows();    // kMaxDeltaWindows
std::size_t HttpStreamPieceBytes();   // kStreamPieceBytes
std::uint64_t HttpDeltaWindowsStarted();  // g_delta_windows_started
std::uint64_t HttpJobsQueued();  // g_jobs_queued
std::uint64_t HttpJobsBuilt();   // g_jobs_built
// g_listening_hook: called with a server's listening socket, under the
// server list's lock, right after listen() and right before it is closed.
void SetHttpListeningHook(void (*hook)(int listen_fd));
// g_retention_build_hook: called on the builder of a /retention profile, before its scan.
void SetHttpRetentionBuildHook(void (*hook)());
// The Date header line every response carries, for that time (AppendDateHeader).
std::string HttpDateHeader(std::int64_t unix_seconds);

// ---- profile files (6_serving/files.hpp)
// WriteFileAtomic: `bytes` to `path`; on failure `error` says why.
bool WriteFileAtomically(const std::string& path, const std::string& bytes, std::string& error);

// ---- profiles built in memory (5_encoding)
// The legacy text heap profile (BuildTextHeapProfile); `extra_comment`, if
// not null, is the line the extra-comments callback appends.
bool BuildTextProfile(std::string& out, const char* extra_comment = nullptr);

// A delta window's baseline (TakeBaseline), and the gzipped profile of what
// happened since (BuildProfileBytes with allocs as the default type).
class Baseline {
 public:
  Baseline();  // takes it now
  ~Baseline();
  Baseline(const Baseline&) = delete;
  Baseline& operator=(const Baseline&) = delete;
  std::int64_t time_nanos() const;
  bool BuildDeltaProfile(std::string& gz) const;

 private:
  alignas(64) unsigned char storage_[128];
};

std::uint64_t MonotonicNanos();  // the engine's clock (0_base/report.hpp)
void ReportLine(const std::string& line);  // "heapprof: <line>" where heapprof's lines go (0_base/report.hpp)

// The next profile encoding runs out of memory while symbolizing, with lines and with names only (builds with
// exceptions; 5_encoding/snapshot.hpp: EncodeGzippedSymbolized).
void FailNextSymbolization();

// While `on`, every load that finds DWARF runs out of memory at its end (builds with exceptions;
// 4_symbolization/debug_info.hpp: DebugObject::EnsureLoaded).
void FailDebugLoads(bool on);
std::size_t DebugInfoBytes();
// The next `n` symbol tables an encoding reads on first use fail as an open()
// refused with EMFILE (4_symbolization/symbolizer.hpp: Symbolizer::Table).
void FailTableLoads(int n);  // what the debug-info cache holds (4_symbolization/debug_memory.hpp)

}  // namespace heapprof_test
