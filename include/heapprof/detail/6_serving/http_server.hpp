// heapprof: the HTTP server behind heapprof::HttpServer (heapprof/http.hpp),
// serving profiles the way Go's net/http/pprof does.
//
// One background thread runs a poll() loop over non-blocking sockets; a
// second one builds the profiles (and symbolz answers), so the index, and
// every connection's reads and writes, never wait for a build; a third builds
// the /retention profiles (a scan of the process), so no scrape waits for a
// scan. The ?debug=1
// text is streamed: produced in pieces of kStreamPieceBytes, the next once the
// client has taken the last, so a connection holds one piece, not the whole
// text. Every allocation of these threads is under the reentrancy guard, so the
// server never shows up in the profiles it serves. Paths, parameters, headers and messages follow
// net/http/pprof (see README.md, "Serving profiles over HTTP"):
//   /debug/pprof/                 HTML index
//   /debug/pprof/heap, /allocs    gzip'ed pprof (?debug=1: Go's legacy text,
//                                 ?seconds=N: the delta over the next N s)
//   /debug/pprof/peak             the peak profile (?debug=1 likewise;
//                                 ?seconds=N: the peak of the next N s, in a window of
//                                 the server's own: one at a time, a second gets a 503)
//   /debug/pprof/retention        the retention profile (gzip'ed pprof only)
//   /debug/pprof/symbol           pprof's symbolz (GET, or POST with the addresses
//                                 as the body; `Expect: 100-continue` answered)
//   /debug/pprof/cmdline          the program's arguments, NUL-separated
// Every response closes its connection. Limits (why: a profiling port must
// never hurt the service): kMaxConnections open at once (a newcomer beyond
// them evicts the connection that has waited longest for its head, once it
// has waited kEvictGraceMs; with none to evict, it gets a 503),
// kMaxDeltaWindows ?seconds= windows at once (more get a 503),
// kHeadTimeoutMs to send the request head (slow clients get a 408),
// kWriteTimeoutMs without taking any of the response, heads of at most 8 KiB / 64 fields.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <linux/sockios.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <csignal>
#include <pthread.h>
#include <string>
#include <optional>
#include <string_view>
#include <deque>
#include <vector>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/0_base/host_threads.hpp"
#include "heapprof/detail/0_base/proc_self.hpp"
#include "heapprof/api.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/2_sampling/thread_registry.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "heapprof/detail/5_encoding/snapshot.hpp"
#include "heapprof/detail/5_encoding/text_profile.hpp"
#include "heapprof/detail/6_serving/http_parser.hpp"
#include "heapprof/detail/6_serving/retention.hpp"

