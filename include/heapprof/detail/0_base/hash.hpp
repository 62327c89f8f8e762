// heapprof: hashing for the engine's tables.
#pragma once

#include <cstddef>
#include <cstdint>

namespace heapprof {
namespace detail {

// A strong 64-bit mix (the splitmix64 finaliser): the tables use the low bits.
inline std::uint64_t Mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t HashCombine(std::uint64_t seed, std::uint64_t value) noexcept {
  return Mix64(seed ^ (value + 0x9E3779B97F4A7C15ull + (seed << 6) + (seed >> 2)));
}

// A sampled stack's PCs, on every sample: one multiply and one xor-shift per
// word, in four independent lanes (four words hash in the latency of one:
// each lane's step is a ~6-cycle chain), then a full mix. HashCombine per
// word cost ~20 instructions in a serial chain, a quarter of a rate-1 sample
// at depth 24 (callgrind); with two lanes the chain was still ~10% of a
// sample on random stacks at depth 32 (perf).
inline std::uint64_t HashWords(const std::uintptr_t* words, std::size_t n, std::uint64_t seed) noexcept {
  constexpr std::uint64_t kMulA = 0x9E3779B97F4A7C15ull;
  constexpr std::uint64_t kMulB = 0xC2B2AE3D27D4EB4Full;
  constexpr std::uint64_t kMulC = 0x165667B19E3779F9ull;
  constexpr std::uint64_t kMulD = 0xD6E8FEB86659FD93ull;
  // Distinct multipliers and starts per lane: a word moved to another lane
  // hashes differently.
  std::uint64_t a = (seed ^ n) * kMulA;
  std::uint64_t b = seed * kMulB + n;
  std::uint64_t c = (seed + n) * kMulC;
  std::uint64_t d = ~seed * kMulD;
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a = (a ^ words[i]) * kMulA;
    b = (b ^ words[i + 1]) * kMulB;
    c = (c ^ words[i + 2]) * kMulC;
    d = (d ^ words[i + 3]) * kMulD;
    a ^= a >> 29;
    b ^= b >> 29;
    c ^= c >> 29;
    d ^= d >> 29;
  }
  // The last 0-3 words, one per lane.
  if (i < n) a = (a ^ words[i]) * kMulA, a ^= a >> 29;
  if (i + 1 < n) b = (b ^ words[i + 1]) * kMulB, b ^= b >> 29;
  if (i + 2 < n) c = (c ^ words[i + 2]) * kMulC, c ^= c >> 29;
  // Two rounds of Mix64, as with two lanes: (a, b) and (c, d) mix side by side.
  const std::uint64_t ab = Mix64(a ^ ((b << 32) | (b >> 32)));
  const std::uint64_t cd = Mix64(c ^ ((d << 32) | (d >> 32)));
  return Mix64(ab ^ (cd * kMulB));
}

// One multiply per 8 bytes (no full mix per word: the caller finishes with
// Mix64), so hashing a label set's few short strings stays a handful of ns.
inline std::uint64_t HashBytes(const char* data, std::size_t n, std::uint64_t seed) noexcept {
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;
  std::uint64_t h = (seed ^ n) * kMul;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    __builtin_memcpy(&w, data + i, 8);
    h = ((h ^ w) * kMul);
    h ^= h >> 29;
  }
  std::uint64_t tail = 0;
  if (i < n) {
    if (n >= 8) {
      __builtin_memcpy(&tail, data + n - 8, 8);  // the last 8 bytes, overlapping: no byte loop
    } else {
      if (n & 4) {
        std::uint32_t w;
        __builtin_memcpy(&w, data, 4);
        tail = w;
        i = 4;
      }
      for (std::size_t k = i * 8; i < n; ++i, k += 8) tail |= std::uint64_t{static_cast<unsigned char>(data[i])} << k;
    }
  }
  h = (h ^ tail) * kMul;
  return h ^ (h >> 29);
}

}  // namespace detail
}  // namespace heapprof
