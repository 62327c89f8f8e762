// heapprof: the exit-time leak report (HEAPPROF=leak_report=1): the in-use
// profile to <prefix>.<pid>.leaks.pb.gz and a table of the top in-use stacks
// on stderr, split by the retention scan (retention.hpp) into unreachable
// (leaked) and reachable (with the root that holds it); the retention profile
// to <prefix>.<pid>.retention.pb.gz (<prefix>.<pid>.<n>.* when an earlier
// process of that pid left its own: UnusedExitFileBase).
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <unwind.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "heapprof/detail/5_encoding/snapshot.hpp"
#include "heapprof/detail/6_serving/files.hpp"
#include "heapprof/detail/6_serving/retention.hpp"

namespace heapprof {
namespace detail {

// Rows in the leak report table.
constexpr std::size_t kLeakReportRows = 10;
// Frames shown per row by default (HEAPPROF=leak_frames=N changes it).
constexpr std::size_t kLeakReportFrames = 6;

// "void ArenaVector<int, std::allocator<int> >::_M_realloc_insert<int>(...)"
// → "std::vector::_M_realloc_insert": template arguments, parameter lists and
// a leading return type dropped, as pprof's default (simplified) names do.
inline ArenaString SimplifyFunctionName(const ArenaString& name) {
  char buf[1024];
  const std::size_t n = ShortFunctionName(name.c_str(), buf, sizeof buf);
  return n != 0 ? ArenaString(buf, n) : name;
}

// Frames of the allocator machinery rather than of the program: the standard
// library's containers and allocators, heapprof itself, the allocation
// functions. A row starts at the first frame that is none of these, so that
// at -O0 a leaked vector's row shows who made the vector, not
// std::__new_allocator::allocate. The retention profile's rule: the C
// allocation functions by their whole name only (as prefixes, "realloc" and
// "malloc" skipped the program's reallocate_buffer and malloc_pool::Grow, and
// a row started at their caller).
inline bool IsAllocatorMachinery(std::string_view name) { return retention::IsMachineryName(name); }

inline std::string_view BaseName(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

struct LeakFrame {
  ArenaString shown;  // "name (file.cpp:42)"
  bool machinery = false;
};

struct LeakRow {
  ArenaVector<ArenaString> frames;  // shown frames, innermost first, from the first frame of the program
  ArenaString held_by;              // the root holding most of the row's bytes, shown after the frames
  ArenaMap<ArenaString, std::int64_t> roots;  // the samples' markers (retention roots) → bytes
  std::int64_t objects = 0, bytes = 0;
};

// The frames of one return address, inline frames expanded, innermost first.
inline void LeakFramesOf(Symbolizer& symbolizer, std::uintptr_t pc, ArenaVector<LeakFrame>& out) {
  SymbolizedFrame frames[32];
  SymbolizedQuality quality;
  const int n = pc != 0 ? symbolizer.Symbolize(pc - 1, frames, 32, &quality) : 0;
  for (int i = 0; i < n; ++i) {
    LeakFrame f;
    f.shown = frames[i].name.empty() ? ArenaString("??") : ArenaString(frames[i].name);
    f.machinery = IsAllocatorMachinery(f.shown);
    if (!frames[i].file.empty() && frames[i].line != 0) {
      f.shown += " (";
      f.shown += BaseName(frames[i].file);
      f.shown += ':';
      f.shown += ArenaDecimal(frames[i].line);
      f.shown += ')';
    }
    out.push_back(std::move(f));
  }
  if (n == 0) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(pc));
    out.push_back(LeakFrame{hex, false});
  }
}

// The in-use part of `data`, summed per stack of shown frames (object sizes
// and labels merged), largest first, as lines for stderr. `max_frames` per row.
inline ArenaVector<ArenaString> FormatLeakTable(const ProfileData& data, Symbolizer& symbolizer,
                                                std::int64_t& total_objects, std::int64_t& total_bytes,
                                                std::size_t max_frames = kLeakReportFrames) {
  if (max_frames == 0) max_frames = kLeakReportFrames;
  ArenaMap<ArenaVector<ArenaString>, LeakRow> by_stack;
  ArenaMap<std::uintptr_t, ArenaVector<LeakFrame>> frames_of;  // pc → its frames
  total_objects = total_bytes = 0;
  for (const ProfileSample& s : data.samples) {
    if (s.inuse_objects <= 0) continue;
    ArenaVector<ArenaString> frames;
    bool skipping = true;
    std::size_t skipped = 0;
    ArenaVector<ArenaString> all;
    for (std::uintptr_t pc : s.pcs) {
      auto it = frames_of.find(pc);
      if (it == frames_of.end()) {
        ArenaVector<LeakFrame> expanded;
        LeakFramesOf(symbolizer, pc, expanded);
        it = frames_of.emplace(pc, std::move(expanded)).first;
      }
      for (const LeakFrame& f : it->second) {
        all.push_back(f.shown);
        if (skipping && f.machinery) {
          ++skipped;
          continue;
        }
        skipping = false;
        frames.push_back(f.shown);
      }
    }
    if (frames.empty()) frames = std::move(all);  // nothing but machinery: show it
    if (s.truncated) frames.emplace_back("[truncated]");
    if (s.overflow) frames.emplace_back("[heapprof: stack table full]");
    ArenaString held_by;
    for (const ArenaString& m : s.markers) {
      if (!held_by.empty()) held_by += " < ";
      held_by += m;
    }
    LeakRow& row = by_stack[frames];
    if (!held_by.empty()) row.roots[held_by] += s.inuse_bytes;
    row.objects += s.inuse_objects;
    row.bytes += s.inuse_bytes;
    total_objects += s.inuse_objects;
    total_bytes += s.inuse_bytes;
  }
  ArenaVector<LeakRow> rows;
  for (auto& entry : by_stack) {
    entry.second.frames = entry.first;
    // One row per allocation stack; the root that holds most of it is named.
    std::int64_t best = -1;
    for (const auto& root : entry.second.roots) {
      if (root.second > best) {
        best = root.second;
        entry.second.held_by = root.first;
      }
    }
    if (entry.second.roots.size() > 1) {
      entry.second.held_by += " (and " + ArenaDecimal(entry.second.roots.size() - 1) + " other roots)";
    }
    rows.push_back(std::move(entry.second));
  }
  std::sort(rows.begin(), rows.end(), [](const LeakRow& a, const LeakRow& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.objects > b.objects;
  });
  ArenaVector<ArenaString> lines;
  char head[160];
  std::snprintf(head, sizeof head, "%14s %10s  %s", "in-use bytes", "objects",
                "allocated at (innermost first, from the first frame outside std:: and heapprof)");
  lines.emplace_back(head);
  for (std::size_t i = 0; i < rows.size() && i < kLeakReportRows; ++i) {
    const LeakRow& row = rows[i];
    char cols[64];
    std::snprintf(cols, sizeof cols, "%14s %10lld  ", FormatBytes(static_cast<double>(row.bytes)).c_str(),
                  static_cast<long long>(row.objects));
    ArenaString line = cols;
    for (std::size_t f = 0; f < row.frames.size() && f < max_frames; ++f) {
      if (f != 0) line += " < ";
      line += row.frames[f];
    }
    if (row.frames.size() > max_frames) line += " < ...";
    if (!row.held_by.empty()) line += "  <== " + row.held_by;
    lines.push_back(std::move(line));
  }
  if (rows.size() > kLeakReportRows) {
    lines.push_back("... and " + ArenaDecimal(rows.size() - kLeakReportRows) + " more stacks in the profile");
  }
  return lines;
}

// LeakSanitizer's suppression file: "leak:<pattern>" lines, '#' comments.
// A pattern matches a frame's function name, file name or module (the
// loaded object's path) anywhere in it; '*' is any run of characters, a
// leading '^' or trailing '$' anchors it (LSan's rules).
struct LeakSuppressions {
  ArenaVector<ArenaString> patterns;
  ArenaString error;

