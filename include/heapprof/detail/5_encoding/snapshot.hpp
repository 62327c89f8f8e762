// heapprof: from buckets to a gzip'ed pprof profile, in memory.
//
// snapshot buckets (lock-free walk) → scale (Go's formula) → ProfileData
// → EncodeProfile (symbolized in process) → GzipCompress → bytes.
// Runs under the reentrancy guard. What the writer allocates comes from the
// profiler's arena (arena_allocator.hpp), never the host's heap: Stats'
// alloc counters do not move while a profile is written.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/2_sampling/buckets.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"
#include "heapprof/detail/5_encoding/gzip.hpp"
#include "heapprof/detail/5_encoding/profile_builder.hpp"
#include "heapprof/detail/0_base/report.hpp"

namespace heapprof {
namespace detail {

// Go's runtime/pprof scaleHeapSample: an object of size s is sampled with
// probability 1 - exp(-s/R), so each sample stands for 1/(1 - exp(-s/R))
// objects. expm1 keeps precision for s << R. Rate 1 recorded everything.
inline double HeapSampleScale(std::uint64_t size, std::uint64_t rate) noexcept {
  if (rate <= 1 || size == 0) return 1.0;
  return 1.0 / -std::expm1(-static_cast<double>(size) / static_cast<double>(rate));
}

// The sample's label set as pprof string labels, in key order.
inline void FillLabels(const LabelSetData* labels, ProfileSample& sample) {
  if (labels == nullptr) return;
  for (std::uint32_t i = 0; i < labels->count; ++i) {
    sample.labels.emplace_back(ArenaString(labels->entries()[i].key), ArenaString(labels->entries()[i].value));
  }
}

inline std::int64_t RealtimeNanos() noexcept {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// Per-bucket counters at one moment: the start of a delta profile
// (/debug/pprof/heap?seconds=N). Buckets are never freed, so a bucket's
// address identifies it for the life of the process.
struct BucketCounts {
  const Bucket* bucket;
  std::uint64_t allocs, frees;
};
struct ProfileBaseline {
  ArenaVector<BucketCounts> counts;  // sorted by bucket address
  std::int64_t time_nanos = 0;
};

// A bucket's counters as one reading. Frees first: it never exceeds allocs,
// which only grows, so live = allocs - frees is never negative.
inline BucketCounts ReadCounts(const Bucket* b) noexcept {
  const std::uint64_t frees = b->frees.load(std::memory_order_relaxed);
  const std::uint64_t allocs = b->allocs.load(std::memory_order_relaxed);
  return BucketCounts{b, allocs, frees};
}

inline ProfileBaseline TakeBaseline() {
  ReentrancyGuard guard;
  EnsureInit();
  ProfileBaseline base;
  base.time_nanos = RealtimeNanos();
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
    data.duration_nanos = data.time_nanos > since->time_nanos ? data.time_nanos - since->time_nanos : 1;
  }
  data.allocs_default = allocs_default;
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
  ReportRaw("heapprof: writing a profile, but no allocation has been seen: the hooks are not installed. "
            "Define HEAPPROF_REPLACE_NEW_DELETE before #include <heapprof.hpp> in one .cpp file of the "
            "program (or allocate through heapprof::allocator).\n");
}

// `data` as a gzip'ed profile.proto message. Throws bad_alloc.
inline ArenaString EncodeGzipped(const ProfileData& data, const ArenaVector<LoadedObject>& objects,
                                 Symbolizer& symbolizer) {
  ArenaString gz;
  GzipCompress(EncodeProfile(data, objects, symbolizer), gz);
  return gz;
}

// Serialised, compressed profile; empty on failure.
// With `since`, the delta profile from that baseline (see SnapshotProfile).
inline bool BuildProfileBytes(bool allocs_default, ArenaString& gz,
                              const ProfileBaseline* since = nullptr) {
  ReentrancyGuard guard;
  EnsureInit();
  WarnIfNoAllocationSeen();
  HEAPPROF_TRY {
    const ProfileData data = SnapshotProfile(allocs_default, since);
    const ArenaVector<LoadedObject> objects = CollectLoadedObjects();
    Symbolizer symbolizer(objects);
    gz = EncodeGzipped(data, objects, symbolizer);
    return true;
  }
  HEAPPROF_CATCH_ALL {  // bad_alloc: a profile is never worth the process
    gz.clear();
    return false;
  }
}

}  // namespace detail
}  // namespace heapprof
