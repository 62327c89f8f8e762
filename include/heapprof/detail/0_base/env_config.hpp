// heapprof: the HEAPPROF environment variable, read once at start-up.
// Format (like jemalloc's MALLOC_CONF): comma-separated key=value pairs, e.g.
//   HEAPPROF=rate=512k
// An unknown key or a bad value is reported on one stderr line and ignored;
// the other pairs still apply and nothing aborts. Parsing allocates nothing:
// it runs from inside the first operator new.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <csignal>
#include <cstring>
#include <string_view>

namespace heapprof {
namespace detail {

// Where heapprof's lines go (HEAPPROF log=): stderr (the default, and
// log=stderr), nowhere (log=none), or appended to a file (log=PATH, relative
// to the working directory at start-up). A build run under the preload
// library (configure checks, CMake's try_compile, tests that compare
// stderr) must not find "heapprof: wrote ..." lines in its tools' stderr.
// The file is opened for each message and closed
// after it (O_APPEND: lines of several processes sharing it stay whole):
// the program owns every descriptor. When it cannot be opened the message
// goes to stderr, not nowhere.
//
// Stderr itself is the one the program started with: its identity (device
// and inode) is taken at start-up (RememberStderr). A program that closed
// fd 2 later (a daemon) hands the number to its next descriptor: an
// accepted client's socket, its database file. A line is written to fd 2
// only while it is that same file, or where a redirection of stderr goes: a
// terminal or other character device (/dev/null), a pipe (a logger), or a
// regular file opened for appending (freopen "a"). Otherwise it is dropped.
struct ReportSink {
  enum Mode : int { kStderr = 0, kNone = 1, kFile = 2 };
  std::atomic<int> mode{kStderr};
  std::atomic<bool> stderr_known{false};  // RememberStderr ran
  bool stderr_open = false;               // fd 2 was open then
  dev_t stderr_dev = 0;
  ino_t stderr_ino = 0;
  char path[4096] = {};
};
inline ReportSink g_report_sink;

// Once, at start-up (EnsureInit), before any line.
inline void RememberStderr() noexcept {
  ReportSink& sink = g_report_sink;
  struct stat st {};
  sink.stderr_open = ::fstat(2, &st) == 0;
  sink.stderr_dev = st.st_dev;
  sink.stderr_ino = st.st_ino;
  sink.stderr_known.store(true, std::memory_order_release);
}

// Whether a line may go to fd 2 now (see ReportSink). Keeps errno.
inline bool StderrWritable() noexcept {
  const ReportSink& sink = g_report_sink;
  const int saved = errno;
  struct stat st {};
  bool ok = ::fstat(2, &st) == 0;
  if (ok && sink.stderr_known.load(std::memory_order_acquire) &&
      !(sink.stderr_open && st.st_dev == sink.stderr_dev && st.st_ino == sink.stderr_ino)) {
    const int flags = ::fcntl(2, F_GETFL);
    ok = flags >= 0 && (flags & O_ACCMODE) != O_RDONLY &&
         (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || (S_ISREG(st.st_mode) && (flags & O_APPEND) != 0));
  }
  errno = saved;
  return ok;
}

// The descriptor one message goes to: 2, -1 (dropped) or the log file
// opened for it (*opened: ReportFdDone closes it). Keeps errno.
inline int ReportFd(bool* opened) noexcept {
  *opened = false;
  const int mode = g_report_sink.mode.load(std::memory_order_acquire);
  if (mode == ReportSink::kNone) return -1;
  if (mode == ReportSink::kFile) {
    const int saved = errno;
    int fd;
    do {
      fd = ::open(g_report_sink.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0644);
    } while (fd < 0 && errno == EINTR);
    errno = saved;
    if (fd >= 0) {
      *opened = true;
      return fd;
    }
  }
  return StderrWritable() ? 2 : -1;
}
inline void ReportFdDone(int fd, bool opened) noexcept {
  if (!opened) return;
  const int saved = errno;
  ::close(fd);
  errno = saved;
}

// The signals a write(2) itself can raise, held off on the calling thread
// while this object lives, so that heapprof's writes fail with an error
// instead of ending the program they profile:
// - SIGPIPE: a line to a stderr that is a pipe whose reader has gone (a
//   logger that died, `prog 2>&1 | head -1`, a supervisor that closed its
//   end). The program may never write to stderr itself; heapprof's line at
//   start-up (a bad HEAPPROF value) or at exit ("wrote ...", the leak table)
//   killed it with SIGPIPE, status 141 instead of its own.
// - SIGXFSZ: a write past RLIMIT_FSIZE (`ulimit -f`, systemd's LimitFSIZE=),
//   whose default action ends the process with a core dump: a profile dump
//   killed the program and left its temporary file behind.
// The write then fails (EPIPE, EFBIG), which the caller reports or drops,
// and says so (WriteFailed); the signal the kernel left pending on this
// thread for that write is taken back before the mask is restored, unless
// one was pending already (the program's own, left for it). Only after such
// a failure: a SIGPIPE or SIGXFSZ that came from elsewhere while the mask
// was held (`kill -PIPE`, a handler's write on this thread, process-directed
// with every thread blocking it) is the program's, and was taken back too
// (swallowed) when this looked only at what was pending.
class WriteSignalsHeld {
 public:
  WriteSignalsHeld() noexcept {
    sigemptyset(&held_);
    sigaddset(&held_, SIGPIPE);
    sigaddset(&held_, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &held_, &saved_);
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) == 0) {
      pipe_was_pending_ = sigismember(&pending, SIGPIPE) == 1;
      xfsz_was_pending_ = sigismember(&pending, SIGXFSZ) == 1;
    }
  }
  // A write under this object failed with `err`: EPIPE raised SIGPIPE, EFBIG SIGXFSZ.
  void WriteFailed(int err) noexcept {
    if (err == EPIPE) pipe_raised_ = true;
    if (err == EFBIG) xfsz_raised_ = true;
  }
  ~WriteSignalsHeld() {
    const int saved_errno = errno;
    if (pipe_raised_ || xfsz_raised_) {
      sigset_t pending;
      sigemptyset(&pending);
      if (sigpending(&pending) == 0) {
        if (pipe_raised_ && !pipe_was_pending_ && sigismember(&pending, SIGPIPE) == 1) TakeBack(SIGPIPE);
        if (xfsz_raised_ && !xfsz_was_pending_ && sigismember(&pending, SIGXFSZ) == 1) TakeBack(SIGXFSZ);
      }
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
    errno = saved_errno;
  }
  WriteSignalsHeld(const WriteSignalsHeld&) = delete;
  WriteSignalsHeld& operator=(const WriteSignalsHeld&) = delete;

 private:
  static void TakeBack(int sig) noexcept {
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    const timespec now{0, 0};
    while (sigtimedwait(&one, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  sigset_t held_, saved_;
  bool pipe_was_pending_ = false;
  bool xfsz_was_pending_ = false;
  bool pipe_raised_ = false;
  bool xfsz_raised_ = false;
};

// `n` bytes where heapprof's lines go (ReportFd), with write(2): no stdio
// buffer, no allocation. Keeps errno.
inline void WriteReport(const char* text, std::size_t n) noexcept {
  bool opened;
  const int fd = ReportFd(&opened);
  if (fd < 0) return;
  const int saved = errno;
  WriteSignalsHeld held;  // a reader gone: EPIPE, not the end of the program
  while (n > 0) {
    const ssize_t done = ::write(fd, text, n);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) held.WriteFailed(errno);
    if (done <= 0) break;
    text += done;
    n -= static_cast<std::size_t>(done);
  }
  errno = saved;
  ReportFdDone(fd, opened);
}

// The next comma-separated pair of HEAPPROF's `text`, which moves past it.
inline std::string_view NextConfigPair(std::string_view& text) noexcept {
  const std::size_t comma = text.find(',');
  const std::string_view pair = text.substr(0, comma);
  text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  return pair;
}

// "4096", "512k", "1m", "2g" (suffix case-insensitive, powers of 1024).
inline bool ParseByteSize(std::string_view text, std::uint64_t& out) noexcept {
  if (text.empty()) return false;
  std::uint64_t shift = 0;
  switch (text.back()) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    default: break;
  }
  if (shift != 0) text.remove_suffix(1);
  if (text.empty()) return false;
  // Past UINT64_MAX the value saturates there: the caller clamps it to its
  // maximum like any other value above it (rejecting it as a bad value
  // contradicted the README's "clamped").
  std::uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    value = value > (UINT64_MAX - digit) / 10 ? UINT64_MAX : value * 10 + digit;  // exact: UINT64_MAX itself parses
  }
  out = shift != 0 && value > (UINT64_MAX >> shift) ? UINT64_MAX : value << shift;
  return true;
}

// One line where heapprof's lines go, without allocating. The
// user's text is echoed with control bytes and non-ASCII escaped (\xNN), so
// a value cannot forge lines or terminal sequences.
inline void ReportConfigProblem(std::string_view what, std::string_view item,
                                std::string_view tail = " ignored") noexcept {
  char line[512];
  std::size_t n = 0;
  auto put = [&](std::string_view s) {
    const std::size_t k = s.size() < sizeof line - 1 - n ? s.size() : sizeof line - 1 - n;
    std::memcpy(line + n, s.data(), k);
    n += k;
  };
  put("heapprof: HEAPPROF: ");
  put(what);
  put(" '");
  static const char kHex[] = "0123456789abcdef";
  for (char ch : item.size() > 100 ? item.substr(0, 100) : item) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      put(std::string_view(&ch, 1));
    } else {
      const char esc[4] = {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
      put(std::string_view(esc, 4));
    }
  }
  put("'");
  put(tail);
  put("\n");
  WriteReport(line, n);
}

