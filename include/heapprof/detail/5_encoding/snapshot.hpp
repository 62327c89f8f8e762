// heapprof: from buckets to a gzip'ed pprof profile, in memory.
//
// snapshot buckets (lock-free walk) → scale (Go's formula) → ProfileData
// → EncodeProfile (symbolized in process) → GzipCompress → bytes.
// Runs under the reentrancy guard. What the writer allocates comes from the
// profiler's arena (arena_allocator.hpp), never the host's heap: Stats'
// alloc counters do not move while a profile is written.
#pragma once

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/2_sampling/buckets.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"
#include "heapprof/detail/2_sampling/peak.hpp"
#include "heapprof/detail/5_encoding/gzip.hpp"
#include "heapprof/detail/5_encoding/profile_builder.hpp"
#include "heapprof/detail/5_encoding/write_headroom.hpp"
#include "heapprof/detail/0_base/report.hpp"

namespace heapprof {
namespace detail {

// The sample's label set as pprof string labels, in key order.
inline void FillLabels(const LabelSetData* labels, ProfileSample& sample) {
  if (labels == nullptr) return;
  for (std::uint32_t i = 0; i < labels->count; ++i) {
    sample.labels.emplace_back(ArenaString(labels->entries()[i].key), ArenaString(labels->entries()[i].value));
  }
}

// A window's start: stamped on both clocks when made.
struct ProfileBaseline {
  ArenaVector<BucketCounts> counts;                   // sorted by bucket address
  std::int64_t time_nanos = RealtimeNanos();          // the profile's time
  std::uint64_t monotonic_nanos = MonotonicNanos();  // the window's length (the wall clock may be stepped)
};

// A window's length in ns (at least 1).
inline std::int64_t WindowNanos(const ProfileBaseline& since) noexcept {
  const std::uint64_t now = MonotonicNanos();
  return now > since.monotonic_nanos ? static_cast<std::int64_t>(now - since.monotonic_nanos) : 1;
}

inline ProfileBaseline TakeBaseline() {
  ReentrancyGuard guard;
  EnsureInit();
  ProfileBaseline base;  // stamped now: before the counts are read
  for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) base.counts.push_back(ReadCounts(b));
  std::sort(base.counts.begin(), base.counts.end(),
            [](const BucketCounts& a, const BucketCounts& b) { return std::less<const Bucket*>()(a.bucket, b.bucket); });
  return base;
}

// The bucket's counters at the baseline; zero for a bucket created after it.
inline BucketCounts BaselineFor(const ProfileBaseline& base, const Bucket* b) noexcept {
  auto it = std::lower_bound(
      base.counts.begin(), base.counts.end(), b,
      [](const BucketCounts& c, const Bucket* key) { return std::less<const Bucket*>()(c.bucket, key); });
  if (it != base.counts.end() && it->bucket == b) return *it;
  return BucketCounts{b, 0, 0};
}

// One bucket's counts as a sample of estimates (Go's scaling).
inline void AppendBucketSample(ProfileData& data, const Bucket* b, double alloc_count, double live_count) {
  const double scale = HeapSampleScale(b->size, b->rate);
  const double size = static_cast<double>(b->size);
  ProfileSample s;
  s.pcs.assign(b->stack->pcs(), b->stack->pcs() + b->stack->depth);
  s.truncated = b->stack->truncated;
  s.overflow = b->stack->overflow;
  s.alloc_objects = std::llround(alloc_count * scale);
  s.alloc_bytes = std::llround(alloc_count * size * scale);
  s.inuse_objects = std::llround(live_count * scale);
  s.inuse_bytes = std::llround(live_count * size * scale);
  s.object_size = static_cast<std::int64_t>(b->size);
  FillLabels(b->labels, s);
  data.samples.push_back(std::move(s));
}

// The sampled heap as estimates. With `since`, a delta profile like Go's
// net/http/pprof ?seconds=N: every value is (now - baseline), so the alloc
// values count only allocations made in the window and the inuse values are
// the change in use (negative where more was freed than allocated); stacks
// with no change are left out; time_nanos is the end of the window and
// duration_nanos its length.
inline ProfileData SnapshotProfile(bool allocs_default, const ProfileBaseline* since = nullptr) {
  ProfileData data;
  data.period = static_cast<std::int64_t>(RateOf(g_rate_state.load(std::memory_order_acquire)));
  data.time_nanos = RealtimeNanos();
  if (since != nullptr) {
    data.duration_nanos = WindowNanos(*since);
  }
  data.allocs_default = allocs_default;
  // Sized once: grown by doubling, the samples were moved up to twice and
  // every new block was fresh pages to fault in (12% of a warm write of
  // 10,000 stacks). Buckets made during the walk only grow it as before.
  std::size_t buckets = 0;
  for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) ++buckets;
  data.samples.reserve(buckets);
  for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) {
    const BucketCounts now = ReadCounts(b);
    const std::uint64_t allocs = now.allocs, frees = now.frees;
    double alloc_count = 0, live_count = 0;
    if (since == nullptr) {
      alloc_count = static_cast<double>(allocs);
      live_count = allocs > frees ? static_cast<double>(allocs - frees) : 0.0;
    } else {
      const BucketCounts before = BaselineFor(*since, b);
      if (allocs == before.allocs && frees == before.frees) continue;
      alloc_count = static_cast<double>(allocs - before.allocs);
      live_count = static_cast<double>(allocs) - static_cast<double>(frees) -
                   (static_cast<double>(before.allocs) - static_cast<double>(before.frees));
    }
    AppendBucketSample(data, b, alloc_count, live_count);
  }
  return data;
}