  // LSan's files are a few KiB. A path that is not a regular file (a FIFO:
  // open() waited for a writer, so the exit hung; /dev/zero: read until the
  // arena failed, 16 GiB and 49 s later, and the whole report was lost to
  // "out of memory") or one above this is refused with its reason.
  static constexpr std::size_t kMaxFileBytes = std::size_t{16} << 20;

  bool Load(const char* path) {
    ArenaString text;
    int fd;
    do {
      fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    } while (fd < 0 && errno == EINTR);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      error = ArenaString("cannot read ") + path + ": " + std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return false;
    }
    if (!S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) > kMaxFileBytes) {
      ::close(fd);
      error = ArenaString("cannot read ") + path +
              (S_ISREG(st.st_mode) ? ": larger than 16 MiB (a suppression file has a line per pattern)"
                                   : ": not a regular file");
      return false;
    }
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = ArenaString("cannot read ") + path + ": " + std::strerror(errno);
        ::close(fd);
        return false;
      }
      if (n == 0 || text.size() + static_cast<std::size_t>(n) > kMaxFileBytes) break;  // (grown since the fstat)
      text.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    std::string_view all(text);
    while (!all.empty()) {
      const std::size_t eol = all.find('\n');
      std::string_view line = all.substr(0, eol);
      all = eol == std::string_view::npos ? std::string_view() : all.substr(eol + 1);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.remove_suffix(1);
      if (line.empty() || line.front() == '#') continue;
      if (line.substr(0, 5) != "leak:") continue;  // other LSan/TSan kinds: not ours
      line.remove_prefix(5);
      if (!line.empty()) patterns.emplace_back(line);
    }
    return true;
  }

  // LSan's TemplateMatch: '*' wildcards, '^'/'$' anchors, else a substring.
  static bool Match(std::string_view pattern, std::string_view text) {
    const bool start_anchored = !pattern.empty() && pattern.front() == '^';
    if (start_anchored) pattern.remove_prefix(1);
    const bool end_anchored = !pattern.empty() && pattern.back() == '$';
    if (end_anchored) pattern.remove_suffix(1);
    return Glob(pattern, text, start_anchored, end_anchored);
  }

  static bool Glob(std::string_view p, std::string_view t, bool anchored_start, bool anchored_end) {
    // Split on '*': each piece in order; the first at 0 when anchored, the
    // last at the end when anchored.
    std::size_t pos = 0;
    bool first = true;
    while (true) {
      const std::size_t star = p.find('*');
      const std::string_view piece = p.substr(0, star);
      const bool last = star == std::string_view::npos;
      if (last) {
        if (anchored_end) {
          if (t.size() < pos + piece.size()) return false;
          const std::size_t at = t.size() - piece.size();
          if (first && anchored_start && at != 0) return false;
          return t.substr(at) == piece;
        }
        if (first && anchored_start) return t.substr(0, piece.size()) == piece;
        return t.find(piece, pos) != std::string_view::npos;
      }
      if (first && anchored_start) {
        if (t.substr(0, piece.size()) != piece) return false;
        pos = piece.size();
      } else {
        const std::size_t at = t.find(piece, pos);
        if (at == std::string_view::npos) return false;
        pos = at + piece.size();
      }
      first = false;
      p.remove_prefix(star + 1);
    }
  }

  bool Matches(const ArenaVector<std::uintptr_t>& pcs, Symbolizer& symbolizer,
               const ArenaVector<LoadedObject>& objects) const {
    for (std::uintptr_t pc : pcs) {
      SymbolizedFrame frames[32];
      SymbolizedQuality q;
      const int n = pc != 0 ? symbolizer.Symbolize(pc - 1, frames, 32, &q) : 0;
      std::string_view module;
      for (const LoadedObject& o : objects) {
        if (pc >= o.start && pc < o.limit) module = o.path;
      }
      for (const ArenaString& pattern : patterns) {
        if (!module.empty() && Match(pattern, module)) return true;
        for (int i = 0; i < n; ++i) {
          if (Match(pattern, frames[i].name) || Match(pattern, frames[i].full_name) ||
              (!frames[i].file.empty() && Match(pattern, frames[i].file))) {
            return true;
          }
        }
      }
    }
    return false;
  }
};

