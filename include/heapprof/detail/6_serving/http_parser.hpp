// heapprof: the HTTP/1.x request head parser and the /debug/pprof/ router
// behind heapprof::HttpServer. Pure functions over bytes: no sockets, no
// globals, so the fuzz target (tests/fuzz/fuzz_http_request.cpp) drives
// exactly what the server runs.
//
// What is accepted (RFC 9112, the subset a profile scraper needs):
//   request line   METHOD SP target SP HTTP/1.0|HTTP/1.1, the target in origin
//                  form (/path?query) or absolute form (http://host/path?query)
//   header lines   name ":" OWS value OWS, ended by an empty line
//   line ends      CRLF or a bare LF (as Go's net/http accepts)
// Request bodies: only POST /debug/pprof/symbol has one (pprof's symbolz
// protocol), sized by Content-Length, at most kMaxBodyBytes (else 413); any
// Transfer-Encoding is refused, and so is a body on any other request (the
// profile endpoints take everything from the query). `Expect: 100-continue`
// (the client holds the body back until the interim answer comes: curl, told
// to or for a body over 1 MiB, a second) is honoured by the server as Go's
// net/http does: the interim `100 Continue` when the body is to be read, the
// expectation ignored when there is no body or the client speaks HTTP/1.0;
// any other expectation is a 417 (Go's rule: the first Expect field counts).
// Limits: the head (request line + headers + empty line) is at most
// kMaxHeadBytes and has at most kMaxHeaders header lines, else 431.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "heapprof/detail/0_base/arena_allocator.hpp"