// The peak snapshot (2_sampling/peak.hpp), copied out of the tracker: the
// copy is sized outside its lock, so the sampled path never waits on a
// writer's allocation.
struct PeakCopy {
  ArenaVector<BucketCounts> counts;
  PeakInfo info;
};

inline PeakCopy CopyPeak(PeakTracker& tracker = g_peak) {
  PeakCopy copy;
  for (;;) {
    copy.counts.resize(tracker.Count() + 64);
    const std::size_t n = tracker.Copy(copy.counts.data(), copy.counts.size(), copy.info);
    if (n != static_cast<std::size_t>(-1)) {
      copy.counts.resize(n);
      return copy;
    }
  }
}

// "1234567 bytes (1.18 MiB)"
inline ArenaString BytesText(std::uint64_t bytes) {
  char buf[96];
  const double v = static_cast<double>(bytes);
  if (bytes >= (std::uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%llu bytes (%.2f GiB)", static_cast<unsigned long long>(bytes), v / (1 << 30));
  } else if (bytes >= (std::uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%llu bytes (%.2f MiB)", static_cast<unsigned long long>(bytes), v / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes (%.2f KiB)", static_cast<unsigned long long>(bytes), v / 1024);
  }
  return buf;
}

// "2024-05-01T12:00:00.123Z" (UTC)
inline ArenaString TimeText(std::int64_t nanos) {
  const time_t secs = nanos / 1000000000;
  tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, static_cast<int>((nanos % 1000000000) / 1000000));
  return buf;
}

// What the peak profile says about itself: pprof prints these with -comments,
// and the ?debug=1 text as `#` lines.
inline ArenaVector<ArenaString> PeakComments(const PeakInfo& info, bool exact) {
  ArenaVector<ArenaString> c;
  const char* how = exact ? "every allocation recorded" : "estimated from samples";
  if (info.time_nanos == 0) {
    c.push_back("heapprof peak: no snapshot yet (nothing sampled since " + TimeText(info.window_nanos) + ")");
    return c;
  }
  c.push_back("heapprof peak: " + BytesText(info.bytes) + " in use at " + TimeText(info.time_nanos) + " (" + how + ")");
  c.push_back("heapprof peak: highest in-use seen in this window " + BytesText(info.max_bytes) +
              "; a snapshot is taken each time in-use first exceeds the last one by 10%");
  c.push_back("heapprof peak: window since " + TimeText(info.window_nanos) + ", " + ArenaDecimal(info.snapshots) +
              " snapshots; in use now " + BytesText(info.inuse_now));
  return c;
}

// The peak snapshot as a profile: its counts, scaled like any profile;
// time_nanos is when the peak was reached.
inline ProfileData PeakProfileData(const PeakCopy& peak) {
  ProfileData data;
  data.period = static_cast<std::int64_t>(RateOf(g_rate_state.load(std::memory_order_acquire)));
  data.time_nanos = peak.info.time_nanos != 0 ? peak.info.time_nanos : RealtimeNanos();
  bool exact = true;
  data.samples.reserve(peak.counts.size());
  for (const BucketCounts& c : peak.counts) {
    if (c.allocs == 0) continue;
    if (c.bucket->rate > 1) exact = false;
    const double live = c.allocs > c.frees ? static_cast<double>(c.allocs - c.frees) : 0.0;
    AppendBucketSample(data, c.bucket, static_cast<double>(c.allocs), live);
  }
  data.comments = PeakComments(peak.info, exact);
  return data;
}

// A profile written before any allocation was seen means the hooks are not in
// this program: say so once, with the fix, rather than hand out empty
// profiles silently (HEAPPROF_REPLACE_NEW_DELETE forgotten, or defined after
// the include).
inline std::atomic<bool> g_no_hooks_reported{false};

