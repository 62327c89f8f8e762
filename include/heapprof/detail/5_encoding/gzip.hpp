// heapprof: gzip (RFC 1952) around our own deflate (RFC 1951): LZ77 + Huffman.
//
// Runs once per profile write, never inside an allocation hook, so it may allocate.
// The trade-off is zlib's fastest levels: hash chains over 4-byte prefixes,
// searched a few links deep, greedy matching, and ever sparser searches through
// data that does not compress. Symbols are collected in batches; each batch
// becomes one block with its own dynamic Huffman code, or fixed codes or stored
// bytes whenever those come out smaller. Everything else is plain RFC 1951/1952.
//
// Symbols, code lengths, counts and tree nodes are int, as in the arithmetic on
// them (none is ever negative). Where one indexes a std::array, whose operator[]
// takes a size_t, a static_cast converts it at that point, so the arithmetic and
// the code compiled from it stay those of int.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena_allocator.hpp"

namespace heapprof {
namespace detail {

// Appends one complete gzip member holding `in` to `out`.
inline void GzipCompress(std::string_view in, ArenaString& out);

namespace deflate {

// ---------------------------------------------------------------------------
// CRC-32 as gzip defines it (RFC 1952 section 8): reflected polynomial
// 0xEDB88320, initial value and final xor all ones.

// Slicing-by-8: table k holds the CRC of byte i followed by k zero bytes, so one
// step folds eight input bytes with eight independent lookups.
using Crc32Tables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr Crc32Tables MakeCrc32Tables() {
  Crc32Tables tables{};
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    std::uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
    tables[0][byte] = crc;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::size_t byte = 0; byte < 256; ++byte) {
      const std::uint32_t previous = tables[k - 1][byte];
      tables[k][byte] = (previous >> 8) ^ tables[0][previous & 0xFFu];
    }
  }
  return tables;
}

// constexpr: built by the compiler, so there is no initialisation order to get wrong.
inline constexpr Crc32Tables kCrc32Tables = MakeCrc32Tables();

inline std::uint32_t LoadLittleEndian32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

// `crc` is a finished CRC (0 for no data yet), so calls can be chained.
inline std::uint32_t Crc32Update(std::uint32_t crc, const unsigned char* data, std::size_t size) {
  const auto& t = kCrc32Tables;
  crc = ~crc;
  for (; size >= 8; data += 8, size -= 8) {
    const std::uint32_t low = crc ^ LoadLittleEndian32(data);
    const std::uint32_t high = LoadLittleEndian32(data + 4);
    crc = t[7][low & 0xFFu] ^ t[6][(low >> 8) & 0xFFu] ^ t[5][(low >> 16) & 0xFFu] ^
          t[4][low >> 24] ^ t[3][high & 0xFFu] ^ t[2][(high >> 8) & 0xFFu] ^
          t[1][(high >> 16) & 0xFFu] ^ t[0][high >> 24];
  }
  for (; size > 0; ++data, --size) crc = (crc >> 8) ^ t[0][(crc ^ *data) & 0xFFu];
  return ~crc;
}

// ---------------------------------------------------------------------------
// Format constants, all from RFC 1951 section 3.2.5 and 3.2.7.

inline constexpr int kMinMatch = 3;
inline constexpr int kMaxMatch = 258;
inline constexpr int kWindowSize = 32768;
inline constexpr int kEndOfBlock = 256;
inline constexpr int kNumLitLenSymbols = 286;  // 287 and 288 exist only in the fixed code
inline constexpr int kNumFixedLitLenSymbols = 288;
inline constexpr int kNumDistSymbols = 30;
inline constexpr int kNumCodeLengthSymbols = 19;
inline constexpr int kMaxCodeLength = 15;
inline constexpr int kMaxCodeLengthCodeLength = 7;  // the 3-bit fields in the block header
inline constexpr std::size_t kMaxStoredChunk = 65535;  // LEN is 16 bits

inline constexpr std::array<std::uint16_t, 29> kLengthBase = {
    3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
    31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
inline constexpr std::array<std::uint8_t, 29> kLengthExtraBits = {
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
inline constexpr std::array<std::uint16_t, 30> kDistBase = {
    1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
    193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
inline constexpr std::array<std::uint8_t, 30> kDistExtraBits = {
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
// The order the code-length code's lengths are sent in: most likely first, so
// trailing zeros can be cut (HCLEN).
inline constexpr std::array<std::uint8_t, kNumCodeLengthSymbols> kCodeLengthOrder = {
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

// Length code index (symbol - 257) for every match length - kMinMatch.
constexpr std::array<std::uint8_t, 256> MakeLengthCodeTable() {
  std::array<std::uint8_t, 256> table{};
  for (std::size_t code = 0; code + 1 < kLengthBase.size(); ++code) {
    const int first = kLengthBase[code] - kMinMatch;
    const int count = 1 << kLengthExtraBits[code];
    for (int i = 0; i < count && first + i < 256; ++i) {
      table[static_cast<std::size_t>(first + i)] = static_cast<std::uint8_t>(code);
    }
  }
  // 258 could also be written as 227 + 31 with code 284, but RFC 1951 reserves
  // code 285 for it and decoders may reject the other spelling.
  table[kMaxMatch - kMinMatch] = static_cast<std::uint8_t>(kLengthBase.size() - 1);
  return table;
}
inline constexpr std::array<std::uint8_t, 256> kLengthCode = MakeLengthCodeTable();

// Distance code for distance - 1: entries [0, 256) map small distances directly;
// from code 16 on every code spans a multiple of 128 distances, so entries
// [256, 512) are indexed by (distance - 1) >> 7.
constexpr std::array<std::uint8_t, 512> MakeDistCodeTable() {
  std::array<std::uint8_t, 512> table{};
  for (std::size_t code = 0; code < kDistBase.size(); ++code) {
    const int first = kDistBase[code] - 1;
    const int count = 1 << kDistExtraBits[code];
    // Past 256 one entry covers 128 distances; stepping by 128 keeps the
    // constant evaluation well inside compilers' step limits.
    for (int d = first; d < first + count; d += d < 256 ? 1 : 128) {
      if (d < 256) {
        table[static_cast<std::size_t>(d)] = static_cast<std::uint8_t>(code);
      } else {
        table[static_cast<std::size_t>(256 + (d >> 7))] = static_cast<std::uint8_t>(code);
      }
    }
  }
  return table;
}
inline constexpr std::array<std::uint8_t, 512> kDistCodeTable = MakeDistCodeTable();

inline int DistCode(std::uint32_t distance_minus_one) {
  return distance_minus_one < 256 ? kDistCodeTable[distance_minus_one]
                                  : kDistCodeTable[256 + (distance_minus_one >> 7)];
}

// ---------------------------------------------------------------------------
// Huffman codes.

// One canonical code word, already bit-reversed: deflate sends Huffman codes
// most significant bit first but everything else least significant bit first.
struct CodeWord {
  std::uint16_t bits = 0;
  std::uint8_t length = 0;
};

// Repairs a length histogram after every leaf deeper than `max_length` was lifted
// to `max_length`, which over-subscribes the code (Kraft sum > 1). Each step turns
// the deepest leaf above the limit into an internal node whose children are that
// leaf and one leaf taken from the bottom level: the Kraft sum, counted in units of
// 2^-max_length, drops by exactly one, so the loop ends on a complete code.
inline void LimitLengthHistogram(std::uint32_t* count, int max_length) {
  std::uint64_t kraft = 0;
  for (int length = 1; length <= max_length; ++length) {
    kraft += static_cast<std::uint64_t>(count[length]) << (max_length - length);
  }
  const std::uint64_t complete = std::uint64_t{1} << max_length;
  while (kraft > complete) {
    int length = max_length - 1;
    while (count[length] == 0) --length;
    --count[length];
    count[length + 1] += 2;
    --count[max_length];
    --kraft;
  }
}

// Optimal-or-close code lengths for `freqs`, none longer than `max_length`.
// Always yields a complete code: with fewer than two used symbols it hands out
// two 1-bit codes, since a zero-length code cannot be sent and some decoders
// (zlib among them) reject incomplete codes.
inline void BuildCodeLengths(const std::uint32_t* freqs, int num_symbols, int max_length,
                             std::uint8_t* lengths) {
  // Sorted by frequency via one integer key per symbol: frequency above the
  // symbol number, which also breaks ties deterministically.
  std::array<std::uint64_t, kNumFixedLitLenSymbols> keys;
  int used = 0;
  for (int s = 0; s < num_symbols; ++s) {
    lengths[s] = 0;
    if (freqs[s] != 0) {
      keys[static_cast<std::size_t>(used++)] =
          static_cast<std::uint64_t>(freqs[s]) << 16 | static_cast<std::uint64_t>(s);
    }
  }
  if (used < 2) {
    const int first = used == 1 ? static_cast<int>(keys[0] & 0xFFFFu) : 0;
    const int second = first == 0 ? 1 : 0;
    lengths[first] = lengths[second] = 1;
    return;
  }
  std::sort(keys.begin(), keys.begin() + used);
  std::array<std::uint16_t, kNumFixedLitLenSymbols> symbols;
  for (int i = 0; i < used; ++i) {
    const auto at = static_cast<std::size_t>(i);
    symbols[at] = static_cast<std::uint16_t>(keys[at] & 0xFFFFu);
  }

  // Huffman's algorithm with two queues instead of a heap: merged nodes are born
  // in non-decreasing weight order, so both queues stay sorted. Nodes [0, used)
  // are the leaves, [used, 2*used-1) the merged nodes; a parent always has a
  // higher index than its children.
  constexpr int kMaxNodes = 2 * kNumFixedLitLenSymbols;
  std::array<std::uint32_t, kMaxNodes> weight;
  std::array<std::uint16_t, kMaxNodes> parent;
  for (int i = 0; i < used; ++i) {
    const auto at = static_cast<std::size_t>(i);
    weight[at] = freqs[symbols[at]];
  }
  int next_leaf = 0;
  int next_merged = used;
  const int root = 2 * used - 2;
  for (int node = used; node <= root; ++node) {
    int children[2];
    for (int& child : children) {
      const bool take_leaf =
          next_leaf < used && (next_merged >= node || weight[static_cast<std::size_t>(next_leaf)] <=
                                                          weight[static_cast<std::size_t>(next_merged)]);
      child = take_leaf ? next_leaf++ : next_merged++;
    }
    weight[static_cast<std::size_t>(node)] =
        weight[static_cast<std::size_t>(children[0])] + weight[static_cast<std::size_t>(children[1])];
    parent[static_cast<std::size_t>(children[0])] = parent[static_cast<std::size_t>(children[1])] =
        static_cast<std::uint16_t>(node);
  }

  // Depths top-down (reusing `weight`), and a histogram of leaf depths with the
  // too-deep ones lifted to the limit.
  std::array<std::uint32_t, kMaxCodeLength + 1> count{};
  weight[static_cast<std::size_t>(root)] = 0;
  for (int node = root - 1; node >= 0; --node) {
    weight[static_cast<std::size_t>(node)] = weight[parent[static_cast<std::size_t>(node)]] + 1;
    if (node < used) {
      ++count[std::min(weight[static_cast<std::size_t>(node)], static_cast<std::uint32_t>(max_length))];
    }
  }
  LimitLengthHistogram(count.data(), max_length);

  // The least frequent symbols take the longest codes.
  int index = 0;
  for (int length = max_length; length >= 1; --length) {
    for (std::uint32_t i = 0; i < count[static_cast<std::size_t>(length)]; ++i) {
      lengths[symbols[static_cast<std::size_t>(index++)]] = static_cast<std::uint8_t>(length);
    }
  }
}

constexpr std::uint16_t ReverseBits(std::uint32_t value, int length) {
  std::uint32_t reversed = 0;
  for (int i = 0; i < length; ++i, value >>= 1) reversed = (reversed << 1) | (value & 1u);
  return static_cast<std::uint16_t>(reversed);
}

// Canonical code assignment, RFC 1951 section 3.2.2.
constexpr void AssignCodeWords(const std::uint8_t* lengths, int num_symbols, CodeWord* words) {
  std::array<std::uint32_t, kMaxCodeLength + 1> count{};
  for (int s = 0; s < num_symbols; ++s) ++count[lengths[s]];
  count[0] = 0;
  std::array<std::uint32_t, kMaxCodeLength + 1> next_code{};
  std::uint32_t code = 0;
  for (int length = 1; length <= kMaxCodeLength; ++length) {
    code = (code + count[static_cast<std::size_t>(length - 1)]) << 1;
    next_code[static_cast<std::size_t>(length)] = code;
  }
  for (int s = 0; s < num_symbols; ++s) {
    words[s].length = lengths[s];
    words[s].bits = lengths[s] ? ReverseBits(next_code[lengths[s]]++, lengths[s]) : std::uint16_t{0};
  }
}

struct BlockCodes {
  std::array<CodeWord, kNumFixedLitLenSymbols> lit_len{};
  std::array<CodeWord, kNumDistSymbols> dist{};
};

// The fixed code of block type 1, RFC 1951 section 3.2.6.
constexpr BlockCodes MakeFixedCodes() {
  BlockCodes codes;
  std::array<std::uint8_t, kNumFixedLitLenSymbols> lengths{};
  for (std::size_t s = 0; s < kNumFixedLitLenSymbols; ++s) {
    lengths[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : 8;
  }
  AssignCodeWords(lengths.data(), kNumFixedLitLenSymbols, codes.lit_len.data());
  std::array<std::uint8_t, kNumDistSymbols> dist_lengths{};
  for (auto& length : dist_lengths) length = 5;
  AssignCodeWords(dist_lengths.data(), kNumDistSymbols, codes.dist.data());
  return codes;
}
inline constexpr BlockCodes kFixedCodes = MakeFixedCodes();

// Extra bits after code-length symbols 16, 17 and 18 (RFC 1951 3.2.7).
inline constexpr std::array<int, 3> kRepeatExtraBits = {2, 3, 7};

// ---------------------------------------------------------------------------
// Output.

// Spelled out byte by byte so no endianness test is needed; GCC and Clang
// merge each into one load or store on little-endian hosts.
inline std::uint64_t LoadLittleEndian64(const unsigned char* p) {
  return static_cast<std::uint64_t>(p[0]) | static_cast<std::uint64_t>(p[1]) << 8 |
         static_cast<std::uint64_t>(p[2]) << 16 | static_cast<std::uint64_t>(p[3]) << 24 |
         static_cast<std::uint64_t>(p[4]) << 32 | static_cast<std::uint64_t>(p[5]) << 40 |
         static_cast<std::uint64_t>(p[6]) << 48 | static_cast<std::uint64_t>(p[7]) << 56;
}

inline void StoreLittleEndian64(unsigned char* p, std::uint64_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
  p[2] = static_cast<unsigned char>(v >> 16);
  p[3] = static_cast<unsigned char>(v >> 24);
  p[4] = static_cast<unsigned char>(v >> 32);
  p[5] = static_cast<unsigned char>(v >> 40);
  p[6] = static_cast<unsigned char>(v >> 48);
  p[7] = static_cast<unsigned char>(v >> 56);
}

// Writes bits least significant first straight into the tail of an ArenaString.
// Every Put stores all eight accumulator bytes and then advances past the whole
// ones, so there is no flush branch; the caller reserves room for a whole block
// first, so Put has no bounds check either.
class BitWriter {
 public:
  // One Put takes up to this many bits: at most 7 are pending before it.
  static constexpr int kMaxPutBits = 56;

  explicit BitWriter(ArenaString& out) : out_(out), pos_(out.size()) {}

  void Reserve(std::size_t bytes) {
    // +8: Put stores eight bytes even when it completes fewer.
    if (out_.size() < pos_ + bytes + 8) out_.resize(pos_ + bytes + 8);
    buffer_ = reinterpret_cast<unsigned char*>(&out_[0]);
  }

  std::uint64_t BitPosition() const { return pos_ * 8 + static_cast<std::uint64_t>(pending_); }

  void Put(std::uint64_t value, int count) {
    bits_ |= value << pending_;
    pending_ += count;
    StoreLittleEndian64(buffer_ + pos_, bits_);
    pos_ += static_cast<std::size_t>(pending_ >> 3);
    bits_ >>= pending_ & ~7;
    pending_ &= 7;
  }

  void AlignToByte() {
    if (pending_ > 0) buffer_[pos_++] = static_cast<unsigned char>(bits_);
    bits_ = 0;
    pending_ = 0;
  }

  // Only after AlignToByte.
  void PutBytes(const unsigned char* data, std::size_t size) {
    if (size == 0) return;  // data may be null for an empty input
    std::memcpy(buffer_ + pos_, data, size);
    pos_ += size;
  }

  // Flushes the last partial byte and trims the reserved slack.
  void Finish() {
    AlignToByte();
    out_.resize(pos_);
  }

 private:
  ArenaString& out_;
  unsigned char* buffer_ = nullptr;
  std::size_t pos_;
  std::uint64_t bits_ = 0;
  int pending_ = 0;  // < 8 between calls
};

// ---------------------------------------------------------------------------
// Matching parameters, measured on a synthetic 1 MiB pprof profile (varints,
// C++ names, addresses): chains of 1 to 8 cost about the same time there, 4
// keeps most of 8's gain; the result is ~10% smaller than gzip -1 and faster
// than zlib level 1. Deeper search or lazy matching would buy a few percent for
// a large share of the time.

inline constexpr int kHashBits = 16;
inline constexpr int kMaxChain = 4;
inline constexpr int kNiceMatch = 64;       // good enough: stop walking the chain
inline constexpr int kMaxInsertMatch = 8;   // longer matches index only their ends
// Searches since the last match before the search step grows by one byte;
// LZ4's default trigger. Makes incompressible data ~8x cheaper.
inline constexpr int kSkipShift = 6;
// 2^32 / golden ratio: multiplicative hashing that spreads nearby keys well.
inline constexpr std::uint32_t kHashMultiplier = 2654435761u;
// One distance short of the 32 KiB window so a chain link read at the far edge
// has never been overwritten by the current position (both map to one slot).
inline constexpr int kMaxDistance = kWindowSize - 1;
// Symbols per block: large enough that the ~60-byte dynamic header is noise,
// small enough that codes follow changes in the data (strings vs. samples).
inline constexpr std::size_t kMaxBlockSymbols = std::size_t{1} << 14;
// Positions are stored as int32 offsets from the start of a segment; beyond
// that the match tables restart, costing a few bytes per GiB.
inline constexpr std::size_t kMaxSegment = std::size_t{1} << 30;
inline constexpr std::int32_t kNoPosition = -(1 << 20);  // farther back than any window

inline std::uint32_t LoadNative32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline std::uint32_t HashPrefix(const unsigned char* p) {
  return (LoadNative32(p) * kHashMultiplier) >> (32 - kHashBits);
}

// Number of equal leading bytes of a and b, at most `limit`.
inline std::size_t CommonPrefixLength(const unsigned char* a, const unsigned char* b,
                                      std::size_t limit) {
  std::size_t length = 0;
  for (; length + 8 <= limit; length += 8) {
    const std::uint64_t difference = LoadLittleEndian64(a + length) ^ LoadLittleEndian64(b + length);
    // Little-endian loads put the first differing byte at the lowest set bit.
    // (config.hpp rules out compilers without the builtin.)
    if (difference != 0) return length + static_cast<std::size_t>(__builtin_ctzll(difference) >> 3);
  }
  while (length < limit && a[length] == b[length]) ++length;
  return length;
}

// A match token has the top bit set and holds (distance - 1) << 8 | (length - 3);
// a literal token is the byte itself.
inline constexpr std::uint32_t kMatchFlag = 0x80000000u;

class Encoder {
 public:
  // `max_segment` exists for tests, which cannot afford GiB inputs.
  explicit Encoder(ArenaString& out, std::size_t max_segment = kMaxSegment)
      : writer_(out),
        max_segment_(std::min(std::max<std::size_t>(max_segment, 1), kMaxSegment)),
        head_(std::size_t{1} << kHashBits),
        prev_(kWindowSize),
        tokens_(kMaxBlockSymbols) {}

  // Appends the raw deflate stream for `data`, ending with a final block.
  // Once per Encoder.
  void Compress(const unsigned char* data, std::size_t size) {
    std::size_t offset = 0;
    do {
      const std::size_t segment = std::min(size - offset, max_segment_);
      CompressSegment(data + offset, segment, offset + segment == size);
      offset += segment;
    } while (offset < size);
    writer_.Finish();
  }

 private:
  void CompressSegment(const unsigned char* data, std::size_t size, bool last) {
    std::fill(head_.begin(), head_.end(), kNoPosition);
    std::fill(prev_.begin(), prev_.end(), kNoPosition);
    const unsigned char* block_start = data;
    std::size_t pos = 0;
    // A position can start a match only with four bytes to hash.
    const std::size_t hash_end = size >= 4 ? size - 3 : 0;
    std::size_t misses = 0;  // match searches since the last match
    while (pos < size) {
      const Match match = pos < hash_end ? FindMatch(data, size, pos) : Match{};
      if (match.length >= static_cast<std::size_t>(kMinMatch)) {
        AddMatch(match.length, match.distance);
        IndexMatch(data, pos, match.length, hash_end);
        pos += match.length;
        misses = 0;
      } else {
        // In data that does not compress, search ever more sparsely (the skip
        // heuristic of LZ4 and Snappy): the bytes between searches still go
        // out as literals, and the first match found resets the pace.
        std::size_t step = 1 + (misses++ >> kSkipShift);
        step = std::min({step, size - pos, kMaxBlockSymbols - num_tokens_});
        for (std::size_t i = 0; i < step; ++i) AddLiteral(data[pos + i]);
        pos += step;
      }
      if (num_tokens_ == kMaxBlockSymbols) {
        const unsigned char* block_end = data + pos;
        FlushBlock(block_start, static_cast<std::size_t>(block_end - block_start), last && pos == size);
        block_start = block_end;
      }
    }
    if (num_tokens_ != 0 || (last && !final_written_)) {
      FlushBlock(block_start, static_cast<std::size_t>(data + size - block_start), last);
    }
  }

  // Indexes the positions inside a match so later data can refer into it.
  // Long matches index only their head and their last bytes: the middle of a
  // long repeat is rarely the best source, and its tail is where the next
  // search starts (runs then match at distance 1).
  void IndexMatch(const unsigned char* data, std::size_t pos, std::size_t length, std::size_t hash_end) {
    const std::size_t end = std::min(pos + length, hash_end);
    const std::size_t head_end = std::min(pos + std::min<std::size_t>(length, kMaxInsertMatch), end);
    for (std::size_t p = pos + 1; p < head_end; ++p) Insert(data, p);
    for (std::size_t p = std::max(head_end, end >= 2 ? end - 2 : 0); p < end; ++p) Insert(data, p);
  }

  void Insert(const unsigned char* data, std::size_t pos) {
    const std::uint32_t hash = HashPrefix(data + pos);
    prev_[pos & (kWindowSize - 1)] = head_[hash];
    head_[hash] = static_cast<std::int32_t>(pos);
  }

  // Greedy: the longest match among the last kMaxChain positions sharing the
  // hash of the next four bytes. Also indexes `pos`.
  struct Match {
    std::size_t length = 0;  // 0: none
    std::size_t distance = 0;
  };

  Match FindMatch(const unsigned char* data, std::size_t size, std::size_t pos) {
    const std::uint32_t hash = HashPrefix(data + pos);
    std::int32_t candidate = head_[hash];
    prev_[pos & (kWindowSize - 1)] = candidate;
    head_[hash] = static_cast<std::int32_t>(pos);

    const std::int64_t here = static_cast<std::int64_t>(pos);
    const std::size_t max_length = std::min<std::size_t>(kMaxMatch, size - pos);
    const unsigned char* current = data + pos;
    const std::uint32_t prefix = LoadNative32(current);
    Match best;
    for (int chain = kMaxChain; chain > 0 && here - candidate <= kMaxDistance; --chain) {
      const unsigned char* earlier = data + candidate;
      // Checking the byte that would extend the best match rejects most
      // candidates with one load.
      if (earlier[best.length] == current[best.length] && LoadNative32(earlier) == prefix) {
        const std::size_t length = 4 + CommonPrefixLength(earlier + 4, current + 4, max_length - 4);
        if (length > best.length) {
          best.length = length;
          best.distance = static_cast<std::size_t>(here - candidate);
          if (length >= static_cast<std::size_t>(kNiceMatch) || length == max_length) break;
        }
      }
      const std::int32_t next = prev_[static_cast<std::size_t>(candidate) & (kWindowSize - 1)];
      if (next >= candidate) break;  // a stale slot from a later position
      candidate = next;
    }
    return best;
  }

  void AddLiteral(unsigned char byte) {
    tokens_[num_tokens_++] = byte;
    ++lit_freqs_[byte];
  }

  void AddMatch(std::size_t length, std::size_t distance) {
    const auto length_index = static_cast<std::uint32_t>(length - kMinMatch);
    const auto distance_index = static_cast<std::uint32_t>(distance - 1);
    tokens_[num_tokens_++] = kMatchFlag | distance_index << 8 | length_index;
    ++lit_freqs_[kEndOfBlock + 1 + kLengthCode[length_index]];
    ++dist_freqs_[static_cast<std::size_t>(DistCode(distance_index))];
  }

  // Bits the block's symbols take under `codes`, headers excluded.
  std::uint64_t SymbolBits(const BlockCodes& codes) const {
    std::uint64_t bits = 0;
    for (int s = 0; s < kNumLitLenSymbols; ++s) {
      const auto at = static_cast<std::size_t>(s);
      std::uint64_t per_symbol = codes.lit_len[at].length;
      if (s > kEndOfBlock) per_symbol += kLengthExtraBits[static_cast<std::size_t>(s - kEndOfBlock - 1)];
      bits += per_symbol * lit_freqs_[at];
    }
    for (int s = 0; s < kNumDistSymbols; ++s) {
      const auto at = static_cast<std::size_t>(s);
      bits += static_cast<std::uint64_t>(codes.dist[at].length + kDistExtraBits[at]) * dist_freqs_[at];
    }
    return bits;
  }

  // Bits of stored blocks for `size` bytes starting at `bit_position`.
  static std::uint64_t StoredBits(std::uint64_t bit_position, std::size_t size) {
    std::uint64_t bits = 0;
    std::size_t left = size;
    do {
      const std::size_t chunk = std::min(left, kMaxStoredChunk);
      const std::uint64_t after_header = bit_position + bits + 3;
      bits += 3 + (8 - after_header % 8) % 8 + 32 + 8 * static_cast<std::uint64_t>(chunk);
      left -= chunk;
    } while (left > 0);
    return bits;
  }

  // A dynamic block header: code lengths run-length coded with symbols 16-18,
  // those symbols Huffman coded in turn.
  struct DynamicHeader {
    int num_lit_len = 0;  // HLIT + 257
    int num_dist = 0;     // HDIST + 1
    int num_code_length_codes = 0;  // HCLEN + 4
    std::array<std::uint8_t, kNumCodeLengthSymbols> code_length_lengths{};
    std::array<CodeWord, kNumCodeLengthSymbols> code_length_words{};
    // Each entry: symbol in the low byte, repeat-count extra bits above.
    ArenaVector<std::uint16_t> runs;
    std::uint64_t bits = 0;
  };

  static void RunLengthEncode(const std::uint8_t* lengths, int count, ArenaVector<std::uint16_t>* runs) {
    for (int i = 0; i < count;) {
      const std::uint8_t value = lengths[i];
      int run = 1;
      while (i + run < count && lengths[i + run] == value) ++run;
      i += run;
      if (value == 0) {
        // 18 repeats a zero 11-138 times, 17 repeats it 3-10 times.
        for (; run >= 11; run -= std::min(run, 138)) {
          runs->push_back(static_cast<std::uint16_t>(18 | (std::min(run, 138) - 11) << 8));
        }
        if (run >= 3) {
          runs->push_back(static_cast<std::uint16_t>(17 | (run - 3) << 8));
          run = 0;
        }
      } else {
        // 16 repeats the previous length 3-6 times.
        runs->push_back(value);
        --run;
        for (; run >= 3; run -= std::min(run, 6)) {
          runs->push_back(static_cast<std::uint16_t>(16 | (std::min(run, 6) - 3) << 8));
        }
      }
      for (; run > 0; --run) runs->push_back(value);
    }
  }

  static void BuildDynamicHeader(const std::uint8_t* lit_len_lengths, const std::uint8_t* dist_lengths,
                                 DynamicHeader* header) {
    header->num_lit_len = kNumLitLenSymbols;
    while (header->num_lit_len > kEndOfBlock + 1 && lit_len_lengths[header->num_lit_len - 1] == 0) {
      --header->num_lit_len;
    }
    header->num_dist = kNumDistSymbols;
    while (header->num_dist > 1 && dist_lengths[header->num_dist - 1] == 0) --header->num_dist;

    // Runs may cross from the literal/length lengths into the distance lengths
    // (RFC 1951 3.2.7: one sequence), so encode them as one array.
    std::array<std::uint8_t, kNumLitLenSymbols + kNumDistSymbols> all{};
    std::copy(lit_len_lengths, lit_len_lengths + header->num_lit_len, all.begin());
    std::copy(dist_lengths, dist_lengths + header->num_dist, all.begin() + header->num_lit_len);
    header->runs.clear();
    RunLengthEncode(all.data(), header->num_lit_len + header->num_dist, &header->runs);

    std::array<std::uint32_t, kNumCodeLengthSymbols> freqs{};
    for (std::uint16_t run : header->runs) ++freqs[run & 0xFFu];
    BuildCodeLengths(freqs.data(), kNumCodeLengthSymbols, kMaxCodeLengthCodeLength,
                     header->code_length_lengths.data());
    AssignCodeWords(header->code_length_lengths.data(), kNumCodeLengthSymbols,
                    header->code_length_words.data());
    header->num_code_length_codes = kNumCodeLengthSymbols;
    while (header->num_code_length_codes > 4 &&
           header->code_length_lengths[kCodeLengthOrder[static_cast<std::size_t>(
               header->num_code_length_codes - 1)]] == 0) {
      --header->num_code_length_codes;
    }

    std::uint64_t bits = 3 + 5 + 5 + 4 + 3 * static_cast<std::uint64_t>(header->num_code_length_codes);
    for (int s = 0; s < kNumCodeLengthSymbols; ++s) {
      const auto at = static_cast<std::size_t>(s);
      const int extra = s >= 16 ? kRepeatExtraBits[static_cast<std::size_t>(s - 16)] : 0;
      bits += static_cast<std::uint64_t>(header->code_length_lengths[at] + extra) * freqs[at];
    }
    header->bits = bits;
  }

  void FlushBlock(const unsigned char* raw, std::size_t raw_size, bool final) {
    lit_freqs_[kEndOfBlock] = 1;

    std::array<std::uint8_t, kNumLitLenSymbols> lit_len_lengths;
    std::array<std::uint8_t, kNumDistSymbols> dist_lengths;
    BuildCodeLengths(lit_freqs_.data(), kNumLitLenSymbols, kMaxCodeLength, lit_len_lengths.data());
    BuildCodeLengths(dist_freqs_.data(), kNumDistSymbols, kMaxCodeLength, dist_lengths.data());
    BlockCodes dynamic;
    AssignCodeWords(lit_len_lengths.data(), kNumLitLenSymbols, dynamic.lit_len.data());
    AssignCodeWords(dist_lengths.data(), kNumDistSymbols, dynamic.dist.data());
    BuildDynamicHeader(lit_len_lengths.data(), dist_lengths.data(), &header_);

    const BlockCodes& fixed = kFixedCodes;
    const std::uint64_t dynamic_bits = header_.bits + SymbolBits(dynamic);
    const std::uint64_t fixed_bits = 3 + SymbolBits(fixed);
    const std::uint64_t stored_bits = StoredBits(writer_.BitPosition(), raw_size);

    const std::uint64_t best = std::min({dynamic_bits, fixed_bits, stored_bits});
    writer_.Reserve(best / 8 + 16);
    const std::uint32_t final_bit = final ? 1u : 0u;
    if (best == stored_bits) {
      WriteStored(raw, raw_size, final_bit);
    } else if (best == fixed_bits) {
      writer_.Put(final_bit | 1u << 1, 3);
      WriteSymbols(fixed);
    } else {
      writer_.Put(final_bit | 2u << 1, 3);
      WriteDynamicHeader(header_);
      WriteSymbols(dynamic);
    }
    final_written_ = final_written_ || final;
    num_tokens_ = 0;
    lit_freqs_.fill(0);
    dist_freqs_.fill(0);
  }

  void WriteStored(const unsigned char* raw, std::size_t size, std::uint32_t final_bit) {
    std::size_t left = size;
    do {
      const std::size_t chunk = std::min(left, kMaxStoredChunk);
      left -= chunk;
      writer_.Put(left == 0 ? final_bit : 0u, 3);
      writer_.AlignToByte();
      const auto len = static_cast<std::uint32_t>(chunk);
      writer_.Put(len | (~len & 0xFFFFu) << 16, 32);
      writer_.PutBytes(raw, chunk);
      raw += chunk;
    } while (left > 0);
  }

  void WriteDynamicHeader(const DynamicHeader& header) {
    writer_.Put(static_cast<std::uint32_t>(header.num_lit_len - 257), 5);
    writer_.Put(static_cast<std::uint32_t>(header.num_dist - 1), 5);
    writer_.Put(static_cast<std::uint32_t>(header.num_code_length_codes - 4), 4);
    for (int i = 0; i < header.num_code_length_codes; ++i) {
      writer_.Put(header.code_length_lengths[kCodeLengthOrder[static_cast<std::size_t>(i)]], 3);
    }
    for (std::uint16_t run : header.runs) {
      const int symbol = run & 0xFF;
      const CodeWord& word = header.code_length_words[static_cast<std::size_t>(symbol)];
      writer_.Put(word.bits, word.length);
      if (symbol >= 16) writer_.Put(run >> 8, kRepeatExtraBits[static_cast<std::size_t>(symbol - 16)]);
    }
  }

  void WriteSymbols(const BlockCodes& codes) {
    // Each match length's code and extra bits, joined once per block.
    struct Joined {
      std::uint32_t bits;
      int count;
    };
    std::array<Joined, kMaxMatch - kMinMatch + 1> lengths;
    for (std::size_t index = 0; index < lengths.size(); ++index) {
      const int code = kLengthCode[index];
      const auto at = static_cast<std::size_t>(code);
      const CodeWord& word = codes.lit_len[static_cast<std::size_t>(kEndOfBlock + 1 + code)];
      const auto extra = static_cast<std::uint32_t>(index + kMinMatch - kLengthBase[at]);
      lengths[index] = {word.bits | extra << word.length, word.length + kLengthExtraBits[at]};
    }
    // Length (at most 15 + 5 bits) and distance (15 + 13) fit one Put.
    static_assert(2 * kMaxCodeLength + 5 + 13 <= BitWriter::kMaxPutBits, "a match needs two Puts");
    for (std::size_t i = 0; i < num_tokens_; ++i) {
      const std::uint32_t token = tokens_[i];
      if ((token & kMatchFlag) == 0) {
        const CodeWord& word = codes.lit_len[token];
        writer_.Put(word.bits, word.length);
        continue;
      }
      const Joined& length = lengths[token & 0xFFu];
      const std::uint32_t distance_index = (token >> 8) & 0x7FFFu;
      const auto dist_code = static_cast<std::size_t>(DistCode(distance_index));
      const CodeWord& dist_word = codes.dist[dist_code];
      const std::uint64_t dist_extra = distance_index + 1 - kDistBase[dist_code];
      const std::uint64_t dist_bits = dist_word.bits | dist_extra << dist_word.length;
      writer_.Put(length.bits | dist_bits << length.count,
                  length.count + dist_word.length + kDistExtraBits[dist_code]);
    }
    const CodeWord& end = codes.lit_len[kEndOfBlock];
    writer_.Put(end.bits, end.length);
  }

  BitWriter writer_;
  std::size_t max_segment_;
  ArenaVector<std::int32_t> head_;  // hash -> latest position with that hash
  ArenaVector<std::int32_t> prev_;  // position % window -> previous position, same hash
  ArenaVector<std::uint32_t> tokens_;
  std::size_t num_tokens_ = 0;
  std::array<std::uint32_t, kNumLitLenSymbols> lit_freqs_{};
  std::array<std::uint32_t, kNumDistSymbols> dist_freqs_{};
  DynamicHeader header_;  // kept to reuse the run buffer between blocks
  bool final_written_ = false;
};

// RFC 1952 2.3: magic, CM = 8 (deflate), no flags, MTIME = 0 so equal input
// gives equal bytes, XFL = 0, OS = 255 (unknown) so the bytes do not depend on
// the host either.
inline constexpr std::array<char, 10> kGzipHeader = {'\x1f', '\x8b', 8, 0, 0, 0, 0, 0, 0, '\xff'};

}  // namespace deflate

inline void GzipCompress(std::string_view in, ArenaString& out) {
  const auto* data = reinterpret_cast<const unsigned char*>(in.data());
  out.append(deflate::kGzipHeader.data(), deflate::kGzipHeader.size());
  deflate::Encoder(out).Compress(data, in.size());
  const std::uint32_t crc = deflate::Crc32Update(0, data, in.size());
  // ISIZE is the length modulo 2^32.
  const auto size = static_cast<std::uint32_t>(in.size());
  for (std::uint32_t word : {crc, size}) {
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>((word >> shift) & 0xFFu));
  }
}

}  // namespace detail
}  // namespace heapprof
