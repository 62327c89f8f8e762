// heapprof: interned stacks and the sample buckets that count against them.
//
// Go's runtime/mprof.go keys a bucket by stack and keeps alloc/free counters;
// we key by (stack, object size, sample rate, label set) so that the write-time
// scaling is exact per bucket: the size is the mean size Go's formula needs, and
// a sample keeps the rate it was drawn at even after SetSampleRate. Bytes are
// count * size, so a bucket holds just two counters.
//
// Stacks and buckets are arena records that are never freed. Buckets are also
// pushed on an append-only list so the writer can walk them without the lock.
//
// Memory is bounded (README "Limits"): at most max_stacks distinct stacks
// (HEAPPROF key, kDefaultMaxStacks by default) and kBucketsPerStack * max_stacks
// buckets. Past either cap a sample goes to the overflow stack, a stack of no
// frames that the writer shows as one "[heapprof: stack table full]" frame,
// still keyed by (size, rate, labels) so its totals stay exact; the overflow
// buckets have a reserve of max_stacks of their own. Only when that is full
// too is a sample dropped (its object is then never in the profile). Both are
// counted in Stats (stack_overflows, samples_dropped).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/0_base/hash.hpp"
#include "heapprof/detail/0_base/intern_table.hpp"
#include "heapprof/detail/0_base/spinlock.hpp"

namespace heapprof {
namespace detail {

struct LabelSetData;  // labels.hpp

constexpr std::uint64_t kDefaultMaxStacks = 16384;
constexpr std::uint64_t kBucketsPerStack = 4;

struct StackRecord {
  std::uint64_t hash;
  std::uint32_t depth;
  bool truncated;
  bool overflow;  // the overflow stack: the stack table was full (depth 0)
  // `depth` return addresses, leaf first, stored right after the record.
  const std::uintptr_t* pcs() const noexcept { return reinterpret_cast<const std::uintptr_t*>(this + 1); }
  std::uintptr_t* pcs() noexcept { return reinterpret_cast<std::uintptr_t*>(this + 1); }

  static std::size_t BytesFor(std::uint32_t depth) noexcept {
    return sizeof(StackRecord) + depth * sizeof(std::uintptr_t);
  }
};

struct Bucket {
  std::uint64_t hash;
  const StackRecord* stack;
  std::uint64_t size;  // object size in bytes
  std::uint64_t rate;  // sample rate the samples were drawn at
  const LabelSetData* labels;
  std::atomic<std::uint64_t> allocs;  // sampled allocations
  std::atomic<std::uint64_t> frees;   // of those, freed
  Bucket* next;                       // the all-buckets list, newest first
};

// The live map's bucket for an object whose sample the tables had no room for
// (RecordAlloc returned nullptr: samples_dropped). No profile shows it (it is
// on no list) and no count moves with it (peak.hpp: CountSampledFree), but the
// object stays in the live map so that its free is still a sampled object's:
// a small block padded to 1 KiB for its sample was counted at its padded size,
// and a sized delete under jemalloc or tcmalloc (block_hooks.hpp:
// HotFreeSized) would count its request's class unless the free filter sends
// it to the slow path, which reads the block's real size.
inline Bucket g_dropped_sample_bucket{};

// Lines of its own (alignas): every sample writes its lock. Sharing a line
// with the flags each sample reads (g_unwinder and the walk's switches), it
// made every sample of two threads recording every allocation wait for that
// line (bench_lazy_threads).
class alignas(64) BucketTable {
 public:
  constexpr BucketTable() noexcept = default;