inline void WarnIfNoAllocationSeen() noexcept {
  if (g_no_hooks_reported.load(std::memory_order_relaxed)) return;
  if (g_registry.Sum().alloc_objects != 0) return;
  if (g_no_hooks_reported.exchange(true, std::memory_order_relaxed)) return;
  const unsigned hooked = g_hook_families.load(std::memory_order_relaxed);
  if (hooked == kNewDeleteHooks) {
    ReportRaw("heapprof: writing a profile, but no allocation has been seen: operator new/delete are hooked "
              "(HEAPPROF_REPLACE_NEW_DELETE) and nothing has called them yet; malloc and free are not hooked "
              "(HEAPPROF_REPLACE_MALLOC, or libheapprof_preload.so, hooks them).\n");
  } else if (hooked != 0) {
    ReportRaw("heapprof: writing a profile, but no allocation has been seen yet (the hooks are installed).\n");
  } else {
    ReportRaw("heapprof: writing a profile, but no allocation has been seen: the hooks are not installed. "
              "Define HEAPPROF_REPLACE_NEW_DELETE before #include <heapprof.hpp> in one .cpp file of the "
              "program (or allocate through heapprof::allocator).\n");
  }
}

// `data` as a gzip'ed profile.proto message. Throws bad_alloc.
inline ArenaString EncodeGzipped(const ProfileData& data, const ArenaVector<LoadedObject>& objects,
                                 Symbolizer& symbolizer) {
  ArenaString gz;
  GzipCompress(EncodeProfile(data, objects, symbolizer), gz);
  return gz;
}

// EncodeGzipped with `symbolizer`'s names, saying what they lack: a file the
// symbolizer could not map for want of memory, or open for want of
// descriptors (elf_file.hpp: tls_files_not_mapped, tls_files_not_opened)
// costs the profile names, or files and lines. A
// comment says so when the symbol tables were missed (probed before the
// encoding, read when it first needs them), a stderr line when anything was.
inline ArenaString EncodeGzippedNamed(ProfileData& data, const ArenaVector<LoadedObject>& objects,
                                      Symbolizer& symbolizer) {
  // The two shortages: the counter, and what the comment and line say ran out.
  struct Shortage {
    const unsigned& files;
    const char* what;
    bool said;
  };
  Shortage shortages[] = {{elf::tls_files_not_mapped, "memory mapping", false},
                          {elf::tls_files_not_opened, "file descriptors opening", false}};
  const auto say = [&data](Shortage& s) {
    data.comments.push_back(ArenaString("heapprof: out of ") + s.what +
                            " object files: frames in them have no names; go tool pprof symbolizes the addresses "
                            "from the binaries");
    s.said = true;
  };
  for (Shortage& s : shortages) {
    if (s.files != 0) say(s);
  }
  ArenaString gz = EncodeGzipped(data, objects, symbolizer);
  // A symbol table is read when the encoding first meets a PC of its object:
  // one missed then gets its comment too, in an encoding done again (the
  // tables read stay read; rare, so the common write encodes once).
  bool again = false;
  for (Shortage& s : shortages) {
    if (!s.said && s.files != 0) {
      say(s);
      again = true;
    }
  }
  if (again) gz = EncodeGzipped(data, objects, symbolizer);
  for (int i = 1; i >= 0; --i) {  // descriptors first, as the lines have been
    if (shortages[i].files == 0) continue;
    char line[200];
    std::snprintf(line, sizeof line,
                  "heapprof: out of %s %u object or debug file(s): profile written without their names or lines\n",
                  shortages[i].what, shortages[i].files);
    ReportRaw(line);
  }
  return gz;
}

// Tests: the next this many encodings with names on the thread
// g_symbolize_oom_thread run out of memory (builds with exceptions; see
// EncodeGzippedSymbolized). Only that thread's: a dump thread's write on a
// loaded machine took one of them.
inline std::atomic<int> g_symbolize_oom_for_tests{0};
inline std::atomic<pthread_t> g_symbolize_oom_thread{};

// One of those failures, when the tests asked for one.
inline bool ConsumeSymbolizeOomForTests() noexcept {
  return HEAPPROF_UNLIKELY(g_symbolize_oom_for_tests.load(std::memory_order_relaxed) > 0) &&
         pthread_equal(g_symbolize_oom_thread.load(std::memory_order_relaxed), pthread_self()) != 0 &&
         g_symbolize_oom_for_tests.fetch_sub(1, std::memory_order_relaxed) > 0;
}

