// heapprof: automatic heap profile dumps and the exit-time leak report.
//
// What gperftools' HEAPPROFILE and jemalloc's prof_prefix give, driven by
// HEAPPROF keys (env_config.hpp):
//   dump_prefix=PATH      files PATH.<pid>.<seq>.heap.pb.gz (default prefix "heapprof")
//   dump_interval=SIZE    a dump each time SIZE more bytes have been allocated
//   inuse_interval=SIZE   a dump each time the in-use high-water mark grows by SIZE
//   dump_time=SECONDS     a dump every SECONDS
//   dump_signal=SIGNAME   a dump when the process receives SIGNAME
//   dump_at_exit=1        a last dump at exit
//   leak_report=1         at exit: the in-use profile to PATH.<pid>.leaks.pb.gz
//                         and a table of the top in-use stacks on stderr
//
// Dumps are written by one background thread, never from inside an allocation:
// it sleeps in poll() on a pipe (the signal handler writes a byte to it) with a
// timeout that is the next dump_time deadline, or 10 ms while a byte trigger is
// set, when it reads Stats (a walk of the thread slots). Each file is written
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
#include <map>
#include <poll.h>
#include <pthread.h>
#include <string>
#include <unistd.h>
#include <vector>

#include "heapprof/api.hpp"
#include "heapprof/detail/engine.hpp"
#include "heapprof/detail/writer.hpp"

namespace heapprof {
namespace detail {

// How often the dumper thread reads Stats while a byte trigger is set.
constexpr int kDumpPollMillis = 10;
// Rows in the leak report table.
constexpr std::size_t kLeakReportRows = 10;
// Frames shown per row.
constexpr std::size_t kLeakReportFrames = 4;

// One line to stderr with a single write(2), so lines from threads don't mix.
inline void ReportLine(const std::string& line) noexcept {
  std::string out = "heapprof: " + line + "\n";
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(2, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

inline std::int64_t MonotonicMillis() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

inline std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t u = 0;
  const bool negative = bytes < 0;
  double v = negative ? -bytes : bytes;
  while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%s%.0f %s", negative ? "-" : "", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%s%.2f %s", negative ? "-" : "", v, units[u]);
  }
  return buf;
}

class Dumper {
 public:
  constexpr Dumper() noexcept = default;

