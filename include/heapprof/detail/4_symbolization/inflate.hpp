// heapprof: a small inflater (RFC 1951 inside an RFC 1950 zlib stream) for
// compressed debug sections (SHF_COMPRESSED with ELFCOMPRESS_ZLIB, what
// `-gz` and `objcopy --compress-debug-sections` write). The output size is
// known from the section's header, so it decodes into one buffer of exactly
// that size; every read and write is checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace heapprof {
namespace detail {
namespace inflate {

class BitReader {
 public:
  BitReader(const unsigned char* data, std::size_t size) : data_(data), size_(size) {}

  // `count` bits, least significant first (3.1.1); sets the error flag at the end.
  std::uint32_t Bits(unsigned count) {
    if (have_ < count) Refill();
    while (have_ < count) {
      if (pos_ >= size_) {
        failed_ = true;
        return 0;
      }
      buffer_ |= static_cast<std::uint64_t>(data_[pos_++]) << have_;
      have_ += 8;
    }
    const std::uint32_t v = static_cast<std::uint32_t>(buffer_ & ((std::uint64_t{1} << count) - 1));
    buffer_ >>= count;
    have_ -= count;
    return v;
  }
  // Up to `count` (<= 32) next bits without consuming them; bits past the end
  // of the input read as zero (available() says how many are real).
  std::uint32_t Peek(unsigned count) {
    if (have_ < count) Refill();
    while (have_ < count && pos_ < size_) {
      buffer_ |= static_cast<std::uint64_t>(data_[pos_++]) << have_;
      have_ += 8;
    }
    return static_cast<std::uint32_t>(buffer_ & ((std::uint64_t{1} << count) - 1));
  }
  unsigned available() const { return have_; }
  // Tops the buffer up to at least 56 bits with one 8-byte load while 8
  // bytes of input are left (the byte loops above finish the last ones):
  // decoding went a byte at a time, the most of a first profile's time on a
  // compressed debug file (README "The preload library").
  // The bits above have_ are then the next input bytes' own, which the next
  // load (or byte) ORs in again unchanged.
  void Refill() {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (size_ - pos_ < 8) return;
    std::uint64_t word;
    std::memcpy(&word, data_ + pos_, 8);
    buffer_ |= word << have_;
    pos_ += (63 - have_) >> 3;
    have_ |= 56;
#endif
  }
  void Drop(unsigned count) {
    buffer_ >>= count;
    have_ -= count;
  }
  void AlignToByte() {
    buffer_ >>= have_ % 8;
    have_ -= have_ % 8;
  }
  // After AlignToByte: whole bytes still buffered go back to the stream.
  std::size_t BytePosition() const { return pos_ - have_ / 8; }
  void SkipTo(std::size_t pos) {
    pos_ = pos;
    buffer_ = 0;
    have_ = 0;
  }
  bool failed() const { return failed_; }
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  const unsigned char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::uint64_t buffer_ = 0;
  unsigned have_ = 0;
  bool failed_ = false;
};

// A canonical Huffman code (3.2.2) as counts per length and symbols in code
// order; decoding walks the lengths, comparing against the first code of each.
// Codes of up to kFastBits bits (nearly all of them in practice) are decoded
// by one table lookup on the next bits instead.
struct Huffman {
  static constexpr unsigned kFastBits = 9;
  std::uint16_t count[16];
  std::uint16_t symbol[320];
  std::uint16_t fast[1u << kFastBits];  // symbol | length << 9; 0: longer code

