// heapprof: per-thread state: the sampling countdown and the Stats counters.
//
// The fast path reads one thread-local pointer and the countdown behind it
// (invariant 3: no atomic read-modify-write, no shared cache line written). A
// thread that never reached the slow path points at g_empty_thread_state, whose
// countdown is 0 forever, so its first allocation takes the slow path and
// registers a real slot (mimalloc's "empty heap" trick: no null check).
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
#include "heapprof/detail/arena.hpp"
#include "heapprof/detail/spinlock.hpp"

namespace heapprof {
namespace detail {

struct alignas(64) ThreadState {
  // --- written by the owning thread on every allocation and free ---
  // Relaxed atomics written with load+store (not RMW): plain moves on x86-64,
  // yet readable by GetStats from other threads without a data race.
  std::atomic<std::int64_t> countdown{0};  // bytes until the next sample
  std::atomic<std::uint64_t> alloc_objects{0};
  std::atomic<std::uint64_t> alloc_bytes{0};
  std::atomic<std::uint64_t> free_objects{0};
  std::atomic<std::uint64_t> free_bytes{0};
  // --- owner only, slow path ---
  std::uint64_t rng = 0;
  std::uint64_t rate_epoch = 0;  // epoch of the rate the countdown was drawn at
  std::uintptr_t stack_lo = 0;   // [stack_lo, stack_hi): this thread's stack
  std::uintptr_t stack_hi = 0;
  // --- registry, under g_registry.lock ---
  ThreadState* next_slot = nullptr;  // every slot ever made
  ThreadState* next_free = nullptr;  // slots whose thread has exited
  bool in_use = false;
};

// Never written: its countdown of 0 sends every allocation to the slow path.
inline ThreadState g_empty_thread_state;

inline thread_local ThreadState* tls_thread_state HEAPPROF_TLS_MODEL = &g_empty_thread_state;

// Read only on slow paths.
struct ThreadFlags {
  std::uint32_t guard = 0;  // > 0 while the profiler itself runs on this thread
  bool suppress = false;    // heapprof::allocator is calling its upstream
  bool exiting = false;     // our key destructor ran: do not register again
};
inline thread_local ThreadFlags tls_thread_flags HEAPPROF_TLS_MODEL;

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
    return slot;
  }

  // Folds the slot's counters into the retired totals and frees the slot.
  void Release(ThreadState* slot) noexcept {
    LockGuard hold(lock_);
    Fold(*slot, retired_);
    slot->alloc_objects.store(0, std::memory_order_relaxed);
    slot->alloc_bytes.store(0, std::memory_order_relaxed);
    slot->free_objects.store(0, std::memory_order_relaxed);
    slot->free_bytes.store(0, std::memory_order_relaxed);
    slot->countdown.store(0, std::memory_order_relaxed);
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
      if (s->in_use) s->countdown.store(0, std::memory_order_relaxed);
    }
  }

  SpinLock& lock() noexcept { return lock_; }  // for fork handlers

 private:
  static void Fold(const ThreadState& s, Totals& t) noexcept {
    t.alloc_objects += s.alloc_objects.load(std::memory_order_relaxed);
    t.alloc_bytes += s.alloc_bytes.load(std::memory_order_relaxed);
    t.free_objects += s.free_objects.load(std::memory_order_relaxed);
    t.free_bytes += s.free_bytes.load(std::memory_order_relaxed);
  }

  SpinLock lock_;
  ThreadState* all_ = nullptr;
  ThreadState* free_ = nullptr;
  Totals retired_;
  std::atomic<std::uint64_t> orphan_alloc_objects_{0}, orphan_alloc_bytes_{0};
  std::atomic<std::uint64_t> orphan_free_objects_{0}, orphan_free_bytes_{0};
};

inline ThreadRegistry g_registry;

// Relaxed load+store increment: the owner is the only writer.
HEAPPROF_ALWAYS_INLINE void BumpCounter(std::atomic<std::uint64_t>& c, std::uint64_t by) noexcept {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace heapprof
