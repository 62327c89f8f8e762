// Rate 1 records every allocation: totals must match to the byte and object,
// per stack, in the profile and in Stats.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <malloc.h>

#include "support/profile_io.hpp"

namespace {

void* g_a[300];
void* g_b[200];

// noinline + a store after the call: no inlining, no tail call, so each is a
// real frame whose return address sits in the caller.
__attribute__((noinline)) void RateOneLeafA(int n) {
  for (int i = 0; i < n; ++i) g_a[i] = new char[100];
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void RateOneLeafB(int n) {
  for (int i = 0; i < n; ++i) g_b[i] = ::operator new(200);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void RateOneMiddle() {
  RateOneLeafA(300);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void RateOneOuter() {
  RateOneMiddle();
  RateOneLeafB(200);
  asm volatile("" ::: "memory");
}

}  // namespace

TEST_CASE("rate 1: every total exact to the byte and object, per stack") {
  using namespace heapprof_test;
  heapprof_test::RateScope rate(1);

  const heapprof::Stats s0 = heapprof::GetStats();
  RateOneOuter();
  // Stats count usable sizes (the profile below: requested sizes). glibc may
  // give a block a few bytes more than its size class (a split that would
  // leave too small a rest), so each block is asked.
  std::uint64_t usable_all = 0, usable_freed = 0;
  for (int i = 0; i < 300; ++i) usable_all += malloc_usable_size(g_a[i]);
  for (int i = 0; i < 200; ++i) usable_all += malloc_usable_size(g_b[i]);
  for (int i = 0; i < 100; ++i) usable_freed += malloc_usable_size(g_a[i]);
  for (int i = 0; i < 50; ++i) usable_freed += malloc_usable_size(g_b[i]);
  for (int i = 0; i < 100; ++i) delete[] static_cast<char*>(g_a[i]);                  // unsized delete[]
  for (int i = 0; i < 50; ++i) ::operator delete(g_b[i], 200);    // sized delete
  const heapprof::Stats s1 = heapprof::GetStats();

  CHECK(s1.alloc_objects - s0.alloc_objects == 500);
  CHECK(s1.alloc_bytes - s0.alloc_bytes == usable_all);
  CHECK(s1.free_objects - s0.free_objects == 150);
  CHECK(s1.free_bytes - s0.free_bytes == usable_freed);
  CHECK(s1.sampled_live_objects - s0.sampled_live_objects == 350);
  CHECK(s1.live_objects - s0.live_objects == 350);

  Profile p;
  std::string why;
  const bool captured = CaptureProfile(p, false, nullptr, &why);
  // Back to the default rate before reading the profile: the decoder's and the
  // checks' own allocations would each be a sample at rate 1 (under TSan that
  // made this case 10x slower). The frees below are counted at any rate.
  rate.Restore();
  REQUIRE_MESSAGE(captured, why);
  REQUIRE_MESSAGE(Validate(p, &why), why);
  CHECK(p.period == 1);
  CHECK(SumForLeaf(p, "RateOneLeafA", "alloc_objects") == 300);
  CHECK(SumForLeaf(p, "RateOneLeafA", "alloc_space") == 30000);
  CHECK(SumForLeaf(p, "RateOneLeafA", "inuse_objects") == 200);
  CHECK(SumForLeaf(p, "RateOneLeafA", "inuse_space") == 20000);
  CHECK(SumForLeaf(p, "RateOneLeafB", "alloc_objects") == 200);
  CHECK(SumForLeaf(p, "RateOneLeafB", "alloc_space") == 40000);
  CHECK(SumForLeaf(p, "RateOneLeafB", "inuse_objects") == 150);
  CHECK(SumForLeaf(p, "RateOneLeafB", "inuse_space") == 30000);

  // The stack: leaf is the caller of operator new, then its callers in order;
  // no heapprof frame and no operator new anywhere in it.
  bool found = false;
  for (const Sample& s : p.samples) {
    const std::vector<std::string> names = FunctionNames(p, s);
    if (names.empty() || names[0].find("RateOneLeafA") == std::string::npos) continue;
    found = true;
    REQUIRE(names.size() >= 3);
    CHECK(names[1].find("RateOneMiddle") != std::string::npos);
    CHECK(names[2].find("RateOneOuter") != std::string::npos);
    for (const std::string& n : names) {
      CHECK(n.find("heapprof::detail") == std::string::npos);
      CHECK(n.find("operator new") == std::string::npos);
    }
    // The numeric label "bytes" carries the object size.
    bool has_bytes_label = false;
    for (const Label& l : s.labels) {
      if (l.key == "bytes") {
        has_bytes_label = true;
        CHECK(l.num == 100);
        CHECK(l.num_unit == "bytes");
      }
    }
    CHECK(has_bytes_label);
  }
  CHECK(found);

  for (int i = 100; i < 300; ++i) delete[] static_cast<char*>(g_a[i]);
  for (int i = 50; i < 200; ++i) ::operator delete(g_b[i], 200);
  Profile after;
  REQUIRE(CaptureProfile(after));
  CHECK(SumForLeaf(after, "RateOneLeafA", "inuse_objects") == 0);
  CHECK(SumForLeaf(after, "RateOneLeafB", "inuse_space") == 0);
  CHECK(SumForLeaf(after, "RateOneLeafA", "alloc_objects") == 300);  // cumulative
}

TEST_CASE("profile metadata: sample types, period type, default sample type") {
  using namespace heapprof_test;
  Profile heap, allocs;
  REQUIRE(CaptureProfile(heap, false));
  REQUIRE(CaptureProfile(allocs, true));
  REQUIRE(heap.sample_types.size() == 4);
  const char* types[] = {"alloc_objects", "alloc_space", "inuse_objects", "inuse_space"};
  const char* units[] = {"count", "bytes", "count", "bytes"};
  for (int i = 0; i < 4; ++i) {
    CHECK(heap.sample_types[i].type == types[i]);
    CHECK(heap.sample_types[i].unit == units[i]);
  }
  CHECK(heap.period_type.type == "space");
  CHECK(heap.period_type.unit == "bytes");
  CHECK(heap.period == static_cast<std::int64_t>(heapprof::GetSampleRate()));
  CHECK(heap.time_nanos > 1600000000LL * 1000000000LL);
  CHECK(heap.default_sample_type.empty());
  CHECK(allocs.default_sample_type == "alloc_space");
  // The main program is the first mapping and carries its build id.
  REQUIRE(!heap.mappings.empty());
  CHECK(heap.mappings[0].filename == SelfExe());
  CHECK(!heap.mappings[0].build_id.empty());
  CHECK(heap.mappings[0].has_functions);
}

namespace {
void* g_u[4];
__attribute__((noinline)) void UnwinderLeaf(int slot) {
  g_u[slot] = ::operator new(64);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void UnwinderMiddle(int slot) {
  UnwinderLeaf(slot);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void UnwinderOuter(int slot) {
  UnwinderMiddle(slot);
  asm volatile("" ::: "memory");
}
}  // namespace

TEST_CASE("both unwinders give the same caller chain; the table is the default") {
  using namespace heapprof_test;
  CHECK(heapprof::GetUnwinder() == heapprof::Unwinder::kTable);
  heapprof_test::RateScope rate(1);
  const heapprof_test::UnwinderScope unwinder;
  for (const heapprof::Unwinder u : {heapprof::Unwinder::kFramePointer, heapprof::Unwinder::kTable}) {
    heapprof::SetUnwinder(u);
    CHECK(heapprof::GetUnwinder() == u);
    UnwinderOuter(u == heapprof::Unwinder::kTable ? 1 : 0);
  }
  heapprof::SetUnwinder(heapprof::Unwinder::kTable);
  Profile p;
  REQUIRE(CaptureProfile(p));
  int chains = 0;
  for (const Sample& s : p.samples) {
    const std::vector<std::string> names = FunctionNames(p, s);
    if (names.empty() || names[0].find("UnwinderLeaf") == std::string::npos) continue;
    REQUIRE(names.size() >= 4);
    CHECK(names[1].find("UnwinderMiddle") != std::string::npos);
    CHECK(names[2].find("UnwinderOuter") != std::string::npos);
    CHECK(names.back().find("_start") != std::string::npos);  // all the way to the entry point
    chains += static_cast<int>(s.values.at(0));
  }
  CHECK(chains == 2);
  const heapprof::Stats st = heapprof::GetStats();
  // libc's frames (_start's caller) were found one FDE at a time: a few
  // samples do not make it build its table (3,713 FDEs).
  CHECK(st.unwind_one_fde_lookups > 0);
  CHECK((st.unwind_objects == 0) == (st.unwind_rows == 0));
  CHECK(st.unwind_table_bytes > 0);  // the object snapshot, the walk records, the rule cache
  ::operator delete(g_u[0]);
  ::operator delete(g_u[1]);
}