  // False for an over-subscribed set of lengths.
  bool Build(const std::uint8_t* lengths, int n) {
    std::memset(count, 0, sizeof count);
    for (int i = 0; i < n; ++i) ++count[lengths[i]];
    int left = 1;
    for (int len = 1; len < 16; ++len) {
      left = left * 2 - count[len];
      if (left < 0) return false;
    }
    std::uint16_t offsets[16];
    offsets[1] = 0;
    for (int len = 1; len < 15; ++len) offsets[len + 1] = static_cast<std::uint16_t>(offsets[len] + count[len]);
    for (int i = 0; i < n; ++i) {
      if (lengths[i] != 0) symbol[offsets[lengths[i]]++] = static_cast<std::uint16_t>(i);
    }
    // The fast table: each short code, bit-reversed (deflate sends Huffman
    // codes most significant bit first into an LSB-first stream), filled in
    // for every value of the bits after it.
    std::memset(fast, 0, sizeof fast);
    // First code of each length (3.2.2): (first of len-1 + count[len-1]) << 1.
    std::uint32_t next[16];
    std::uint32_t code = 0;
    next[1] = 0;
    for (int len = 2; len < 16; ++len) {
      code = (code + count[len - 1]) << 1;
      next[len] = code;
    }
    for (int i = 0; i < n; ++i) {
      const unsigned len = lengths[i];
      if (len == 0) continue;
      const std::uint32_t c = next[len]++;
      if (len > kFastBits) continue;
      std::uint32_t reversed = 0;
      for (unsigned b = 0; b < len; ++b) reversed |= ((c >> b) & 1u) << (len - 1 - b);
      for (std::uint32_t fill = reversed; fill < (1u << kFastBits); fill += 1u << len) {
        fast[fill] = static_cast<std::uint16_t>(static_cast<unsigned>(i) | (len << 9));
      }
    }
    return true;
  }

  int Decode(BitReader& in) const {
    const std::uint16_t entry = fast[in.Peek(kFastBits)];
    if (entry != 0 && (entry >> 9) <= in.available()) {
      in.Drop(entry >> 9);
      return entry & 0x1ff;
    }
    return DecodeSlow(in);
  }