namespace heapprof {
namespace detail {
namespace http {

constexpr std::size_t kMaxHeadBytes = 8192;
constexpr std::size_t kMaxHeaders = 64;
constexpr std::size_t kMaxMethodBytes = 16;
constexpr std::uint64_t kMaxBodyBytes = 1 << 20;
// ?seconds=N above this is refused: a delta request holds a connection slot
// for its whole window.
constexpr std::int64_t kMaxDeltaSeconds = 3600;

// A refusal: the status and the one-line reason sent as the body.
struct Error {
  int status = 0;  // 0: no error
  const char* reason = "";
  const char* allow = "GET, HEAD";  // 405: the methods the path takes (the Allow header)
};

struct Request {
  std::string_view method;  // views into the parsed head
  std::string_view target;  // as sent
  int minor_version = 1;    // HTTP/1.<minor>
  ArenaString path;         // percent-decoded
  std::string_view raw_query;  // after '?', as sent (the symbolz GET form)
  std::uint64_t content_length = 0;
  // Query parameters the profile endpoints read; the first occurrence wins
  // (Go's FormValue). Unknown parameters are ignored, as Go does.
  bool has_seconds = false, has_debug = false, has_gc = false;
  ArenaString seconds, debug, gc;  // percent-decoded values
  bool has_host = false;
  bool close = false;  // Connection: close asked for (we always close anyway)
  // The first Expect field has the token 100-continue (the server answers
  // `100 Continue` before it reads a body; without a body, or from an
  // HTTP/1.0 client, the expectation is ignored, RFC 9110 10.1.1).
  bool expect_continue = false;
};

inline bool IsTokenChar(unsigned char c) noexcept {
  // RFC 9110 tchar
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-':
    case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

inline bool EqualsNoCase(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    unsigned char x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
    if (x >= 'A' && x <= 'Z') x = static_cast<unsigned char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<unsigned char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Whether `token` is one of the comma- or space-separated elements of a field
// value, ASCII case-insensitively ("100-Continue", "foo, 100-continue").
inline bool HasToken(std::string_view value, std::string_view token) noexcept {
  while (!value.empty()) {
    const std::size_t end = value.find_first_of(", \t");
    if (EqualsNoCase(value.substr(0, end), token)) return true;
    if (end == std::string_view::npos) break;
    value.remove_prefix(end + 1);
  }
  return false;
}

// Offset one past the empty line that ends the head, or 0 while it has not
// arrived. Monotone in the input: for a prefix of the bytes it returns 0 or the
// same offset, so the server can call it again after every read.
inline std::size_t FindHeadEnd(std::string_view buf) noexcept {
  // An empty line is "\n\n" or "\n\r\n". Leading empty lines before the
  // request line are tolerated by RFC 9112 but no scraper sends them; they
  // are a request line error below.
  for (std::size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != '\n') continue;
    if (i + 1 < buf.size() && buf[i + 1] == '\n') return i + 2;
    if (i + 2 < buf.size() && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
  }
  return 0;
}

// Splits off one line (without its CRLF/LF) from `rest`; false if none.
inline bool NextLine(std::string_view& rest, std::string_view& line) noexcept {
  const std::size_t nl = rest.find('\n');
  if (nl == std::string_view::npos) return false;
  line = rest.substr(0, nl);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  rest.remove_prefix(nl + 1);
  return true;
}

inline int HexValue(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoding; in a query, '+' is a space. False on a bad escape or a NUL.
inline bool PercentDecode(std::string_view in, bool plus_is_space, ArenaString& out) {
  out.clear();
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      c = static_cast<char>(hi * 16 + lo);
      if (c == '\0') return false;
      i += 2;
    } else if (c == '+' && plus_is_space) {
      c = ' ';
    }
    out += c;
  }
  return true;
}

inline Error ParseQuery(std::string_view query, Request& req) {
  ArenaString key, value;
  while (!query.empty()) {
    std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query.remove_prefix(amp == std::string_view::npos ? query.size() : amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    const std::string_view raw_key = pair.substr(0, eq);
    const std::string_view raw_value = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    if (!PercentDecode(raw_key, true, key) || !PercentDecode(raw_value, true, value)) {
      return Error{400, "malformed percent-encoding in the query"};
    }
    if (key == "seconds" && !req.has_seconds) {
      req.has_seconds = true;
      req.seconds = value;
    } else if (key == "debug" && !req.has_debug) {
      req.has_debug = true;
      req.debug = value;
    } else if (key == "gc" && !req.has_gc) {
      req.has_gc = true;
      req.gc = value;
    }
  }
  return Error{};
}

// The request line of a head whose first line may not have arrived yet:
// rejects junk as soon as it is certainly junk, so a client sending garbage
// without ever sending an empty line gets its 400 at once instead of at the
// read deadline. {0} while the prefix could still be a request.
inline Error CheckPartialHead(std::string_view buf) noexcept {
  const std::size_t limit = buf.size() < kMaxMethodBytes + 1 ? buf.size() : kMaxMethodBytes + 1;
  for (std::size_t i = 0; i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(buf[i]);
    if (c == ' ') return i == 0 ? Error{400, "malformed request line"} : Error{};
    if (!IsTokenChar(c)) return Error{400, "malformed request line"};
  }
  if (buf.size() > kMaxMethodBytes) return Error{400, "malformed request line: method too long"};
  return Error{};
}

// Parses a complete head (FindHeadEnd's bytes). `req` views into `head`.
inline Error ParseHead(std::string_view head, Request& req) {
  req = Request{};
  if (head.size() > kMaxHeadBytes) return Error{431, "request header fields too large"};
  std::string_view rest = head, line;
  if (!NextLine(rest, line)) return Error{400, "malformed request line"};

  // METHOD SP target SP HTTP/1.x, single spaces.
  const std::size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0 || sp1 > kMaxMethodBytes) {
    return Error{400, "malformed request line"};
  }
  req.method = line.substr(0, sp1);
  for (char c : req.method) {
    if (!IsTokenChar(static_cast<unsigned char>(c))) return Error{400, "malformed request line"};
  }
  const std::size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1) return Error{400, "malformed request line"};
  req.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || version[5] < '0' ||
      version[5] > '9' || version[7] < '0' || version[7] > '9') {
    return Error{400, "malformed HTTP version"};
  }
  if (version[5] != '1') return Error{505, "HTTP version not supported"};
  req.minor_version = version[7] - '0';
  for (char c : req.target) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return Error{400, "malformed request target"};
  }
  // The absolute form (http://host/path), which RFC 9112 (3.2.2) says a
  // server must accept though clients send it only to proxies: its path
  // serves (the Host header still required of HTTP/1.1, as Go's net/http
  // does). A bare authority (http://host) is the path "/".
  for (const std::string_view scheme : {std::string_view("http://"), std::string_view("https://")}) {
    if (req.target.size() >= scheme.size() && EqualsNoCase(req.target.substr(0, scheme.size()), scheme)) {
      const std::size_t path = req.target.find('/', scheme.size());
      if (path == std::string_view::npos && req.target.find('?') != std::string_view::npos) break;  // http://host?q: refused below
      req.target = path == std::string_view::npos ? std::string_view("/") : req.target.substr(path);
      break;
    }
  }
  if (req.target.empty() || req.target[0] != '/') {
    return Error{400, "unsupported request target: expected a path such as /debug/pprof/heap"};
  }