// The largest values the numeric keys take; larger ones are clamped (and
// said so): past them the tables' own arithmetic would overflow (4 buckets
// per stack), and nothing real needs more.
constexpr std::uint64_t kMaxConfigRate = (std::uint64_t{1} << 40) - 1;  // 1 TiB, the engine's limit
constexpr std::uint64_t kMaxConfigStacks = std::uint64_t{1} << 24;
constexpr std::uint64_t kMaxConfigLabelSets = std::uint64_t{1} << 20;

// `v` clamped to `max`, with one stderr line when it was above.
inline std::uint64_t ClampConfigValue(const char* what, std::string_view value, std::uint64_t v,
                                      std::uint64_t max, const char* clamped_to) noexcept {
  if (v <= max) return v;
  ReportConfigProblem(what, value, clamped_to);
  return max;
}

// HEAPPROF=lines=0: every profile the process writes is symbolized from the
// symbol tables alone, without reading any DWARF (no files, lines or inlined
// frames). Set once at start-up (EnsureInit), read by the symbolizer. A
// process's first profile with lines reads the DWARF of the objects its PCs
// fall in, inflating it when compressed: Debian's libc6-dbg, 8.5 MB of
// sections, about 24 ms, for the libc frames every stack has. A bash script
// of ~365 short processes under the preload library with dump_at_exit=1 took
// 7.7-9.2 s, 0.88-1.14 s with lines=0 (README "The preload library").
inline std::atomic<bool> g_symbolize_names_only{false};

