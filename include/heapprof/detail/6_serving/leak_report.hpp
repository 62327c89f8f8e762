// heapprof: the exit-time leak report (HEAPPROF=leak_report=1): the in-use
// profile to <prefix>.<pid>.leaks.pb.gz and a table of the top in-use stacks
// on stderr.
#pragma once

#include <unistd.h>

#include <algorithm>
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
// std::__new_allocator::allocate.
inline bool IsAllocatorMachinery(std::string_view name) {
  for (const char* prefix : {"std::", "__gnu_cxx::", "__cxx", "heapprof::", "operator new", "operator delete",
                             "malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "__libc_"}) {
    if (name.compare(0, std::strlen(prefix), prefix) == 0) return true;
  }
  return false;
}

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
    LeakRow& row = by_stack[frames];
    row.objects += s.inuse_objects;
    row.bytes += s.inuse_bytes;
    total_objects += s.inuse_objects;
    total_bytes += s.inuse_bytes;
  }
  ArenaVector<LeakRow> rows;
  for (auto& entry : by_stack) {
    entry.second.frames = entry.first;
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
    lines.push_back(std::move(line));
  }
  if (rows.size() > kLeakReportRows) {
    lines.push_back("... and " + ArenaDecimal(rows.size() - kLeakReportRows) + " more stacks in the profile");
  }
  return lines;
}

inline void LeakReport(const ArenaString& prefix) noexcept {
  ReentrancyGuard guard;
  HEAPPROF_TRY {
    char name[64];
    std::snprintf(name, sizeof name, ".%ld.leaks.pb.gz", static_cast<long>(getpid()));
    const ArenaString path = prefix + name;
    // One snapshot and one symbolizer for both the file and the table, so
    // they agree and the ELF files are read once.
    const ProfileData data = SnapshotProfile(false);
    const ArenaVector<LoadedObject> objects = CollectLoadedObjects();
    Symbolizer symbolizer(objects);
    ArenaString error;
    const bool written = WriteFileAtomic(path, EncodeGzipped(data, objects, symbolizer), &error);
    std::int64_t objects_in_use = 0, bytes_in_use = 0;
    const ArenaVector<ArenaString> table =
        FormatLeakTable(data, symbolizer, objects_in_use, bytes_in_use, g_env_config.leak_frames);
    const std::uint64_t rate = RateOf(g_rate_state.load(std::memory_order_acquire));
    ArenaString how = rate <= 1 ? ArenaString(rate == 1 ? "every allocation recorded" : "sampling off")
                                : "estimated from samples, rate " + ArenaDecimal(rate) + " bytes";
    ArenaString out = "leak report: " + ArenaDecimal(objects_in_use) + " objects, " +
                      FormatBytes(static_cast<double>(bytes_in_use)) + " still in use at exit (" + how + ")";
    if (objects_in_use == 0) out += ": nothing to report";
    ReportLine(out);
    if (objects_in_use != 0) {
      for (const ArenaString& line : table) ReportLine("  " + line);
    }
    if (written) {
      ReportLine("leak profile: " + path + "  (go tool pprof -sample_index=inuse_space -top " + path + ")");
    } else {
      ReportLine("cannot write the leak profile: " + error);
    }
  }
  HEAPPROF_CATCH_ALL_NOEXCEPT { ReportLine("leak report: out of memory"); }
}

}  // namespace detail
}  // namespace heapprof