// How the report's figures were obtained, said in its first line. Exact
// only when the rate is 1 and every bucket was sampled at 1: a period at
// another rate (before a SetSampleRate(1), say) left allocations unrecorded
// and its samples are estimates. The rate of the moment alone said "every
// allocation recorded" of estimates, and "sampling off" of samples taken
// before a SetSampleRate(0).
inline ArenaString LeakFiguresHow() {
  const std::uint64_t now = RateOf(g_rate_state.load(std::memory_order_acquire));
  bool exact = now == 1;
  std::uint64_t lo = 0, hi = 0;  // the rates of the buckets with live objects
  for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) {
    if (b->rate != 1) exact = false;
    const BucketCounts c = ReadCounts(b);
    if (c.allocs <= c.frees) continue;
    if (hi == 0 || b->rate < lo) lo = b->rate;
    if (b->rate > hi) hi = b->rate;
  }
  if (exact) return "every allocation recorded";
  if (hi == 0) return now == 0 ? ArenaString("sampling off") : "estimated from samples, rate " + ArenaDecimal(now) + " bytes";
  ArenaString how = hi == 1 ? ArenaString("not every allocation recorded: the rate was not 1 throughout")
                    : lo == hi ? "estimated from samples, rate " + ArenaDecimal(hi) + " bytes"
                               : "estimated from samples, rates " + ArenaDecimal(lo) + " to " + ArenaDecimal(hi) + " bytes";
  if (now == 0) how += "; sampling off now";
  return how;
}