struct EnvConfig {
  bool has_rate = false;
  std::uint64_t rate = 0;
  bool has_max_label_sets = false;
  std::uint64_t max_label_sets = 0;
  bool has_unwinder = false;
  bool unwinder_table = true;  // unwinder=table; false: unwinder=fp
  // max_stacks=N: cap on distinct stacks (buckets.hpp, README "Limits").
  bool has_max_stacks = false;
  std::uint64_t max_stacks = 0;

  // Automatic dumps and the exit report (dumps.hpp). Strings are copied into
  // the struct: parsing must not allocate.
  static constexpr std::size_t kMaxPath = 1024;
  char dump_prefix[kMaxPath] = {};  // empty: "heapprof" in the working directory
  std::uint64_t dump_interval = 0;  // bytes allocated between dumps; 0 off
  std::uint64_t inuse_interval = 0; // growth of the in-use high-water mark between dumps; 0 off
  std::uint64_t dump_time = 0;      // seconds between dumps; 0 off
  int dump_signal = 0;              // signal number; 0 off
  bool dump_at_exit = false;
  bool leak_report = false;
  bool lines = true;  // lines=0: names only (g_symbolize_names_only)
  // Memory events (README "Memory events").
  bool peak_at_exit = false;         // <prefix>.<pid>.peak.pb.gz at exit
  std::uint32_t dump_near_oom = 0;   // millionths of the memory limit; 0 off
  std::uint64_t rss_interval = 0;    // a dump per new RSS high this far above the last; 0 off
  bool oom_dump = false;             // <prefix>.<pid>.oom.pb.gz when an allocation fails
  std::uint64_t oom_reserve = 0;     // bytes mapped for it at start-up; 0: the default (DefaultOomReserve)
  std::size_t leak_frames = 0;      // frames per leak report row; 0: the default (6)
  // leak_exit_code=N: exit with N when the leak report finds unreachable
  // objects (LeakSanitizer's exitcode); -1 off.
  int leak_exit_code = -1;
  // leak_suppressions=FILE: LeakSanitizer's suppression format ("leak:<pattern>").
  char leak_suppressions[kMaxPath] = {};
  // HTTP endpoint (http.hpp), "host:port"; empty: off.
  static constexpr std::size_t kMaxListen = 256;
  char http[kMaxListen] = {};