  // Starts the thread if a trigger is configured. Called once, at start-up.
  void Start(const EnvConfig& cfg) noexcept {
    cfg_ = &cfg;
    if (!cfg.WantsDumper()) return;
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      ReportLine(std::string("cannot start the dump thread: pipe: ") + std::strerror(errno));
      return;
    }
    if (cfg.dump_signal != 0) InstallSignalHandler(cfg.dump_signal);
    // The thread takes no signals: the program's handlers run on its threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int rc = pthread_create(&thread_, nullptr, &Dumper::Main, this);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (rc != 0) {
      ReportLine(std::string("cannot start the dump thread: ") + std::strerror(rc));
      return;
    }
    running_.store(true, std::memory_order_release);
  }

  // Stops and joins the thread (exit path); later Dump() calls still work.
  void Stop() noexcept {
    if (!running_.exchange(false, std::memory_order_acq_rel)) return;
    stop_.store(true, std::memory_order_release);
    Wake();
    pthread_join(thread_, nullptr);
  }

  // Writes the next <prefix>.<pid>.<seq>.heap.pb.gz; `why` goes in the log line.
  bool Dump(const char* why) noexcept {
    ReentrancyGuard guard;
    pthread_mutex_lock(&write_mutex_);
    bool ok = false;
    try {
      const unsigned seq = ++seq_;
      char name[64];
      std::snprintf(name, sizeof name, ".%ld.%04u.heap.pb.gz", static_cast<long>(getpid()), seq);
      const std::string path = Prefix() + name;
      std::string error;
      ok = WriteProfileFile(path, false, &error);
      if (ok) {
        ReportLine("wrote " + path + " (" + why + ")");
      } else {
        ReportLine("cannot write heap profile (" + std::string(why) + "): " + error);
      }
    } catch (...) {
      ok = false;
    }
    pthread_mutex_unlock(&write_mutex_);
    return ok;
  }

  std::string Prefix() const {
    return cfg_ != nullptr && cfg_->dump_prefix[0] != '\0' ? std::string(cfg_->dump_prefix) : std::string("heapprof");
  }

  // The signal handler's end of the pipe (async-signal-safe: one write(2)).
  void OnSignal() noexcept {
    signal_pending_.store(true, std::memory_order_relaxed);
    Wake();
  }

 private:
  void Wake() noexcept {
    const int saved = errno;
    const char byte = 1;
    ssize_t ignored = ::write(wake_[1], &byte, 1);  // full pipe: a wake-up is already pending
    (void)ignored;
    errno = saved;
  }

  static void SignalHandler(int) noexcept;

  void InstallSignalHandler(int sig) noexcept {
    struct sigaction sa {};
    sa.sa_handler = &Dumper::SignalHandler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(sig, &sa, nullptr) != 0) {
      ReportLine(std::string("cannot install the dump_signal handler: ") + std::strerror(errno));
    }
  }

  static void* Main(void* self) noexcept {
    ReentrancyGuard guard;  // the thread's own allocations are counted, never sampled
    static_cast<Dumper*>(self)->Loop();
    return nullptr;
  }

  void Loop() noexcept {
    const EnvConfig& cfg = *cfg_;
    const bool byte_triggers = cfg.dump_interval != 0 || cfg.inuse_interval != 0;
    std::uint64_t next_alloc_mark = cfg.dump_interval;
    std::uint64_t next_inuse_mark = cfg.inuse_interval;
    const std::int64_t period_ms = static_cast<std::int64_t>(cfg.dump_time) * 1000;
    std::int64_t next_time = period_ms != 0 ? MonotonicMillis() + period_ms : 0;
    char drain[64];
    while (!stop_.load(std::memory_order_acquire)) {
      int timeout = -1;
      if (byte_triggers) timeout = kDumpPollMillis;
      if (next_time != 0) {
        const std::int64_t left = std::max<std::int64_t>(0, next_time - MonotonicMillis());
        if (timeout < 0 || left < timeout) timeout = static_cast<int>(std::min<std::int64_t>(left, 1 << 30));
      }
      pollfd pfd{wake_[0], POLLIN, 0};
      ::poll(&pfd, 1, timeout);
      while (::read(wake_[0], drain, sizeof drain) > 0) {
      }
      if (stop_.load(std::memory_order_acquire)) break;
      if (signal_pending_.exchange(false, std::memory_order_relaxed)) Dump("dump_signal");
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
    }
  }

  const EnvConfig* cfg_ = nullptr;
  int wake_[2] = {-1, -1};
  pthread_t thread_{};
  std::atomic<bool> running_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> signal_pending_{false};
  pthread_mutex_t write_mutex_ = PTHREAD_MUTEX_INITIALIZER;
  unsigned seq_ = 0;  // under write_mutex_
};

inline Dumper g_dumper;

inline void Dumper::SignalHandler(int) noexcept { g_dumper.OnSignal(); }

// ---------------------------------------------------------------- leak report

