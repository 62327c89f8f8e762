// heapprof: the profiler's own memory.
// Invariant 1 of DESIGN.md: nothing the engine does from inside an allocation
// hook may call malloc or operator new. Everything it keeps (thread slots,
// stacks, buckets, the live map, label sets) comes from here: mmap'ed chunks,
// carved into power-of-two blocks with one free list per size class.
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
    if (size > kLargest) return MapLarge(size);
    const int cls = ClassOf(size);
    const std::size_t block = kMinBlock << cls;
    LockGuard hold(lock_);
    if (FreeBlock* b = free_[cls]) {
      free_[cls] = b->next;
      std::memset(static_cast<void*>(b), 0, block);
      return b;
    }
    std::uintptr_t at = (bump_ + block - 1) & ~(std::uintptr_t{block} - 1);
    if (bump_ == 0 || at + block > bump_end_) {
      void* chunk = MapPages(kChunk);
      if (chunk == nullptr) return nullptr;
      bump_ = reinterpret_cast<std::uintptr_t>(chunk);
      bump_end_ = bump_ + kChunk;
      at = bump_;  // chunks are page aligned, so every class up to kLargest fits
    }
    bump_ = at + block;
    return reinterpret_cast<void*>(at);  // fresh mmap pages are already zero
  }

  // `size` must be the size passed to Allocate.
  void Free(void* p, std::size_t size) noexcept {
    if (p == nullptr) return;
    if (size > kLargest) {
      const std::size_t len = RoundToPage(size);
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

 private:
  struct FreeBlock {
    FreeBlock* next;
  };

  static int ClassOf(std::size_t size) noexcept {
    if (size <= kMinBlock) return 0;
    return 64 - __builtin_clzll(static_cast<unsigned long long>(size - 1)) - 4;
  }
  static std::size_t RoundToPage(std::size_t n) noexcept { return (n + 4095) & ~std::size_t{4095}; }

  void* MapPages(std::size_t len) noexcept {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    mapped_.fetch_add(len, std::memory_order_relaxed);
    return p;
  }
  void* MapLarge(std::size_t size) noexcept { return MapPages(RoundToPage(size)); }

  SpinLock lock_;
  std::uintptr_t bump_ = 0;
  std::uintptr_t bump_end_ = 0;
  FreeBlock* free_[kClasses] = {};
  std::atomic<std::size_t> mapped_{0};
};

// Constant-initialised (invariant 2): usable from the first operator new.
inline Arena g_arena;

}  // namespace detail
}  // namespace heapprof