namespace heapprof {
namespace detail {
namespace http {

constexpr std::size_t kMaxConnections = 64;
// Connections turned away with a 503 that may drain at once, at least (more
// get the 503 and a close at once, which the client may see as a reset). Not
// fewer than this whatever the limit: with a limit of 1, a client connecting
// right after another's 503 (whose end the server had not yet seen) got a
// reset 1 run in ~10 on a loaded machine (test_http's 503 test).
constexpr std::size_t kMinTurnedAway = 4;
constexpr std::int64_t kHeadTimeoutMs = 10000;
// Every slot taken, a newcomer evicts the connection that has waited longest
// for its request head (or a /symbol body), once that one has waited this
// long since its accept: it gets the 408 the head timeout gives. Without
// this, 64 clients that send half a request and stop (slowloris) held every
// slot until their 408s (10 s) and the drain after them: every scraper got a
// 503 meanwhile. Only connections still sending their request are evicted,
// never one whose response is being built or written, nor a ?seconds=
// window: a client reconnecting all the time cannot take a slot from a
// request in progress. 1 s: a real client writes its head as soon as it has
// connected, so it arrives one path's latency after the accept, and 1 s
// covers a path of a few hundred ms with a lost segment resent (Linux's
// shortest retransmission timeout is 200 ms); a slow client holds a slot 1 s,
// not 10 + 2 s. Meanwhile the newcomer waits in the listen backlog (the
// listening socket is not polled until then), not turned away. A client
// opening such connections faster than 64 a second still fills the backlog,
// and others' connects wait (README, "Serving profiles over HTTP").
constexpr std::int64_t kEvictGraceMs = 1000;
constexpr std::int64_t kWriteTimeoutMs = 60000;
// After the response, unread request bytes are read and dropped for up to
// this long (or kDrainBytes) before closing: closing a socket with unread
// input sends a reset, which can destroy the response before the client reads
// it (the 431 answer to an oversized head, say).
constexpr std::int64_t kDrainTimeoutMs = 2000;
constexpr std::size_t kDrainBytes = 1 << 20;
// A streamed ?debug=1 text response is produced in pieces of about this
// size, the next one once the client has taken the last.
constexpr std::size_t kStreamPieceBytes = 256 * 1024;
// ?seconds=N windows open at once: more get a 503 at once. A window holds a
// connection for up to an hour; without this cap 64 of them took every slot.
constexpr std::size_t kMaxDeltaWindows = 4;

// The limits above, as one value a test can shrink.
struct Limits {
  std::size_t max_connections = kMaxConnections;
  std::int64_t head_timeout_ms = kHeadTimeoutMs;
  std::int64_t write_timeout_ms = kWriteTimeoutMs;
  std::size_t max_delta_windows = kMaxDeltaWindows;
  std::int64_t evict_grace_ms = kEvictGraceMs;
};

// Delta windows (?seconds=N) whose baseline has been taken, over all servers:
// lets a test allocate strictly inside a window without sleeping.
inline std::atomic<std::uint64_t> g_delta_windows_started{0};
// Jobs handed to builder threads and jobs built, over all servers: lets a
// test see that a gone client's job was dropped unbuilt without timing it.
inline std::atomic<std::uint64_t> g_jobs_queued{0};
inline std::atomic<std::uint64_t> g_jobs_built{0};
// Tests only: called on the builder that builds a /retention profile, before
// its scan (a test holds it there to see that other requests do not wait).
inline void (*g_retention_build_hook)() = nullptr;

// A parsed "host:port". Accepted: "127.0.0.1:6060", ":6060" (empty host:
// loopback, unlike Go, which binds every interface), "localhost:6060",
// "[::1]:6060", "0.0.0.0:6060" / "[::]:6060" (every interface, on request
// only). Hosts are numeric (no DNS lookups from inside a profiler) except
// "localhost". Port 0 picks a free one.
struct ListenAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

// Why a server did not start. kInvalidAddress is a malformed `listen`
// (std::invalid_argument from HttpServer), kSystem a failed socket call
// (std::system_error, with `err`).
struct StartError {
  enum Kind { kNone, kInvalidAddress, kSystem } kind = kNone;
  int err = 0;
  ArenaString message;  // the whole message
  ArenaString context;  // kSystem: the message without strerror(err), for std::system_error
};

// False (and `error` says why) for a malformed address.
inline bool ParseListenAddress(std::string_view listen, ListenAddress& out, StartError& error) {
  const auto bad = [&](const char* why) {
    error.kind = StartError::kInvalidAddress;
    error.message = "heapprof::HttpServer: bad listen address \"" + ArenaString(listen) + "\": " + why +
                    " (expected host:port, e.g. 127.0.0.1:6060, [::1]:6060 or :0)";
    return false;
  };
  std::string_view host, port;
  if (!listen.empty() && listen[0] == '[') {
    const std::size_t close = listen.find(']');
    if (close == std::string_view::npos) return bad("missing ']'");
    host = listen.substr(1, close - 1);
    if (close + 1 >= listen.size() || listen[close + 1] != ':') return bad("missing :port");
    port = listen.substr(close + 2);
    if (host.empty()) return bad("empty IPv6 address");
  } else {
    const std::size_t colon = listen.rfind(':');
    if (colon == std::string_view::npos) return bad("missing :port");
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return bad("an IPv6 address needs brackets");
  }
  if (port.empty() || port.size() > 5) return bad("bad port");
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return bad("bad port");
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return bad("port out of range");

  out = ListenAddress{};
  if (listen[0] == '[') {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&out.addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<std::uint16_t>(value));
    const ArenaString h(host);
    if (inet_pton(AF_INET6, h.c_str(), &a6->sin6_addr) != 1) return bad("not a numeric IPv6 address");
    out.len = sizeof(sockaddr_in6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&out.addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<std::uint16_t>(value));
    const ArenaString h = host.empty() || host == "localhost" ? ArenaString("127.0.0.1") : ArenaString(host);
    if (inet_pton(AF_INET, h.c_str(), &a4->sin_addr) != 1) return bad("not a numeric IPv4 address or localhost");
    out.len = sizeof(sockaddr_in);
  }
  return true;
}

inline const char* StatusText(int status) noexcept {
  switch (status) {
    case 200: return "OK";
    case 301: return "Moved Permanently";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

// `Date: <IMF-fixdate>` for the time `unix_seconds` (RFC 9110 5.6.7:
// "Sun, 06 Nov 1994 08:49:37 GMT"), as Go's server sends on every response
// (RFC 9110 6.6.1: an origin server with a clock must, on 2xx, 3xx and 4xx).
// Arithmetic only: strftime's day and month names follow the program's
// locale, and gmtime_r may read the time zone files (and allocate) once.
inline void AppendDateHeader(ArenaString& out, std::int64_t unix_seconds) {
  static constexpr const char kDays[7][4] = {"Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"};  // day 0: 1970-01-01
  static constexpr const char kMonths[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  std::int64_t days = unix_seconds / 86400, secs = unix_seconds % 86400;
  if (secs < 0) {
    secs += 86400;
    --days;
  }
  const int weekday = static_cast<int>(((days % 7) + 7) % 7);
  // The civil date of a day count (days since 1970-01-01), in eras of 400
  // years that start on March 1st (the leap day last in its year).
  const std::int64_t z = days + 719468;
  const std::int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const std::int64_t doe = z - era * 146097;                                 // [0, 146096]
  const std::int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;  // [0, 399]
  const std::int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);          // [0, 365]
  const std::int64_t mp = (5 * doy + 2) / 153;                               // [0, 11], March first
  const std::int64_t day = doy - (153 * mp + 2) / 5 + 1;                     // [1, 31]
  const std::int64_t month = mp < 10 ? mp + 3 : mp - 9;                      // [1, 12]
  const std::int64_t year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  AppendFormat(out, "Date: %s, %02d %s %04lld %02d:%02d:%02d GMT\r\n", kDays[weekday], static_cast<int>(day),
               kMonths[month - 1], static_cast<long long>(year), static_cast<int>(secs / 3600),
               static_cast<int>(secs / 60 % 60), static_cast<int>(secs % 60));
}

inline void AppendDateHeader(ArenaString& out) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  AppendDateHeader(out, std::int64_t{now.tv_sec});
}

// A response head's start: the status line, Date, then `headers` (each
// response's own; AppendResponse and AppendStreamHead end the head).
inline void AppendHeadStart(ArenaString& out, int status,
                            const ArenaVector<std::pair<const char*, ArenaString>>& headers) {
  char line[96];
  std::snprintf(line, sizeof line, "HTTP/1.1 %d %s\r\n", status, StatusText(status));
  out += line;
  AppendDateHeader(out);
  for (const auto& h : headers) {
    out += h.first;
    out += ": ";
    out += h.second;
    out += "\r\n";
  }
}

// Status line, Date, headers, Content-Length, Connection: close, then the
// body unless head_only.
inline void AppendResponse(ArenaString& out, int status, const ArenaVector<std::pair<const char*, ArenaString>>& headers,
                           const ArenaString& body, bool head_only) {
  AppendHeadStart(out, status, headers);
  char line[96];
  std::snprintf(line, sizeof line, "Content-Length: %zu\r\nConnection: close\r\n\r\n", body.size());
  out += line;
  if (!head_only) out += body;
}

// The head of a response whose body is streamed (its length is not known
// when the head goes out). `chunked` (HTTP/1.1 clients): chunked transfer
// coding, whose last chunk tells a complete body from one cut short (a
// failed build, a dropped connection). Otherwise (HTTP/1.0, which has no
// chunks) the end of the body is the end of the connection, RFC 9112 6.3.
inline void AppendStreamHead(ArenaString& out, int status,
                             const ArenaVector<std::pair<const char*, ArenaString>>& headers, bool chunked) {
  AppendHeadStart(out, status, headers);
  if (chunked) out += "Transfer-Encoding: chunked\r\n";
  out += "Connection: close\r\n\r\n";
}

// A piece of a streamed body: as a chunk when `chunked` (an empty piece
// makes none: a zero-size chunk ends the body), and the last chunk after it
// when `last`.
inline void AppendStreamPiece(ArenaString& out, const ArenaString& piece, bool chunked, bool last) {
  if (!chunked) {
    out += piece;
    return;
  }
  if (!piece.empty()) {
    AppendFormat(out, "%zx\r\n", piece.size());
    out += piece;
    out += "\r\n";
  }
  if (last) out += "0\r\n\r\n";
}

// Go's serveError / http.Error: one line of text. X-Go-Pprof is what
// pprof's fetcher looks for before it shows the body of an error response
// (driver/fetch.go statusCodeError, symbolizer.go likewise): without it
// `go tool pprof` printed only "server response: 400 Bad Request", never the
// reason. Go's serveError sends it; every error here is the profiler's own,
// so all of them do.
// `allow`: a 405's Allow header, the methods the path takes (RFC 9110 15.5.6).
inline ArenaString ErrorResponse(int status, const char* reason, bool head_only = false,
                                 const char* allow = "GET, HEAD") {
  ArenaString out;
  ArenaVector<std::pair<const char*, ArenaString>> headers = {
      {"Content-Type", "text/plain; charset=utf-8"}, {"X-Content-Type-Options", "nosniff"}, {"X-Go-Pprof", "1"}};
  if (status == 405) headers.emplace_back("Allow", allow);
  AppendResponse(out, status, headers, ArenaString(reason) + "\n", head_only);
  return out;
}

// A response that could not be built for want of memory: every way a build
// fails (the write's headroom refused, a bad_alloc while building). A 503,
// the service's state for now, not a fault of the request; Go's handlers
// answer a failed collection with a 500 "failed to collect profile", which
// here was the answer in builds with exceptions only: without them the same
// shortage closed the connection without a word.
inline ArenaString OutOfMemoryResponse(bool head_only = false) {
  return ErrorResponse(503, "out of memory building the response", head_only);
}

// Go's html.EscapeString set (what http.Redirect's body uses).
inline void AppendHtmlEscaped(std::string_view text, ArenaString& out) {
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '\'': out += "&#39;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      default: out += c;
    }
  }
}

inline ArenaString IndexHtml() {
  ArenaString b =
      "<html>\n<head>\n<title>/debug/pprof/</title>\n<style>\n.profile-name{\n\tdisplay:inline-block;\n"
      "\twidth:6rem;\n}\n</style>\n</head>\n<body>\n/debug/pprof/<br>\n<br>\nTypes of profiles available:\n"
      "<table>\n<thead><td>Count</td><td>Profile</td></thead>\n";
  char line[160];
  // Go's Count column is Profile.Count, the number of stacks (records) in
  // the profile: for heap and allocs the records ?debug=1 lists (every
  // bucket with an allocation, as Go's MemProfile(inuseZero=true)), as the
  // peak row's is its snapshot's buckets. It was the number of sampled live
  // objects, which is neither (and says nothing of allocs).
  std::uint64_t records = 0;
  for (const Bucket* bucket = g_buckets.Head(); bucket != nullptr; bucket = bucket->next) {
    if (ReadCounts(bucket).allocs != 0) ++records;
  }
  const std::uint64_t live = GetStats().sampled_live_objects;
  std::snprintf(line, sizeof line, "<tr><td>%llu</td><td><a href='allocs?debug=1'>allocs</a></td></tr>\n",
                static_cast<unsigned long long>(records));
  b += line;
  // Listed as Go's index lists it: a row with a count of 0, in name order.
  b += "<tr><td>0</td><td><a href='cmdline'>cmdline</a></td></tr>\n";
  std::snprintf(line, sizeof line, "<tr><td>%llu</td><td><a href='heap?debug=1'>heap</a></td></tr>\n",
                static_cast<unsigned long long>(records));
  b += line;
  std::snprintf(line, sizeof line, "<tr><td>%llu</td><td><a href='peak?debug=1'>peak</a></td></tr>\n",
                static_cast<unsigned long long>(g_peak.Count()));
  b += line;
  // (The retention profile's records are known only after its scan: its
  // row counts the sampled live objects the scan starts from.)
  std::snprintf(line, sizeof line, "<tr><td>%llu</td><td><a href='retention'>retention</a></td></tr>\n",
                static_cast<unsigned long long>(live));
  b += line;
  b += "</table>\n<p>\nProfile Descriptions:\n<ul>\n"
       "<li><div class=profile-name>allocs: </div> A sampling of all past memory allocations "
       "(<a href='allocs'>pprof</a>)</li>\n"
       "<li><div class=profile-name>cmdline: </div> The command line invocation of the current program</li>\n"
       "<li><div class=profile-name>heap: </div> A sampling of memory allocations of live objects. "
       "You can specify the gc GET parameter to run GC before taking the heap sample "
       "(accepted and ignored here) (<a href='heap'>pprof</a>)</li>\n"
       "<li><div class=profile-name>peak: </div> The heap profile as it was when the in-use heap was highest "
       "(since start or ResetPeak; seconds=N: the peak of the next N s) (<a href='peak'>pprof</a>)</li>\n"
       "<li><div class=profile-name>retention: </div> Each sampled live object on its shortest chain of "
       "references from a root: a global, a thread's stack or TLS, unsampled heap, or unreachable (a leak) "
       "(<a href='retention'>pprof</a>)</li>\n"
       "</ul>\n</p>\n</body>\n</html>\n";
  return b;
}

// Stats as `# name = value` lines after the records, like Go's
// `# runtime.MemStats` block.
inline void AppendStatsComments(ArenaString& out) {
  const Stats s = GetStats();
  out += "\n# heapprof.Stats\n";
  const std::pair<const char*, std::uint64_t> rows[] = {
      {"alloc_objects", s.alloc_objects}, {"alloc_bytes", s.alloc_bytes},
      {"free_objects", s.free_objects},   {"free_bytes", s.free_bytes},
      {"live_objects", s.live_objects},   {"live_bytes", s.live_bytes},
      {"sampled_live_objects", s.sampled_live_objects}, {"profiler_bytes", s.profiler_bytes},
      {"label_sets", s.label_sets},       {"label_set_overflows", s.label_set_overflows},
      {"sample_rate", GetSampleRate()},
  };
  for (const auto& r : rows) AppendFormat(out, "# %s = %llu\n", r.first, static_cast<unsigned long long>(r.second));
}

// The peak snapshot's facts, for ?debug=1 of /peak (after the Stats).
inline ArenaString PeakTextComments(const PeakInfo& info, bool exact) {
  ArenaString out = "\n# heapprof.Peak\n";
  for (const ArenaString& c : PeakComments(info, exact)) {
    out += "# ";
    out += c;
    out += '\n';
  }
  return out;
}

// The peak snapshot's counts and the comments that go with them.
inline bool BeginPeakText(TextProfileStream& stream, ArenaString& out) {
  const PeakCopy peak = CopyPeak();
  bool exact = true;
  for (const BucketCounts& c : peak.counts) exact = exact && c.bucket->rate <= 1;
  const ArenaString comments = PeakTextComments(peak.info, exact);
  return stream.Begin(out, AppendStatsComments, &peak.counts, comments);
}

// The interim response to `Expect: 100-continue`, sent before a body is read.
constexpr std::string_view kContinueLine = "HTTP/1.1 100 Continue\r\n\r\n";

// Go's Symbol handler: "num_symbols: 1", then "<addr> <function>" for each
// address that resolves.
inline ArenaString SymbolBody(std::string_view addresses) {
  ArenaString body = "num_symbols: 1\n";
  const ArenaVector<LoadedObject> objects = CollectProfileObjects();
  Symbolizer symbolizer(objects);
  ArenaString name;
  ForEachSymbolAddress(addresses, [&](std::uint64_t pc) {
    std::uintptr_t start = 0;
    if (symbolizer.Lookup(pc, name, start)) {
      AppendFormat(body, "%#llx ", static_cast<unsigned long long>(pc));
      body += name;
      body += '\n';
    }
  });
  return body;
}

// The complete response for a plan (other than kDelta before its window
// ends). `symbol_request`: kSymbol's addresses (the body or the query).
inline ArenaString BuildResponse(const Plan& plan, const ProfileBaseline* since = nullptr,
                                 std::string_view symbol_request = {}) {
  const char* name = plan.retention ? "retention" : plan.peak ? "peak" : plan.allocs ? "allocs" : "heap";
  ArenaString out, body;
  switch (plan.action) {
    case Action::kError:
      return ErrorResponse(plan.error.status, plan.error.reason, plan.head_only, plan.error.allow);
    case Action::kRedirect:
      // Go's http.Redirect: to GET and HEAD a short HTML body with the link,
      // to other methods none.
      if (!plan.redirect_html) {
        AppendResponse(out, 301, {{"Location", plan.location}}, ArenaString(), plan.head_only);
        return out;
      }
      body = "<a href=\"";
      AppendHtmlEscaped(plan.location, body);
      body += "\">Moved Permanently</a>.\n\n";
      AppendResponse(out, 301, {{"Location", plan.location}, {"Content-Type", "text/html; charset=utf-8"}}, body,
                     plan.head_only);
      return out;
    case Action::kIndex:
      AppendResponse(out, 200,
                     {{"X-Content-Type-Options", "nosniff"}, {"Content-Type", "text/html; charset=utf-8"}},
                     IndexHtml(), plan.head_only);
      return out;
    case Action::kSymbol:
      AppendResponse(out, 200,
                     {{"X-Content-Type-Options", "nosniff"}, {"Content-Type", "text/plain; charset=utf-8"}},
                     SymbolBody(symbol_request), plan.head_only);
      return out;
    case Action::kCmdline:
      // Go's Cmdline: os.Args joined by NUL bytes, no NUL after the last.
      // /proc/self/cmdline ends each argument with a NUL: without its last
      // one it is that join. Read now, so a program that rewrote its argv
      // (a process title) shows what ps shows.
      if (!elf::ReadProcFile(ProcSelfPath("cmdline").c_str(), body)) {
        return ErrorResponse(500, "cannot read /proc/self/cmdline", plan.head_only);
      }
      if (!body.empty() && body.back() == '\0') body.pop_back();
      AppendResponse(out, 200,
                     {{"X-Content-Type-Options", "nosniff"}, {"Content-Type", "text/plain; charset=utf-8"}}, body,
                     plan.head_only);
      return out;
    case Action::kText: {
      TextProfileStream stream;
      bool ok = plan.peak ? BeginPeakText(stream, body) : stream.Begin(body, AppendStatsComments);
      while (ok && !stream.done()) ok = stream.Next(body, static_cast<std::size_t>(-1));
      if (!ok) return OutOfMemoryResponse(plan.head_only);
      AppendResponse(out, 200,
                     {{"X-Content-Type-Options", "nosniff"}, {"Content-Type", "text/plain; charset=utf-8"}}, body,
                     plan.head_only);
      return out;
    }
    case Action::kProfile:
    case Action::kDelta: {
      bool built;
      if (plan.retention) {
        built = BuildRetentionProfileBytes(body);
      } else if (plan.peak) {
        const bool window = plan.action == Action::kDelta && since != nullptr;
        built = BuildPeakProfileBytes(body, window ? WindowNanos(*since) : 0);
        if (window) g_window_peak_open.store(false, std::memory_order_relaxed);  // copied: the window is over
      } else {
        built = BuildProfileBytes(plan.allocs, body, plan.action == Action::kDelta ? since : nullptr);
      }
      if (!built) return OutOfMemoryResponse(plan.head_only);
      ArenaString disposition = "attachment; filename=\"";
      disposition += name;
      if (plan.action == Action::kDelta && !plan.peak) disposition += "-delta";
      disposition += '"';
      AppendResponse(out, 200,
                     {{"X-Content-Type-Options", "nosniff"},
                      {"Content-Type", "application/octet-stream"},
                      {"Content-Disposition", disposition}},
                     body, plan.head_only);
      return out;
    }
  }
  return ErrorResponse(500, "internal error", plan.head_only);
}

struct Connection {
  // kBuilding: the builder thread is making the response (or its next piece).
  enum class State { kReading, kReadingBody, kWaiting, kBuilding, kWriting, kDraining };
  int fd = -1;
  State state = State::kReading;
  std::int64_t deadline_ms = 0;  // reading: head; waiting: end of the window; writing: send
  std::size_t drained = 0;
  // Turned away with a 503 (the connection limit), or evicted with a 408 for
  // a newcomer (kEvictGraceMs): not counted in the limit.
  bool busy = false;
  std::int64_t accepted_ms = 0;  // when accept() took it (eviction: the oldest first)
  std::size_t head_end = 0;  // kReadingBody: where the body starts in `in`
  ArenaString in;
  ArenaString out;
  std::size_t sent = 0;
  Plan plan;
  ArenaPtr<ProfileBaseline> baseline;
  std::uint64_t serial = 0;                   // names the connection to the builder
  ArenaPtr<TextProfileStream> stream;  // a streamed text body with more to come
  bool chunked = false;                // the client speaks HTTP/1.1: a streamed body goes in chunks
  int unsent = -1;                     // kWriting: the socket's queue at the last progress (UnsentBytes)
  // Bytes of kContinueLine not sent yet (`Expect: 100-continue`): they go
  // out before anything else on the connection (Flush, SendContinue).
  std::size_t continue_left = 0;
};

// Work for the builder thread, and what it hands back.
struct BuildJob {
  std::uint64_t serial = 0;
  Plan plan;
  ArenaPtr<ProfileBaseline> baseline;
  ArenaString symbol_request;
  ArenaPtr<TextProfileStream> stream;  // set: the stream's next piece
  bool chunked = false;                // a streamed body in chunks (an HTTP/1.1 client)
};
struct BuildResult {
  std::uint64_t serial = 0;
  ArenaString bytes;
  ArenaPtr<TextProfileStream> stream;  // more to come
  bool continued = false;              // a later piece of a stream: its head is out already
};

class Server;

// Every running server, so that a forked child closes their listening
// sockets: the child has no server thread, and a socket it kept open would
// take connections nobody answers and keep the port from being bound again
// (a new instance of the parent, say). The child is a full process
// otherwise; it may start its own server.
// The lock is held while a server opens or closes its listening socket, and
// across fork() (prepare to parent/child handler). Recursive where the libc
// has a static initialiser for one (glibc): a fork on the thread that holds
// it (the tests' g_listening_hook forks there) does not wait for itself.
#if defined(PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP)
#define HEAPPROF_SERVERS_MUTEX_INITIALIZER PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP
#else
#define HEAPPROF_SERVERS_MUTEX_INITIALIZER PTHREAD_MUTEX_INITIALIZER
#endif
struct ServerList {
  pthread_mutex_t mutex = HEAPPROF_SERVERS_MUTEX_INITIALIZER;
  Server* head = nullptr;
  bool atfork_registered = false;
};
inline ServerList g_servers;
// Tests only: called with a server's listening socket, under g_servers' lock,
// right after listen() and right before the socket is closed (the moments a
// fork must not leave the socket to a child).
inline void (*g_listening_hook)(int listen_fd) = nullptr;
void CloseServersInForkedChild() noexcept;
inline void LockServers() noexcept { pthread_mutex_lock(&g_servers.mutex); }
inline void UnlockServers() noexcept { pthread_mutex_unlock(&g_servers.mutex); }
inline void ForkChildServers() noexcept {
  CloseServersInForkedChild();
  // The child's copy of the mutex was locked by the forking thread (prepare):
  // reinitialise rather than unlock a mutex this thread may not own.
  g_servers.mutex = HEAPPROF_SERVERS_MUTEX_INITIALIZER;
}

class Server {
 public:
  // Listens and starts the thread; ok() says whether it did, error() why not.
  explicit Server(std::string_view listen, Limits limits = {}) : limits_(limits) {
    ListenAddress addr;
    if (!ParseListenAddress(listen, addr, error_)) return;
    const auto fail = [&](int err, const ArenaString& what) {
      error_.kind = StartError::kSystem;
      error_.err = err;
      error_.context = "heapprof::HttpServer: " + what;
      error_.message = error_.context + ": " + std::strerror(err);
    };
    // The listening socket exists only while the server is in g_servers, so
    // that a fork by another thread at any moment gives the child a socket its
    // fork handler closes. Opened after it joined the list, the lock held
    // from before socket() on (a fork waits in the prepare handler). Before,
    // the server joined the list only after listen() and its threads' start:
    // a child forked in between kept a listening socket nobody answered (it
    // took connections, and held the port, for as long as it lived). Under
    // the lock: system calls only, no allocation (a forking thread may hold
    // the engine's locks while it waits for this one).
    const char* failed = nullptr;
    int err = 0;
    LockServers();
    if (!g_servers.atfork_registered) {
      // Safe under the lock: until registered, fork() does not take it.
      g_servers.atfork_registered = true;
      pthread_atfork(&LockServers, &UnlockServers, &ForkChildServers);
    }
    Link();
    if (!OpenSockets(addr, failed, err)) {
      CloseSocketsAndUnlink();
      UnlockServers();
      fail(err, failed == nullptr ? ArenaString("cannot listen on ") + ArenaString(listen) : ArenaString(failed));
      return;
    }
    UnlockServers();
    // The server's threads take no signals (the program's handlers run on
    // its own threads), and their stacks are not the program's default size
    // (host_threads.hpp).
    int rc = StartOwnThread(&builder_, &Server::BuilderMain, this);
    if (rc == 0) {
      rc = StartOwnThread(&scan_builder_, &Server::ScanBuilderMain, this);
      if (rc != 0) StopBuilder(false);
    }
    if (rc == 0) {
      rc = StartOwnThread(&thread_, &Server::ThreadMain, this);
      if (rc != 0) StopBuilder();
    }
    if (rc != 0) {
      LockServers();
      CloseSocketsAndUnlink();
      UnlockServers();
      fail(rc, "cannot start its thread");
      return;
    }
    running_ = true;
  }

