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
    for (std::size_t i = hash & mask_;; i = (i + 1) & mask_) {
      Record* r = slots_[i];
      if (r == nullptr) return nullptr;
      if (r->hash == hash && equal(*r)) return r;
    }
  }

  // Starts loading what a Find(hash) will read first: the hash's slot and
  // the record in it (the likely match). Lets the lookups of one sample (its
  // stack's, its bucket's) wait for memory at the same time.
  void Prefetch(std::uint64_t hash) const noexcept {
    if (slots_ == nullptr) return;
    Record* const* slot = slots_ + (hash & mask_);
    if (Record* r = *slot) __builtin_prefetch(r);
  }

  // Adds a record known to be absent. False if the table could not grow.
  bool Insert(Record* record) noexcept {
    if ((size_ + 1) * 2 > capacity() && !Grow()) return false;
    Place(slots_, mask_, record);
    ++size_;
    return true;
  }

  std::size_t size() const noexcept { return size_; }
  std::size_t MemoryBytes() const noexcept { return capacity() * sizeof(Record*); }

 private:
  std::size_t capacity() const noexcept { return slots_ == nullptr ? 0 : mask_ + 1; }

  static void Place(Record** slots, std::size_t mask, Record* record) noexcept {
    std::size_t i = record->hash & mask;
    while (slots[i] != nullptr) i = (i + 1) & mask;
    slots[i] = record;
  }

  bool Grow() noexcept {
    const std::size_t new_cap = capacity() == 0 ? 256 : capacity() * 2;
    auto** fresh = static_cast<Record**>(g_arena.Allocate(new_cap * sizeof(Record*)));
    if (fresh == nullptr) return false;
    for (std::size_t i = 0; i < capacity(); ++i) {
      if (slots_[i] != nullptr) Place(fresh, new_cap - 1, slots_[i]);
    }
    g_arena.Free(slots_, capacity() * sizeof(Record*));
    slots_ = fresh;
    mask_ = new_cap - 1;
    return true;
  }

  Record** slots_ = nullptr;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace detail
}  // namespace heapprof