  bool WantsDumper() const noexcept {
    return dump_interval != 0 || inuse_interval != 0 || dump_time != 0 || dump_signal != 0 ||
           dump_near_oom != 0 || rss_interval != 0 || oom_dump;
  }
};

// Signal names for dump_signal: "USR1", "SIGUSR1", case-sensitive like kill -l.
// Only signals whose default action a dump may reasonably replace.
struct SignalNameEntry {
  const char* name;
  int number;
};
inline constexpr SignalNameEntry kDumpSignals[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT},   {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"ALRM", SIGALRM},
    {"TERM", SIGTERM}, {"URG", SIGURG},   {"WINCH", SIGWINCH}, {"PWR", SIGPWR},   {"PROF", SIGPROF}, {"VTALRM", SIGVTALRM}};
inline int ParseSignalName(std::string_view name) noexcept {
  if (name.size() > 3 && name.substr(0, 3) == "SIG") name.remove_prefix(3);
  for (const SignalNameEntry& e : kDumpSignals) {
    if (name == e.name) return e.number;
  }
  return 0;
}
// The name ParseSignalName reads as `number` ("?" for none).
inline const char* DumpSignalName(int number) noexcept {
  for (const SignalNameEntry& e : kDumpSignals) {
    if (number == e.number) return e.name;
  }
  return "?";
}

// Copies `value` into a fixed buffer; false if it does not fit or is empty.
template <std::size_t N>
inline bool CopyConfigString(std::string_view value, char (&out)[N]) noexcept {
  if (value.empty() || value.size() >= N) return false;
  std::memcpy(out, value.data(), value.size());
  out[value.size()] = '\0';
  return true;
}

// A plain count: digits only. Past UINT64_MAX it saturates there, so that
// the caller clamps or rejects it by its range (20 digits or more were a
// "bad value" before, even where the README promises a clamp).
inline bool ParseCount(std::string_view text, std::uint64_t& out) noexcept {
  if (text.empty()) return false;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    v = v > (UINT64_MAX - digit) / 10 ? UINT64_MAX : v * 10 + digit;
  }
  out = v;
  return true;
}

// A fraction in (0, 1] as millionths: "0.9", ".95", "1", "1.0" (at most six
// decimals).
inline bool ParseFraction(std::string_view text, std::uint32_t& out) noexcept {
  if (text.empty() || text.size() > 12) return false;
  std::uint64_t whole = 0, frac = 0, scale = 1000000;
  std::size_t i = 0;
  bool digits = false;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i, digits = true) {
    whole = whole * 10 + static_cast<std::uint64_t>(text[i] - '0');
  }
  if (i < text.size()) {
    if (text[i] != '.') return false;
    for (++i; i < text.size(); ++i, digits = true) {
      if (text[i] < '0' || text[i] > '9' || scale == 1) return false;
      scale /= 10;
      frac += static_cast<std::uint64_t>(text[i] - '0') * scale;
    }
  }
  if (!digits || whole > 1) return false;
  const std::uint64_t v = whole * 1000000 + frac;
  if (v == 0 || v > 1000000) return false;
  out = static_cast<std::uint32_t>(v);
  return true;
}

