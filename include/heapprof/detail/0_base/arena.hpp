// heapprof: the profiler's own memory.
// Invariant 1 of DESIGN.md: nothing the engine does from inside an allocation
// hook may call malloc or operator new. Everything it keeps (thread slots,
// stacks, buckets, the live map, label sets) comes from here: mmap'ed chunks,
// carved into page-sized runs of power-of-two blocks, one free list per size
// class.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sys/mman.h>

#include "heapprof/detail/0_base/spinlock.hpp"

namespace heapprof {
namespace detail {

class Arena {
 public:
  static constexpr std::size_t kMinBlock = 16;                // one class per power of two from here
  static constexpr std::size_t kChunk = std::size_t{1} << 20;  // carved by bump allocation
  static constexpr std::size_t kLargest = kChunk / 4;          // above: a mapping of its own
  static constexpr int kClasses = 15;                          // 16 B .. 256 KiB

  constexpr Arena() noexcept = default;

  // Zeroed memory aligned to min(size class, 4096), or nullptr if the OS said no.
  void* Allocate(std::size_t size) noexcept {
    void* p = AllocateUninitialized(size);
    if (p != nullptr && size <= kLargest) std::memset(p, 0, kMinBlock << ClassOf(size));  // mmap'ed: zero
    return p;
  }

  // The same without the zeroing (for containers, which construct what they use).
  void* AllocateUninitialized(std::size_t size) noexcept {
    if (size > kLargest) return MapLarge(size);
    const int cls = ClassOf(size);
    LockGuard hold(lock_);
    if (free_[cls] == nullptr && !RefillLocked(cls)) return nullptr;
    FreeBlock* b = free_[cls];
    free_[cls] = b->next;
    return b;
  }

  // `size` must be the size passed to Allocate.
  void Free(void* p, std::size_t size) noexcept {
    if (p == nullptr) return;
    if (size > kLargest) {
      const std::size_t len = RoundToPage(size);
      {
        LockGuard hold(lock_);
        ForgetRangeLocked(reinterpret_cast<std::uintptr_t>(p));
      }
      munmap(p, len);
      mapped_.fetch_sub(len, std::memory_order_relaxed);
      return;
    }
    const int cls = ClassOf(size);
    LockGuard hold(lock_);
    FreeBlock* b = static_cast<FreeBlock*>(p);
    b->next = free_[cls];
    free_[cls] = b;
  }

  // Bytes mapped from the OS for the profiler's own use.
  std::size_t MappedBytes() const noexcept { return mapped_.load(std::memory_order_relaxed); }

  SpinLock& lock() noexcept { return lock_; }  // for fork handlers

  // Headroom: memory mapped ahead of a piece of work that cannot recover from
  // running out of memory half way (a profile write built without exceptions:
  // 5_encoding/write_headroom.hpp). While a region is held, new chunks and
  // large blocks are carved from it before the OS is asked. Returns the
  // region's slot (of kMaxHeadroom), or -1 when the OS refused the mapping or
  // every slot is taken.
  int AddHeadroom(std::size_t bytes) noexcept {
    const std::size_t len = RoundToPage(bytes);
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    {
      LockGuard hold(lock_);
      for (int i = 0; i < kMaxHeadroom; ++i) {
        if (headroom_[i].end != 0) continue;
        headroom_[i].next = reinterpret_cast<std::uintptr_t>(p);
        headroom_[i].end = headroom_[i].next + len;
        return i;
      }
    }
    munmap(p, len);
    return -1;
  }
  // Gives back what was not carved from the region.
  void DropHeadroom(int slot) noexcept {
    if (slot < 0 || slot >= kMaxHeadroom) return;
    Region r;
    {
      LockGuard hold(lock_);
      r = headroom_[slot];
      headroom_[slot] = Region{};
    }
    if (r.next < r.end) munmap(reinterpret_cast<void*>(r.next), r.end - r.next);
  }
  // In a forked child: the regions of the parent's writes, whose threads are
  // not in the child, are given back and their slots freed.
  void DropHeadroomInChild() noexcept {
    for (int i = 0; i < kMaxHeadroom; ++i) DropHeadroom(i);
  }
  // Slots in use (for the tests).
  int HeadroomHeld() noexcept {
    LockGuard hold(lock_);
    int n = 0;
    for (const Region& r : headroom_) n += r.end != 0 ? 1 : 0;
    return n;
  }
  // Bytes ever taken for chunks and large blocks (from the OS or headroom):
  // the growth of a piece of work is the difference across it.
  std::size_t DrawnBytes() const noexcept { return drawn_.load(std::memory_order_relaxed); }

  // The arena's mappings, so that the retention scan (6_serving/retention.hpp)
  // can leave the profiler's own memory out of "heap memory": it holds the
  // live map, whose keys point at every sampled object. Copies at most `max`
  // [start, end) pairs; returns how many there are, or -1 when some mapping
  // was not recorded (more than kMaxRanges at once).
  static constexpr std::size_t kMaxRanges = 4096;
  static constexpr int kMaxHeadroom = 8;
  static constexpr std::size_t kMaxCopiedRanges = kMaxRanges + kMaxHeadroom;
  // The headroom regions held at the time (their uncarved parts) come after
  // them: they are the profiler's too. At most kMaxCopiedRanges in all.
  long CopyRanges(std::uintptr_t (*out)[2], std::size_t max) noexcept {
    LockGuard hold(lock_);
    if (ranges_overflow_) return -1;
    std::size_t n = 0;
    for (std::size_t i = 0; i < ranges_count_; ++i, ++n) {
      if (n < max) {
        out[n][0] = ranges_[i][0];
        out[n][1] = ranges_[i][1];
      }
    }
    for (const Region& r : headroom_) {
      if (r.next >= r.end) continue;
      if (n < max) {
        out[n][0] = r.next;
        out[n][1] = r.end;
      }
      ++n;
    }
    return static_cast<long>(n);
  }

