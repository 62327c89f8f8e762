// heapprof: sampled objects that are still live, found again on free.
//
// Two parts:
//  - the free filter (1_hooks/fast_path.hpp): 2^16 counters indexed by a hash of the pointer; a counter
//    is the number of live sampled objects hashing there, and a bitmap
//    (8 KiB) says which are not 0. An unsampled free reads one bit, sees 0
//    and is done (one load, a shift and a branch). Counters
//    change only under the owning shard's lock; one that reaches 0xFFFF sticks
//    there (it only costs lookups, never a missed free).
//  - the map: pointer -> bucket, split into shards by the same hash so threads
//    freeing different objects rarely meet on a lock. Open addressing with
//    backward-shift deletion: no tombstones, so a long-running process never
//    degrades.
//
// Exactness: on_free runs before the memory goes back to malloc, so an address
// is always removed before malloc can hand it out (and sample it) again.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/2_sampling/buckets.hpp"
#include "heapprof/detail/2_sampling/peak.hpp"
#include "heapprof/detail/0_base/spinlock.hpp"
#include "heapprof/detail/1_hooks/fast_path.hpp"

namespace heapprof {
namespace detail {

constexpr int kLiveShardBits = 6;

// ---------------------------------------------------------------- re-entry
// A signal handler may free a sampled object while its thread is inside
// Insert or Remove, holding the very shard lock that free needs: waiting
// would be waiting on itself, forever. So each thread marks the shard it is
// about to lock (before taking the lock, cleared after releasing it), and a
// free that finds its shard marked by its own thread is deferred: the block
// is not released (the hook, or heapprof::allocator, skips its release) and
// is queued here; the interrupted operation, once out of the lock, removes it
// from the map, counts it and releases it (engine.hpp: DrainDeferredFrees).
// Nothing is lost and no address can be reused while its entry is still in
// the map.
struct DeferredFree {
  void* p;
  std::size_t n;
  ReleaseFn release;  // heapprof::allocator's upstream; null: the global hooks' real free
  unsigned how;       // kFreeSized / kFreeCanDefer, as given to OnFreeSlow
};
// Nested frees of sampled objects per interrupted operation; more go on the
// overflow lists below. 16, not 32: this state is static TLS (initial-exec),
// and a library with heapprof compiled in that is dlopen'ed must fit in what
// glibc leaves for such objects (about 1.6 KiB in all with glibc 2.36's
// defaults). At 32, the hooks plugin test's library needed 1,680 bytes and
// its dlopen failed ("cannot allocate memory in static TLS block").
constexpr int kMaxDeferredFrees = 16;

struct LiveMapThreadState {
  const void* held_shard = nullptr;  // the shard this thread locks or holds
  // Slot states: 0 free, 2 being written, 1 full. Claimed with a CAS, so a
  // handler interrupting a handler cannot take the same slot.
  std::uint8_t state[kMaxDeferredFrees] = {};
  DeferredFree frees[kMaxDeferredFrees] = {};
  // Full slots: counted up by a push after its slot is full, down by a pop, so
  // the drain after every sample and slow free is one load when none is
  // queued (scanning 32 states was ~230 instructions, twice per pair at
  // rate 1). Same-thread only (a handler and the code it interrupted): an
  // atomic add, never a lock-prefixed shared line.
  std::uint32_t queued = 0;
  // Frees beyond the slots (a signal storm: handler after handler while the
  // thread stays inside one operation; 32 slots overflowed in the hostile
  // test): lists threaded through the blocks themselves, which are ours
  // until drained (PushOverflowFree, PushSizedOverflowFree). Counted in
  // `queued` too.
  void* overflow = nullptr;        // the global hooks' blocks
  void* overflow_sized = nullptr;  // heapprof::allocator's (SizedOverflowNode)
  bool draining = false;
};
inline thread_local LiveMapThreadState tls_live_map HEAPPROF_TLS_MODEL;

// Queues a deferred free; false when every slot is taken.
inline bool PushDeferredFree(void* p, std::size_t n, unsigned how, ReleaseFn release) noexcept {
  LiveMapThreadState& t = tls_live_map;
  for (int i = 0; i < kMaxDeferredFrees; ++i) {
    std::uint8_t expected = 0;
    if (__atomic_compare_exchange_n(&t.state[i], &expected, std::uint8_t{2}, false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
      t.frees[i] = DeferredFree{p, n, release, how};
      __atomic_signal_fence(__ATOMIC_SEQ_CST);
      __atomic_store_n(&t.state[i], std::uint8_t{1}, __ATOMIC_RELAXED);
      __atomic_fetch_add(&t.queued, 1u, __ATOMIC_RELAXED);
      return true;
    }
  }
  return false;
}

// Queues a deferred free of a global hook's block when every slot is taken:
// its first word links it to the list (the block is not released until the
// drain, and nothing else reads it; its size is asked again then). For
// blocks of at least a pointer's size.
inline void PushOverflowFree(void* p) noexcept {
  LiveMapThreadState& t = tls_live_map;
  void* head = __atomic_load_n(&t.overflow, __ATOMIC_RELAXED);
  std::memcpy(p, &head, sizeof head);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&t.overflow, p, __ATOMIC_RELAXED);
  __atomic_fetch_add(&t.queued, 1u, __ATOMIC_RELAXED);
}

// The same for a heapprof::allocator block (at least a node's size), which
// its upstream releases: the node, at the block's start, keeps what the slot
// would (the requested size, the release). Read back with memcpy: such a
// block need not be aligned for pointers.
struct SizedOverflowNode {
  void* next;
  std::size_t n;
  ReleaseFn release;
};
inline void PushSizedOverflowFree(void* p, std::size_t n, ReleaseFn release) noexcept {
  LiveMapThreadState& t = tls_live_map;
  const SizedOverflowNode node{__atomic_load_n(&t.overflow_sized, __ATOMIC_RELAXED), n, release};
  std::memcpy(p, &node, sizeof node);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&t.overflow_sized, p, __ATOMIC_RELAXED);
  __atomic_fetch_add(&t.queued, 1u, __ATOMIC_RELAXED);
}

// Takes a whole overflow list (one exchange: a handler pushing meanwhile
// starts a new list); the caller counts `queued` down per block.
inline void* TakeOverflowFrees(void*& list) noexcept { return __atomic_exchange_n(&list, nullptr, __ATOMIC_RELAXED); }

// Takes one queued free; false when none is queued.
inline bool PopDeferredFree(DeferredFree& out) noexcept {
  LiveMapThreadState& t = tls_live_map;
  if (__atomic_load_n(&t.queued, __ATOMIC_RELAXED) == 0) return false;
  for (int i = 0; i < kMaxDeferredFrees; ++i) {
    if (__atomic_load_n(&t.state[i], __ATOMIC_RELAXED) != 1) continue;
    out = t.frees[i];
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&t.state[i], std::uint8_t{0}, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&t.queued, 1u, __ATOMIC_RELAXED);
    return true;
  }
  return false;
}

