// heapprof: the byte-countdown sampler (Poisson sampling over allocated bytes).
//
// Each thread keeps a countdown of bytes until its next sample. An allocation of
// n bytes with countdown c is sampled when n >= c; the next countdown is then a
// fresh draw from an exponential distribution with mean R (the sample rate).
// Because the exponential is memoryless, the countdown left at the start of any
// allocation is itself Exp(R), so an allocation of n bytes is sampled with
// probability 1 - exp(-n/R), independently of everything before it. Go
// (runtime/malloc.go nextSample) and tcmalloc (sampler.h) use the same process;
// the write-time scaling in writer.hpp inverts exactly that probability.
//
// The draw runs only on the slow path, but still avoids libm: -ln(u) comes from
// our own log below (|error| < 1e-12 relative), so a sampled allocation never
// calls into a library that could itself allocate or take a lock.
#pragma once

#include <cstddef>
#include <cstdint>

namespace heapprof {
namespace detail {

// splitmix64: 64-bit state, passes BigCrush, three multiplies per draw.
inline std::uint64_t NextRandom(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Natural log of x > 0 without libm: x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// ln(m) = 2 atanh(t) with t = (m-1)/(m+1), |t| <= 0.1716, summed to t^15.
inline double NaturalLog(double x) noexcept {
  std::uint64_t bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  int e = static_cast<int>((bits >> 52) & 0x7FF) - 1023;
  bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // m in [1, 2)
  double m;
  __builtin_memcpy(&m, &bits, sizeof m);
  if (m > 1.4142135623730951) {
    m *= 0.5;
    ++e;
  }
  const double t = (m - 1.0) / (m + 1.0);
  const double t2 = t * t;
  double series = 1.0 / 15;
  series = series * t2 + 1.0 / 13;
  series = series * t2 + 1.0 / 11;
  series = series * t2 + 1.0 / 9;
  series = series * t2 + 1.0 / 7;
  series = series * t2 + 1.0 / 5;
  series = series * t2 + 1.0 / 3;
  series = series * t2 + 1.0;
  return e * 0.6931471805599453 + 2.0 * t * series;
}

// Bytes until the next sample: ceil of an Exp(rate) draw, so P(distance <= n)
// = 1 - exp(-n/rate) for every whole n. Rate 1 means "every allocation": the
// distance is 0 (as Go's MemProfileRate == 1), never a random value that could
// skip a 1-byte object.
inline std::int64_t DrawSampleDistance(std::uint64_t& rng, std::uint64_t rate) noexcept {
  if (rate <= 1) return 0;
  // 53 random bits -> u uniform in (0, 1]; never 0, so the log is finite.
  const double u = static_cast<double>((NextRandom(rng) >> 11) + 1) * 0x1p-53;
  const double distance = -NaturalLog(u) * static_cast<double>(rate);
  // Cap far beyond any real draw (u >= 2^-53 gives at most 36.7 * rate).
  if (distance >= 9.0e18) return INT64_MAX / 2;
  const auto whole = static_cast<std::int64_t>(distance);
  return whole + 1;  // ceil for non-integers; integers are measure zero
}

}  // namespace detail
}  // namespace heapprof
