// Helpers of the malloc test suite: Stats deltas, per-leaf profile totals.
#pragma once

#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <dlfcn.h>
#include <string>

#include "support/profile_io.hpp"

namespace malloc_test {

inline void* volatile g_sink;

// True when the allocator under heapprof's malloc is glibc's (not a preloaded
// jemalloc or tcmalloc): some tests check glibc's own documented behaviour
// (errno on every failure, realloc(p, 0) frees), which other allocators differ from.
inline bool RealMallocIsGlibc() {
  Dl_info info{};
  void* next = dlsym(RTLD_NEXT, "malloc");
  return next != nullptr && dladdr(next, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libc.so") != nullptr;
}

// The rate for one test, restored after.
class RateScope {
 public:
  explicit RateScope(std::size_t rate) : saved_(heapprof::GetSampleRate()) { heapprof::SetSampleRate(rate); }
  ~RateScope() { heapprof::SetSampleRate(saved_); }
  RateScope(const RateScope&) = delete;
  RateScope& operator=(const RateScope&) = delete;

 private:
  std::size_t saved_;
};

struct Delta {
  heapprof::Stats before = heapprof::GetStats();
  heapprof::Stats after{};
  void Stop() { after = heapprof::GetStats(); }
  std::uint64_t allocs() const { return after.alloc_objects - before.alloc_objects; }
  std::uint64_t alloc_bytes() const { return after.alloc_bytes - before.alloc_bytes; }
  std::uint64_t frees() const { return after.free_objects - before.free_objects; }
  std::uint64_t free_bytes() const { return after.free_bytes - before.free_bytes; }
  std::int64_t live_bytes() const {
    return static_cast<std::int64_t>(after.alloc_bytes - after.free_bytes) -
           static_cast<std::int64_t>(before.alloc_bytes - before.free_bytes);
  }
  std::int64_t live_objects() const {
    return static_cast<std::int64_t>(after.alloc_objects - after.free_objects) -
           static_cast<std::int64_t>(before.alloc_objects - before.free_objects);
  }
};

// The profile's four values summed over samples whose stack has a frame
// whose function name contains `frame` (the leaf when `leaf_only`).
struct Totals {
  std::int64_t alloc_objects = 0, alloc_space = 0, inuse_objects = 0, inuse_space = 0;
  Totals operator-(const Totals& o) const {
    return {alloc_objects - o.alloc_objects, alloc_space - o.alloc_space, inuse_objects - o.inuse_objects,
            inuse_space - o.inuse_space};
  }
};

inline Totals ProfileTotals(const std::string& frame, bool leaf_only = true) {
  heapprof_test::Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::CaptureProfile(p, false, nullptr, &why), why);
  const int ao = heapprof_test::SampleTypeIndex(p, "alloc_objects");
  const int as = heapprof_test::SampleTypeIndex(p, "alloc_space");
  const int io = heapprof_test::SampleTypeIndex(p, "inuse_objects");
  const int is = heapprof_test::SampleTypeIndex(p, "inuse_space");
  Totals t;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> names = heapprof_test::FunctionNames(p, s);
    bool hit = false;
    for (std::size_t i = 0; i < names.size() && !hit; ++i) {
      hit = names[i].find(frame) != std::string::npos;
      if (leaf_only) break;
    }
    if (!hit) continue;
    t.alloc_objects += s.values.at(static_cast<std::size_t>(ao));
    t.alloc_space += s.values.at(static_cast<std::size_t>(as));
    t.inuse_objects += s.values.at(static_cast<std::size_t>(io));
    t.inuse_space += s.values.at(static_cast<std::size_t>(is));
  }
  return t;
}

}  // namespace malloc_test