// For the tests only: every Insert fails as when the map cannot grow (the
// arena out of memory), which no test can arrange reliably otherwise.
inline bool g_live_map_refuses_for_tests = false;

class LiveMap {
 public:
  constexpr LiveMap() noexcept = default;

  // Remembers a sampled object. An address still present means its free was
  // never seen (memory released behind our back, e.g. by free()): the old entry
  // is retired as freed and replaced. False when out of memory (sample dropped).
  // `of_allocator`: a heapprof::allocator's object, else a global hook's
  // block. Both can be live at one address (an upstream handing out the start
  // of a block the program got from new, as a pool carving its chunk does):
  // each kind has its own entry, which only a free of that kind removes.
  // Otherwise the allocator's free took the padded block's entry, and that
  // block's sized delete then skipped the cold path (block_hooks.hpp:
  // HotFreeSized): its request's class counted, and freed into by sdallocx.
  bool Insert(const void* p, Bucket* bucket, bool of_allocator) noexcept {
    if (HEAPPROF_UNLIKELY(__atomic_load_n(&g_live_map_refuses_for_tests, __ATOMIC_RELAXED))) return false;
    Shard& s = ShardOf(p);
    ShardHold hold(s);
    const auto key = reinterpret_cast<std::uintptr_t>(p);
    if ((s.size + 1) * 4 > s.Capacity() * 3 && !s.Grow()) return false;
    std::size_t i = s.Home(key);
    for (;; i = (i + 1) & s.mask) {
      Entry& e = s.entries[i];
      if (e.key == 0) break;
      if (e.key == key && e.of_allocator() == of_allocator) {
        CountSampledFree(e.bucket());
        if (e.bucket() == &g_dropped_sample_bucket) s.AddLive(1);
        e = Entry::Of(key, bucket, of_allocator);
        if (bucket == &g_dropped_sample_bucket) s.AddLive(-1);
        return true;
      }
    }
    s.entries[i] = Entry::Of(key, bucket, of_allocator);
    ++s.size;
    // (A dropped sample's object is not one the profile tracks: Stats::sampled_live_objects.)
    if (bucket != &g_dropped_sample_bucket) s.AddLive(1);
    FilterAdd(p, +1);
    return true;
  }

