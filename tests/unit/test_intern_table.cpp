// The intern table behind the stack, bucket and label-set tables: slots hold
// a record's address with 4 bits of its hash, so these tests pick hashes that
// share slots, tags or both.
#include <heapprof.hpp>
#include "heapprof/detail/0_base/hash.hpp"
#include "heapprof/detail/0_base/intern_table.hpp"
#include "heapprof/detail/2_sampling/buckets.hpp"

#include <doctest/doctest.h>

#include <algorithm>
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

// HashWords, the stack tables' hash: the tables take a slot from
// the low bits and a tag from the top 4, so both must spread for stacks that
// differ in one PC at any depth and position; a PC moved to another position
// (another lane, or the same lane further on) must change the hash, and so
// must the depth.
namespace {
// Chi-squared per degree of freedom of `total` samples over `bins`: 1 for
// uniform bins, with sigma sqrt(2 / (bins - 1)).
double Chi2PerDof(const std::vector<int>& bins, std::size_t total) {
  const double mean = static_cast<double>(total) / static_cast<double>(bins.size());
  double chi = 0;
  for (int c : bins) chi += (c - mean) * (c - mean) / mean;
  return chi / static_cast<double>(bins.size() - 1);
}
}  // namespace

TEST_CASE("stack hash: one PC changed at any position spreads the slot and tag bits; moved PCs and depth count") {
  using heapprof::detail::HashWords;
  std::uintptr_t w[40];
  auto reset = [&w] {
    for (int k = 0; k < 40; ++k) w[k] = 0x55550000u + static_cast<std::uintptr_t>(k) * 0x40;
  };
  constexpr int kSlots = 4096;
  std::vector<int> slots(kSlots), tags(16);
  int total = 0;
  for (int depth : {1, 2, 3, 4, 5, 7, 8, 24, 32, 33, 40}) {
    for (int pos = 0; pos < depth; ++pos) {
      for (int v = 1; v <= 1000; ++v) {
        reset();
        w[pos] += static_cast<std::uintptr_t>(v) * 16;  // return addresses 16 bytes apart
        const std::uint64_t h = HashWords(w, static_cast<std::size_t>(depth), 0x1b873593u);
        ++slots[h & (kSlots - 1)];
        ++tags[h >> 60];
        ++total;
      }
    }
  }
  // Chi-squared over the slots: for uniform bits chi2/dof is 1 with sigma
  // sqrt(2/4095) = 0.022; 1.15 is ~7 sigma (the inputs are fixed: this is
  // deterministic, not flaky). Tags: 16 bins, sigma sqrt(2/15) = 0.37.
  CHECK(Chi2PerDof(slots, static_cast<std::size_t>(total)) < 1.15);
  CHECK(Chi2PerDof(tags, static_cast<std::size_t>(total)) < 3.0);
  // Any two PCs swapped in a 32-deep stack: a different hash.
  int equal = 0;
  for (int i = 0; i < 32; ++i) {
    for (int j = i + 1; j < 32; ++j) {
      reset();
      const std::uint64_t before = HashWords(w, 32, 7);
      std::swap(w[i], w[j]);
      equal += HashWords(w, 32, 7) == before ? 1 : 0;
    }
  }
  CHECK(equal == 0);
  // A stack and the same stack one frame deeper with a zero word; seeds differ.
  reset();
  w[5] = 0;
  CHECK(HashWords(w, 5, 7) != HashWords(w, 6, 7));
  CHECK(HashWords(w, 6, 7) != HashWords(w, 6, 8));
}

TEST_CASE("bucket hash: size, rate, labels and stack each spread the slot and tag bits; no two keys collide") {
  using heapprof::detail::BucketTable;
  using heapprof::detail::LabelSetData;
  std::uintptr_t w[8];
  for (int k = 0; k < 8; ++k) w[k] = 0x55550000u + static_cast<std::uintptr_t>(k) * 0x40;
  constexpr int kSlots = 4096;
  std::vector<int> slots(kSlots), tags(16);
  std::vector<std::uint64_t> all;
  auto add = [&](std::uint64_t stack, std::uint64_t size, std::uint64_t rate, std::uintptr_t labels) {
    const std::uint64_t h = BucketTable::BucketHash(stack, size, rate, reinterpret_cast<const LabelSetData*>(labels));
    ++slots[h & (kSlots - 1)];
    ++tags[h >> 60];
    all.push_back(h);
  };
  const std::uint64_t rates[] = {1, 4096, 65536, 524288};
  for (int s = 0; s < 8; ++s) {
    w[s % 8] += 16;
    const std::uint64_t stack = heapprof::detail::HashWords(w, 8, 0x1b873593u);
    for (std::uint64_t rate : rates) {
      for (std::uint64_t size = 1; size <= 4096; ++size) add(stack, size, rate, 0);  // sizes 1 apart
      for (std::uintptr_t l = 1; l <= 4096; ++l) add(stack, 64, rate, 0x7f0000001000u + l * 64);  // label sets 64 B apart
    }
  }
  for (std::uint64_t s = 1; s <= 32768; ++s) add(s, 64, 524288, 0);  // stack hashes alone
  // As in the stack hash test: chi2/dof 1 +- 0.022 for uniform slot bits
  // (1.15 is ~7 sigma, deterministic inputs), tags 1 +- 0.37.
  CHECK(Chi2PerDof(slots, all.size()) < 1.15);
  CHECK(Chi2PerDof(tags, all.size()) < 3.0);
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
}
