// heapprof: the registry of per-thread states (1_hooks/fast_path.hpp), and the
// reentrancy guard.
//
// Slots live in the arena and are never unmapped; a thread's slot is recycled
// after its exit is seen through a pthread key destructor, which first folds the
// slot's counters into the retired totals so Stats never lose a count.
#pragma once

#include <atomic>
#include <cstdint>
#include <new>
#include <pthread.h>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/0_base/spinlock.hpp"
#include "heapprof/detail/1_hooks/block_hooks.hpp"
#include "heapprof/detail/1_hooks/fast_path.hpp"

namespace heapprof {
namespace detail {

// The profiler's own work on this thread: allocations it makes are counted in
// Stats but never sampled, and nothing re-enters the sampling machinery.
class ReentrancyGuard {
 public:
  ReentrancyGuard() noexcept { ++tls_thread_flags.guard; }
  ~ReentrancyGuard() { --tls_thread_flags.guard; }
  ReentrancyGuard(const ReentrancyGuard&) = delete;
  ReentrancyGuard& operator=(const ReentrancyGuard&) = delete;
};

struct Totals {
  std::uint64_t alloc_objects = 0, alloc_bytes = 0, free_objects = 0, free_bytes = 0;
};

class ThreadRegistry {
 public:
  constexpr ThreadRegistry() noexcept = default;

  // A recycled or new slot, marked in use; nullptr if the arena is out of memory.
  ThreadState* Acquire() noexcept {
    LockGuard hold(lock_);
    ThreadState* slot = free_;
    if (slot != nullptr) {
      free_ = slot->next_free;
    } else {
      slot = static_cast<ThreadState*>(g_arena.Allocate(sizeof(ThreadState)));
      if (slot == nullptr) return nullptr;
      new (slot) ThreadState();
      slot->next_slot = all_;
      all_ = slot;
    }
    slot->in_use = true;
    slot->next_free = nullptr;
    StoreRelaxed(slot->sampled_min, g_sampled_min.load(std::memory_order_acquire));
    return slot;
  }

  // The rate is going below kPaddedSamplingMinRate: small blocks may be
  // sampled from now on, so every free must read the filter. Each slot first,
  // then the process value that a sample checks (block_hooks.hpp).
  void LowerSampledMin() noexcept {
    LockGuard hold(lock_);
    if (g_sampled_min.load(std::memory_order_relaxed) == 0) return;
    for (ThreadState* s = all_; s != nullptr; s = s->next_slot) StoreRelaxed(s->sampled_min, std::uint64_t{0});
    g_sampled_min.store(0, std::memory_order_release);
  }

  // Folds the slot's counters into the retired totals and frees the slot.
  void Release(ThreadState* slot) noexcept {
    LockGuard hold(lock_);
    Fold(*slot, retired_);
    StoreRelaxed(slot->alloc_objects, std::uint64_t{0});
    StoreRelaxed(slot->alloc_bytes, std::uint64_t{0});
    StoreRelaxed(slot->free_objects, std::uint64_t{0});
    StoreRelaxed(slot->free_bytes, std::uint64_t{0});
    StoreRelaxed(slot->countdown, std::int64_t{0});
    slot->in_use = false;
    slot->next_free = free_;
    free_ = slot;
  }

  // Allocations by threads without a slot (exiting, or out of memory): rare, so
  // a shared atomic is fine here.
  void CountUnregisteredAlloc(std::uint64_t bytes) noexcept {
    orphan_alloc_objects_.fetch_add(1, std::memory_order_relaxed);
    orphan_alloc_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  // A sample skipped because its thread was inside the profiler (a signal
  // handler's allocation, or the profiler's own): rare, a shared atomic.
  void CountNestedSample() noexcept { nested_samples_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t NestedSamples() const noexcept { return nested_samples_.load(std::memory_order_relaxed); }

  // An unregistered thread's block that turned out a heapprof::allocator's
  // own (engine.hpp: UncountScopeBlock): counted by the allocator instead.
  void UncountUnregisteredAlloc(std::uint64_t bytes) noexcept {
    orphan_alloc_objects_.fetch_sub(1, std::memory_order_relaxed);
    orphan_alloc_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  void CountUnregisteredFree(std::uint64_t bytes) noexcept {
    orphan_free_objects_.fetch_add(1, std::memory_order_relaxed);
    orphan_free_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }

  Totals Sum() noexcept {
    Totals t;
    {
      LockGuard hold(lock_);
      t = retired_;
      for (ThreadState* s = all_; s != nullptr; s = s->next_slot) Fold(*s, t);
    }
    t.alloc_objects += orphan_alloc_objects_.load(std::memory_order_relaxed);
    t.alloc_bytes += orphan_alloc_bytes_.load(std::memory_order_relaxed);
    t.free_objects += orphan_free_objects_.load(std::memory_order_relaxed);
    t.free_bytes += orphan_free_bytes_.load(std::memory_order_relaxed);
    return t;
  }

  // Asks every thread to re-read the sample rate at its next allocation. Exact
  // for the calling thread (nobody else writes its countdown); best effort for
  // the others by design: an owner's own load+store may overwrite our 0, and
  // then it notices at its next sample (or within kRateRecheckBytes when off).
  void PokeAll() noexcept {
    LockGuard hold(lock_);
    for (ThreadState* s = all_; s != nullptr; s = s->next_slot) {
      if (s->in_use) StoreRelaxed(s->countdown, std::int64_t{0});
    }
  }

  SpinLock& lock() noexcept { return lock_; }  // for fork handlers

 private:
  static void Fold(const ThreadState& s, Totals& t) noexcept {
    t.alloc_objects += LoadRelaxed(s.alloc_objects);
    t.alloc_bytes += LoadRelaxed(s.alloc_bytes);
    t.free_objects += LoadRelaxed(s.free_objects);
    t.free_bytes += LoadRelaxed(s.free_bytes);
  }

  SpinLock lock_;
  ThreadState* all_ = nullptr;
  ThreadState* free_ = nullptr;
  Totals retired_;
  std::atomic<std::uint64_t> orphan_alloc_objects_{0}, orphan_alloc_bytes_{0};
  std::atomic<std::uint64_t> orphan_free_objects_{0}, orphan_free_bytes_{0};
  std::atomic<std::uint64_t> nested_samples_{0};
};

inline ThreadRegistry g_registry;

}  // namespace detail
}  // namespace heapprof