  // The bucket for this sample, created on first use; one more alloc counted.
  // nullptr when the sample is dropped (counted): the arena is out of memory,
  // or the stack table and the overflow reserve are both full.
  // `known`: the record of this very stack (pcs, depth and truncated equal),
  // interned earlier, or null. `interned`, if given, receives the stack's
  // record when it is a real one (not the overflow stack), else null.
  // `new_stack`, if given, is set true when this call made the stack's record.
  Bucket* RecordAlloc(const std::uintptr_t* pcs, std::uint32_t depth, bool truncated, std::uint64_t size,
                      std::uint64_t rate, const LabelSetData* labels, const StackRecord* known = nullptr,
                      const StackRecord** interned = nullptr, bool* new_stack = nullptr) noexcept {
    if (interned != nullptr) *interned = nullptr;
    const std::uint64_t stack_hash =
        known != nullptr ? known->hash : HashWords(pcs, depth, truncated ? 0x5bd1e995u : 0x1b873593u);
    // The bucket's hash needs only the stack's hash, so both tables' first
    // reads start at once, before the stack is found: on a stack the tables
    // have not seen lately each read misses the caches, and the two lookups
    // are otherwise back to back (bench_sample_cost, random stacks).
    const std::uint64_t bucket_hash = BucketHash(stack_hash, size, rate, labels);
    LockGuard hold(lock_);
    if (known == nullptr) stacks_.Prefetch(stack_hash);
    buckets_.Prefetch(bucket_hash);
    const std::uint64_t max_stacks = max_stacks_.load(std::memory_order_relaxed);
    const StackRecord* stack =
        known != nullptr ? known : InternStack(stack_hash, pcs, depth, truncated, max_stacks, new_stack);
    if (stack == nullptr) return Dropped();
    if (interned != nullptr && !stack->overflow) *interned = stack;
    // The bucket's hash follows its stack: bucket_hash unless the stack
    // table was full (the overflow stack has a hash of its own).
    std::uint64_t hash = stack->overflow ? BucketHash(stack->hash, size, rate, labels) : bucket_hash;
    Bucket* b = FindBucket(hash, stack, size, rate, labels);
    if (b == nullptr && !stack->overflow && normal_buckets_ >= kBucketsPerStack * max_stacks) {
      // Bucket cap: this stack is known, but not with this size/rate/labels.
      stack = OverflowStack();
      if (stack == nullptr) return Dropped();
      hash = BucketHash(stack->hash, size, rate, labels);
      b = FindBucket(hash, stack, size, rate, labels);
    }
    if (b == nullptr) {
      std::size_t& count = stack->overflow ? overflow_buckets_ : normal_buckets_;
      if (stack->overflow && count >= max_stacks) return Dropped();
      void* mem = g_arena.Allocate(sizeof(Bucket));
      if (mem == nullptr) return Dropped();
      b = new (mem) Bucket{hash, stack, size, rate, labels, {0}, {0},
                           head_.load(std::memory_order_relaxed)};
      if (!buckets_.Insert(b)) {
        g_arena.Free(mem, sizeof(Bucket));
        return Dropped();
      }
      ++count;
      bucket_bytes_ += sizeof(Bucket);
      head_.store(b, std::memory_order_release);  // publish: the writer walks from head_
    }
    b->allocs.fetch_add(1, std::memory_order_relaxed);
    if (stack->overflow) stack_overflows_.fetch_add(1, std::memory_order_relaxed);
    return b;
  }

  // Cap on distinct stacks (HEAPPROF=max_stacks); applies to stacks interned
  // from now on.
  void SetMaxStacks(std::uint64_t n) noexcept { max_stacks_.store(n, std::memory_order_relaxed); }
  std::uint64_t MaxStacks() const noexcept { return max_stacks_.load(std::memory_order_relaxed); }
  // Samples attributed to the overflow stack, and samples not recorded at all.
  std::uint64_t StackOverflows() const noexcept { return stack_overflows_.load(std::memory_order_relaxed); }
  std::uint64_t SamplesDropped() const noexcept { return samples_dropped_.load(std::memory_order_relaxed); }

  // Newest bucket; walk ->next. Lock-free: buckets are never removed.
  const Bucket* Head() const noexcept { return head_.load(std::memory_order_acquire); }

  // Distinct stacks interned (the overflow stack not included).
  std::size_t StackCount() noexcept {
    LockGuard hold(lock_);
    return stacks_.size();
  }
  std::size_t BucketCount() noexcept {
    LockGuard hold(lock_);
    return buckets_.size();
  }
  std::size_t MemoryBytes() noexcept {
    LockGuard hold(lock_);
    return stacks_.MemoryBytes() + buckets_.MemoryBytes() + stack_bytes_ + bucket_bytes_;
  }