// HEAPPROF's log= (the last one given), applied to g_report_sink before the
// rest is parsed, so that the other keys' problems go where it says. Run
// once, at start-up (EnsureInit); ParseEnvConfig skips the key.
inline void ConfigureReportSink(std::string_view text) noexcept {
  std::string_view value;
  bool given = false;
  while (!text.empty()) {
    const std::string_view pair = NextConfigPair(text);
    if (pair.substr(0, 4) == "log=") {
      value = pair.substr(4);
      given = true;
    }
  }
  if (!given) return;
  ReportSink& sink = g_report_sink;
  if (value == "stderr") {
    sink.mode.store(ReportSink::kStderr, std::memory_order_release);
    return;
  }
  if (value == "none") {
    sink.mode.store(ReportSink::kNone, std::memory_order_release);
    return;
  }
  std::size_t at = 0;
  if (!value.empty() && value[0] != '/') {  // relative: to the working directory now, at start-up
    if (::getcwd(sink.path, sizeof sink.path) == nullptr) {
      ReportConfigProblem("log: the working directory cannot be read for the relative path", value,
                          ": lines stay on stderr");
      return;
    }
    at = std::strlen(sink.path);
    if (at > 0 && sink.path[at - 1] != '/') sink.path[at++] = '/';
  }
  if (value.empty() || at + value.size() >= sizeof sink.path || value.find('\0') != std::string_view::npos) {
    ReportConfigProblem("bad value for log (stderr, none or a file path under 4096 bytes):", value,
                        ": lines stay on stderr");
    return;
  }
  std::memcpy(sink.path + at, value.data(), value.size());
  sink.path[at + value.size()] = '\0';
  sink.mode.store(ReportSink::kFile, std::memory_order_release);
}