  // The bucket of a sampled object being freed (removed from the map), or
  // nullptr if `p` was not sampled (as an object of that kind: see Insert).
  Bucket* Remove(const void* p, bool of_allocator) noexcept {
    Shard& s = ShardOf(p);
    ShardHold hold(s);
    if (s.entries == nullptr) return nullptr;
    const auto key = reinterpret_cast<std::uintptr_t>(p);
    std::size_t i = s.Home(key);
    for (;; i = (i + 1) & s.mask) {
      if (s.entries[i].key == 0) return nullptr;
      if (s.entries[i].key == key && s.entries[i].of_allocator() == of_allocator) break;
    }
    Bucket* bucket = s.entries[i].bucket();
    // Backward-shift: pull later members of the probe run into the hole.
    for (std::size_t hole = i, j = (i + 1) & s.mask;; j = (j + 1) & s.mask) {
      const Entry e = s.entries[j];
      if (e.key == 0) {
        s.entries[hole] = Entry{};
        break;
      }
      const std::size_t home = s.Home(e.key);
      // Move e if its home is not cyclically within (hole, j].
      if (((j - home) & s.mask) >= ((j - hole) & s.mask)) {
        s.entries[hole] = e;
        hole = j;
      }
    }
    --s.size;
    if (bucket != &g_dropped_sample_bucket) s.AddLive(-1);
    FilterAdd(p, -1);
    return bucket;
  }

  // True when this thread is inside Insert or Remove on `p`'s shard: only a
  // signal handler interrupting it can ask.
  bool HeldByThisThread(const void* p) noexcept { return tls_live_map.held_shard == &ShardOf(p); }

  // The shards' counts, each read without its lock (a sum of moments).
  std::uint64_t LiveCount() const noexcept {
    std::uint64_t total = 0;
    for (const Shard& s : shards_) total += s.live.load(std::memory_order_relaxed);
    return total;
  }

  std::size_t MemoryBytes() noexcept {
    std::size_t total = 0;
    for (Shard& s : shards_) {
      LockGuard hold(s.lock);
      total += s.Capacity() * sizeof(Entry);
    }
    return total;
  }

  // f(pointer, bucket) for every entry, one shard at a time under its lock
  // (the retention scan's snapshot). f must not allocate or free.
  template <class F>
  void ForEach(F&& f) noexcept {
    for (Shard& s : shards_) {
      ShardHold hold(s);
      for (std::size_t i = 0; i < s.Capacity(); ++i) {
        if (s.entries[i].key != 0) f(s.entries[i].key, s.entries[i].bucket());
      }
    }
  }

  void LockAll() noexcept {
    for (Shard& s : shards_) s.lock.lock();
  }
  void UnlockAll() noexcept {
    for (Shard& s : shards_) s.lock.unlock();
  }

 private:
  struct Entry {
    std::uintptr_t key = 0;  // 0 = empty: operator new never returns null on success
    std::uintptr_t tagged = 0;  // the bucket, bit 0 set for a heapprof::allocator's object

    static Entry Of(std::uintptr_t key, Bucket* bucket, bool of_allocator) noexcept {
      return Entry{key, reinterpret_cast<std::uintptr_t>(bucket) | (of_allocator ? 1u : 0u)};
    }
    Bucket* bucket() const noexcept { return reinterpret_cast<Bucket*>(tagged & ~std::uintptr_t{1}); }
    bool of_allocator() const noexcept { return (tagged & 1) != 0; }
  };
  static_assert(alignof(Bucket) >= 2, "Entry: bit 0 of a bucket's address is the kind");

