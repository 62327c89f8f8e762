// heapprof: the exit-time leak report (HEAPPROF=leak_report=1): the in-use
// profile to <prefix>.<pid>.leaks.pb.gz and a table of the top in-use stacks
// on stderr.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
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
// Frames shown per row.
constexpr std::size_t kLeakReportFrames = 4;

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
  HEAPPROF_TRY {
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
  }
  HEAPPROF_CATCH_ALL_NOEXCEPT { ReportLine("leak report: out of memory"); }
}

}  // namespace detail
}  // namespace heapprof
