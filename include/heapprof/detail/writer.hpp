// heapprof: from buckets to a gzip'ed pprof profile.
//
// snapshot buckets (lock-free walk) → scale (Go's formula) → ProfileData
// → EncodeProfile (symbolized in process) → GzipCompress → ostream.
// Runs under the reentrancy guard: what the writer allocates is counted in
// Stats but never sampled, and no engine lock is held while it allocates.
#pragma once

#include <cmath>
#include <cstdint>
#include <ctime>
#include <new>
#include <ostream>
#include <string>

#include "heapprof/detail/buckets.hpp"
#include "heapprof/detail/elf.hpp"
#include "heapprof/detail/engine.hpp"
#include "heapprof/detail/gzip.hpp"
#include "heapprof/detail/profile_builder.hpp"

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
    sample.labels.emplace_back(std::string(labels->entries()[i].key), std::string(labels->entries()[i].value));
  }
}

inline ProfileData SnapshotProfile(bool allocs_default) {
  ProfileData data;
  data.period = static_cast<std::int64_t>(RateOf(g_rate_state.load(std::memory_order_acquire)));
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  data.time_nanos = static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  data.allocs_default = allocs_default;
  for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) {
    // frees first: it never exceeds allocs, which only grows.
    const std::uint64_t frees = b->frees.load(std::memory_order_relaxed);
    const std::uint64_t allocs = b->allocs.load(std::memory_order_relaxed);
    const std::uint64_t live = allocs > frees ? allocs - frees : 0;
    const double scale = HeapSampleScale(b->size, b->rate);
    const double size = static_cast<double>(b->size);
    ProfileSample s;
    s.pcs.assign(b->stack->pcs(), b->stack->pcs() + b->stack->depth);
    s.truncated = b->stack->truncated;
    s.overflow = b->stack->overflow;
    s.alloc_objects = std::llround(static_cast<double>(allocs) * scale);
    s.alloc_bytes = std::llround(static_cast<double>(allocs) * size * scale);
    s.inuse_objects = std::llround(static_cast<double>(live) * scale);
    s.inuse_bytes = std::llround(static_cast<double>(live) * size * scale);
    s.object_size = static_cast<std::int64_t>(b->size);
    FillLabels(b->labels, s);
    data.samples.push_back(std::move(s));
  }
  return data;
}

// Serialised, compressed profile; empty on failure.
inline bool BuildProfileBytes(bool allocs_default, std::string& gz) noexcept {
  ReentrancyGuard guard;
  EnsureInit();
  try {
    const ProfileData data = SnapshotProfile(allocs_default);
    const std::vector<LoadedObject> objects = CollectLoadedObjects();
    Symbolizer symbolizer(objects);
    const std::string raw = EncodeProfile(data, objects, symbolizer);
    gz.clear();
    GzipCompress(raw, gz);
    return true;
  } catch (...) {  // bad_alloc: a profile is never worth the process
    gz.clear();
    return false;
  }
}

inline bool WriteProfile(std::ostream& out, bool allocs_default) noexcept {
  ReentrancyGuard guard;
  std::string gz;
  if (!BuildProfileBytes(allocs_default, gz)) return false;
  try {
    out.write(gz.data(), static_cast<std::streamsize>(gz.size()));
    out.flush();
    return !out.fail();
  } catch (...) {  // a stream with exceptions() enabled
    return false;
  }
}

}  // namespace detail
}  // namespace heapprof
