// The intern table behind the stack, bucket and label-set tables: slots hold
// a record's address with 4 bits of its hash, so these tests pick hashes that
// share slots, tags or both.
#include <heapprof.hpp>
#include "heapprof/detail/0_base/intern_table.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

namespace {

struct Rec {
  std::uint64_t hash;
  int id;
};

Rec* Make(std::uint64_t hash, int id) {
  void* mem = heapprof::detail::g_arena.Allocate(sizeof(Rec));
  REQUIRE(mem != nullptr);
  REQUIRE(reinterpret_cast<std::uintptr_t>(mem) % 16 == 0);
  return new (mem) Rec{hash, id};
}

Rec* FindId(const heapprof::detail::InternTable<Rec>& t, std::uint64_t hash, int id) {
  return t.Find(hash, [id](const Rec& r) { return r.id == id; });
}

}  // namespace

TEST_CASE("intern table: records that share a slot, a tag, or both are each found; absent ones are not") {
  heapprof::detail::InternTable<Rec> t;
  CHECK(FindId(t, 1, 1) == nullptr);  // no slots yet
  t.Prefetch(1);                       // nor does prefetching read any
  std::vector<Rec*> recs;
  std::vector<std::uint64_t> hashes;
  int id = 0;
  // Same low bits (one slot, probed in a row), top 4 bits (the tag) equal
  // or different; the same full hash twice (told apart by `equal` only).
  for (std::uint64_t top = 0; top < 16; ++top) {
    for (std::uint64_t mid = 0; mid < 3; ++mid) {
      hashes.push_back((top << 60) | (mid << 32) | 0x5);
    }
  }
  hashes.push_back(hashes.front());
  for (std::uint64_t h : hashes) {
    Rec* r = Make(h, id++);
    REQUIRE(t.Insert(r));
    recs.push_back(r);
  }
  // Then enough more to grow the table several times (256 slots at first).
  for (int i = 0; i < 3000; ++i) {
    const std::uint64_t h = (static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t{7} << 60);
    Rec* r = Make(h, id++);
    REQUIRE(t.Insert(r));
    recs.push_back(r);
  }
  CHECK(t.size() == recs.size());
  std::size_t found = 0;
  for (Rec* r : recs) {
    t.Prefetch(r->hash);
    found += FindId(t, r->hash, r->id) == r ? 1 : 0;
  }
  CHECK(found == recs.size());
  // Present hash, absent record; absent hash with a present record's slot
  // and tag; absent hash with a present slot and another tag.
  CHECK(FindId(t, recs[0]->hash, -1) == nullptr);
  CHECK(FindId(t, (std::uint64_t{3} << 60) | (std::uint64_t{9} << 32) | 0x5, 3) == nullptr);
  CHECK(FindId(t, (std::uint64_t{3} << 60) | 0x6, 3) == nullptr);
  CHECK(t.MemoryBytes() >= 2 * recs.size() * sizeof(std::uintptr_t));
}