  // Headers.
  std::size_t count = 0;
  bool has_length = false, ended = false, has_expect = false, expect_other = false;
  while (NextLine(rest, line)) {
    if (line.empty()) {
      ended = true;
      break;
    }
    if (++count > kMaxHeaders) return Error{431, "too many header fields"};
    if (line[0] == ' ' || line[0] == '\t') return Error{400, "obsolete header line folding"};
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return Error{400, "malformed header field"};
    const std::string_view name = line.substr(0, colon);
    for (char c : name) {
      if (!IsTokenChar(static_cast<unsigned char>(c))) return Error{400, "malformed header field name"};
    }
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    for (char c : value) {
      const unsigned char u = static_cast<unsigned char>(c);
      if ((u < 0x20 && u != '\t') || u == 0x7f) return Error{400, "malformed header field value"};
    }
    if (EqualsNoCase(name, "host")) {
      if (req.has_host) return Error{400, "duplicate Host header"};
      req.has_host = true;
    } else if (EqualsNoCase(name, "content-length")) {
      if (value.empty() || value.size() > 19) return Error{400, "malformed Content-Length"};
      std::uint64_t length = 0;
      for (char c : value) {
        if (c < '0' || c > '9') return Error{400, "malformed Content-Length"};
        length = length * 10 + static_cast<std::uint64_t>(c - '0');
      }
      if (has_length && length != req.content_length) return Error{400, "conflicting Content-Length headers"};
      has_length = true;
      req.content_length = length;
    } else if (EqualsNoCase(name, "transfer-encoding")) {
      return Error{400, "Transfer-Encoding not supported: send Content-Length"};
    } else if (EqualsNoCase(name, "connection")) {
      if (EqualsNoCase(value, "close")) req.close = true;
    } else if (EqualsNoCase(name, "expect") && !has_expect) {
      // Only the first Expect field counts (Go's Header.get), and an empty
      // one asks nothing.
      has_expect = true;
      req.expect_continue = HasToken(value, "100-continue");
      expect_other = !req.expect_continue && !value.empty();
    }
  }
  if (!ended) return Error{400, "incomplete request head"};
  if (req.content_length > kMaxBodyBytes) return Error{413, "request body too large"};
  if (req.minor_version >= 1 && !req.has_host) return Error{400, "missing required Host header"};
  if (expect_other) return Error{417, "unsupported Expect header: only 100-continue is supported"};

