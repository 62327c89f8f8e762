// heapprof: the peak heap profile (always on).
//
// tcmalloc's rule: the estimated in-use heap (what the profile's inuse_space
// would sum to: each live sample weighs size / (1 - exp(-size/rate))) is kept
// in one counter, moved on the sampled path only: + weight when a sample is
// recorded, - weight when a sampled object is freed. When it first exceeds
// the last snapshot by 10%, every bucket's counters are copied into a buffer
// of the profiler's arena. WritePeakHeapProfile encodes that copy, like a
// heap profile written at that instant.
//
// Cost, all on the sampled path (the unsampled fast paths are unchanged): one
// atomic add and a compare per sampled allocation and per free of a sampled
// object; a snapshot is a walk of the bucket list, 24 bytes per bucket
// copied (README "Memory events" has the measured figures). Growth by 10% per
// snapshot bounds their number: ~24 per tenfold growth of the heap. Memory:
// one buffer of 24 bytes per bucket (arena, in Stats::profiler_bytes), grown
// by doubling, never shrunk.
//
// The snapshot is taken when the estimate first exceeds 1.1x the previous one,
// so the true maximum can be up to 10% above it (a heap that grows slowly to
// its peak); the highest estimate seen is kept too and written beside it.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/0_base/spinlock.hpp"
#include "heapprof/detail/2_sampling/buckets.hpp"