 private:
  struct FreeBlock {
    FreeBlock* next;
  };

  // A run of blocks of one class onto its free list: a page (or one block
  // when larger) from the current chunk. Runs are whole pages, so the bump
  // pointer stays page aligned and blocks of different classes never leave
  // alignment gaps between them (interleaved 2 KiB stack records and 64 B
  // buckets used to take 4 KiB per stack).
  bool RefillLocked(int cls) noexcept {
    const std::size_t block = kMinBlock << cls;
    const std::size_t run = block < 4096 ? 4096 : block;
    if (bump_ == 0 || bump_ + run > bump_end_) {
      void* chunk = TakeHeadroomLocked(kChunk);
      if (chunk == nullptr) chunk = MapPages(kChunk);
      if (chunk == nullptr) return false;
      RememberRangeLocked(reinterpret_cast<std::uintptr_t>(chunk), kChunk);
      RecycleLocked(bump_, bump_end_);  // the old chunk's tail
      bump_ = reinterpret_cast<std::uintptr_t>(chunk);
      bump_end_ = bump_ + kChunk;
    }
    for (std::size_t off = run; off >= block;) {  // lowest address popped first
      off -= block;
      auto* b = reinterpret_cast<FreeBlock*>(bump_ + off);
      b->next = free_[cls];
      free_[cls] = b;
    }
    bump_ += run;
    return true;
  }

  // Puts the never-used bytes [from, to) (page aligned) on the free lists, as
  // the largest naturally aligned power-of-two blocks that fit.
  void RecycleLocked(std::uintptr_t from, std::uintptr_t to) noexcept {
    while (from != 0 && to - from >= kMinBlock) {
      std::size_t block = kMinBlock;
      int cls = 0;
      while (cls + 1 < kClasses && (from & ((block << 1) - 1)) == 0 && from + (block << 1) <= to) {
        block <<= 1;
        ++cls;
      }
      auto* b = reinterpret_cast<FreeBlock*>(from);
      b->next = free_[cls];
      free_[cls] = b;
      from += block;
    }
  }

  static int ClassOf(std::size_t size) noexcept {
    if (size <= kMinBlock) return 0;
    return 64 - __builtin_clzll(static_cast<unsigned long long>(size - 1)) - 4;
  }
  static std::size_t RoundToPage(std::size_t n) noexcept { return (n + 4095) & ~std::size_t{4095}; }

  void* MapPages(std::size_t len) noexcept {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    mapped_.fetch_add(len, std::memory_order_relaxed);
    drawn_.fetch_add(len, std::memory_order_relaxed);
    return p;
  }
  // Under lock_ (the fork handlers hold it, so a child never inherits it taken).
  void RememberRangeLocked(std::uintptr_t start, std::size_t len) noexcept {
    if (ranges_count_ == kMaxRanges) {
      ranges_overflow_ = true;
      return;
    }
    ranges_[ranges_count_][0] = start;
    ranges_[ranges_count_][1] = start + len;
    ++ranges_count_;
  }
  void ForgetRangeLocked(std::uintptr_t start) noexcept {
    for (std::size_t i = 0; i < ranges_count_; ++i) {
      if (ranges_[i][0] != start) continue;
      ranges_[i][0] = ranges_[ranges_count_ - 1][0];
      ranges_[i][1] = ranges_[ranges_count_ - 1][1];
      --ranges_count_;
      return;
    }
  }
  void* MapLarge(std::size_t size) noexcept {
    const std::size_t len = RoundToPage(size);
    {
      LockGuard hold(lock_);
      if (void* p = TakeHeadroomLocked(len)) {
        RememberRangeLocked(reinterpret_cast<std::uintptr_t>(p), len);
        return p;
      }
    }
    void* p = MapPages(len);
    if (p != nullptr) {
      LockGuard hold(lock_);
      RememberRangeLocked(reinterpret_cast<std::uintptr_t>(p), len);
    }
    return p;
  }
  // A chunk or a large block carved from a headroom region, if one has room.
  // The carved pages are then the arena's like any mapping: a large block's
  // Free unmaps them.
  void* TakeHeadroomLocked(std::size_t len) noexcept {
    for (Region& r : headroom_) {
      if (r.end - r.next < len) continue;
      void* p = reinterpret_cast<void*>(r.next);
      r.next += len;
      mapped_.fetch_add(len, std::memory_order_relaxed);
      drawn_.fetch_add(len, std::memory_order_relaxed);
      return p;
    }
    return nullptr;
  }

  struct Region {
    std::uintptr_t next = 0;  // [next, end): mapped, not carved yet
    std::uintptr_t end = 0;
  };

  SpinLock lock_;
  Region headroom_[kMaxHeadroom] = {};
  std::atomic<std::size_t> drawn_{0};
  std::uintptr_t bump_ = 0;
  std::uintptr_t bump_end_ = 0;
  FreeBlock* free_[kClasses] = {};
  std::atomic<std::size_t> mapped_{0};
  std::uintptr_t ranges_[kMaxRanges][2] = {};
  std::size_t ranges_count_ = 0;
  bool ranges_overflow_ = false;  // a mapping went unrecorded: the table was full
};

// Constant-initialised (invariant 2): usable from the first operator new.
inline Arena g_arena;

}  // namespace detail
}  // namespace heapprof