// The leak report runs inside exit(): above its frames are libc's exit
// machinery (exit, __run_exit_handlers), then whoever called exit(): a
// function of the program, or, once main has returned, libc's start-up
// code (__libc_start_call_main), with nothing of the program live on the
// stack. The frames of exit() itself are live but hold nothing of the
// program's, and their slots left unwritten still hold what the program's
// last calls left there: a leak at rate 1 was "reachable <== [stack]
// thread N" from one, and leak_exit_code missed it (LeakSanitizer misses
// it the same way). The lowest address of the first frame above that run
// of frames of the module that called the exit handlers (libc); 0 when the
// walk does not get there (no unwind info, libc linked in statically): the
// scan then starts at its own frame as elsewhere. What those frames saved
// of their caller's registers is not lost: the unwinder gives the caller's
// callee-saved registers as they were at its call, and the scan reads them
// (ScanResult::saved_registers).
#if defined(__x86_64__)
constexpr int kExitCallerRegisters[] = {3, 6, 12, 13, 14, 15};  // DWARF: rbx rbp r12-r15
#elif defined(__aarch64__)
constexpr int kExitCallerRegisters[] = {19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29};  // x19-x29
#endif
static_assert(sizeof kExitCallerRegisters / sizeof kExitCallerRegisters[0] <= 16, "ScanResult::saved_registers");
struct ExitCallerWalk {
  const void* own_base = nullptr;   // the module of the report's own code
  const void* exit_base = nullptr;  // the module of the frames above ours (libc)
  std::uintptr_t last_exit_cfa = 0, floor = 0;
  std::uintptr_t* registers = nullptr;  // the caller's callee-saved registers, out
  std::size_t register_count = 0;
  int frames = 0;
};
inline _Unwind_Reason_Code ExitCallerStep(_Unwind_Context* ctx, void* arg) {
  auto& w = *static_cast<ExitCallerWalk*>(arg);
  const std::uintptr_t ip = _Unwind_GetIP(ctx);
  if (ip == 0 || ++w.frames > 256) return _URC_END_OF_STACK;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(ip - 1), &info) == 0 || info.dli_fbase == nullptr) return _URC_END_OF_STACK;
  if (w.exit_base == nullptr) {
    if (info.dli_fbase == w.own_base) return _URC_NO_REASON;  // the profiler's frames, RunExitHook's
    w.exit_base = info.dli_fbase;
  }
  if (info.dli_fbase == w.exit_base) {
    w.last_exit_cfa = _Unwind_GetCFA(ctx);
    return _URC_NO_REASON;
  }
  w.floor = w.last_exit_cfa;  // the caller of exit() (or start-up code past libc's own)
  w.register_count = 0;
  for (const int reg : kExitCallerRegisters) w.registers[w.register_count++] = _Unwind_GetGR(ctx, reg);
  return _URC_END_OF_STACK;
}
// `registers` (16 words) and `count`: out, the caller's callee-saved registers.
__attribute__((__noinline__)) inline std::uintptr_t ExitCallerFrame(std::uintptr_t* registers, std::size_t& count) noexcept {
  count = 0;
  ExitCallerWalk w;
  w.registers = registers;
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&ExitCallerFrame), &self) == 0 || self.dli_fbase == nullptr) return 0;
  w.own_base = self.dli_fbase;
  _Unwind_Backtrace(&ExitCallerStep, &w);
  if (w.floor == 0 && w.exit_base != nullptr && w.exit_base != w.own_base) {
    w.floor = w.last_exit_cfa;  // libc to the end of the stack (a thread's start): no caller, no registers
  }
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (w.floor <= here) return 0;
  count = w.register_count;
  return w.floor;
}