namespace heapprof {
namespace detail {

// Go's runtime/pprof scaleHeapSample: an object of size s is sampled with
// probability 1 - exp(-s/R), so each sample stands for 1/(1 - exp(-s/R))
// objects. expm1 keeps precision for s << R. Rate 1 recorded everything.
inline double HeapSampleScale(std::uint64_t size, std::uint64_t rate) noexcept {
  if (rate <= 1 || size == 0) return 1.0;
  return 1.0 / -std::expm1(-static_cast<double>(size) / static_cast<double>(rate));
}

// The bytes one sample of bucket `b` stands for, rounded: the same number at
// its allocation and at its free, so the estimate returns exactly to its
// baseline. At rate 1 it is the requested size.
inline std::uint64_t SampleWeight(const Bucket* b) noexcept {
  if (b->rate <= 1) return b->size;
  return static_cast<std::uint64_t>(std::llround(static_cast<double>(b->size) * HeapSampleScale(b->size, b->rate)));
}

// One bucket's counters at one moment (also the baseline of a delta profile,
// 5_encoding/snapshot.hpp). Buckets are never freed, so a bucket's address
// identifies it for the life of the process.
struct BucketCounts {
  const Bucket* bucket;
  std::uint64_t allocs, frees;
};

// A bucket's counters as one reading. Frees first: it never exceeds allocs,
// which only grows, so live = allocs - frees is never negative.
inline BucketCounts ReadCounts(const Bucket* b) noexcept {
  const std::uint64_t frees = b->frees.load(std::memory_order_relaxed);
  const std::uint64_t allocs = b->allocs.load(std::memory_order_relaxed);
  return BucketCounts{b, allocs, frees};
}

inline std::int64_t RealtimeNanos() noexcept {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return std::int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

// What a writer gets: the snapshot's facts (the counts are copied separately).
struct PeakInfo {
  std::uint64_t bytes = 0;         // estimated in-use bytes when the snapshot was taken
  std::int64_t time_nanos = 0;     // CLOCK_REALTIME of the snapshot; 0: none yet
  std::uint64_t max_bytes = 0;     // highest estimate seen in this window
  std::int64_t window_nanos = 0;   // when the window started (process start or ResetPeak)
  std::uint64_t snapshots = 0;     // snapshots taken in this window
  std::uint64_t inuse_now = 0;     // the estimate right now
};

// The estimated in-use heap, shared by every window. On a line of its own:
// every sample and every sampled free write it, and every sample reads the
// peak trackers' fields, which shared its line.
struct alignas(64) InuseEstimate {
  std::atomic<std::uint64_t> bytes{0};
};
inline InuseEstimate g_inuse_estimate;

// One window's peak: its highest estimate and the snapshot taken on the way.
class PeakTracker {
 public:
  constexpr PeakTracker() noexcept = default;

  // Sampled path: the estimate `now`, just after a sampled allocation.
  void Observe(std::uint64_t now) noexcept {
    std::uint64_t max = max_.load(std::memory_order_relaxed);
    while (now > max && !max_.compare_exchange_weak(max, now, std::memory_order_relaxed)) {
    }
    if (HEAPPROF_LIKELY(now <= next_mark_.load(std::memory_order_relaxed))) return;
    MaybeSnapshot(now);
  }

  // A new window that starts at the heap as it is now.
  void Reset() noexcept {
    Held hold(*this);
    const std::uint64_t now = g_inuse_estimate.bytes.load(std::memory_order_relaxed);
    window_nanos_ = RealtimeNanos();
    snapshots_ = 0;
    max_.store(now, std::memory_order_relaxed);
    SnapshotLocked(now);
  }

  // Copies the snapshot into `out` (capacity `cap` entries); the count, or
  // SIZE_MAX when `cap` is too small (call again with at least Count()).
  std::size_t Copy(BucketCounts* out, std::size_t cap, PeakInfo& info) noexcept {
    Held hold(*this);
    if (count_ > cap) return static_cast<std::size_t>(-1);
    if (count_ != 0) std::memcpy(static_cast<void*>(out), counts_, count_ * sizeof(BucketCounts));
    info.bytes = bytes_;
    info.time_nanos = time_nanos_;
    info.max_bytes = max_.load(std::memory_order_relaxed);
    info.window_nanos = window_nanos_;
    info.snapshots = snapshots_;
    info.inuse_now = g_inuse_estimate.bytes.load(std::memory_order_relaxed);
    return count_;
  }
  std::size_t Count() const noexcept { return count_published_.load(std::memory_order_relaxed); }

  std::uint64_t InuseEstimate() const noexcept { return g_inuse_estimate.bytes.load(std::memory_order_relaxed); }
  std::size_t BufferBytes() const noexcept { return cap_published_.load(std::memory_order_relaxed) * sizeof(BucketCounts); }

  SpinLock& lock() noexcept { return lock_; }  // for fork handlers

  // The tracker held, as by a snapshot or a writer's copy: a sample that
  // crosses the mark meanwhile is snapshotted when it is let go.
  class Held {
   public:
    explicit Held(PeakTracker& tracker) noexcept : tracker_(tracker) { tracker_.lock_.lock(); }
    ~Held() { tracker_.ReleaseAndCatchUp(); }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;

   private:
    PeakTracker& tracker_;
  };

  // The window of a process that has not called ResetPeak: its start.
  void StartWindow() noexcept {
    if (window_nanos_ == 0) window_nanos_ = RealtimeNanos();
  }

 private:
  // Another thread taking a snapshot (or a writer copying) makes this one
  // skip: the sampled path never waits here. The holder takes the snapshot
  // this one skipped when it lets go (ReleaseAndCatchUp).
  HEAPPROF_NOINLINE void MaybeSnapshot(std::uint64_t now) noexcept {
    // Pairs with the fence in ReleaseAndCatchUp: either the holder's reload
    // of the estimate sees this thread's sample (added before this point), or
    // the try_lock below sees the lock free.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!lock_.try_lock()) return;
    if (now > next_mark_.load(std::memory_order_relaxed)) SnapshotLocked(now);
    ReleaseAndCatchUp();
  }

  // Unlocks, then takes the snapshot that a sample crossing the mark while the
  // lock was held skipped. Without this, that crossing was lost whenever no
  // later sample crossed the mark again: two threads each allocating 64 MiB
  // at once, at rate 1, left a peak profile holding one of the blocks in 8 of
  // 40 runs (its comment said 128 MiB were seen, its samples summed to 64).
  // A peak that comes and goes while the lock is held is still missed
  // (the highest-seen comment shows it).
  void ReleaseAndCatchUp() noexcept {
    for (;;) {
      lock_.unlock();
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (g_inuse_estimate.bytes.load(std::memory_order_relaxed) <= next_mark_.load(std::memory_order_relaxed)) return;
      if (!lock_.try_lock()) return;  // the new holder catches up in its turn
      const std::uint64_t now = g_inuse_estimate.bytes.load(std::memory_order_relaxed);
      if (now > next_mark_.load(std::memory_order_relaxed)) SnapshotLocked(now);
    }
  }

  void SnapshotLocked(std::uint64_t now) noexcept {
    std::size_t n = 0;
    bool complete = true;
    for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) {
      if (n == cap_ && !Grow()) {
        complete = false;
        break;
      }
      counts_[n++] = ReadCounts(b);
    }
    // Out of memory for the copy (the arena could not grow the buffer): no
    // snapshot rather than a partial one, which would not be the heap at any
    // moment; the mark moves on all the same, and the next 10% tries again.
    next_mark_.store(now + now / 10, std::memory_order_relaxed);
    if (!complete) {
      count_ = 0;
      count_published_.store(0, std::memory_order_relaxed);
      bytes_ = 0;
      time_nanos_ = 0;
      return;
    }
    count_ = n;
    count_published_.store(n, std::memory_order_relaxed);
    bytes_ = now;
    time_nanos_ = RealtimeNanos();
    ++snapshots_;
  }

  bool Grow() noexcept {
    const std::size_t cap = cap_ == 0 ? 256 : cap_ * 2;
    auto* mem = static_cast<BucketCounts*>(g_arena.Allocate(cap * sizeof(BucketCounts)));
    if (mem == nullptr) return false;
    if (cap_ != 0) {
      std::memcpy(static_cast<void*>(mem), counts_, cap_ * sizeof(BucketCounts));
      g_arena.Free(counts_, cap_ * sizeof(BucketCounts));
    }
    counts_ = mem;
    cap_ = cap;
    cap_published_.store(cap, std::memory_order_relaxed);
    return true;
  }

  SpinLock lock_;
  std::atomic<std::uint64_t> max_{0};
  std::atomic<std::uint64_t> next_mark_{0};  // 0: the first sample takes one
  // Under lock_:
  BucketCounts* counts_ = nullptr;
  std::size_t cap_ = 0;
  std::size_t count_ = 0;
  std::uint64_t bytes_ = 0;
  std::int64_t time_nanos_ = 0;
  std::int64_t window_nanos_ = 0;
  std::uint64_t snapshots_ = 0;
  std::atomic<std::size_t> count_published_{0};
  std::atomic<std::size_t> cap_published_{0};
};

// The program's window: since the process started, or since ResetPeak().
inline PeakTracker g_peak;
// The HTTP server's /debug/pprof/peak?seconds=N window (one at a time), fed
// only while one is open: a window of the server's never resets the
// program's (a scrape every minute would have made peak_at_exit the peak of
// the last minute), nor ResetPeak() the server's.
inline PeakTracker g_window_peak;
inline std::atomic<bool> g_window_peak_open{false};

// The sampled path, after the bucket counted the allocation.
inline void CountSampledPeak(const Bucket* b) noexcept {
  const std::uint64_t w = SampleWeight(b);
  const std::uint64_t now = g_inuse_estimate.bytes.fetch_add(w, std::memory_order_relaxed) + w;
  g_peak.Observe(now);
  if (HEAPPROF_UNLIKELY(g_window_peak_open.load(std::memory_order_relaxed))) g_window_peak.Observe(now);
}

// Every free of a sampled object goes through here: its bucket, then the
// in-use estimate.
inline void CountSampledFree(Bucket* b) noexcept {
  if (b == &g_dropped_sample_bucket) return;  // never counted as sampled (buckets.hpp)
  b->frees.fetch_add(1, std::memory_order_relaxed);
  g_inuse_estimate.bytes.fetch_sub(SampleWeight(b), std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace heapprof
