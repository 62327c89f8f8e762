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

// The 64x64 -> 128-bit product of x and y, its halves xored: one multiply
// mixes two words (as in wyhash's "mum"). Every platform heapprof is enabled
// on (config.hpp: x86-64 and AArch64, GCC and Clang) has __int128; this
// header is compiled only there.
// (__extension__: no -Wpedantic warning in the including program.)
__extension__ typedef unsigned __int128 Uint128;
inline std::uint64_t FoldMultiply(std::uint64_t x, std::uint64_t y) noexcept {
  const Uint128 p = static_cast<Uint128>(x) * y;
  return static_cast<std::uint64_t>(p) ^ static_cast<std::uint64_t>(p >> 64);
}

// Xored into a word before it is folded (HashWords, the bucket hash of
// 2_sampling/buckets.hpp): non-canonical on x86-64 and AArch64 (bits 48-63
// neither all 0 nor all 1), so no address xored with one gives a zero factor.
constexpr std::uint64_t kFoldS0 = 0xA0761D6478BD642Full;
constexpr std::uint64_t kFoldS1 = 0xE7037ED1A0B428DBull;
constexpr std::uint64_t kFoldS2 = 0x8EBC6AF09C88C6E3ull;
constexpr std::uint64_t kFoldS3 = 0x589965CC75374CC3ull;

// A sampled stack's PCs, on every sample: two lanes, each folding two words
// into its state with one multiply (a PC xored with a constant that no
// canonical address equals, times the other PC xored with the lane's state),
// so four words hash in the latency of one multiply and an xor; then a full
// mix. HashCombine per word cost ~20 instructions in a serial chain (a
// quarter of a rate-1 sample at depth 24, callgrind); one multiply and
// xor-shift per word in two lanes was still ~10% of a sample on random
// stacks at depth 32 (perf), four lanes ~9 instructions a word.
inline std::uint64_t HashWords(const std::uintptr_t* words, std::size_t n, std::uint64_t seed) noexcept {
  constexpr std::uint64_t kMulA = 0x9E3779B97F4A7C15ull;
  constexpr std::uint64_t kMulB = 0xC2B2AE3D27D4EB4Full;
  std::uint64_t a = (seed ^ n) * kMulA;
  std::uint64_t b = seed * kMulB + n;
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a = FoldMultiply(words[i] ^ kFoldS0, words[i + 1] ^ a);
    b = FoldMultiply(words[i + 2] ^ kFoldS1, words[i + 3] ^ b);
  }
  // The last 0-3 words.
  if (i + 2 <= n) {
    a = FoldMultiply(words[i] ^ kFoldS2, words[i + 1] ^ a);
    i += 2;
  }
  if (i < n) b = FoldMultiply(words[i] ^ kFoldS3, b ^ kFoldS2);
  return Mix64(a ^ Mix64(b));
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