// The exit-time report. Returns true when unreachable objects (not
// suppressed) remain: HEAPPROF=leak_exit_code then sets the exit status.
// `suppressions`: the leak_suppressions file (empty: none), a relative path
// already resolved against the start-up directory as the dump prefix is (a
// daemon's chdir("/") before exit lost it: "cannot read", every suppressed
// leak reported and leak_exit_code's status).
inline bool LeakReport(const ArenaString& prefix, const ArenaString& suppressions_path = ArenaString()) noexcept {
  ReentrancyGuard guard;
  bool leaked = false;
  WriteHeadroom headroom;  // built without exceptions: the memory first, or no report
  if (!headroom.ok()) {
    ReportRaw("heapprof: leak report skipped: not enough memory to write it safely\n");
    return false;
  }
  HEAPPROF_TRY {
    const ArenaString base = UnusedExitFileBase(prefix, {"leaks", "retention"});
    const ArenaString path = base + ".leaks.pb.gz";
    // The scan first, before this report allocates anything of its own.
    retention::ScanResult scan;
    const std::uintptr_t floor = ExitCallerFrame(scan.saved_registers, scan.saved_register_count);
    // With the caller of exit() found, the scan starts at that caller's
    // frame, with the registers the unwinder gave; without, at our own frame,
    // with this thread's registers spilled there. The scan and the rest run
    // on a stack with room for them (files.hpp).
    std::uintptr_t from = floor;
    // (An exception thrown on the profiler's stack is thrown again on this
    // one: the catch below reports it.)
    auto rest = [&] {
      retention::Scan(scan, from);
      // One snapshot and one symbolizer for the files and the tables, so they
      // agree and the ELF files are read once.
      const ProfileData data = SnapshotProfile(false);
      const ArenaVector<LoadedObject> objects = CollectProfileObjects();
      Symbolizer symbolizer(objects);
      ArenaString error;
      const bool written = WriteFileAtomic(path, EncodeGzipped(data, objects, symbolizer), &error);
      const ProfileData retained = retention::RetentionProfileData(scan, objects, symbolizer);
      const ArenaString retention_path = base + ".retention.pb.gz";
      ArenaString retention_error;
      const bool retention_written =
          WriteFileAtomic(retention_path, EncodeGzipped(retained, objects, symbolizer), &retention_error);

      LeakSuppressions suppressions;
      if (!suppressions_path.empty() && !suppressions.Load(suppressions_path.c_str())) {
        ReportLine("leak report: leak_suppressions: " + suppressions.error);
      }
      // Split: unreachable, reachable (held by its root), suppressed.
      ProfileData unreachable, reachable, suppressed;
      for (const ProfileSample& s : retained.samples) {
        const ArenaString& root = s.markers.empty() ? ArenaString() : s.markers.back();
        ProfileSample copy = s;
        copy.markers.clear();
        if (root == "[unreachable]") {
          if (!suppressions.patterns.empty() && suppressions.Matches(s.pcs, symbolizer, objects)) {
            suppressed.samples.push_back(std::move(copy));
          } else {
            unreachable.samples.push_back(std::move(copy));
          }
        } else {
          copy.markers.push_back(root);
          reachable.samples.push_back(std::move(copy));
        }
      }
      std::int64_t objects_in_use = 0, bytes_in_use = 0;
      std::int64_t u_objects = 0, u_bytes = 0, r_objects = 0, r_bytes = 0, s_objects = 0, s_bytes = 0;
      FormatLeakTable(data, symbolizer, objects_in_use, bytes_in_use, g_env_config.leak_frames);
      const ArenaVector<ArenaString> u_table =
          FormatLeakTable(unreachable, symbolizer, u_objects, u_bytes, g_env_config.leak_frames);
      const ArenaVector<ArenaString> r_table =
          FormatLeakTable(reachable, symbolizer, r_objects, r_bytes, g_env_config.leak_frames);
      FormatLeakTable(suppressed, symbolizer, s_objects, s_bytes, g_env_config.leak_frames);
      const ArenaString how = LeakFiguresHow();
      // The object totals sum positive counts (FormatLeakTable), so the casts keep their values.
      ArenaString out = "leak report: " + ArenaDecimal(static_cast<unsigned long long>(objects_in_use)) +
                        " objects, " + FormatBytes(static_cast<double>(bytes_in_use)) + " still in use at exit (" +
                        how + ")";
      if (objects_in_use == 0) out += ": nothing to report";
      ReportLine(out);
      if (objects_in_use != 0) {
        if (scan.maps_unreadable) {
          // Without the maps there was no scan: nothing is known to be
          // unreachable, and nothing is called a leak (nor sets leak_exit_code).
          ReportLine(ArenaString("leak report: ") + scan.not_scanned_why +
                     ": what holds these objects is unknown, so none is counted as leaked; leak_exit_code does not "
                     "apply");
        }
        ReportLine("leak report: unreachable (leaked): " + ArenaDecimal(static_cast<unsigned long long>(u_objects)) +
                   " objects, " + FormatBytes(static_cast<double>(u_bytes)));
        if (scan.threads_running != 0) {
          // Said only in the retention profile's comments before: a running
          // thread's buffer was "leaked" (and leak_exit_code's status) with
          // nothing on stderr to say why.
          const bool one = scan.threads_running == 1;
          ReportLine("leak report: " + ArenaDecimal(scan.threads_running) +
                     (one ? " thread was running during the scan: its stack and registers were not read, so what only "
                            "it holds is counted as unreachable"
                          : " threads were running during the scan: their stacks and registers were not read, so what "
                            "only they hold is counted as unreachable"));
        }
        if (u_objects != 0) {
          for (const ArenaString& line : u_table) ReportLine("  " + line);
        }
        ReportLine(ArenaString(scan.maps_unreadable ? "leak report: not scanned (named after <==): "
                                                    : "leak report: reachable (held by a root, named after <==): ") +
                   ArenaDecimal(static_cast<unsigned long long>(r_objects)) + " objects, " +
                   FormatBytes(static_cast<double>(r_bytes)));
        if (r_objects != 0) {
          for (const ArenaString& line : r_table) ReportLine("  " + line);
        }
        if (!suppressions.patterns.empty()) {
          ReportLine("leak report: suppressed (leak_suppressions): " +
                     ArenaDecimal(static_cast<unsigned long long>(s_objects)) + " objects, " +
                     FormatBytes(static_cast<double>(s_bytes)));
        }
      }
      if (written) {
        ReportLine("leak profile: " + path + "  (go tool pprof -sample_index=inuse_space -top " + path + ")");
      } else {
        ReportLine("cannot write the leak profile: " + error);
      }
      if (retention_written) {
        ReportLine("retention profile: " + retention_path + "  (go tool pprof -traces " + retention_path + ")");
      } else {
        ReportLine("cannot write the retention profile: " + retention_error);
      }
      leaked = u_objects != 0;
    };
    auto spilled = [&](std::uintptr_t sp) {
      from = sp;
      RunWithBuildStack(rest);
    };
    if (floor != 0) {
      RunWithBuildStack(rest);
    } else {
      retention::WithRegistersSpilled(spilled);
    }
  }
  HEAPPROF_CATCH_ALL_NOEXCEPT { ReportLine("leak report: out of memory"); }
  return leaked;
}

}  // namespace detail
}  // namespace heapprof
