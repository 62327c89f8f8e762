// heapprof: an open-addressing set of arena records, keyed by a stored hash.
// Shared by the stack table and the bucket table; callers hold their lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heapprof/detail/0_base/arena.hpp"

namespace heapprof {
namespace detail {

// Record must have a `std::uint64_t hash` member. Records are never removed:
// like Go's buckets they live as long as the process.
template <class Record>
class InternTable {
 public:
  constexpr InternTable() noexcept = default;

  // The record equal to the probe (same hash and `equal(record)`), or nullptr.
  template <class Equal>
  Record* Find(std::uint64_t hash, Equal&& equal) const noexcept {
    if (slots_ == nullptr) return nullptr;
    const std::uintptr_t tag = TagOf(hash);
    for (std::size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const std::uintptr_t w = slots_[i];
      if (w == 0) return nullptr;
      if ((w & kTagMask) != tag) continue;  // another record: not read
      Record* r = reinterpret_cast<Record*>(w & ~kTagMask);
      if (r->hash == hash && equal(*r)) return r;
    }
  }

  // Starts loading what a Find(hash) will read first: the hash's slot and,
  // if its tag matches, the record in it (the likely match). Lets the lookups
  // of one sample (its stack's, its bucket's) wait for memory at the same time.
  void Prefetch(std::uint64_t hash) const noexcept {
    if (slots_ == nullptr) return;
    const std::uintptr_t w = slots_[hash & mask_];
    if (w != 0 && (w & kTagMask) == TagOf(hash)) __builtin_prefetch(reinterpret_cast<const void*>(w & ~kTagMask));
  }

  // Adds a record known to be absent (16-byte aligned, as arena blocks are).
  // False if the table could not grow.
  bool Insert(Record* record) noexcept {
    if ((reinterpret_cast<std::uintptr_t>(record) & kTagMask) != 0) return false;  // cannot happen
    if ((size_ + 1) * 2 > capacity() && !Grow()) return false;
    Place(slots_, mask_, reinterpret_cast<std::uintptr_t>(record) | TagOf(record->hash), record->hash);
    ++size_;
    return true;
  }

  std::size_t size() const noexcept { return size_; }
  std::size_t MemoryBytes() const noexcept { return capacity() * sizeof(std::uintptr_t); }

 private:
  // A slot is the record's address with 4 bits of its hash in the low bits
  // (records are 16-byte aligned): a probe that passes a slot of another
  // record reads that record only when the 4 bits agree (1 in 16), not
  // every time. The bits are the hash's top ones; the slot index uses the
  // low ones. On tables larger than the caches, each record read is a miss.
  static constexpr std::uintptr_t kTagMask = 15;
  static std::uintptr_t TagOf(std::uint64_t hash) noexcept { return hash >> 60; }

  std::size_t capacity() const noexcept { return slots_ == nullptr ? 0 : mask_ + 1; }

  static void Place(std::uintptr_t* slots, std::size_t mask, std::uintptr_t word, std::uint64_t hash) noexcept {
    std::size_t i = hash & mask;
    while (slots[i] != 0) i = (i + 1) & mask;
    slots[i] = word;
  }

  bool Grow() noexcept {
    const std::size_t new_cap = capacity() == 0 ? 256 : capacity() * 2;
    auto* fresh = static_cast<std::uintptr_t*>(g_arena.Allocate(new_cap * sizeof(std::uintptr_t)));
    if (fresh == nullptr) return false;
    for (std::size_t i = 0; i < capacity(); ++i) {
      const std::uintptr_t w = slots_[i];
      if (w != 0) Place(fresh, new_cap - 1, w, reinterpret_cast<const Record*>(w & ~kTagMask)->hash);
    }
    g_arena.Free(slots_, capacity() * sizeof(std::uintptr_t));
    slots_ = fresh;
    mask_ = new_cap - 1;
    return true;
  }

  std::uintptr_t* slots_ = nullptr;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace detail
}  // namespace heapprof
