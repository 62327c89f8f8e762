// Test-only gzip (RFC 1952) and inflate (RFC 1951) decoder.
//
// Written apart from heapprof's encoder so that tests do not check the encoder
// against its own reading of the RFC. It is as strict as zlib where the RFC leaves
// room (over-subscribed or incomplete codes, distances past the start of the
// output, symbols 286/287 and 30/31) so that anything it accepts, zlib-based
// readers such as `go tool pprof` accept too. Every read is bounds-checked: a
// malformed stream makes Gunzip return false, never read outside `gz`.
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

namespace heapprof_test {

// Decodes every gzip member in `gz` (concatenated members are concatenated, as
// `gzip -dc` does) into `out`, replacing its contents. Returns false, with `out`
// cleared, on any malformed input: bad header, bad deflate data, CRC-32 or
// ISIZE mismatch, truncation or trailing bytes.
bool Gunzip(std::string_view gz, std::string& out);

namespace inflate_detail {

constexpr std::array<std::uint32_t, 256> MakeCrcTable() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t n = 0; n < 256; ++n) {
    std::uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}
inline constexpr std::array<std::uint32_t, 256> kCrcTable = MakeCrcTable();

// Plain byte-at-a-time CRC-32 (RFC 1952 section 8), deliberately not the
// encoder's sliced version.
inline std::uint32_t Crc32(const unsigned char* data, std::size_t size) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) c = kCrcTable[(c ^ data[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

#ifdef HEAPPROF_TEST_SUPPORT_IMPLEMENTATION  // compiled once: tests/support/support_impl.cpp
// Reads bits least significant first from a byte range.
class BitReader {
 public:
  BitReader(const unsigned char* data, std::size_t size) : data_(data), size_(size) {}

  // Up to 57 bits buffered, as many as the input still has.
  void Refill() {
    while (count_ <= 56 && pos_ < size_) {
      bits_ |= static_cast<std::uint64_t>(data_[pos_++]) << count_;
      count_ += 8;
    }
  }

  bool Read(int count, std::uint32_t* value) {
    if (count_ < count) {
      Refill();
      if (count_ < count) return false;
    }
    *value = static_cast<std::uint32_t>(bits_ & ((std::uint64_t{1} << count) - 1));
    bits_ >>= count;
    count_ -= count;
    return true;
  }

  // The next `count` bits, zero-padded past the end of the input.
  std::uint32_t Peek(int count) {
    if (count_ < count) Refill();
    return static_cast<std::uint32_t>(bits_ & ((std::uint64_t{1} << count) - 1));
  }

  bool Skip(int count) {
    if (count > count_) return false;
    bits_ >>= count;
    count_ -= count;
    return true;
  }

  // Drops the rest of the current byte and hands whole buffered bytes back to
  // the input, so byte-level reads continue exactly after the bit stream.
  void AlignToByte() {
    pos_ -= static_cast<std::size_t>(count_ / 8);
    bits_ = 0;
    count_ = 0;
  }

  // Only after AlignToByte.
  std::size_t BytePosition() const { return pos_; }
  bool TakeBytes(std::size_t n, const unsigned char** bytes) {
    if (n > size_ - pos_) return false;
    *bytes = data_ + pos_;
    pos_ += n;
    return true;
  }

 private:
  const unsigned char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::uint64_t bits_ = 0;
  int count_ = 0;
};

inline constexpr int kMaxBits = 15;

// A canonical Huffman code decoded by one lookup in a table indexed by the next
// max-length bits (reversed, as they arrive).
class HuffmanDecoder {
 public:
  enum class Incomplete { kReject, kAllowSingleCode };

  bool Build(const std::uint8_t* lengths, int num_symbols, Incomplete incomplete) {
    std::array<int, kMaxBits + 1> count{};
    for (int s = 0; s < num_symbols; ++s) {
      if (lengths[s] > kMaxBits) return false;
      ++count[lengths[s]];
    }
    count[0] = 0;
    int used = 0;
    int left = 1;  // unused code space at the current length
    max_length_ = 0;
    for (int length = 1; length <= kMaxBits; ++length) {
      left = left * 2 - count[length];
      if (left < 0) return false;  // over-subscribed
      used += count[length];
      if (count[length] != 0) max_length_ = length;
    }
    if (left > 0) {
      // zlib's rule: the one incomplete code it accepts is a single 1-bit code,
      // and no code at all (a block without matches may send no distances).
      const bool single = used == 1 && count[1] == 1;
      if (incomplete == Incomplete::kReject || !(single || used == 0)) return false;
    }
    table_.assign(std::size_t{1} << max_length_, 0);
    if (used == 0) return true;  // every lookup fails

    std::array<int, kMaxBits + 1> next_code{};
    int code = 0;
    for (int length = 1; length <= kMaxBits; ++length) {
      code = (code + count[length - 1]) << 1;
      next_code[length] = code;
    }
    for (int s = 0; s < num_symbols; ++s) {
      const int length = lengths[s];
      if (length == 0) continue;
      int reversed = 0;
      for (int i = 0, c = next_code[length]++; i < length; ++i, c >>= 1) reversed = (reversed << 1) | (c & 1);
      const auto entry = static_cast<std::uint16_t>(s << 4 | length);
      for (std::size_t i = static_cast<std::size_t>(reversed); i < table_.size(); i += std::size_t{1} << length) {
        table_[i] = entry;
      }
    }
    return true;
  }

  // The next symbol, or -1 for an unassigned code or the end of the input.
  int Decode(BitReader& in) const {
    const std::uint16_t entry = table_[in.Peek(max_length_)];
    const int length = entry & 15;
    if (length == 0 || !in.Skip(length)) return -1;
    return entry >> 4;
  }

 private:
  std::vector<std::uint16_t> table_{0};
  int max_length_ = 0;
};

// RFC 1951 section 3.2.5.
inline constexpr std::uint16_t kLengthBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                           31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
inline constexpr std::uint8_t kLengthExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                           2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
inline constexpr std::uint16_t kDistBase[30] = {1,    2,    3,    4,    5,    7,     9,     13,    17,  25,
                                         33,   49,   65,   97,   129,  193,   257,   385,   513, 769,
                                         1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
inline constexpr std::uint8_t kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                         6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
inline constexpr std::uint8_t kCodeLengthOrder[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

// Output buffer that grows geometrically; `window_start` is where the current
// member began, the earliest byte a distance may reach.
struct Output {
  std::string& bytes;
  std::size_t size;
  std::size_t window_start;

  void Reserve(std::size_t extra) {
    if (bytes.size() - size < extra) bytes.resize(std::max(bytes.size() * 2, size + extra));
  }
};

inline bool DecodeBlockData(BitReader& in, const HuffmanDecoder& lit_len, const HuffmanDecoder& dist,
                            Output& out) {
  for (;;) {
    const int symbol = lit_len.Decode(in);
    if (symbol < 0) return false;
    if (symbol < 256) {
      out.Reserve(1);
      out.bytes[out.size++] = static_cast<char>(symbol);
      continue;
    }
    if (symbol == 256) return true;
    if (symbol > 285) return false;
    std::uint32_t extra = 0;
    if (!in.Read(kLengthExtra[symbol - 257], &extra)) return false;
    const std::size_t length = kLengthBase[symbol - 257] + extra;
    const int dist_symbol = dist.Decode(in);
    if (dist_symbol < 0 || dist_symbol > 29) return false;
    if (!in.Read(kDistExtra[dist_symbol], &extra)) return false;
    const std::size_t distance = kDistBase[dist_symbol] + extra;
    if (distance > out.size - out.window_start) return false;
    out.Reserve(length);
    char* to = &out.bytes[out.size];
    const char* from = to - distance;
    for (std::size_t i = 0; i < length; ++i) to[i] = from[i];  // may overlap: byte order matters
    out.size += length;
  }
}

inline bool InflateStored(BitReader& in, Output& out) {
  in.AlignToByte();
  const unsigned char* header = nullptr;
  if (!in.TakeBytes(4, &header)) return false;
  const unsigned length = header[0] | header[1] << 8;
  const unsigned complement = header[2] | header[3] << 8;
  if ((length ^ 0xFFFFu) != complement) return false;
  const unsigned char* bytes = nullptr;
  if (!in.TakeBytes(length, &bytes)) return false;
  out.Reserve(length);
  if (length != 0) std::memcpy(&out.bytes[out.size], bytes, length);
  out.size += length;
  return true;
}

inline bool InflateFixed(BitReader& in, Output& out) {
  std::uint8_t lengths[288 + 32];
  for (int s = 0; s < 288; ++s) lengths[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : 8;
  for (int s = 0; s < 32; ++s) lengths[288 + s] = 5;
  HuffmanDecoder lit_len;
  HuffmanDecoder dist;
  lit_len.Build(lengths, 288, HuffmanDecoder::Incomplete::kReject);
  dist.Build(lengths + 288, 32, HuffmanDecoder::Incomplete::kReject);
  return DecodeBlockData(in, lit_len, dist, out);
}

inline bool InflateDynamic(BitReader& in, Output& out) {
  std::uint32_t hlit = 0, hdist = 0, hclen = 0;
  if (!in.Read(5, &hlit) || !in.Read(5, &hdist) || !in.Read(4, &hclen)) return false;
  const int num_lit_len = static_cast<int>(hlit) + 257;
  const int num_dist = static_cast<int>(hdist) + 1;
  if (num_lit_len > 286 || num_dist > 30) return false;

  std::uint8_t code_length_lengths[19] = {};
  for (std::uint32_t i = 0; i < hclen + 4; ++i) {
    std::uint32_t length = 0;
    if (!in.Read(3, &length)) return false;
    code_length_lengths[kCodeLengthOrder[i]] = static_cast<std::uint8_t>(length);
  }
  HuffmanDecoder code_length_code;
  if (!code_length_code.Build(code_length_lengths, 19, HuffmanDecoder::Incomplete::kReject)) return false;

  std::uint8_t lengths[286 + 30] = {};
  const int total = num_lit_len + num_dist;
  for (int i = 0; i < total;) {
    const int symbol = code_length_code.Decode(in);
    if (symbol < 0) return false;
    if (symbol < 16) {
      lengths[i++] = static_cast<std::uint8_t>(symbol);
      continue;
    }
    std::uint8_t value = 0;
    std::uint32_t repeat = 0;
    if (symbol == 16) {
      if (i == 0) return false;  // nothing to repeat
      value = lengths[i - 1];
      if (!in.Read(2, &repeat)) return false;
      repeat += 3;
    } else if (symbol == 17) {
      if (!in.Read(3, &repeat)) return false;
      repeat += 3;
    } else {
      if (!in.Read(7, &repeat)) return false;
      repeat += 11;
    }
    if (repeat > static_cast<std::uint32_t>(total - i)) return false;
    for (std::uint32_t r = 0; r < repeat; ++r) lengths[i++] = value;
  }
  if (lengths[256] == 0) return false;  // a block that cannot end

  HuffmanDecoder lit_len;
  HuffmanDecoder dist;
  if (!lit_len.Build(lengths, num_lit_len, HuffmanDecoder::Incomplete::kAllowSingleCode)) return false;
  if (!dist.Build(lengths + num_lit_len, num_dist, HuffmanDecoder::Incomplete::kAllowSingleCode)) return false;
  return DecodeBlockData(in, lit_len, dist, out);
}

inline bool Inflate(BitReader& in, Output& out) {
  for (;;) {
    std::uint32_t final_block = 0, type = 0;
    if (!in.Read(1, &final_block) || !in.Read(2, &type)) return false;
    bool ok = false;
    switch (type) {
      case 0: ok = InflateStored(in, out); break;
      case 1: ok = InflateFixed(in, out); break;
      case 2: ok = InflateDynamic(in, out); break;
      default: return false;
    }
    if (!ok) return false;
    if (final_block) return true;
  }
}

inline std::uint32_t Load32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

// Skips the member header (RFC 1952 2.3) at `*pos`, checking what it can.
inline bool ReadMemberHeader(const unsigned char* data, std::size_t size, std::size_t* pos) {
  constexpr unsigned kFlagHeaderCrc = 2, kFlagExtra = 4, kFlagName = 8, kFlagComment = 16;
  const std::size_t start = *pos;
  std::size_t p = start;
  if (size - p < 10) return false;
  if (data[p] != 0x1f || data[p + 1] != 0x8b || data[p + 2] != 8) return false;
  const unsigned flags = data[p + 3];
  if (flags & 0xE0u) return false;  // reserved bits must be zero
  p += 10;
  if (flags & kFlagExtra) {
    if (size - p < 2) return false;
    const std::size_t extra = data[p] | data[p + 1] << 8;
    p += 2;
    if (size - p < extra) return false;
    p += extra;
  }
  for (unsigned flag : {kFlagName, kFlagComment}) {
    if (!(flags & flag)) continue;
    while (p < size && data[p] != 0) ++p;
    if (p == size) return false;
    ++p;  // the terminating zero
  }
  if (flags & kFlagHeaderCrc) {
    if (size - p < 2) return false;
    const unsigned expected = data[p] | data[p + 1] << 8;
    if ((Crc32(data + start, p - start) & 0xFFFFu) != expected) return false;
    p += 2;
  }
  *pos = p;
  return true;
}

inline bool GunzipMember(const unsigned char* data, std::size_t size, std::size_t* pos, Output& out) {
  if (!ReadMemberHeader(data, size, pos)) return false;
  out.window_start = out.size;
  BitReader in(data + *pos, size - *pos);
  if (!Inflate(in, out)) return false;
  in.AlignToByte();
  const unsigned char* trailer = nullptr;
  if (!in.TakeBytes(8, &trailer)) return false;
  *pos += in.BytePosition();
  const auto* member = reinterpret_cast<const unsigned char*>(out.bytes.data()) + out.window_start;
  const std::size_t member_size = out.size - out.window_start;
  return Load32(trailer) == Crc32(member, member_size) &&
         Load32(trailer + 4) == static_cast<std::uint32_t>(member_size);
}

#endif  // HEAPPROF_TEST_SUPPORT_IMPLEMENTATION
}  // namespace inflate_detail

#ifdef HEAPPROF_TEST_SUPPORT_IMPLEMENTATION  // compiled once: tests/support/support_impl.cpp

bool Gunzip(std::string_view gz, std::string& out) {
  const auto* data = reinterpret_cast<const unsigned char*>(gz.data());
  out.clear();
  // A first guess at the output size; Output::Reserve doubles from there.
  out.resize(std::min<std::size_t>(gz.size(), std::size_t{64} << 20) * 4 + 64);
  inflate_detail::Output output{out, 0, 0};
  std::size_t pos = 0;
  do {
    if (!inflate_detail::GunzipMember(data, gz.size(), &pos, output)) {
      out.clear();
      return false;
    }
  } while (pos < gz.size());
  out.resize(output.size);
  return true;
}

#endif  // HEAPPROF_TEST_SUPPORT_IMPLEMENTATION

}  // namespace heapprof_test