// `data` symbolized, as a gzip'ed profile.proto message. A write with names
// may need much memory at once: reading a large binary's symbol table or
// indexing its DWARF for the first time (a library dlopen'ed since the last
// write, or the first write). When it runs out of memory, the profile is not
// lost; each step needs less memory than the one before:
//   1. names, files and lines (DWARF read as needed);
//   2. the debug-info cache given back (DropDebugCacheIfUnused), then names
//      from the symbol tables, with no DWARF read (tls_symbolize_cached_debug_only),
//      and a comment saying so;
//   3. no names: the locations keep their addresses and mappings
//      (has_functions false), which go tool pprof symbolizes from the
//      binaries, and a comment says why.
// Step 2 came in when an oom dump (a 64 MiB reserve, a 36 MB test binary,
// Debian's libc6-dbg installed) failed in one run of two: step 1 ran out of
// memory loading libc's debug file, with the program's DWARF cached by then,
// and step 3 found no room either: no profile at all. (Any bad_alloc of a
// step gets the next one.) Only with exceptions: without, the write's
// headroom decides beforehand (write_headroom.hpp). Throws bad_alloc when
// the last step fails too.
inline ArenaString EncodeGzippedSymbolized(ProfileData& data, const ArenaVector<LoadedObject>& objects) {
  elf::tls_files_not_mapped = 0;
  elf::tls_files_not_opened = 0;
#if HEAPPROF_EXCEPTIONS
  try {
    Symbolizer symbolizer(objects);
    if (ConsumeSymbolizeOomForTests()) throw std::bad_alloc();
    return EncodeGzippedNamed(data, objects, symbolizer);
  } catch (const std::bad_alloc&) {
    // The symbolizer's memory is back in the arena.
  }
  DropDebugCacheIfUnused();
  if (!tls_symbolize_cached_debug_only) {  // (an oom dump sized for names has had its step 2)
    data.comments.emplace_back("heapprof: out of memory reading debug info: function names from the symbol tables, "
                               "without files or lines");
    elf::tls_files_not_mapped = 0;
    elf::tls_files_not_opened = 0;
    tls_symbolize_cached_debug_only = true;
    try {
      Symbolizer symbolizer(objects);
      if (ConsumeSymbolizeOomForTests()) throw std::bad_alloc();
      ArenaString gz = EncodeGzippedNamed(data, objects, symbolizer);
      tls_symbolize_cached_debug_only = false;
      ReportRaw("heapprof: out of memory reading debug info: profile written with function names but without "
                "files or lines\n");
      return gz;
    } catch (const std::bad_alloc&) {
    }
    tls_symbolize_cached_debug_only = false;
    data.comments.pop_back();
  }
  data.comments.emplace_back("heapprof: out of memory encoding with function names: written without them; "
                             "go tool pprof symbolizes the addresses from the binaries");
  const ArenaVector<LoadedObject> none;
  Symbolizer bare(none);
  ArenaString gz = EncodeGzipped(data, objects, bare);
  ReportRaw("heapprof: out of memory encoding a profile with function names: written without them "
            "(go tool pprof symbolizes it from the binaries)\n");
  return gz;
#else
  Symbolizer symbolizer(objects);
  return EncodeGzippedNamed(data, objects, symbolizer);
#endif
}

// The peak profile, serialised and compressed; false on failure.
// `duration_nanos` != 0: the HTTP server's window (g_window_peak), that long.
inline bool BuildPeakProfileBytes(ArenaString& gz, std::int64_t duration_nanos = 0) {
  ReentrancyGuard guard;
  EnsureInit();
  WarnIfNoAllocationSeen();
  WriteHeadroom headroom;  // built without exceptions: the memory first, or no write
  if (!headroom.ok()) return false;
  HEAPPROF_TRY {
    ProfileData data = PeakProfileData(CopyPeak(duration_nanos != 0 ? g_window_peak : g_peak));
    data.duration_nanos = duration_nanos;
    const ArenaVector<LoadedObject> objects = CollectProfileObjects();
    gz = EncodeGzippedSymbolized(data, objects);
    return true;
  }
  HEAPPROF_CATCH_ALL {
    gz.clear();
    return false;
  }
}

// Serialised, compressed profile; empty on failure.
// With `since`, the delta profile from that baseline (see SnapshotProfile).
inline bool BuildProfileBytes(bool allocs_default, ArenaString& gz,
                              const ProfileBaseline* since = nullptr) {
  ReentrancyGuard guard;
  EnsureInit();
  WarnIfNoAllocationSeen();
  WriteHeadroom headroom;  // built without exceptions: the memory first, or no write
  if (!headroom.ok()) return false;
  HEAPPROF_TRY {
    ProfileData data = SnapshotProfile(allocs_default, since);
    const ArenaVector<LoadedObject> objects = CollectProfileObjects();
    gz = EncodeGzippedSymbolized(data, objects);
    return true;
  }
  HEAPPROF_CATCH_ALL {  // bad_alloc: a profile is never worth the process
    gz.clear();
    return false;
  }
}

}  // namespace detail
}  // namespace heapprof