// "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int>(...)"
// → "std::vector::_M_realloc_insert": template arguments, parameter lists and
// a leading return type dropped, as pprof's default (simplified) names do.
inline std::string SimplifyFunctionName(std::string name) {
  const std::size_t clone = name.find(" [clone ");  // GCC's ".isra.0", ".constprop.0" copies
  if (clone != std::string::npos) name.resize(clone);
  std::string out;
  int angle = 0, paren = 0;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (paren == 0 && angle == 0 && name.compare(i, 21, "(anonymous namespace)") == 0) {
      out += "(anonymous namespace)";
      i += 20;
      continue;
    }
    if (c == '(' && paren == 0 && angle == 0 && i >= 8 && name.compare(i - 8, 10, "operator()") == 0) {
      out += "()";
      ++i;
      continue;
    }
    if (c == '(' && angle == 0) {
      ++paren;
      continue;
    }
    if (c == ')' && paren > 0) {
      --paren;
      continue;
    }
    if (paren > 0) continue;
    // "operator<" / "operator<<" are names, not template brackets.
    if (c == '<' && !(i >= 8 && name.compare(i - 8, 8, "operator") == 0)) {
      ++angle;
      continue;
    }
    if (c == '>' && angle > 0) {
      --angle;
      continue;
    }
    if (angle > 0) continue;
    out += c;
  }
  // Qualifiers after the parameter list.
  for (bool again = true; again;) {
    again = false;
    for (const char* q : {" const", " volatile", " &&", " &", " noexcept"}) {
      const std::size_t n = std::strlen(q);
      if (out.size() > n && out.compare(out.size() - n, n, q) == 0) {
        out.resize(out.size() - n);
        again = true;
      }
    }
  }
  // A return type ("void ", "int* ") before the qualified name.
  std::size_t space = std::string::npos;
  for (std::size_t i = 0, depth = 0; i < out.size(); ++i) {
    if (out[i] == '(') ++depth;
    if (out[i] == ')' && depth > 0) --depth;
    if (out[i] == ' ' && depth == 0) space = i;
  }
  if (space != std::string::npos) out = out.substr(space + 1);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out.empty() ? name : out;
}

struct LeakRow {
  std::vector<std::string> frames;  // simplified names, innermost first
  std::int64_t objects = 0, bytes = 0;
};

// The in-use part of `data`, summed per stack of function names (call sites,
// object sizes and labels merged), largest first, as lines for stderr.
inline std::vector<std::string> FormatLeakTable(const ProfileData& data, Symbolizer& symbolizer,
                                                std::int64_t& total_objects, std::int64_t& total_bytes) {
  std::map<std::vector<std::string>, LeakRow> by_stack;
  std::map<std::uintptr_t, std::string> names;  // pc → simplified name
  total_objects = total_bytes = 0;
  std::string name;
  for (const ProfileSample& s : data.samples) {
    if (s.inuse_objects <= 0) continue;
    std::vector<std::string> frames;
    for (std::uintptr_t pc : s.pcs) {
      auto it = names.find(pc);
      if (it == names.end()) {
        std::uintptr_t start = 0;
        std::string shown;
        if (symbolizer.Lookup(pc - 1, name, start)) {
          shown = SimplifyFunctionName(name);
        } else {
          char hex[32];
          std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(pc));
          shown = hex;
        }
        it = names.emplace(pc, std::move(shown)).first;
      }
      frames.push_back(it->second);
    }
    if (s.truncated) frames.emplace_back("[truncated]");
    if (s.overflow) frames.emplace_back("[heapprof: stack table full]");
    LeakRow& row = by_stack[frames];
    row.objects += s.inuse_objects;
    row.bytes += s.inuse_bytes;
    total_objects += s.inuse_objects;
    total_bytes += s.inuse_bytes;
  }
  std::vector<LeakRow> rows;
  for (auto& entry : by_stack) {
    entry.second.frames = entry.first;
    rows.push_back(std::move(entry.second));
  }
  std::sort(rows.begin(), rows.end(), [](const LeakRow& a, const LeakRow& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.objects > b.objects;
  });
  std::vector<std::string> lines;
  char head[128];
  std::snprintf(head, sizeof head, "%14s %10s  %s", "in-use bytes", "objects", "allocated at (innermost first)");
  lines.emplace_back(head);
  for (std::size_t i = 0; i < rows.size() && i < kLeakReportRows; ++i) {
    const LeakRow& row = rows[i];
    char cols[64];
    std::snprintf(cols, sizeof cols, "%14s %10lld  ", FormatBytes(static_cast<double>(row.bytes)).c_str(),
                  static_cast<long long>(row.objects));
    std::string line = cols;
    for (std::size_t f = 0; f < row.frames.size() && f < kLeakReportFrames; ++f) {
      if (f != 0) line += " < ";
      line += row.frames[f];
    }
    if (row.frames.size() > kLeakReportFrames) line += " < ...";
    lines.push_back(std::move(line));
  }
  if (rows.size() > kLeakReportRows) {
    lines.push_back("... and " + std::to_string(rows.size() - kLeakReportRows) + " more stacks in the profile");
  }
  return lines;
}

