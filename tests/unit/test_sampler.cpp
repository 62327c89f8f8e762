// The sampler's draw: an exponential distribution with mean = rate.
#include <heapprof.hpp>
#include "heapprof/detail/0_base/env_config.hpp"
#include "heapprof/detail/2_sampling/sampler.hpp"
#include "heapprof/detail/5_encoding/snapshot.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <unistd.h>
#include <cstdint>

using heapprof::detail::DrawSampleDistance;
using heapprof::detail::NaturalLog;

TEST_CASE("NaturalLog matches libm's log to 1e-12 relative over the whole range") {
  std::uint64_t rng = 12345;
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const double u = static_cast<double>((heapprof::detail::NextRandom(rng) >> 11) + 1) * 0x1p-53;
    const double want = std::log(u);
    const double got = NaturalLog(u);
    worst = std::fmax(worst, std::fabs(got - want) / std::fmax(std::fabs(want), 1e-300));
  }
  for (double x : {1.0, 2.0, 0.5, 1.4142135623730951, 0x1p-53, 1e-300, 1e300, 3.0, 7.5}) {
    worst = std::fmax(worst, std::fabs(NaturalLog(x) - std::log(x)) / std::fmax(std::fabs(std::log(x)), 1.0));
  }
  INFO("worst relative error " << worst);
  CHECK(worst < 1e-12);
}

TEST_CASE("draws are Exp(rate): mean, variance and CDF within 5 sigma") {
  const double rate = 524288;
  const int n = 1000000;
  std::uint64_t rng = 0xC0FFEE;
  double sum = 0, sum_sq = 0;
  int below_rate = 0, below_one = 0;
  for (int i = 0; i < n; ++i) {
    const double d = static_cast<double>(DrawSampleDistance(rng, 524288));
    below_one += d < 1;
    sum += d;
    sum_sq += d * d;
    if (d <= rate) ++below_rate;
  }
  CHECK(below_one == 0);
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  // Exp(R): sd of the sample mean is R/sqrt(n); the sample variance has sd
  // R^2 sqrt((kurtosis - 1)/n) = R^2 sqrt(8/n). The ceil adds ~0.5 to the mean.
  const double mean_sigma = rate / std::sqrt(n);
  const double var_sigma = rate * rate * std::sqrt(8.0 / n);
  INFO("mean " << mean << " var " << var);
  CHECK(std::fabs(mean - (rate + 0.5)) <= 5 * mean_sigma);
  CHECK(std::fabs(var - rate * rate) <= 5 * var_sigma);
  // P(distance <= R) = 1 - 1/e: the probability the engine's scaling inverts.
  const double p = 1 - std::exp(-1.0);
  const double p_sigma = std::sqrt(p * (1 - p) / n);
  CHECK(std::fabs(static_cast<double>(below_rate) / n - p) <= 5 * p_sigma);
}

TEST_CASE("rate 1 samples every allocation, rate 0 never draws") {
  std::uint64_t rng = 1;
  for (int i = 0; i < 1000; ++i) CHECK(DrawSampleDistance(rng, 1) == 0);
  CHECK(DrawSampleDistance(rng, 0) == 0);
  // Small rates still draw from the distribution (>= 1, mean ~ rate).
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += static_cast<double>(DrawSampleDistance(rng, 100));
  CHECK(std::fabs(sum / 100000 - 100.5) < 5 * 100 / std::sqrt(100000.0));
}

TEST_CASE("write-time scaling is Go's 1/(1-exp(-size/rate))") {
  using heapprof::detail::HeapSampleScale;
  CHECK(HeapSampleScale(100, 1) == 1.0);
  CHECK(HeapSampleScale(0, 524288) == 1.0);
  CHECK(HeapSampleScale(524288, 524288) == doctest::Approx(1.0 / (1.0 - std::exp(-1.0))).epsilon(1e-12));
  CHECK(HeapSampleScale(64, 524288) == doctest::Approx(524288.0 / 64 + 0.5).epsilon(1e-6));
  CHECK(HeapSampleScale(std::uint64_t{1} << 40, 524288) == doctest::Approx(1.0));
}

