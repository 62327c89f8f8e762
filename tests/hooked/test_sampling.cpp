// At the default 512 KiB rate, the scaled estimates are unbiased: over a large
// workload they land within 5 standard deviations of the truth (a false alarm
// once in ~3.5 million runs per check), with sigma derived here, not tuned.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "support/profile_io.hpp"

namespace {

void* volatile g_sampling_sink;

__attribute__((noinline)) void ChurnSmall(std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    char* p = new char[64];
    g_sampling_sink = p;
    delete[] p;
  }
}
__attribute__((noinline)) void ChurnMedium(std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    char* p = new char[4096];
    g_sampling_sink = p;
    delete[] p;
  }
}
__attribute__((noinline)) void ChurnLarge(std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    char* p = new char[262144];
    g_sampling_sink = p;
    delete[] p;
  }
}
__attribute__((noinline)) void KeepMedium(std::vector<char*>& keep, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) keep[i] = new char[4096];
  asm volatile("" ::: "memory");
}

// Each of `count` objects of `size` bytes is sampled with p = 1 - exp(-size/R)
// and stands for 1/p objects, so the count estimate has variance count(1-p)/p.
double CountSigma(double count, double size, double rate) {
  const double p = -std::expm1(-size / rate);
  return std::sqrt(count * (1 - p) / p);
}

void CheckEstimate(const heapprof_test::Profile& prof, const char* leaf, const char* type, double truth_count,
                   double size) {
  const double rate = 524288;
  const double sigma = CountSigma(truth_count, size, rate);
  const bool bytes = std::string(type).find("space") != std::string::npos;
  const double truth = bytes ? truth_count * size : truth_count;
  const double bound = 5 * sigma * (bytes ? size : 1);
  const double got = static_cast<double>(heapprof_test::SumForLeaf(prof, leaf, type));
  INFO(leaf << " " << type << ": estimate " << got << ", truth " << truth << ", 5 sigma " << bound);
  CHECK(std::fabs(got - truth) <= bound);
}

}  // namespace

TEST_CASE("512 KiB: estimates over a large workload are within 5 sigma") {
  using namespace heapprof_test;
  heapprof_test::RateScope rate(524288);
  // 1 GiB through each size: ~2048 expected samples for the small and medium
  // sizes (relative sigma ~2.2%) and ~1600 for the large one. Sanitizer
  // builds run an eighth of it: the bounds follow from the counts either way.
#if defined(HEAPPROF_TSAN) || defined(HEAPPROF_ASAN)
  const std::size_t scale = 8;
#else
  const std::size_t scale = 1;
#endif
  const std::size_t small = (std::size_t{1} << 30) / 64 / scale;
  const std::size_t medium = (std::size_t{1} << 30) / 4096 / scale;
  const std::size_t large = (std::size_t{1} << 30) / 262144 / scale;
  const std::size_t kept = 65536 / scale;  // 256 MiB live
  std::vector<char*> keep(kept);
  ChurnSmall(small);
  ChurnMedium(medium);
  ChurnLarge(large);
  KeepMedium(keep, kept);

  Profile p;
  std::string why;
  REQUIRE_MESSAGE(CaptureProfile(p, false, nullptr, &why), why);
  CHECK(p.period == 524288);
  CheckEstimate(p, "ChurnSmall", "alloc_objects", static_cast<double>(small), 64);
  CheckEstimate(p, "ChurnSmall", "alloc_space", static_cast<double>(small), 64);
  CheckEstimate(p, "ChurnMedium", "alloc_space", static_cast<double>(medium), 4096);
  CheckEstimate(p, "ChurnLarge", "alloc_objects", static_cast<double>(large), 262144);
  CheckEstimate(p, "ChurnLarge", "alloc_space", static_cast<double>(large), 262144);
  CheckEstimate(p, "KeepMedium", "inuse_space", static_cast<double>(kept), 4096);
  CheckEstimate(p, "KeepMedium", "inuse_objects", static_cast<double>(kept), 4096);
  // Churned objects are all freed: nothing of theirs may remain in use.
  CHECK(SumForLeaf(p, "ChurnSmall", "inuse_objects") == 0);
  CHECK(SumForLeaf(p, "ChurnLarge", "inuse_space") == 0);

  for (char* c : keep) delete[] c;
}

TEST_CASE("a rate change keeps earlier samples at the rate they were taken at") {
  using namespace heapprof_test;
  // Sampled at 1: exact. Then at 1 MiB: nothing of these 10 tiny objects may
  // be rescaled by the new rate.
  heapprof_test::RateScope rate(1);
  std::vector<char*> keep(10);
  KeepMedium(keep, 10);
  rate.Set(1 << 20);
  Profile p;
  REQUIRE(CaptureProfile(p));
  CHECK(SumForLeaf(p, "KeepMedium", "inuse_objects") == 10);
  CHECK(SumForLeaf(p, "KeepMedium", "inuse_space") == 10 * 4096);
  for (char* c : keep) delete[] c;
  Profile after;
  REQUIRE(CaptureProfile(after));
  CHECK(SumForLeaf(after, "KeepMedium", "inuse_objects") == 0);
}

TEST_CASE("rate 0 turns sampling off but Stats still count") {
  heapprof_test::RateScope restore;  // saves only: SetSampleRate itself is under test
  heapprof::SetSampleRate(0);
  CHECK(heapprof::GetSampleRate() == 0);
  const heapprof::Stats s0 = heapprof::GetStats();
  ChurnLarge(64);  // 16 MiB: at any non-zero rate near 512 KiB it would be sampled
  const heapprof::Stats s1 = heapprof::GetStats();
  CHECK(s1.alloc_objects - s0.alloc_objects == 64);
  CHECK(s1.sampled_live_objects == s0.sampled_live_objects);
}
