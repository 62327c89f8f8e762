// bench/accuracy: a heap with known totals per stack, to compare a sampled
// profiler's estimates with the truth. Four allocation sites, each its own
// noinline function (the leaf frame of its stack), all objects kept live:
//   SmallSite   2,000,000 x 32 B        = 64,000,000 B
//   MediumSite     16,384 x 4 KiB       = 67,108,864 B
//   LargeSite         256 x 256 KiB     = 67,108,864 B
//   MixedSite     500,000 x 64 B + 512 x 64 KiB = 65,554,432 B (two sizes, one stack)
// The objects are allocated interleaved (round-robin over the sites), so no
// site sees a different part of the sampler's sequence.
//
// Built twice, like churn: bench_accuracy_heapprof (HEAPPROF_BENCH_HOOKED)
// writes heapprof's profile (rate from HEAPPROF, default 512 KiB) to argv[1];
// bench_accuracy_plain asks jemalloc for a heap profile with mallctl
// "prof.dump" (found with dlsym, so run it with LD_PRELOAD=libjemalloc.so.2
// MALLOC_CONF=prof:true,lg_prof_sample:19) into argv[1]. Both print the true
// totals: "truth SITE objects=N bytes=B".
#if defined(HEAPPROF_BENCH_HOOKED)
#include <heapprof.hpp>  // the light API; the hooks: bench/hooks/new_delete.cpp
#include <fstream>
#else
#include <dlfcn.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

struct Site {
  const char* name;
  std::size_t size_a;
  long count_a;
  std::size_t size_b;  // a second size from the same stack (MixedSite only)
  long count_b;
};

constexpr Site kSites[4] = {
    {"SmallSite", 32, 2000000, 0, 0},
    {"MediumSite", 4096, 16384, 0, 0},
    {"LargeSite", 262144, 256, 0, 0},
    {"MixedSite", 64, 500000, 65536, 512},
};

std::vector<void*>* g_live;

void Touch(void* p, std::size_t n) {
  // Write one byte per page: the memory is really used, and not optimised away.
  for (std::size_t i = 0; i < n; i += 4096) static_cast<volatile char*>(p)[i] = 1;
}

__attribute__((noinline)) void SmallSite(std::size_t n) {
  void* p = ::operator new(n);
  Touch(p, n);
  g_live->push_back(p);
}
__attribute__((noinline)) void MediumSite(std::size_t n) {
  void* p = ::operator new(n);
  Touch(p, n);
  g_live->push_back(p);
}
__attribute__((noinline)) void LargeSite(std::size_t n) {
  void* p = ::operator new(n);
  Touch(p, n);
  g_live->push_back(p);
}
__attribute__((noinline)) void MixedSite(std::size_t n) {
  void* p = ::operator new(n);
  Touch(p, n);
  g_live->push_back(p);
}

void (*const kFns[4])(std::size_t) = {SmallSite, MediumSite, LargeSite, MixedSite};

}  // namespace

int main(int argc, char** argv) {
  const char* out = argc > 1 ? argv[1] : "accuracy.prof";
  std::vector<void*> live;
  live.reserve(2600000);  // before anything is counted: the vector's own buffer is one allocation
  g_live = &live;
  long done[4][2] = {};
  // Round-robin in 10,000 steps: each step allocates 1/10,000 of every site's objects.
  constexpr long kSteps = 10000;
  for (long step = 0; step < kSteps; ++step) {
    for (int s = 0; s < 4; ++s) {
      const Site& site = kSites[s];
      for (int k = 0; k < 2; ++k) {
        const long total = k == 0 ? site.count_a : site.count_b;
        const std::size_t size = k == 0 ? site.size_a : site.size_b;
        const long upto = total * (step + 1) / kSteps;
        for (; done[s][k] < upto; ++done[s][k]) kFns[s](size);
      }
    }
  }
  for (int s = 0; s < 4; ++s) {
    const Site& site = kSites[s];
    std::printf("truth %s objects=%ld bytes=%lld\n", site.name, site.count_a + site.count_b,
                static_cast<long long>(site.size_a) * site.count_a + static_cast<long long>(site.size_b) * site.count_b);
  }
#if defined(HEAPPROF_BENCH_HOOKED)
  std::ofstream f(out, std::ios::binary);
  if (!heapprof::WriteHeapProfile(f)) {
    std::fprintf(stderr, "accuracy: writing %s failed\n", out);
    return 1;
  }
#else
  using Mallctl = int (*)(const char*, void*, std::size_t*, void*, std::size_t);
  auto mallctl = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
  if (mallctl == nullptr) {
    std::fprintf(stderr, "accuracy: no mallctl (run with LD_PRELOAD=libjemalloc.so.2)\n");
    return 1;
  }
  const char* path = out;
  if (int err = mallctl("prof.dump", nullptr, nullptr, &path, sizeof path); err != 0) {
    std::fprintf(stderr, "accuracy: mallctl(prof.dump) failed: %d (MALLOC_CONF=prof:true?)\n", err);
    return 1;
  }
#endif
  for (void* p : live) ::operator delete(p);
  return 0;
}