TEST_CASE("HEAPPROF parser: sizes, suffixes, bad values, unknown keys") {
  using heapprof::detail::ParseByteSize;
  std::uint64_t v = 0;
  CHECK((ParseByteSize("4096", v) && v == 4096));
  CHECK((ParseByteSize("512k", v) && v == 524288));
  CHECK((ParseByteSize("512K", v) && v == 524288));
  CHECK((ParseByteSize("2m", v) && v == 2097152));
  CHECK((ParseByteSize("1g", v) && v == 1073741824));
  CHECK((ParseByteSize("0", v) && v == 0));
  CHECK_FALSE(ParseByteSize("", v));
  CHECK_FALSE(ParseByteSize("k", v));
  CHECK_FALSE(ParseByteSize("-1", v));
  CHECK_FALSE(ParseByteSize("12q", v));
  CHECK_FALSE(ParseByteSize("1.5m", v));
  // Past UINT64_MAX: saturated there, for the caller to clamp.
  CHECK((ParseByteSize("99999999999999999999", v) && v == UINT64_MAX));
  CHECK((ParseByteSize("99999999999999g", v) && v == UINT64_MAX));

  const auto cfg = heapprof::detail::ParseEnvConfig("rate=1k");
  CHECK(cfg.has_rate);
  CHECK(cfg.rate == 1024);
  // Bad pairs are skipped (and reported on stderr); good ones still apply.
  const auto mixed = heapprof::detail::ParseEnvConfig(",bogus=1,rate=xx,,=,rate=64k,junk");
  CHECK(mixed.has_rate);
  CHECK(mixed.rate == 65536);
  CHECK_FALSE(heapprof::detail::ParseEnvConfig("rate=").has_rate);

  const auto unw = heapprof::detail::ParseEnvConfig("unwinder=fp,max_label_sets=77");
  CHECK(unw.has_unwinder);
  CHECK_FALSE(unw.unwinder_table);
  CHECK(unw.has_max_label_sets);
  CHECK(unw.max_label_sets == 77);
  CHECK(heapprof::detail::ParseEnvConfig("unwinder=table").unwinder_table);
  CHECK_FALSE(heapprof::detail::ParseEnvConfig("unwinder=libunwind").has_unwinder);
  CHECK_FALSE(heapprof::detail::ParseEnvConfig("max_label_sets=0").has_max_label_sets);
  CHECK_FALSE(heapprof::detail::ParseEnvConfig("max_label_sets=12x").has_max_label_sets);
  const auto stacks = heapprof::detail::ParseEnvConfig("max_stacks=100000,rate=1");
  CHECK(stacks.has_max_stacks);
  CHECK(stacks.max_stacks == 100000);
  CHECK(stacks.rate == 1);
  CHECK_FALSE(heapprof::detail::ParseEnvConfig("max_stacks=0").has_max_stacks);
  CHECK_FALSE(heapprof::detail::ParseEnvConfig("max_stacks=-5").has_max_stacks);
}

namespace {
// What ParseEnvConfig writes to stderr for `text`.
std::string StderrOfParse(const char* text, heapprof::detail::EnvConfig& cfg) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const int saved = dup(2);
  dup2(fds[1], 2);
  cfg = heapprof::detail::ParseEnvConfig(text);
  dup2(saved, 2);
  close(saved);
  close(fds[1]);
  std::string out;
  char buf[1024];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  return out;
}
}  // namespace

TEST_CASE("HEAPPROF: numeric keys are clamped, and say so; echoed values are escaped") {
  heapprof::detail::EnvConfig cfg;
  std::string err = StderrOfParse("max_stacks=4611686018427387904,max_label_sets=99999999,rate=18446744073709551615", cfg);
  CHECK(cfg.max_stacks == (std::uint64_t{1} << 24));  // 4x of it still fits the bucket arithmetic
  CHECK(cfg.max_label_sets == (std::uint64_t{1} << 20));
  CHECK(cfg.rate == (std::uint64_t{1} << 40) - 1);
  CHECK(err.find("max_stacks '4611686018427387904' is above 16777216: clamped to it\n") != std::string::npos);
  CHECK(err.find("max_label_sets '99999999' is above 1048576") != std::string::npos);
  CHECK(err.find("rate '18446744073709551615' is above 1 TiB") != std::string::npos);
  // In range: nothing said.
  CHECK(StderrOfParse("max_stacks=16777216,rate=1g", cfg).empty());
  CHECK(cfg.max_stacks == (std::uint64_t{1} << 24));
  // Control bytes and non-ASCII in an echoed value cannot forge a line.
  err = StderrOfParse("rate=1\nheapprof: forged\x1b[2J\xff", cfg);
  CHECK(err == "heapprof: HEAPPROF: bad value for rate (bytes, optional k/m/g suffix): "
               "'1\\x0aheapprof: forged\\x1b[2J\\xff' ignored\n");
}