  // Path and query.
  const std::size_t q = req.target.find('?');
  std::string_view raw_path = req.target.substr(0, q);
  const std::size_t hash = raw_path.find('#');
  if (hash != std::string_view::npos) raw_path = raw_path.substr(0, hash);
  if (!PercentDecode(raw_path, false, req.path)) return Error{400, "malformed percent-encoding in the path"};
  if (q != std::string_view::npos) {
    std::string_view query = req.target.substr(q + 1);
    const std::size_t qhash = query.find('#');
    if (qhash != std::string_view::npos) query = query.substr(0, qhash);
    req.raw_query = query;
    const Error e = ParseQuery(query, req);
    if (e.status != 0) return e;
  }
  return Error{};
}

// What the server does with a parsed request.
enum class Action {
  kError,     // send `error`
  kRedirect,  // 301 to `location` (a path that is not clean, /debug/pprof)
  kIndex,     // the HTML index
  kProfile,   // gzip'ed pprof, now
  kDelta,     // gzip'ed pprof delta after `seconds`
  kText,      // legacy text heap profile (debug != 0)
  kSymbol,    // pprof's symbolz: addresses from the body (POST) or the query
  kCmdline,   // the program's arguments, NUL-separated (Go's Cmdline handler)
};

struct Plan {
  Action action = Action::kError;
  Error error;
  bool head_only = false;  // HEAD: the same headers, no body
  bool allocs = false;     // /allocs (default sample type alloc_space)
  bool peak = false;       // /peak: the peak profile (?seconds=N: a new peak window of N s)
  bool retention = false;  // /retention: the retention profile (retention.hpp); pprof only
  std::int64_t seconds = 0;
  std::uint64_t body_bytes = 0;  // kSymbol POST: the body to read first
  // kRedirect: the Location (an escaped path, then the query as sent), and
  // whether the response has Go's HTML body and its Content-Type (GET and
  // HEAD; other methods get neither, as from Go's http.Redirect).
  ArenaString location;
  bool redirect_html = false;
};

// Go's ServeMux cleanPath: path.Clean of a rooted path (no empty or "."
// segments, ".." takes away the segment before it and nothing at the root),
// with a trailing slash kept.
inline ArenaString CleanPath(std::string_view p) {
  ArenaString out;
  out.reserve(p.size() + 1);
  std::size_t i = 0;
  while (i < p.size()) {
    std::size_t end = p.find('/', i);
    if (end == std::string_view::npos) end = p.size();
    const std::string_view segment = p.substr(i, end - i);
    i = end + 1;
    if (segment.empty() || segment == ".") continue;
    if (segment == "..") {
      const std::size_t slash = out.rfind('/');
      out.resize(slash == ArenaString::npos ? 0 : slash);
      continue;
    }
    out += '/';
    out += segment;
  }
  if (out.empty()) return ArenaString("/");
  if (!p.empty() && p.back() == '/') out += '/';
  return out;
}

// A decoded path as Go's url.URL writes one (EscapedPath): every byte but
// the unreserved ones and $&+,/:;=@ as %XX, so the Location header of a
// redirect never carries a CR, a LF, a space or a '?' that a %0d, %20 or
// %3f in the request's path decoded to.
inline void AppendEscapedPath(std::string_view path, ArenaString& out) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (char ch : path) {
    const unsigned char c = static_cast<unsigned char>(ch);
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      std::string_view("-_.~$&+,/:;=@").find(ch) != std::string_view::npos;
    if (keep) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
}

// strconv.ParseInt(s, 10, 64) as Go's handler uses it: optional sign, decimal.
inline bool ParseInt64(std::string_view s, std::int64_t& out) noexcept {
  if (s.empty()) return false;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') {
    neg = s[0] == '-';
    s.remove_prefix(1);
    if (s.empty()) return false;
  }
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    if (v > (static_cast<std::uint64_t>(INT64_MAX) + 1 - static_cast<std::uint64_t>(c - '0')) / 10) return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (!neg && v > static_cast<std::uint64_t>(INT64_MAX)) return false;
  out = neg ? static_cast<std::int64_t>(0 - v) : static_cast<std::int64_t>(v);
  return true;
}

// strconv.ParseUint(s, 0, 64): "0x" hex, leading "0" octal, else decimal.
inline bool ParseUintBase0(std::string_view s, std::uint64_t& out) noexcept {
  unsigned base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s.remove_prefix(2);
  } else if (s.size() > 1 && s[0] == '0') {
    base = 8;
    s.remove_prefix(1);
  }
  if (s.empty()) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    const int d = HexValue(c);
    if (d < 0 || static_cast<unsigned>(d) >= base) return false;
    if (v > (UINT64_MAX - static_cast<unsigned>(d)) / base) return false;
    v = v * base + static_cast<unsigned>(d);
  }
  out = v;
  return true;
}

// The symbolz request "0xaddr+0xaddr+...": calls f(addr) for each non-zero,
// parseable address (Go skips the others too).
template <typename F>
void ForEachSymbolAddress(std::string_view text, F&& f) {
  while (!text.empty()) {
    const std::size_t plus = text.find('+');
    std::uint64_t pc = 0;
    if (ParseUintBase0(text.substr(0, plus), pc) && pc != 0) f(pc);
    if (plus == std::string_view::npos) break;
    text.remove_prefix(plus + 1);
  }
}

