// heapprof: a streaming protobuf encoder for the subset of the wire format
// (https://protobuf.dev/programming-guides/encoding/) that profile.proto needs.
// It appends straight into an ArenaString: no message tree, no generated code,
// no allocation beyond the output buffer growing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "heapprof/detail/0_base/arena_allocator.hpp"

namespace heapprof {
namespace detail {

enum class WireType : std::uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kFixed32 = 5,
};

// 64 bits at 7 payload bits per byte.
constexpr std::size_t kMaxVarintBytes = 10;

inline std::size_t VarintSize(std::uint64_t v) {
  // v | 1 keeps clz defined for zero, which still takes one byte.
  const int bits = 64 - __builtin_clzll(v | 1);
  return static_cast<std::size_t>((bits + 6) / 7);
}

// Writes at most kMaxVarintBytes at `p`; returns one past the last byte written.
inline char* WriteVarint(char* p, std::uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(static_cast<std::uint8_t>(v) | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

inline void AppendVarint(ArenaString& out, std::uint64_t v) {
  char buf[kMaxVarintBytes];
  out.append(buf, static_cast<std::size_t>(WriteVarint(buf, v) - buf));
}

inline std::uint64_t Tag(std::uint32_t field, WireType type) {
  return (std::uint64_t{field} << 3) | static_cast<std::uint32_t>(type);
}

inline void AppendTag(ArenaString& out, std::uint32_t field, WireType type) {
  AppendVarint(out, Tag(field, type));
}

// Writers into a caller's buffer, for a run of fields assembled on the stack
// and appended at once (one append per field is what costs; ProtoWriter).
// Each returns one past the last byte written.

// A varint field: at most 2 * kMaxVarintBytes bytes.
inline char* PutVarintField(char* p, std::uint32_t field, std::uint64_t v) {
  return WriteVarint(WriteVarint(p, Tag(field, WireType::kVarint)), v);
}

// Packed repeated varints, `count` > 0 of them: the payload is written at
// p + 2 * kMaxVarintBytes, then moved back behind its head once its length is
// known. Needs (count + 2) * kMaxVarintBytes bytes at `p`.
template <typename Int>
inline char* PutPackedVarints(char* p, std::uint32_t field, const Int* values, std::size_t count) {
  char* const body = p + 2 * kMaxVarintBytes;
  char* e = body;
  for (std::size_t i = 0; i < count; ++i) e = WriteVarint(e, static_cast<std::uint64_t>(values[i]));
  const std::size_t body_len = static_cast<std::size_t>(e - body);
  char* h = WriteVarint(WriteVarint(p, Tag(field, WireType::kLengthDelimited)), body_len);
  std::memmove(h, body, body_len);
  return h + body_len;
}

class ProtoWriter {
 public:
  // Lists this long or shorter are assembled on the stack (PackedVarints).
  static constexpr std::size_t kShortPacked = 64;

  // Bytes already encoded (PutVarintField, PutPackedVarints), as they are.
  void Raw(const char* bytes, std::size_t n) { out_.append(bytes, n); }

  explicit ProtoWriter(ArenaString& out) : out_(out) {}

  ArenaString& buffer() { return out_; }

  void Uint64(std::uint32_t field, std::uint64_t v) {
    // One append per field: the append call, not the byte shuffling, is what
    // costs when a profile writes millions of small fields.
    char buf[2 * kMaxVarintBytes];
    char* p = WriteVarint(buf, Tag(field, WireType::kVarint));
    p = WriteVarint(p, v);
    out_.append(buf, static_cast<std::size_t>(p - buf));
  }
  // int64 (not sint64) carries the two's-complement bit pattern, so a negative
  // value always takes the full ten bytes.
  void Int64(std::uint32_t field, std::int64_t v) { Uint64(field, static_cast<std::uint64_t>(v)); }
  void Bool(std::uint32_t field, bool v) { Uint64(field, v ? 1 : 0); }

  // proto3 reads an absent scalar as zero, so dropping zeros loses nothing and
  // keeps the many "unset" ids, flags and string indices of a profile free.
  void OptUint64(std::uint32_t field, std::uint64_t v) {
    if (v != 0) Uint64(field, v);
  }
  void OptInt64(std::uint32_t field, std::int64_t v) {
    if (v != 0) Int64(field, v);
  }
  void OptBool(std::uint32_t field, bool v) {
    if (v) Bool(field, true);
  }

  void Bytes(std::uint32_t field, std::string_view bytes) {
    char buf[2 * kMaxVarintBytes];
    char* p = WriteVarint(buf, Tag(field, WireType::kLengthDelimited));
    p = WriteVarint(p, bytes.size());
    out_.append(buf, static_cast<std::size_t>(p - buf));
    out_.append(bytes.data(), bytes.size());
  }
  void String(std::uint32_t field, std::string_view s) { Bytes(field, s); }

  // Packed repeated varint field. `Int` may be signed: a negative element is
  // sign-extended to 64 bits, as int32/int64 fields require. An empty list
  // writes nothing, which every reader takes as an empty repeated field.
  template <typename Int>
  void PackedVarints(std::uint32_t field, const Int* values, std::size_t count) {
    if (count == 0) return;
    // Short lists: encoded on the stack and appended once (resize() zero-filled
    // what the loop below then writes over).
    if (count <= kShortPacked) {
      char buf[(kShortPacked + 2) * kMaxVarintBytes];
      Raw(buf, static_cast<std::size_t>(PutPackedVarints(buf, field, values, count) - buf));
      return;
    }
    std::size_t len = 0;
    for (std::size_t i = 0; i < count; ++i) len += VarintSize(AsVarint(values[i]));
    char head[2 * kMaxVarintBytes];
    char* h = WriteVarint(head, Tag(field, WireType::kLengthDelimited));
    h = WriteVarint(h, len);
    const std::size_t head_len = static_cast<std::size_t>(h - head);
    const std::size_t at = out_.size();
    out_.resize(at + head_len + len);
    char* p = &out_[at];
    std::memcpy(p, head, head_len);
    p += head_len;
    for (std::size_t i = 0; i < count; ++i) p = WriteVarint(p, AsVarint(values[i]));
  }

  // Embedded message: Begin writes the tag and a one-byte length placeholder and
  // returns a mark; End patches the length in. Nearly every message of a profile
  // is shorter than 128 bytes, so this sizes each message once instead of
  // walking it twice; a longer one pays a single shift of its own bytes.
  // Begin/End pairs nest like parentheses.
  std::size_t BeginMessage(std::uint32_t field) {
    AppendTag(out_, field, WireType::kLengthDelimited);
    out_.push_back('\0');
    return out_.size();
  }
  void EndMessage(std::size_t mark) {
    const std::size_t len = out_.size() - mark;
    if (len < 0x80) {
      out_[mark - 1] = static_cast<char>(len);
      return;
    }
    char buf[kMaxVarintBytes];
    const std::size_t n = static_cast<std::size_t>(WriteVarint(buf, len) - buf);
    out_.insert(mark, n - 1, '\0');
    std::memcpy(&out_[mark - 1], buf, n);
  }
  template <typename Body>
  void Message(std::uint32_t field, Body&& body) {
    const std::size_t mark = BeginMessage(field);
    body();
    EndMessage(mark);
  }

 private:
  template <typename Int>
  static std::uint64_t AsVarint(Int v) {
    static_assert(sizeof(Int) <= 8, "varints hold at most 64 bits");
    // Conversion to unsigned is modular: sign extension for negatives.
    return static_cast<std::uint64_t>(v);
  }

  ArenaString& out_;
};

}  // namespace detail
}  // namespace heapprof