  int DecodeSlow(BitReader& in) const {
    int code = 0, first = 0, index = 0;
    for (int len = 1; len < 16; ++len) {
      code |= static_cast<int>(in.Bits(1));
      if (in.failed()) return -1;
      const int c = count[len];
      if (code - first < c) return symbol[index + code - first];
      index += c;
      first = (first + c) << 1;
      code <<= 1;
    }
    return -1;
  }
};

constexpr std::uint16_t kLengthBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                           31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr std::uint8_t kLengthExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                           2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr std::uint16_t kDistBase[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,
                                         33,  49,  65,  97,  129, 193,  257,  385,  513,  769,
                                         1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr std::uint8_t kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                         6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

class Inflater {
 public:
  Inflater(unsigned char* out, std::size_t capacity) : out_(out), cap_(capacity) {}

  // Decodes raw deflate data; true when the final block ended cleanly.
  bool Run(BitReader& in) {
    for (;;) {
      const std::uint32_t final_block = in.Bits(1);
      const std::uint32_t type = in.Bits(2);
      if (in.failed()) return false;
      bool ok = false;
      if (type == 0) ok = Stored(in);
      else if (type == 1) ok = Fixed(in);
      else if (type == 2) ok = Dynamic(in);
      if (!ok) return false;
      if (final_block) return true;
    }
  }
  std::size_t written() const { return n_; }

 private:
  bool Stored(BitReader& in) {
    in.AlignToByte();
    const std::uint32_t len = in.Bits(16);
    const std::uint32_t nlen = in.Bits(16);
    if (in.failed() || (len ^ 0xffffu) != nlen) return false;
    const std::size_t at = in.BytePosition();
    if (len > in.size() - at || len > cap_ - n_) return false;
    std::memcpy(out_ + n_, in.data() + at, len);
    n_ += len;
    in.SkipTo(at + len);
    return true;
  }

  bool Fixed(BitReader& in) {
    std::uint8_t lengths[320];
    int i = 0;
    for (; i < 144; ++i) lengths[i] = 8;
    for (; i < 256; ++i) lengths[i] = 9;
    for (; i < 280; ++i) lengths[i] = 7;
    for (; i < 288; ++i) lengths[i] = 8;
    Huffman lit, dist;
    lit.Build(lengths, 288);
    for (i = 0; i < 30; ++i) lengths[i] = 5;
    dist.Build(lengths, 30);
    return Codes(in, lit, dist);
  }

  bool Dynamic(BitReader& in) {
    const int nlen = static_cast<int>(in.Bits(5)) + 257;
    const int ndist = static_cast<int>(in.Bits(5)) + 1;
    const int ncode = static_cast<int>(in.Bits(4)) + 4;
    if (in.failed() || nlen > 286 || ndist > 30) return false;
    static constexpr std::uint8_t kOrder[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    std::uint8_t lengths[320] = {};
    for (int i = 0; i < ncode; ++i) lengths[kOrder[i]] = static_cast<std::uint8_t>(in.Bits(3));
    Huffman lencode;
    if (in.failed() || !lencode.Build(lengths, 19)) return false;
    int i = 0;
    while (i < nlen + ndist) {
      const int sym = lencode.Decode(in);
      if (sym < 0) return false;
      if (sym < 16) {
        lengths[i++] = static_cast<std::uint8_t>(sym);
        continue;
      }
      std::uint8_t value = 0;
      int repeat = 0;
      if (sym == 16) {
        if (i == 0) return false;
        value = lengths[i - 1];
        repeat = 3 + static_cast<int>(in.Bits(2));
      } else if (sym == 17) {
        repeat = 3 + static_cast<int>(in.Bits(3));
      } else {
        repeat = 11 + static_cast<int>(in.Bits(7));
      }
      if (in.failed() || i + repeat > nlen + ndist) return false;
      while (repeat-- > 0) lengths[i++] = value;
    }
    if (lengths[256] == 0) return false;  // no end-of-block code
    Huffman lit, dist;
    if (!lit.Build(lengths, nlen) || !dist.Build(lengths + nlen, ndist)) return false;
    return Codes(in, lit, dist);
  }

  bool Codes(BitReader& in, const Huffman& lit, const Huffman& dist) {
    for (;;) {
      int sym = lit.Decode(in);
      if (sym < 0) return false;
      if (sym < 256) {
        if (n_ >= cap_) return false;
        out_[n_++] = static_cast<unsigned char>(sym);
        continue;
      }
      if (sym == 256) return true;
      sym -= 257;
      if (sym >= 29) return false;
      const std::size_t length = kLengthBase[sym] + in.Bits(kLengthExtra[sym]);
      const int dsym = dist.Decode(in);
      if (dsym < 0 || dsym >= 30) return false;
      const std::size_t distance = kDistBase[dsym] + in.Bits(kDistExtra[dsym]);
      if (in.failed() || distance > n_ || length > cap_ - n_) return false;
      const unsigned char* from = out_ + n_ - distance;
      unsigned char* to = out_ + n_;
      if (distance >= 8 && cap_ - n_ >= length + 8) {
        // 8 bytes a step, up to 7 past the end (room checked): each step
        // reads bytes written at least 8 before, so an overlapping copy
        // (distance < length) repeats its pattern as the byte loop does.
        for (std::size_t k = 0; k < length; k += 8) {
          std::uint64_t word;
          std::memcpy(&word, from + k, 8);
          std::memcpy(to + k, &word, 8);
        }
      } else {
        // Byte by byte: the copy may overlap its own output (distance < length).
        for (std::size_t k = 0; k < length; ++k) to[k] = from[k];
      }
      n_ += length;
    }
  }

  unsigned char* out_;
  std::size_t cap_;
  std::size_t n_ = 0;
};

// A zlib stream (RFC 1950: CMF/FLG header, deflate data, Adler-32) into
// out[0..size); true only when it produced exactly `size` bytes whose
// checksum matches.
inline bool ZlibInflate(const unsigned char* in, std::size_t in_size, unsigned char* out, std::size_t size) {
  if (in_size < 6) return false;
  const unsigned cmf = in[0], flg = in[1];
  if ((cmf & 0x0f) != 8 || (cmf >> 4) > 7 || ((cmf << 8) | flg) % 31 != 0 || (flg & 0x20) != 0) return false;
  BitReader bits(in + 2, in_size - 2);
  Inflater inflater(out, size);
  if (!inflater.Run(bits) || inflater.written() != size) return false;
  bits.AlignToByte();
  const std::size_t at = 2 + bits.BytePosition();
  if (at + 4 > in_size) return false;
  std::uint32_t a = 1, b = 0;
  for (std::size_t i = 0; i < size;) {
    // 5552 bytes keep the sums below 2^32 before the modulo (RFC 1950, 9.).
    const std::size_t end = i + 5552 < size ? i + 5552 : size;
    for (; i < end; ++i) {
      a += out[i];
      b += a;
    }
    a %= 65521u;
    b %= 65521u;
  }
  const std::uint32_t expected = (std::uint32_t{in[at]} << 24) | (std::uint32_t{in[at + 1]} << 16) |
                                 (std::uint32_t{in[at + 2]} << 8) | in[at + 3];
  return ((b << 16) | a) == expected;
}

}  // namespace inflate
}  // namespace detail
}  // namespace heapprof