  // Serving now: started, in the process that started it (a forked child's
  // copy has neither the thread nor the listening socket), and with its
  // descriptors (LostDescriptors). Before, a child's copy and a server whose
  // socket the program had closed both still said they were serving.
  bool ok() const noexcept {
    return running_ && ::getpid() == owner_pid_ && !fds_lost_.load(std::memory_order_acquire) &&
           !gave_up_.load(std::memory_order_acquire);
  }
  const StartError& error() const noexcept { return error_; }
  // Why ok() is false ("" when it is true).
  const char* ErrorMessage() const noexcept {
    if (!running_) return error_.message.c_str();
    if (::getpid() != owner_pid_) {
      return "heapprof::HttpServer: a copy in a forked child, which does not serve (the parent does; "
             "start a server of the child's own)";
    }
    if (fds_lost_.load(std::memory_order_acquire)) {
      return "heapprof::HttpServer: the program closed its socket or eventfd; not serving any more";
    }
    if (gave_up_.load(std::memory_order_acquire)) return gave_up_message_;
    return "";
  }

  ~Server() {
    if (!running_) return;
    stop_.store(true, std::memory_order_release);
    WakeServer();  // if the program closed it, the thread sees stop_ within kFdCheckMillis
    // In a forked child the server thread does not exist: joining would wait
    // forever.
    if (::getpid() == owner_pid_) {
      pthread_join(thread_, nullptr);
      StopBuilder();
      for (const BuildJob& job : jobs_) {  // queued, never to be built
        if (!job.stream && IsPeakWindow(job.plan)) g_window_peak_open.store(false, std::memory_order_relaxed);
      }
      if (!fds_lost_.load(std::memory_order_acquire)) {
        for (Connection& c : conns_) {
          AbandonPeakWindow(c);
          ShutdownAndClose(c.fd);
        }
      }
    }
    // Still in g_servers until the listening socket is closed, under the
    // lock: a child forked meanwhile closes it (before, the server left the
    // list first, and a child forked during the join kept the socket).
    LockServers();
    CloseSocketsAndUnlink();
    UnlockServers();
  }

