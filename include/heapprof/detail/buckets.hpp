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
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "heapprof/config.hpp"
#include "heapprof/detail/arena.hpp"
#include "heapprof/detail/hash.hpp"
#include "heapprof/detail/intern_table.hpp"
#include "heapprof/detail/spinlock.hpp"

namespace heapprof {
namespace detail {

struct LabelSetData;  // labels.hpp

struct StackRecord {
  std::uint64_t hash;
  std::uint32_t depth;
  bool truncated;
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

class BucketTable {
 public:
  constexpr BucketTable() noexcept = default;

  // The bucket for this sample, created on first use; one more alloc counted.
  // nullptr only when the arena is out of memory (the sample is dropped).
  Bucket* RecordAlloc(const std::uintptr_t* pcs, std::uint32_t depth, bool truncated, std::uint64_t size,
                      std::uint64_t rate, const LabelSetData* labels) noexcept {
    const std::uint64_t stack_hash = HashWords(pcs, depth, truncated ? 0x5bd1e995u : 0x1b873593u);
    LockGuard hold(lock_);
    const StackRecord* stack = InternStack(stack_hash, pcs, depth, truncated);
    if (stack == nullptr) return nullptr;
    std::uint64_t h = HashCombine(stack_hash, size);
    h = HashCombine(h, rate);
    h = HashCombine(h, reinterpret_cast<std::uintptr_t>(labels));
    Bucket* b = buckets_.Find(h, [&](const Bucket& x) {
      return x.stack == stack && x.size == size && x.rate == rate && x.labels == labels;
    });
    if (b == nullptr) {
      void* mem = g_arena.Allocate(sizeof(Bucket));
      if (mem == nullptr) return nullptr;
      b = new (mem) Bucket{h, stack, size, rate, labels, {0}, {0}, head_.load(std::memory_order_relaxed)};
      if (!buckets_.Insert(b)) {
        g_arena.Free(mem, sizeof(Bucket));
        return nullptr;
      }
      bucket_bytes_ += sizeof(Bucket);
      head_.store(b, std::memory_order_release);  // publish: the writer walks from head_
    }
    b->allocs.fetch_add(1, std::memory_order_relaxed);
    return b;
  }

  // Newest bucket; walk ->next. Lock-free: buckets are never removed.
  const Bucket* Head() const noexcept { return head_.load(std::memory_order_acquire); }

  std::size_t StackCount() noexcept {
    LockGuard hold(lock_);
    return stacks_.size();
  }
  std::size_t MemoryBytes() noexcept {
    LockGuard hold(lock_);
    return stacks_.MemoryBytes() + buckets_.MemoryBytes() + stack_bytes_ + bucket_bytes_;
  }

  SpinLock& lock() noexcept { return lock_; }  // for fork handlers

 private:
  const StackRecord* InternStack(std::uint64_t hash, const std::uintptr_t* pcs, std::uint32_t depth,
                                 bool truncated) noexcept {
    const StackRecord* found = stacks_.Find(hash, [&](const StackRecord& s) {
      return s.depth == depth && s.truncated == truncated &&
             std::memcmp(s.pcs(), pcs, depth * sizeof(std::uintptr_t)) == 0;
    });
    if (found != nullptr) return found;
    const std::size_t bytes = StackRecord::BytesFor(depth);
    auto* s = static_cast<StackRecord*>(g_arena.Allocate(bytes));
    if (s == nullptr) return nullptr;
    s->hash = hash;
    s->depth = depth;
    s->truncated = truncated;
    std::memcpy(s->pcs(), pcs, depth * sizeof(std::uintptr_t));
    if (!stacks_.Insert(s)) {
      g_arena.Free(s, bytes);
      return nullptr;
    }
    stack_bytes_ += bytes;
    return s;
  }

  SpinLock lock_;
  InternTable<StackRecord> stacks_;
  InternTable<Bucket> buckets_;
  std::atomic<Bucket*> head_{nullptr};
  std::size_t stack_bytes_ = 0;
  std::size_t bucket_bytes_ = 0;
};

inline BucketTable g_buckets;

}  // namespace detail
}  // namespace heapprof
