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

#include "heapprof/config.hpp"
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
  // see WriteHeadroom below). While a region is held, new chunks and large
  // blocks are carved from it before the OS is asked. Returns the region's
  // slot, or -1 when the OS refused the mapping (or every slot is taken).
  static constexpr int kMaxHeadroom = 8;
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
  // Bytes ever taken for chunks and large blocks (from the OS or headroom):
  // the growth of a piece of work is the difference across it.
  std::size_t DrawnBytes() const noexcept { return drawn_.load(std::memory_order_relaxed); }
  // How much the last write grew the arena (NoteWriteGrowth): what the next
  // one should expect to need. A cold first write (tables, debug info) grows
  // it most; a warm one reuses what is on the free lists.
  void NoteWriteGrowth(std::size_t bytes) noexcept {
    last_growth_.store(bytes, std::memory_order_relaxed);
    wrote_once_.store(true, std::memory_order_relaxed);
  }
  bool WroteOnce() const noexcept { return wrote_once_.load(std::memory_order_relaxed); }
  std::size_t LastWriteGrowth() const noexcept { return last_growth_.load(std::memory_order_relaxed); }

  // The arena's mappings, so that the retention scan (6_serving/retention.hpp)
  // can leave the profiler's own memory out of "heap memory": it holds the
  // live map, whose keys point at every sampled object. Copies at most `max`
  // [start, end) pairs; returns how many there are, or -1 when some mapping
  // was not recorded (more than kMaxRanges at once).
  static constexpr std::size_t kMaxRanges = 4096;
  long CopyRanges(std::uintptr_t (*out)[2], std::size_t max) noexcept {
    LockGuard hold(lock_);
    if (ranges_overflow_) return -1;
    for (std::size_t i = 0; i < ranges_count_ && i < max; ++i) {
      out[i][0] = ranges_[i][0];
      out[i][1] = ranges_[i][1];
    }
    return static_cast<long>(ranges_count_);
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
    {
      LockGuard hold(lock_);
      if (void* p = TakeHeadroomLocked(RoundToPage(size))) {
        RememberRangeLocked(reinterpret_cast<std::uintptr_t>(p), RoundToPage(size));
        return p;
      }
    }
    void* p = MapPages(RoundToPage(size));
    if (p != nullptr) {
      LockGuard hold(lock_);
      RememberRangeLocked(reinterpret_cast<std::uintptr_t>(p), RoundToPage(size));
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
  std::atomic<std::size_t> last_growth_{0};
  std::atomic<bool> wrote_once_{false};
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

// Writing a profile allocates through containers (ArenaString, ArenaVector),
// which report running out of memory with std::bad_alloc; the writers catch
// it and fail the write. Built without exceptions, nothing can catch it, and
// the process would end (std::terminate) for want of a profile. So there, a
// write first maps the memory it expects to need (twice what the last write
// grew the arena by, at least kMinWriteHeadroom; kFirstWriteHeadroom for the
// first) and fails at once, cleanly, when the OS refuses; the arena then
// carves the write's memory from that headroom, and what is left is unmapped
// at the end. A write that needs more than that still asks the OS for the
// rest. With exceptions this is a no-op: a failure half way is caught.
constexpr std::size_t kFirstWriteHeadroom = std::size_t{64} << 20;
constexpr std::size_t kMinWriteHeadroom = std::size_t{8} << 20;
constexpr std::size_t kMaxWriteHeadroom = std::size_t{1} << 30;

inline std::size_t WriteHeadroomBytes(const Arena& arena = g_arena) noexcept {
  if (!arena.WroteOnce()) return kFirstWriteHeadroom;
  const std::size_t seen = arena.LastWriteGrowth();
  const std::size_t want = seen > kMaxWriteHeadroom / 2 ? kMaxWriteHeadroom : 2 * seen;
  return want < kMinWriteHeadroom ? kMinWriteHeadroom : want;
}

// Holds a headroom region for a piece of work and records how much the arena
// grew across it. `bytes` 0: WriteHeadroomBytes().
class ArenaHeadroom {
 public:
  explicit ArenaHeadroom(Arena& arena = g_arena, std::size_t bytes = 0) noexcept
      : arena_(arena),
        drawn_at_(arena.DrawnBytes()),
        slot_(arena.AddHeadroom(bytes != 0 ? bytes : WriteHeadroomBytes(arena))) {}
  ~ArenaHeadroom() {
    arena_.DropHeadroom(slot_);
    if (slot_ >= 0) arena_.NoteWriteGrowth(arena_.DrawnBytes() - drawn_at_);
  }
  ArenaHeadroom(const ArenaHeadroom&) = delete;
  ArenaHeadroom& operator=(const ArenaHeadroom&) = delete;
  bool ok() const noexcept { return slot_ >= 0; }

 private:
  Arena& arena_;
  std::size_t drawn_at_;
  int slot_;
};

#if HEAPPROF_EXCEPTIONS
// With exceptions a write that runs out of memory half way is caught and fails.
struct WriteHeadroom {
  constexpr bool ok() const noexcept { return true; }
};
#else
// Set while this thread's outermost write holds its headroom: a write inside
// it (a dump's file, then the profile it builds) shares it.
inline thread_local bool tls_write_headroom HEAPPROF_TLS_MODEL = false;

class WriteHeadroom {
 public:
  WriteHeadroom() noexcept {
    if (tls_write_headroom) return;
    drawn_at_ = g_arena.DrawnBytes();
    slot_ = g_arena.AddHeadroom(WriteHeadroomBytes());
    if (slot_ < 0) {
      refused_ = true;
      return;
    }
    tls_write_headroom = true;
  }
  ~WriteHeadroom() {
    if (slot_ < 0) return;
    g_arena.DropHeadroom(slot_);
    g_arena.NoteWriteGrowth(g_arena.DrawnBytes() - drawn_at_);
    tls_write_headroom = false;
  }
  WriteHeadroom(const WriteHeadroom&) = delete;
  WriteHeadroom& operator=(const WriteHeadroom&) = delete;
  bool ok() const noexcept { return !refused_; }

 private:
  std::size_t drawn_at_ = 0;
  int slot_ = -1;
  bool refused_ = false;
};
#endif

}  // namespace detail
}  // namespace heapprof