  SpinLock& lock() noexcept { return lock_; }  // for fork handlers

  // Two folded multiplies (hash.hpp: FoldMultiply), then one full mix: three
  // HashCombine calls were ~90 instructions a sample in one serial chain,
  // which the bucket table's prefetch waits for (callgrind, random stacks).
  // (Public for tests.)
  static std::uint64_t BucketHash(std::uint64_t stack_hash, std::uint64_t size, std::uint64_t rate,
                                  const LabelSetData* labels) noexcept {
    const std::uint64_t h = FoldMultiply(stack_hash ^ kFoldS0, size ^ kFoldS1);
    return Mix64(FoldMultiply(h ^ rate ^ kFoldS2, reinterpret_cast<std::uintptr_t>(labels) ^ kFoldS3));
  }

 private:

  Bucket* FindBucket(std::uint64_t hash, const StackRecord* stack, std::uint64_t size, std::uint64_t rate,
                     const LabelSetData* labels) const noexcept {
    return buckets_.Find(hash, [&](const Bucket& x) {
      return x.stack == stack && x.size == size && x.rate == rate && x.labels == labels;
    });
  }

  Bucket* Dropped() noexcept {
    samples_dropped_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }

  // Made on first use, outside the stack table: it never counts against the cap.
  const StackRecord* OverflowStack() noexcept {
    if (overflow_stack_ == nullptr) {
      auto* s = static_cast<StackRecord*>(g_arena.Allocate(StackRecord::BytesFor(0)));
      if (s == nullptr) return nullptr;
      s->hash = 0x6f766572666c6f77ull;  // "overflow"
      s->depth = 0;
      s->truncated = false;
      s->overflow = true;
      stack_bytes_ += StackRecord::BytesFor(0);
      overflow_stack_ = s;
    }
    return overflow_stack_;
  }

  const StackRecord* InternStack(std::uint64_t hash, const std::uintptr_t* pcs, std::uint32_t depth,
                                 bool truncated, std::uint64_t max_stacks, bool* made) noexcept {
    const StackRecord* found = stacks_.Find(hash, [&](const StackRecord& s) {
      return s.depth == depth && s.truncated == truncated &&
             std::memcmp(s.pcs(), pcs, depth * sizeof(std::uintptr_t)) == 0;
    });
    if (found != nullptr) return found;
    if (stacks_.size() >= max_stacks) return OverflowStack();
    const std::size_t bytes = StackRecord::BytesFor(depth);
    auto* s = static_cast<StackRecord*>(g_arena.Allocate(bytes));
    if (s == nullptr) return nullptr;
    s->hash = hash;
    s->depth = depth;
    s->truncated = truncated;
    s->overflow = false;
    std::memcpy(s->pcs(), pcs, depth * sizeof(std::uintptr_t));
    if (!stacks_.Insert(s)) {
      g_arena.Free(s, bytes);
      return nullptr;
    }
    stack_bytes_ += bytes;
    if (made != nullptr) *made = true;
    return s;
  }

  SpinLock lock_;
  InternTable<StackRecord> stacks_;
  InternTable<Bucket> buckets_;
  std::atomic<Bucket*> head_{nullptr};
  std::size_t stack_bytes_ = 0;
  std::size_t bucket_bytes_ = 0;
  const StackRecord* overflow_stack_ = nullptr;
  std::size_t normal_buckets_ = 0;    // buckets of real stacks
  std::size_t overflow_buckets_ = 0;  // buckets of the overflow stack
  std::atomic<std::uint64_t> max_stacks_{kDefaultMaxStacks};
  std::atomic<std::uint64_t> stack_overflows_{0};
  std::atomic<std::uint64_t> samples_dropped_{0};
};

inline BucketTable g_buckets;

}  // namespace detail
}  // namespace heapprof