  struct alignas(64) Shard {
    SpinLock lock;
    Entry* entries = nullptr;
    std::size_t mask = 0;
    std::size_t size = 0;
    // Its entries of sampled objects (not of dropped samples'): written under
    // the lock, on the line the lock already brought in, and read without it
    // (LiveCount). One counter for the map was a shared line that every
    // sample and every sampled free wrote: with two threads recording every
    // allocation, a third of the map's time (bench_lazy_threads).
    std::atomic<std::uint64_t> live{0};
    void AddLive(int d) noexcept {
      live.store(live.load(std::memory_order_relaxed) + static_cast<std::uint64_t>(d), std::memory_order_relaxed);
    }

    std::size_t Capacity() const noexcept { return entries == nullptr ? 0 : mask + 1; }
    // Bits below the shard prefix, so a shard's keys spread over its table.
    std::size_t Home(std::uintptr_t key) const noexcept {
      return (PointerHash(reinterpret_cast<const void*>(key)) >> 8) & mask;
    }
    bool Grow() noexcept {
      const std::size_t old_cap = Capacity();
      const std::size_t new_cap = old_cap == 0 ? 64 : old_cap * 2;
      auto* fresh = static_cast<Entry*>(g_arena.Allocate(new_cap * sizeof(Entry)));
      if (fresh == nullptr) return false;
      Entry* old = entries;
      entries = fresh;
      mask = new_cap - 1;
      for (std::size_t i = 0; i < old_cap; ++i) {
        if (old[i].key == 0) continue;
        std::size_t j = Home(old[i].key);
        while (entries[j].key != 0) j = (j + 1) & mask;
        entries[j] = old[i];
      }
      g_arena.Free(old, old_cap * sizeof(Entry));
      return true;
    }
  };

  // The shard's lock, with this thread's mark set before taking it and
  // cleared after releasing it (see LiveMapThreadState).
  class ShardHold {
   public:
    // Saves and restores the previous mark: a handler's own Remove on another
    // shard runs inside the interrupted operation and must leave its mark.
    explicit ShardHold(Shard& s) noexcept : s_(s), saved_(tls_live_map.held_shard) {
      tls_live_map.held_shard = &s;
      __atomic_signal_fence(__ATOMIC_SEQ_CST);
      s.lock.lock();
    }
    ~ShardHold() {
      s_.lock.unlock();
      __atomic_signal_fence(__ATOMIC_SEQ_CST);
      tls_live_map.held_shard = saved_;
    }
    ShardHold(const ShardHold&) = delete;
    ShardHold& operator=(const ShardHold&) = delete;

   private:
    Shard& s_;
    const void* saved_;
  };

  Shard& ShardOf(const void* p) noexcept {
    // The top bits, a prefix of the filter index: all pointers sharing a filter
    // counter share a shard, so the counter only ever changes under one lock.
    return shards_[PointerHash(p) >> (64 - kLiveShardBits)];
  }

  // Under the shard lock of p: the counter, and its bit in a word whose 64
  // counters all belong to this shard (the shard is a prefix of the index).
  // The bit is set before the sampled object's address leaves the hook, and
  // cleared only when no live sampled object hashes there.
  static void FilterAdd(const void* p, int delta) noexcept {
    static_assert(kFreeFilterBits - 6 >= kLiveShardBits, "a word of filter bits must not span shards");
    const std::size_t i = FreeFilterIndex(p);
    std::uint16_t& c = g_free_filter[i];
    const std::uint16_t v = LoadRelaxed(c);
    if (v == 0xFFFF) return;  // saturated: stays "maybe sampled" for good
    const auto now = static_cast<std::uint16_t>(v + delta);
    StoreRelaxed(c, now);
    if ((v == 0) != (now == 0)) {
      std::uint64_t& word = g_free_bits[i >> 6];
      const std::uint64_t bit = std::uint64_t{1} << (i & 63);
      StoreRelaxed(word, now != 0 ? (LoadRelaxed(word) | bit) : (LoadRelaxed(word) & ~bit));
    }
  }

  Shard shards_[std::size_t{1} << kLiveShardBits];
};

inline LiveMap g_live_map;

}  // namespace detail
}  // namespace heapprof