  // In a forked child (fork handler, single-threaded): give up the listening
  // socket and the eventfd. Before, the child kept the eventfd: a daemon
  // (nginx's master, started under HEAPPROF=http, forks into the background
  // and then forks its workers) held one more descriptor in every process,
  // and a child destroying its copy of the server woke the parent's thread
  // through it. The connections stay as they are: the server thread may have
  // been changing their list at the fork.
  void CloseListenerInChild() noexcept {
    if (listen_id_.Is(listen_fd_)) ::close(listen_fd_);
    if (wake_id_.Is(wake_fd_)) ::close(wake_fd_);
    listen_fd_ = wake_fd_ = -1;
  }

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  std::uint16_t port() const noexcept { return port_; }

 private:
  // Under g_servers' lock (Link, CloseSocketsAndUnlink, OpenSockets).
  void Link() noexcept {
    next_ = g_servers.head;
    g_servers.head = this;
  }

  // The listening socket and the eventfd; false with the failed call's name
  // (null: bind or listen) and errno. System calls only.
  bool OpenSockets(const ListenAddress& addr, const char*& failed, int& err) noexcept {
    listen_fd_ = ::socket(addr.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) {
      failed = "socket";
      err = errno;
      return false;
    }
    listen_id_ = FileId::Of(listen_fd_);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr.addr), addr.len) != 0 ||
        ::listen(listen_fd_, 128) != 0) {
      err = errno;
      return false;
    }
    if (g_listening_hook != nullptr) g_listening_hook(listen_fd_);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      failed = "eventfd";
      err = errno;
      return false;
    }
    wake_id_ = FileId::Of(wake_fd_);
    return true;
  }

  // Closes the descriptors that are still ours (LostDescriptors) and leaves
  // g_servers. The listening socket is closed before the server leaves the
  // list, under the same lock: no fork sees it open and unlisted.
  void CloseSocketsAndUnlink() noexcept {
    if (g_listening_hook != nullptr && listen_fd_ >= 0) g_listening_hook(listen_fd_);
    if (listen_id_.Is(listen_fd_)) ::close(listen_fd_);
    if (wake_id_.Is(wake_fd_)) ::close(wake_fd_);
    listen_fd_ = wake_fd_ = -1;
    for (Server** link = &g_servers.head; *link != nullptr; link = &(*link)->next_) {
      if (*link == this) {
        *link = next_;
        break;
      }
    }
  }

  static void* ThreadMain(void* self) noexcept {
    static_cast<Server*>(self)->Run();
    return nullptr;
  }

  // A descriptor's identity, to tell ours from the program's file that took
  // its number: a program that closes every descriptor it did not open
  // (closefrom(3), python-daemon, os.closerange) closes the listening socket
  // and the eventfd, and its next files get their numbers. Reading that
  // "eventfd" read the program's file, writing it wrote 8 bytes into it, and
  // accept() on it failed at once, every time (or, on the program's own
  // listening socket, took its connections); and a poll() that had been
  // waiting on the closed ones never returned, so Stop's join at exit hung.
  struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    static FileId Of(int fd) noexcept {
      struct stat st {};
      FileId id;
      if (fd >= 0 && ::fstat(fd, &st) == 0) {
        id.dev = st.st_dev;
        id.ino = st.st_ino;
      }
      return id;
    }
    bool Is(int fd) const noexcept {
      struct stat st {};
      return fd >= 0 && ino != 0 && ::fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
    }
  };
  // How long the server thread waits, at most, before it checks that its
  // descriptors are still its own (and stop_): one fstat pair a second, idle.
  static constexpr int kFdCheckMillis = 1000;

  // The server thread's wake-up (a result, Stop), unless the eventfd's number
  // is no longer ours.
  void WakeServer() noexcept {
    if (fds_lost_.load(std::memory_order_acquire) || !wake_id_.Is(wake_fd_)) return;
    const std::uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }

  // The server thread: true (and one line said) when the program has closed
  // the listening socket or the eventfd. The server stops; the program's
  // files under those numbers, and the connections' (which may be the
  // program's too by now), are left alone.
  bool LostDescriptors() noexcept {
    if (listen_id_.Is(listen_fd_) && wake_id_.Is(wake_fd_)) return false;
    fds_lost_.store(true, std::memory_order_release);
    char line[160];
    std::snprintf(line, sizeof line,
                  "HTTP server on port %u: the program closed its socket (fd %d) or eventfd (fd %d); not serving any more",
                  static_cast<unsigned>(port_), listen_fd_, wake_fd_);
    ReportLine(line);
    conns_.clear();
    return true;
  }

  // The server thread: a call its loop cannot do without keeps failing (a
  // seccomp filter refusing poll or accept4: EPERM, ENOSYS). Before, a
  // refused poll ended the thread without a word, and a refused accept4 spun
  // it on a core (the connection stays in the backlog: the socket stays
  // readable); either way clients waited, connected, until their own
  // timeout. Now one line; the socket stops listening (clients are refused)
  // and the connections are closed.
  void GiveUp(const char* call, int err) noexcept {
    std::snprintf(gave_up_message_, sizeof gave_up_message_, "heapprof::HttpServer: %s: %s; not serving any more",
                  call, std::strerror(err));
    gave_up_.store(true, std::memory_order_release);
    char line[200];
    std::snprintf(line, sizeof line, "HTTP server on port %u: %s: %s; not serving any more",
                  static_cast<unsigned>(port_), call, std::strerror(err));
    ReportLine(line);
    ::shutdown(listen_fd_, SHUT_RDWR);
    for (Connection& c : conns_) {
      if (c.fd >= 0) Close(c);
    }
  }

  static void* BuilderMain(void* self) noexcept {
    auto* server = static_cast<Server*>(self);
    server->BuildLoop(server->jobs_);
    return nullptr;
  }
  static void* ScanBuilderMain(void* self) noexcept {
    auto* server = static_cast<Server*>(self);
    server->BuildLoop(server->scan_jobs_);
    return nullptr;
  }

  // A /retention profile: a scan of the whole process (about 1 s per GiB of
  // heap), built on a thread of its own. On the one builder, a /heap scrape
  // queued behind a scan waited for it: 1.0 s behind a 1 GiB heap's scan,
  // 2+ s at rate 1, and a scraper with a short timeout (Prometheus-style
  // scrape_timeout) timed out behind a large heap's.
  static bool IsScan(const BuildJob& job) noexcept {
    return !job.stream && job.plan.retention && job.plan.action == Action::kProfile;
  }

  void StopBuilder(bool scan_builder = true) noexcept {
    pthread_mutex_lock(&jobs_mutex_);
    builder_stop_ = true;
    pthread_cond_broadcast(&jobs_cond_);
    pthread_mutex_unlock(&jobs_mutex_);
    pthread_join(builder_, nullptr);
    if (scan_builder) pthread_join(scan_builder_, nullptr);
  }

  // A builder thread: one job of its queue at a time, oldest first. Two of
  // them: `jobs_` (every response but /retention's) and `scan_jobs_`
  // (/retention's), so that no scrape waits for a scan. Each queue holds at
  // most one job per connection (Queue).
  void BuildLoop(ArenaDeque<BuildJob>& queue) noexcept {
    ReentrancyGuard guard;  // nothing the builder allocates is sampled
    tls_profiler_thread = true;  // libc's and libstdc++'s mallocs here: the arena's (malloc.hpp: OwnAlloc)
    OwnThreadMark mark;  // not one of the program's threads (host_threads.hpp)
    for (;;) {
      BuildJob job;
      pthread_mutex_lock(&jobs_mutex_);
      while (queue.empty() && !builder_stop_) pthread_cond_wait(&jobs_cond_, &jobs_mutex_);
      const bool stop = builder_stop_;
      if (!stop) {
        job = std::move(queue.front());
        queue.pop_front();
      }
      pthread_mutex_unlock(&jobs_mutex_);
      if (stop) return;
      g_jobs_built.fetch_add(1, std::memory_order_relaxed);
      BuildResult r;
      r.serial = job.serial;
      r.continued = static_cast<bool>(job.stream);
      {
        // Built without exceptions: the memory for the response first (the
        // profile's build records its size for the next); refused, or out of
        // memory during the build, the result is empty: the server thread
        // answers a 503 (TakeResults).
        WriteHeadroom headroom(false);
        if (headroom.ok()) {
          HEAPPROF_TRY { Build(job, r); }
          HEAPPROF_CATCH_ALL_NOEXCEPT {
            r.bytes = ArenaString();
            r.stream.reset();
          }
        } else if (!r.continued && IsPeakWindow(job.plan)) {
          // A /peak?seconds= window whose profile is never built: closed here
          // (BuildResponse closes it once it has copied it). Left open, every
          // later /peak?seconds= got a 503 'already in progress', for good.
          g_window_peak_open.store(false, std::memory_order_relaxed);
        }
        pthread_mutex_lock(&jobs_mutex_);
        HEAPPROF_TRY { results_.push_back(std::move(r)); }
        HEAPPROF_CATCH_ALL_NOEXCEPT {}
        pthread_mutex_unlock(&jobs_mutex_);
      }
      WakeServer();
    }
  }

  // The stream's next piece into r (after what r holds), and the stream
  // into r if more is to come. A failed piece ends the stream without the
  // last chunk: a chunked client sees the body cut short.
  static void NextPiece(ArenaPtr<TextProfileStream>& stream, ArenaString piece, bool chunked, BuildResult& r) {
    const bool ok = stream->Next(piece, kStreamPieceBytes);
    AppendStreamPiece(r.bytes, piece, chunked, ok && stream->done());
    if (!stream->done()) r.stream = std::move(stream);
  }

  static void Build(BuildJob& job, BuildResult& r) {
    if (job.stream) {  // the next piece of a text body
      NextPiece(job.stream, ArenaString(), job.chunked, r);
      return;
    }
    if (job.plan.action == Action::kText) {
      const ArenaVector<std::pair<const char*, ArenaString>> headers = {
          {"X-Content-Type-Options", "nosniff"}, {"Content-Type", "text/plain; charset=utf-8"}};
      if (job.plan.head_only) {
        AppendStreamHead(r.bytes, 200, headers, job.chunked);
        return;
      }
      ArenaPtr<TextProfileStream> stream = MakeArena<TextProfileStream>();
      ArenaString first;
      if (!(job.plan.peak ? BeginPeakText(*stream, first) : stream->Begin(first, AppendStatsComments))) {
        r.bytes = OutOfMemoryResponse();
        return;
      }
      AppendStreamHead(r.bytes, 200, headers, job.chunked);
      NextPiece(stream, std::move(first), job.chunked, r);
      return;
    }
    if (IsScan(job) && g_retention_build_hook != nullptr) g_retention_build_hook();
    r.bytes = BuildResponse(job.plan, job.baseline.get(), job.symbol_request);
  }

  // Hands the connection's request to the builder.
  void Dispatch(Connection& c, ArenaPtr<ProfileBaseline> baseline, ArenaString symbol_request) {
    BuildJob job;
    job.serial = c.serial = ++next_serial_;
    job.plan = c.plan;
    job.baseline = std::move(baseline);
    job.symbol_request = std::move(symbol_request);
    job.chunked = c.chunked;
    Queue(std::move(job));
    ArenaString().swap(c.in);
    c.state = Connection::State::kBuilding;
    c.deadline_ms = INT64_MAX;  // the builder always answers
  }

  // At most one job per connection is queued or being built, and Close drops
  // a closed connection's queued job: the queue never holds more than the
  // connection limit.
  void Queue(BuildJob job) {
    g_jobs_queued.fetch_add(1, std::memory_order_relaxed);
    const bool scan = IsScan(job);
    pthread_mutex_lock(&jobs_mutex_);
    HEAPPROF_TRY { (scan ? scan_jobs_ : jobs_).push_back(std::move(job)); }
    HEAPPROF_CATCH_ALL_NOEXCEPT {}
    pthread_cond_broadcast(&jobs_cond_);
    pthread_mutex_unlock(&jobs_mutex_);
  }

  // The builder's answers, to their connections (gone ones are dropped).
  void TakeResults() {
    ArenaVector<BuildResult> done;
    pthread_mutex_lock(&jobs_mutex_);
    done.swap(results_);
    pthread_mutex_unlock(&jobs_mutex_);
    for (BuildResult& r : done) {
      for (Connection& c : conns_) {
        if (c.fd < 0 || c.serial != r.serial || c.state != Connection::State::kBuilding) continue;
        if (r.bytes.empty() && !r.stream) {
          if (r.continued) {  // the head is out: the body ends cut short (chunked: no last chunk)
            Close(c);
            break;
          }
          // The builder ran out of memory (its headroom refused, a bad_alloc
          // while building). Closed without a word, as before, a scraper saw
          // a protocol failure (curl: "Empty reply from server", go tool
          // pprof: EOF), not that the service was short of memory.
          ArenaString response;
          HEAPPROF_TRY { response = OutOfMemoryResponse(c.plan.head_only); }
          HEAPPROF_CATCH_ALL_NOEXCEPT {}
          if (response.empty()) {
            Close(c);
          } else {
            Respond(c, std::move(response));
          }
          break;
        }
        c.stream = std::move(r.stream);
        c.out = std::move(r.bytes);
        c.sent = 0;
        c.state = Connection::State::kWriting;
        c.deadline_ms = MonotonicMillis() + limits_.write_timeout_ms;
        Flush(c);
        break;
      }
    }
  }

  void Run() noexcept {
    ReentrancyGuard guard;  // nothing the server allocates is sampled
    tls_profiler_thread = true;  // libc's and libstdc++'s mallocs here: the arena's (malloc.hpp: OwnAlloc)
    OwnThreadMark mark;  // not one of the program's threads (host_threads.hpp)
    std::int64_t last_threads_check = MonotonicMillis();
    ArenaVector<pollfd> fds;
    while (!stop_.load(std::memory_order_acquire)) {
      HEAPPROF_TRY {
        fds.clear();
        fds.push_back(pollfd{wake_fd_, POLLIN, 0});
        // Out of file descriptors: accept() keeps failing while the listen
        // socket stays readable, so stop watching it for a moment.
        const std::int64_t loop_start = MonotonicMillis();
        const bool accept_paused = loop_start < accept_paused_until_ms_;
        // Every slot taken by connections of which one may be evicted in a
        // moment (EvictableAt): the newcomers wait in the backlog until then.
        const std::int64_t evictable_at = EvictableAt();
        const bool wait_for_eviction = evictable_at > loop_start;
        fds.push_back(pollfd{listen_fd_, static_cast<short>(accept_paused || wait_for_eviction ? 0 : POLLIN), 0});
        std::int64_t next = accept_paused ? accept_paused_until_ms_ : -1;
        if (wait_for_eviction && (next < 0 || evictable_at < next)) next = evictable_at;
        for (const Connection& c : conns_) {
          // Waiting connections are watched for reads too: the client
          // hanging up cancels its window (as in Go, where the request's
          // context ends).
          short events = c.state == Connection::State::kWriting    ? POLLOUT
                         : c.state == Connection::State::kBuilding ? 0
                                                                   : POLLIN;
          // A `100 Continue` the socket did not take at once (it always
          // does on a new connection; this is for completeness).
          if (c.state == Connection::State::kReadingBody && c.continue_left != 0) events |= POLLOUT;
          fds.push_back(pollfd{c.fd, events, 0});
          if (next < 0 || c.deadline_ms < next) next = c.deadline_ms;
        }
        int timeout = kFdCheckMillis;
        if (next >= 0) {
          const std::int64_t wait = next - MonotonicMillis();
          timeout = wait <= 0 ? 0 : static_cast<int>(wait > kFdCheckMillis ? kFdCheckMillis : wait);
        }
        const int n = ::poll(fds.data(), fds.size(), timeout);
        if (n < 0 && errno != EINTR) {  // a seccomp filter; EINVAL: RLIMIT_NOFILE below the count
          GiveUp("poll", errno);
          break;
        }
        if (stop_.load(std::memory_order_acquire)) break;
        EndIfProgramThreadsGone(MonotonicMillis(), last_threads_check);  // HEAPPROF=http's (host_threads.hpp)
        // Checked when idle, and before the eventfd is read or accept() runs.
        if ((n == 0 || (n > 0 && ((fds[0].revents | fds[1].revents) != 0))) && LostDescriptors()) break;
        if (n > 0 && (fds[0].revents & POLLIN)) {
          std::uint64_t wakes = 0;
          while (::read(wake_fd_, &wakes, sizeof wakes) < 0 && errno == EINTR) {
          }
        }
        // Connections first (their indices match fds[2..]), then new ones.
        const std::int64_t now = MonotonicMillis();
        for (std::size_t i = 0; i < conns_.size(); ++i) {
          if (n > 0 && fds[i + 2].revents != 0) Service(conns_[i], fds[i + 2].revents);
          Connection& c = conns_[i];
          if (c.fd >= 0 && now >= c.deadline_ms) Expire(c);
        }
        TakeResults();
        Reap();
        if (n > 0 && (fds[1].revents & POLLIN)) Accept();
        if (gave_up_.load(std::memory_order_relaxed)) break;
      }
      HEAPPROF_CATCH_ALL_NOEXCEPT {
        // bad_alloc somewhere: drop every connection rather than the thread.
        for (Connection& c : conns_) Close(c);
        Reap();
      }
    }
  }

  // Connections that count in the limit, and those turned away (busy).
  void CountConnections(std::size_t& counted, std::size_t& busy) const noexcept {
    counted = busy = 0;
    for (const Connection& c : conns_) {
      if (c.fd < 0) continue;
      (c.busy ? busy : counted) += 1;
    }
  }
  std::size_t MaxTurnedAway() const noexcept {
    return limits_.max_connections > kMinTurnedAway ? limits_.max_connections : kMinTurnedAway;
  }

  // The connection a newcomer may evict when every slot is taken: the one
  // that has waited longest for its request (head, or /symbol body), or
  // null. Never one past its request (built, written, a ?seconds= window).
  Connection* EvictionCandidate() noexcept {
    Connection* oldest = nullptr;
    for (Connection& c : conns_) {
      if (c.fd < 0 || c.busy) continue;
      if (c.state != Connection::State::kReading && c.state != Connection::State::kReadingBody) continue;
      if (oldest == nullptr || c.accepted_ms < oldest->accepted_ms) oldest = &c;
    }
    return oldest;
  }
  // -1: a slot is free, or none can be evicted (a newcomer is accepted: it
  // gets a slot or the 503). Otherwise when the candidate can be evicted
  // (its grace over): until then newcomers are left in the backlog.
  std::int64_t EvictableAt() noexcept {
    std::size_t counted = 0, busy = 0;
    CountConnections(counted, busy);
    if (counted < limits_.max_connections) return -1;
    const Connection* candidate = EvictionCandidate();
    return candidate == nullptr ? -1 : candidate->accepted_ms + limits_.evict_grace_ms;
  }

  // Answers `c` with `response` and stops counting it: it drains as any
  // answered connection (kDrainTimeoutMs), unless MaxTurnedAway() are
  // draining already: then the answer and close() at once (the client may
  // see a reset). Bounds the connections held to the limit plus that.
  void TurnAway(Connection& c, const ArenaString& response, std::size_t busy) {
    c.busy = true;
    if (busy >= MaxTurnedAway()) {
      (void)::send(c.fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      Close(c);
      return;
    }
    Respond(c, response);
  }

  void Accept() {
    for (int i = 0; i < 64; ++i) {
      std::size_t counted = 0, busy = 0;
      CountConnections(counted, busy);
      Connection* evict = nullptr;
      if (counted >= limits_.max_connections) {
        evict = EvictionCandidate();
        // Its grace not over yet: the newcomers wait in the backlog (Run
        // polls the listening socket again once it is).
        if (evict != nullptr && MonotonicMillis() < evict->accepted_ms + limits_.evict_grace_ms) return;
      }
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == ENOSYS || err == EPERM || err == EACCES) {
          // Refused: a seccomp filter (EPERM is also a firewall's word on
          // one connection). Given up after kAcceptRefusals in a row.
          if (++accept_refusals_ >= kAcceptRefusals) {
            GiveUp("accept4", err);
            return;
          }
          accept_paused_until_ms_ = MonotonicMillis() + 100;
        } else if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          accept_paused_until_ms_ = MonotonicMillis() + 100;
        }
        return;  // EAGAIN, a connection reset before we took it, ...
      }
      accept_refusals_ = 0;
      if (evict != nullptr) {
        // The one that has waited longest for its request makes room, with
        // the 408 the head timeout would have given it.
        TurnAway(*evict,
                 ErrorResponse(408, evict->state == Connection::State::kReading ? "timed out reading the request head"
                                                                                : "timed out reading the request body"),
                 busy);
      } else if (counted >= limits_.max_connections) {
        // None to evict: turned away. Answered like any error: the 503, then
        // the request read and dropped (kDrainTimeoutMs). Closed with the
        // request unread, the socket sent a reset, which could destroy the
        // 503 before the client read it (go tool pprof: "Unsolicited
        // response received on idle HTTP channel").
        Connection c;
        c.fd = fd;
        conns_.push_back(std::move(c));
        TurnAway(conns_.back(), ErrorResponse(503, "too many connections to the profiling server"), busy);
        continue;
      }
      Connection c;
      c.fd = fd;
      c.accepted_ms = MonotonicMillis();
      c.deadline_ms = c.accepted_ms + limits_.head_timeout_ms;
      c.in.reserve(1024);
      conns_.push_back(std::move(c));
    }
  }

  void Service(Connection& c, short revents) {
    if (c.state == Connection::State::kBuilding) {
      if (revents & (POLLERR | POLLHUP | POLLNVAL)) Close(c);  // the client is gone
      return;
    }
    if (c.state == Connection::State::kWriting) {
      if (revents & (POLLERR | POLLHUP | POLLNVAL)) return Close(c);
      Flush(c);
      return;
    }
    if ((revents & POLLOUT) && !SendContinue(c)) return;
    char buf[4096];
    for (;;) {
      const ssize_t got = ::recv(c.fd, buf, sizeof buf, 0);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return Close(c);
      }
      if (got == 0) {  // the client is done sending
        if (c.state == Connection::State::kDraining) return Close(c);
        if (c.state == Connection::State::kWaiting) {
          // The client hung up, or shut down only its sending side (nc -N,
          // a shell's `printf ... | nc`): the window is cancelled, and, as
          // from Go's handler (its request's context ends), a 500 says why.
          // Before, the connection was closed without a word: a client that
          // still read saw an empty reply. One that is gone resets the write.
          AbandonPeakWindow(c);
          c.baseline.reset();
          return Respond(c, ErrorResponse(500, "context canceled: the client closed its side of the connection "
                                               "during the ?seconds= window"));
        }
        if (c.state == Connection::State::kReadingBody) {
          return Respond(c, ErrorResponse(400, "incomplete request body"));
        }
        return Respond(c, ErrorResponse(400, "incomplete request head"));
      }
      if (c.state == Connection::State::kDraining) {
        c.drained += static_cast<std::size_t>(got);
        if (c.drained > kDrainBytes) return Close(c);
        continue;
      }
      if (c.state == Connection::State::kWaiting) continue;  // bytes after the head: ignored
      // Reading the head: every byte of the read is kept (OnInput answers a
      // 431 as soon as more than kMaxHeadBytes are held without an end, so
      // `in` stays under kMaxHeadBytes + sizeof buf). Capped at
      // kMaxHeadBytes + 1, a read that took the rest of a head of over 4 KiB
      // and the start of a symbolz body lost the body's first bytes past the
      // cap: the body never completed, and the client got a 408 after 10 s.
      const std::size_t cap = c.state == Connection::State::kReadingBody ? c.head_end + c.plan.body_bytes
                                                                           : kMaxHeadBytes + sizeof buf;
      const std::size_t room = cap > c.in.size() ? cap - c.in.size() : 0;
      c.in.append(buf, static_cast<std::size_t>(got) < room ? static_cast<std::size_t>(got) : room);
      if (c.state == Connection::State::kReadingBody) {
        if (OnBody(c)) return;
        continue;
      }
      if (OnInput(c)) return;
    }
  }

  // True when the connection has moved past reading.
  bool OnInput(Connection& c) {
    const std::size_t end = FindHeadEnd(c.in);
    if (end == 0) {
      if (c.in.size() > kMaxHeadBytes) {
        Respond(c, ErrorResponse(431, "request header fields too large"));
        return true;
      }
      const Error e = CheckPartialHead(c.in);
      if (e.status != 0) {
        Respond(c, ErrorResponse(e.status, e.reason));
        return true;
      }
      return false;
    }
    Request req;
    const Error e = ParseHead(std::string_view(c.in).substr(0, end), req);
    if (e.status != 0) {
      Respond(c, ErrorResponse(e.status, e.reason, req.method == "HEAD"));
      return true;
    }
    c.plan = PlanRequest(req);
    c.chunked = req.minor_version >= 1;
    if (c.plan.action == Action::kSymbol && c.plan.body_bytes == 0) {
      Dispatch(c, nullptr, ArenaString(req.raw_query));
      return true;
    }
    if (c.plan.action == Action::kSymbol) {
      c.head_end = end;
      c.state = Connection::State::kReadingBody;
      if (c.in.size() > end + c.plan.body_bytes) c.in.resize(end + c.plan.body_bytes);
      c.in.reserve(end + c.plan.body_bytes);
      // `Expect: 100-continue`: the client waits for this before it sends
      // the body (curl a second, its --expect100-timeout; then it sends
      // anyway). As Go's server: when the body is to be read, and to an
      // HTTP/1.1 client. Not when the whole body is here already (RFC 9110
      // 10.1.1 lets a server omit it then). The body stays bounded by the
      // head deadline (kHeadTimeoutMs from the accept), as without it.
      if (req.expect_continue && req.minor_version >= 1 && c.in.size() < end + c.plan.body_bytes) {
        c.continue_left = kContinueLine.size();
        if (!SendContinue(c)) return true;
      }
      OnBody(c);
      return true;
    }
    if (c.plan.action == Action::kDelta) {
      std::size_t waiting = 0;
      for (const Connection& other : conns_) waiting += other.state == Connection::State::kWaiting ? 1 : 0;
      if (waiting >= limits_.max_delta_windows) {
        Respond(c, ErrorResponse(503, ("too many ?seconds= profiles in progress (at most " +
                                       ArenaDecimal(limits_.max_delta_windows) + " at once)")
                                          .c_str()));
        return true;
      }
      if (c.plan.peak) {
        // One peak window at a time in the process: each starts by resetting
        // the server's window (g_window_peak), so a second one would reset the
        // first's, which would then serve the second's period under its own
        // duration. The flag is the process's, not this server's connections:
        // a second HttpServer (HEAPPROF=http beside the program's own) reset
        // the first one's window.
        ArenaPtr<ProfileBaseline> start = MakeArena<ProfileBaseline>();  // no counts: the start's time only
        if (g_window_peak_open.exchange(true, std::memory_order_acq_rel)) {
          Respond(c, ErrorResponse(503, "a peak ?seconds= profile is already in progress (one at a time: "
                                        "each starts by resetting the peak)"));
          return true;
        }
        // A window of its own: the peak from now on. Not the program's window
        // (ResetPeak()), which goes on: peak_at_exit and WritePeakHeapProfile
        // still see the peak since start (or the program's own ResetPeak).
        {
          ReentrancyGuard guard;
          g_window_peak.Reset();
        }
        c.baseline = std::move(start);
      } else {
        c.baseline = MakeArena<ProfileBaseline>(TakeBaseline());
      }
      g_delta_windows_started.fetch_add(1, std::memory_order_acq_rel);
      c.state = Connection::State::kWaiting;
      // The window is at least `seconds` long from the baseline: the deadline
      // in whole ms rounded up (MonotonicMillis truncates, so a deadline
      // from it could end the window up to 1 ms short).
      const std::uint64_t end_ns = c.baseline->monotonic_nanos + static_cast<std::uint64_t>(c.plan.seconds) * 1000000000u;
      c.deadline_ms = static_cast<std::int64_t>((end_ns + 999999u) / 1000000u);
      ArenaString().swap(c.in);
      return true;
    }
    if (c.plan.action == Action::kProfile || c.plan.action == Action::kText || c.plan.action == Action::kCmdline) {
      // (/cmdline too: reading /proc/self/cmdline takes the process's mmap
      // lock, which a long mmap or munmap elsewhere can hold: not on the loop.)
      Dispatch(c, nullptr, ArenaString());
    } else {
      Respond(c, BuildResponse(c.plan));  // the index, a redirect, an error: nothing to build
    }
    return true;
  }

  // True once the body is complete and answered.
  bool OnBody(Connection& c) {
    if (c.in.size() < c.head_end + c.plan.body_bytes) return false;
    Dispatch(c, nullptr, c.in.substr(c.head_end));
    return true;
  }

  void Respond(Connection& c, ArenaString response) {
    ArenaString().swap(c.in);
    c.out = std::move(response);
    c.sent = 0;
    c.state = Connection::State::kWriting;
    c.deadline_ms = MonotonicMillis() + limits_.write_timeout_ms;
    Flush(c);
  }

  // Sends `data` from offset `sent` on, advancing it, until all is sent or
  // the socket's queue is full; false when the connection was closed (a
  // send error).
  bool SendFrom(Connection& c, std::string_view data, std::size_t& sent) {
    while (sent < data.size()) {
      const ssize_t n = ::send(c.fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        Close(c);
        return false;
      }
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }

  // Sends what is left of a `100 Continue`; false when the connection was
  // closed.
  bool SendContinue(Connection& c) {
    std::size_t sent = kContinueLine.size() - c.continue_left;
    const bool open = SendFrom(c, kContinueLine, sent);
    c.continue_left = kContinueLine.size() - sent;
    return open;
  }

  void Flush(Connection& c) {
    const std::size_t was_sent = c.sent, was_continue_left = c.continue_left;
    if (!SendContinue(c)) return;
    if (c.continue_left == 0 && !SendFrom(c, std::string_view(c.out.data(), c.out.size()), c.sent)) return;
    // The write deadline counts from the last progress: only a client that
    // stops reading is dropped. Counted from the start of the response (or
    // of a piece), a client reading slowly but steadily was cut off mid-text.
    if (c.sent != was_sent || c.continue_left != was_continue_left) {
      c.deadline_ms = MonotonicMillis() + limits_.write_timeout_ms;
      c.unsent = UnsentBytes(c.fd);
    }
    if (c.continue_left != 0 || c.sent < c.out.size()) return;
    if (c.stream) {  // the piece is out: the builder makes the next
      BuildJob job;
      job.serial = c.serial;
      job.stream = std::move(c.stream);
      job.chunked = c.chunked;
      Queue(std::move(job));
      ArenaString().swap(c.out);
      c.sent = 0;
      c.state = Connection::State::kBuilding;
      c.deadline_ms = INT64_MAX;
      return;
    }
    // All sent: half-close so the client sees the end of the response, then
    // drain (see kDrainTimeoutMs).
    ::shutdown(c.fd, SHUT_WR);
    ArenaString().swap(c.out);
    c.state = Connection::State::kDraining;
    c.deadline_ms = MonotonicMillis() + kDrainTimeoutMs;
  }

  void Expire(Connection& c) {
    switch (c.state) {
      case Connection::State::kReading:
        Respond(c, ErrorResponse(408, "timed out reading the request head"));
        break;
      case Connection::State::kReadingBody:
        Respond(c, ErrorResponse(408, "timed out reading the request body"));
        break;
      case Connection::State::kWaiting:
        Dispatch(c, std::move(c.baseline), ArenaString());
        break;
      case Connection::State::kBuilding:  // no deadline: the builder answers
        break;
      case Connection::State::kWriting: {  // a client that does not read its response
        // send() succeeds only once a third of the socket's buffer is free
        // (several MiB on loopback), so a slow reader can go a long time
        // without one: the bytes leaving the socket's queue are progress too.
        const int unsent = UnsentBytes(c.fd);
        if (unsent >= 0 && c.unsent >= 0 && unsent < c.unsent) {
          c.unsent = unsent;
          c.deadline_ms = MonotonicMillis() + limits_.write_timeout_ms;
          break;
        }
        Close(c);
        break;
      }
      case Connection::State::kDraining:  // a client that does not stop sending
        Close(c);
        break;
    }
  }

  // What the socket has yet to deliver (sent or not, unacknowledged); -1 if
  // unknown.
  static int UnsentBytes(int fd) noexcept {
    int n = 0;
    return ::ioctl(fd, SIOCOUTQ, &n) == 0 ? n : -1;
  }

  // shutdown() first: it ends the connection for the client even when a
  // forked child holds a copy of the socket, where close() alone only drops
  // this process's reference and the client waits for the child to exit.
  static void ShutdownAndClose(int fd) noexcept {
    if (fd < 0) return;
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }

  // A /peak?seconds= window that ends without its profile (the client hung
  // up, the server stops) closes the server's peak window too: left open,
  // every sampled allocation of the process went on feeding it (an Observe,
  // and a bucket walk at each new 10% high) until the next such request.
  // While waiting, or once its job is queued but not built (DropJob; the
  // builder closes it when it copies the window).
  static bool IsPeakWindow(const Plan& plan) noexcept { return plan.peak && plan.action == Action::kDelta; }
  static void AbandonPeakWindow(const Connection& c) noexcept {
    if (c.state == Connection::State::kWaiting && IsPeakWindow(c.plan)) {
      g_window_peak_open.store(false, std::memory_order_relaxed);
    }
  }

  void Close(Connection& c) noexcept {
    AbandonPeakWindow(c);
    ShutdownAndClose(c.fd);
    c.fd = -1;
    // A job the builder has not taken yet is dropped: nobody would read what
    // it builds. Clients that send a request and reset the connection at once
    // otherwise queued one scan each (500 of them: 13 s of CPU, and the next
    // request waited behind them all). A job being built runs to its end; its
    // result finds no connection.
    if (c.state == Connection::State::kBuilding) DropJob(c.serial);
  }

  void DropJob(std::uint64_t serial) noexcept {
    BuildJob dropped;  // freed after the lock is let go
    pthread_mutex_lock(&jobs_mutex_);
    for (ArenaDeque<BuildJob>* queue : {&jobs_, &scan_jobs_}) {
      for (auto it = queue->begin(); it != queue->end(); ++it) {
        if (it->serial != serial) continue;
        dropped = std::move(*it);
        queue->erase(it);
        if (!dropped.stream && IsPeakWindow(dropped.plan)) g_window_peak_open.store(false, std::memory_order_relaxed);
        break;
      }
    }
    pthread_mutex_unlock(&jobs_mutex_);
  }

  void Reap() {
    std::size_t keep = 0;
    for (std::size_t i = 0; i < conns_.size(); ++i) {
      if (conns_[i].fd < 0) continue;
      if (keep != i) conns_[keep] = std::move(conns_[i]);
      ++keep;
    }
    conns_.resize(keep);
  }

  const Limits limits_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  FileId listen_id_, wake_id_;          // what listen_fd_ and wake_fd_ were when opened
  std::atomic<bool> fds_lost_{false};  // the program closed one of them (LostDescriptors)
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  ArenaVector<Connection> conns_;  // the server thread's only
  std::uint64_t next_serial_ = 0;  // the server thread's only
  pthread_t builder_{};
  pthread_t scan_builder_{};
  pthread_mutex_t jobs_mutex_ = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t jobs_cond_ = PTHREAD_COND_INITIALIZER;
  ArenaDeque<BuildJob> jobs_;         // under jobs_mutex_
  ArenaDeque<BuildJob> scan_jobs_;    // under jobs_mutex_: /retention's, for scan_builder_ (IsScan)
  ArenaVector<BuildResult> results_;  // under jobs_mutex_
  bool builder_stop_ = false;         // under jobs_mutex_
  std::int64_t accept_paused_until_ms_ = 0;
  static constexpr int kAcceptRefusals = 10;  // 100 ms apart
  int accept_refusals_ = 0;  // accept4's EPERM/EACCES/ENOSYS in a row (Accept)
  std::atomic<bool> gave_up_{false};  // GiveUp: the server thread has ended
  char gave_up_message_[160] = {};
  const pid_t owner_pid_ = ::getpid();
  pthread_t thread_{};
  bool running_ = false;
  StartError error_;
  Server* next_ = nullptr;  // g_servers, under its mutex
  friend void CloseServersInForkedChild() noexcept;
};

inline void CloseServersInForkedChild() noexcept {
  for (Server* s = g_servers.head; s != nullptr; s = s->next_) s->CloseListenerInChild();
  g_servers.head = nullptr;  // the child's servers own nothing to stop
}

}  // namespace http

struct EngineApi;  // implementation.hpp

// What heapprof::HttpServer (heapprof/http.hpp) points at: a server of this
// copy of heapprof, or one that the engine recording the process runs for it
// (libheapprof_preload.so's: `remote`, a handle of that engine's).
struct HttpServerState {
  explicit HttpServerState(std::string_view listen) { server.emplace(listen); }
  HttpServerState(const EngineApi* e, void* handle) noexcept : engine(e), remote(handle) {}
  std::optional<http::Server> server;
  const EngineApi* engine = nullptr;
  void* remote = nullptr;
};

}  // namespace detail
}  // namespace heapprof