// Routes a request the way Go's net/http/pprof does, with Go's messages.
inline Plan PlanRequest(const Request& req) {
  Plan plan;
  const bool get = req.method == "GET", head = req.method == "HEAD", post = req.method == "POST";
  plan.head_only = head;
  constexpr std::string_view kPrefix = "/debug/pprof/";
  // Go's ServeMux, before any handler and for any method but CONNECT: a path
  // that is not clean ("..", ".", "//") is answered with a 301 to its clean
  // form, and /debug/pprof (a subtree registered only with its slash) with a
  // 301 to /debug/pprof/, the query kept as sent. Before, "/debug/pprof/../pprof/heap"
  // and "/debug//pprof/heap" were a 404, and the query was lost on /debug/pprof.
  if (req.method != "CONNECT") {
    ArenaString clean = CleanPath(req.path);
    if (clean == "/debug/pprof") clean += '/';
    if (clean != req.path) {
      plan.action = Action::kRedirect;
      AppendEscapedPath(clean, plan.location);
      if (!req.raw_query.empty()) {
        plan.location += '?';
        plan.location += req.raw_query;
      }
      plan.redirect_html = get || head;
      return plan;
    }
  }
  if (req.path == "/debug/pprof/symbol" && !get && !head && !post) {
    plan.error = Error{405, "method not allowed: use GET, HEAD or POST", "GET, HEAD, POST"};
    return plan;
  }
  if (req.path == "/debug/pprof/symbol") {
    plan.action = Action::kSymbol;
    plan.body_bytes = post ? req.content_length : 0;
    if (!post && req.content_length != 0) {
      plan.action = Action::kError;
      plan.error = Error{400, "request body not supported"};
    }
    return plan;
  }
  if (!get && !head) {
    plan.error = Error{405, "method not allowed: use GET or HEAD"};
    return plan;
  }
  if (req.content_length != 0) {
    plan.error = Error{400, "request body not supported"};
    return plan;
  }
  if (req.path.compare(0, kPrefix.size(), kPrefix) != 0) {
    plan.error = Error{404, "404 page not found"};
    return plan;
  }
  const std::string_view name = std::string_view(req.path).substr(kPrefix.size());
  if (name.empty()) {
    plan.action = Action::kIndex;
    return plan;
  }
  if (name == "cmdline") {  // Go's Cmdline handler reads no parameters
    plan.action = Action::kCmdline;
    return plan;
  }
  if (name == "retention") {
    // A scan of the process as it is now: no text form, no window.
    if (req.has_seconds && !req.seconds.empty()) {
      // Go's message for a profile without deltas (serveDeltaProfile).
      plan.error = Error{400, "\"seconds\" parameter is not supported for this profile type"};
      return plan;
    }
    plan.retention = true;
    plan.action = Action::kProfile;
    return plan;
  }
  if (name != "heap" && name != "allocs" && name != "peak") {
    plan.error = Error{404, "Unknown profile"};
    return plan;
  }
  plan.allocs = name == "allocs";
  plan.peak = name == "peak";
  // Go's Atoi with the error ignored: anything not an integer is debug=0.
  std::int64_t debug = 0;
  if (req.has_debug && !ParseInt64(req.debug, debug)) debug = 0;
  if (req.has_seconds && !req.seconds.empty()) {
    std::int64_t sec = 0;
    if (!ParseInt64(req.seconds, sec) || sec <= 0) {
      plan.error = Error{400, "invalid value for \"seconds\" - must be a positive integer"};
      return plan;
    }
    if (sec > kMaxDeltaSeconds) {
      plan.error = Error{400, "profile duration exceeds the server's limit of 3600 seconds"};
      return plan;
    }
    if (debug != 0) {
      plan.error = Error{400, "seconds and debug params are incompatible"};
      return plan;
    }
    plan.action = Action::kDelta;
    plan.seconds = sec;
    return plan;
  }
  // gc=1: Go runs a GC first; there is nothing to collect here. Accepted, ignored.
  plan.action = debug != 0 ? Action::kText : Action::kProfile;
  return plan;
}

}  // namespace http
}  // namespace detail
}  // namespace heapprof