inline void LeakReport(const std::string& prefix) noexcept {
  ReentrancyGuard guard;
  try {
    char name[64];
    std::snprintf(name, sizeof name, ".%ld.leaks.pb.gz", static_cast<long>(getpid()));
    const std::string path = prefix + name;
    // One snapshot and one symbolizer for both the file and the table, so
    // they agree and the ELF files are read once.
    const ProfileData data = SnapshotProfile(false);
    const std::vector<LoadedObject> objects = CollectLoadedObjects();
    Symbolizer symbolizer(objects);
    std::string error;
    const bool written = WriteFileAtomic(path, EncodeGzipped(data, objects, symbolizer), &error);
    std::int64_t objects_in_use = 0, bytes_in_use = 0;
    const std::vector<std::string> table = FormatLeakTable(data, symbolizer, objects_in_use, bytes_in_use);
    const std::uint64_t rate = RateOf(g_rate_state.load(std::memory_order_acquire));
    std::string how = rate <= 1 ? std::string(rate == 1 ? "every allocation recorded" : "sampling off")
                                : "estimated from samples, rate " + std::to_string(rate) + " bytes";
    std::string out = "leak report: " + std::to_string(objects_in_use) + " objects, " +
                      FormatBytes(static_cast<double>(bytes_in_use)) + " still in use at exit (" + how + ")";
    if (objects_in_use == 0) out += ": nothing to report";
    ReportLine(out);
    if (objects_in_use != 0) {
      for (const std::string& line : table) ReportLine("  " + line);
    }
    if (written) {
      ReportLine("leak profile: " + path + "  (go tool pprof -sample_index=inuse_space -top " + path + ")");
    } else {
      ReportLine("cannot write the leak profile: " + error);
    }
  } catch (...) {
    ReportLine("leak report: out of memory");
  }
}

// Stops the HEAPPROF=http server (http.hpp sets it).
inline std::atomic<void (*)()> g_stop_http{nullptr};

// atexit (see engine.hpp): the last dump and the leak report.
inline void RunExitActions() {
  if (void (*stop)() = g_stop_http.exchange(nullptr)) stop();
  g_dumper.Stop();
  const EnvConfig& cfg = g_env_config;
  if (cfg.dump_at_exit) g_dumper.Dump("dump_at_exit");
  if (cfg.leak_report) LeakReport(g_dumper.Prefix());
}

// Starts what HEAPPROF asks for. Runs during static initialisation (the inline
// variable below); without HEAPPROF in the environment it does nothing at all,
// so the profiler still starts only at its first use.
inline bool StartDumpsFromEnv() noexcept {
  if (std::getenv("HEAPPROF") == nullptr) return false;
  EnsureInit();  // parses HEAPPROF unless the first allocation already did
  const EnvConfig& cfg = g_env_config;
  if (cfg.dump_at_exit || cfg.leak_report || cfg.WantsDumper()) g_exit_hook.store(&RunExitActions);
  g_dumper.Start(cfg);
  return true;
}

inline const bool g_dumps_started = StartDumpsFromEnv();

}  // namespace detail
}  // namespace heapprof