// Splits `text` into pairs and applies the known keys; reports the rest.
inline EnvConfig ParseEnvConfig(std::string_view text) noexcept {
  EnvConfig cfg;
  while (!text.empty()) {
    const std::string_view pair = NextConfigPair(text);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    if (eq == std::string_view::npos) {
      ReportConfigProblem("expected key=value, got", pair);
      continue;
    }
    const std::string_view key = pair.substr(0, eq);
    const std::string_view value = pair.substr(eq + 1);
    if (key == "rate") {
      std::uint64_t v;
      if (ParseByteSize(value, v)) {
        cfg.has_rate = true;
        cfg.rate = ClampConfigValue("rate", value, v, kMaxConfigRate, " is above 1 TiB: clamped to 1099511627775");
      } else {
        ReportConfigProblem("bad value for rate (bytes, optional k/m/g suffix):", value);
      }
    } else if (key == "unwinder") {
      if (value == "table" || value == "fp") {
        cfg.has_unwinder = true;
        cfg.unwinder_table = value == "table";
      } else {
        ReportConfigProblem("bad value for unwinder (fp or table):", value);
      }
    } else if (key == "max_label_sets") {
      std::uint64_t v;
      if (ParseCount(value, v) && v > 0) {
        cfg.has_max_label_sets = true;
        cfg.max_label_sets =
            ClampConfigValue("max_label_sets", value, v, kMaxConfigLabelSets, " is above 1048576: clamped to it");
      } else {
        ReportConfigProblem("bad value for max_label_sets (a count > 0):", value);
      }
    } else if (key == "max_stacks") {
      std::uint64_t v;
      if (ParseCount(value, v) && v > 0) {
        cfg.has_max_stacks = true;
        cfg.max_stacks = ClampConfigValue("max_stacks", value, v, kMaxConfigStacks, " is above 16777216: clamped to it");
      } else {
        ReportConfigProblem("bad value for max_stacks (a count > 0):", value);
      }
    } else if (key == "dump_prefix") {
      if (!CopyConfigString(value, cfg.dump_prefix)) {
        ReportConfigProblem("bad value for dump_prefix (a non-empty path under 1024 bytes):", value);
      }
    } else if (key == "dump_interval" || key == "inuse_interval") {
      std::uint64_t v;
      if (ParseByteSize(value, v) && v > 0) {
        (key == "dump_interval" ? cfg.dump_interval : cfg.inuse_interval) = v;
      } else {
        ReportConfigProblem(key == "dump_interval"
                                ? "bad value for dump_interval (bytes > 0, optional k/m/g suffix):"
                                : "bad value for inuse_interval (bytes > 0, optional k/m/g suffix):",
                            value);
      }
    } else if (key == "dump_time") {
      std::uint64_t v;
      if (ParseCount(value, v) && v > 0 && v <= 10u * 365 * 24 * 3600) {
        cfg.dump_time = v;
      } else {
        ReportConfigProblem("bad value for dump_time (whole seconds, 1 to 315360000 = 10 years):", value);
      }
    } else if (key == "dump_signal") {
      const int sig = ParseSignalName(value);
      if (sig != 0) {
        cfg.dump_signal = sig;
      } else {
        ReportConfigProblem("bad value for dump_signal (HUP INT QUIT USR1 USR2 ALRM TERM URG WINCH PWR PROF VTALRM):",
                            value);
      }
    } else if (key == "dump_at_exit" || key == "leak_report") {
      if (value == "1" || value == "0" || value == "true" || value == "false") {
        (key == "dump_at_exit" ? cfg.dump_at_exit : cfg.leak_report) = value == "1" || value == "true";
      } else {
        ReportConfigProblem(key == "dump_at_exit" ? "bad value for dump_at_exit (0 or 1):"
                                                  : "bad value for leak_report (0 or 1):",
                            value);
      }
    } else if (key == "lines") {
      if (value == "1" || value == "0" || value == "true" || value == "false") {
        cfg.lines = value == "1" || value == "true";
      } else {
        ReportConfigProblem("bad value for lines (0 or 1):", value);
      }
    } else if (key == "peak_at_exit" || key == "oom_dump") {
      if (value == "1" || value == "0" || value == "true" || value == "false") {
        (key == "peak_at_exit" ? cfg.peak_at_exit : cfg.oom_dump) = value == "1" || value == "true";
      } else {
        ReportConfigProblem(key == "peak_at_exit" ? "bad value for peak_at_exit (0 or 1):"
                                                  : "bad value for oom_dump (0 or 1):",
                            value);
      }
    } else if (key == "dump_near_oom") {
      std::uint32_t v;
      if (ParseFraction(value, v)) {
        cfg.dump_near_oom = v;
      } else {
        ReportConfigProblem("bad value for dump_near_oom (a fraction of the memory limit, 0 < x <= 1, e.g. 0.9):",
                            value);
      }
    } else if (key == "oom_reserve") {
      std::uint64_t v;
      if (ParseByteSize(value, v) && v > 0 && v <= (std::uint64_t{1} << 40)) {
        cfg.oom_reserve = v;
      } else {
        ReportConfigProblem("bad value for oom_reserve (bytes > 0, optional k/m/g suffix):", value);
      }
    } else if (key == "rss_interval") {
      std::uint64_t v;
      if (ParseByteSize(value, v) && v > 0) {
        cfg.rss_interval = v;
      } else {
        ReportConfigProblem("bad value for rss_interval (bytes > 0, optional k/m/g suffix):", value);
      }
    } else if (key == "leak_frames") {
      std::uint64_t v;
      if (ParseCount(value, v) && v > 0 && v <= 64) {
        cfg.leak_frames = v;
      } else {
        ReportConfigProblem("bad value for leak_frames (1 to 64):", value);
      }
    } else if (key == "leak_exit_code") {
      std::uint64_t v;
      if (ParseCount(value, v)) {
        cfg.leak_exit_code = static_cast<int>(
            ClampConfigValue("leak_exit_code", value, v, 255, " is above 255 (an exit status is 8 bits): clamped to 255"));
      } else {
        ReportConfigProblem("bad value for leak_exit_code (an exit status, 0 to 255):", value);
      }
    } else if (key == "leak_suppressions") {
      if (!CopyConfigString(value, cfg.leak_suppressions)) {
        ReportConfigProblem("bad value for leak_suppressions (a non-empty path under 1024 bytes):", value);
      }
    } else if (key == "log") {
      // ConfigureReportSink's, at start-up.
    } else if (key == "http") {
      if (!CopyConfigString(value, cfg.http)) {
        ReportConfigProblem("bad value for http (host:port):", value);
      }
    } else {
      ReportConfigProblem("unknown key", key);
    }
  }
  return cfg;
}

}  // namespace detail
}  // namespace heapprof
