// The streaming encoder against hand-computed wire bytes. The expected bytes
// come from the encoding rules (and the worked examples of
// protobuf.dev/programming-guides/encoding), never from running the encoder.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "heapprof/detail/5_encoding/protobuf.hpp"
#include "support/profile_decoder.hpp"

using heapprof::detail::ArenaString;

namespace {

using heapprof::detail::ProtoWriter;
using heapprof::detail::WireType;

ArenaString Bytes(std::initializer_list<int> bytes) {
  ArenaString s;
  for (const int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

ArenaString Varint(std::uint64_t v) {
  ArenaString out;
  heapprof::detail::AppendVarint(out, v);
  return out;
}

ArenaString Hex(const ArenaString& s) {
  static const char kDigits[] = "0123456789abcdef";
  ArenaString out;
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
    out += ' ';
  }
  return out;
}

#define CHECK_BYTES(actual, expected) CHECK(Hex(actual) == Hex(expected))

}  // namespace

TEST_CASE("protobuf: varints") {
  CHECK_BYTES(Varint(0), Bytes({0x00}));
  CHECK_BYTES(Varint(1), Bytes({0x01}));
  CHECK_BYTES(Varint(127), Bytes({0x7f}));
  CHECK_BYTES(Varint(128), Bytes({0x80, 0x01}));
  CHECK_BYTES(Varint(300), Bytes({0xac, 0x02}));
  CHECK_BYTES(Varint(16383), Bytes({0xff, 0x7f}));
  CHECK_BYTES(Varint(16384), Bytes({0x80, 0x80, 0x01}));
  // 2^32 = bit 32: 4 empty 7-bit groups (28 bits), then 1 << 4 in the fifth.
  CHECK_BYTES(Varint(std::uint64_t{1} << 32), Bytes({0x80, 0x80, 0x80, 0x80, 0x10}));
  CHECK_BYTES(Varint(UINT64_MAX),
              Bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
}

TEST_CASE("protobuf: VarintSize matches the encoded length at every boundary") {
  using heapprof::detail::VarintSize;
  CHECK(VarintSize(0) == 1);
  CHECK(VarintSize(UINT64_MAX) == 10);
  for (int bits = 1; bits <= 64; ++bits) {
    const std::uint64_t top = bits == 64 ? UINT64_MAX : (std::uint64_t{1} << bits) - 1;
    const std::uint64_t first = std::uint64_t{1} << (bits - 1);
    CAPTURE(bits);
    CHECK(VarintSize(top) == Varint(top).size());
    CHECK(VarintSize(first) == Varint(first).size());
    CHECK(VarintSize(top) == static_cast<std::size_t>((bits + 6) / 7));
  }
}

TEST_CASE("protobuf: tags") {
  ArenaString out;
  heapprof::detail::AppendTag(out, 1, WireType::kVarint);
  CHECK_BYTES(out, Bytes({0x08}));
  out.clear();
  heapprof::detail::AppendTag(out, 2, WireType::kLengthDelimited);
  CHECK_BYTES(out, Bytes({0x12}));
  out.clear();
  heapprof::detail::AppendTag(out, 15, WireType::kLengthDelimited);
  CHECK_BYTES(out, Bytes({0x7a}));
  out.clear();
  // Field 16 is the first whose tag needs two bytes: 16 << 3 = 128.
  heapprof::detail::AppendTag(out, 16, WireType::kVarint);
  CHECK_BYTES(out, Bytes({0x80, 0x01}));
  out.clear();
  heapprof::detail::AppendTag(out, 1, WireType::kFixed64);
  heapprof::detail::AppendTag(out, 1, WireType::kFixed32);
  CHECK_BYTES(out, Bytes({0x09, 0x0d}));
  out.clear();
  // The largest field number, 2^29 - 1: tag (2^32 - 8) | 0.
  heapprof::detail::AppendTag(out, (1u << 29) - 1, WireType::kVarint);
  CHECK_BYTES(out, Bytes({0xf8, 0xff, 0xff, 0xff, 0x0f}));
}

TEST_CASE("protobuf: scalar fields") {
  ArenaString out;
  ProtoWriter w(out);
  SUBCASE("uint64: the spec's 150 example") {
    w.Uint64(1, 150);
    CHECK_BYTES(out, Bytes({0x08, 0x96, 0x01}));
  }
  SUBCASE("uint64 max") {
    w.Uint64(3, UINT64_MAX);
    CHECK_BYTES(out, Bytes({0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
  }
  SUBCASE("int64 negative: ten bytes of two's complement") {
    w.Int64(2, -1);
    CHECK_BYTES(out, Bytes({0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
  }
  SUBCASE("int64 min") {
    w.Int64(1, INT64_MIN);
    CHECK_BYTES(out, Bytes({0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}));
  }
  SUBCASE("zero is written by the plain setters") {
    w.Uint64(1, 0);
    w.Int64(2, 0);
    w.Bool(3, false);
    CHECK_BYTES(out, Bytes({0x08, 0x00, 0x10, 0x00, 0x18, 0x00}));
  }
  SUBCASE("bool") {
    w.Bool(7, true);
    CHECK_BYTES(out, Bytes({0x38, 0x01}));
  }
  SUBCASE("optional setters drop zero and keep the rest") {
    w.OptUint64(1, 0);
    w.OptInt64(2, 0);
    w.OptBool(3, false);
    CHECK(out.empty());
    w.OptUint64(1, 5);
    w.OptInt64(2, -2);
    w.OptBool(3, true);
    CHECK_BYTES(out, Bytes({0x08, 0x05, 0x10, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                            0x01, 0x18, 0x01}));
  }
}

TEST_CASE("protobuf: length-delimited bytes and strings") {
  ArenaString out;
  ProtoWriter w(out);
  SUBCASE("the spec's \"testing\" example") {
    w.String(2, "testing");
    CHECK_BYTES(out, Bytes({0x12, 0x07, 't', 'e', 's', 't', 'i', 'n', 'g'}));
  }
  SUBCASE("empty string still writes tag and zero length") {
    w.String(6, "");
    CHECK_BYTES(out, Bytes({0x32, 0x00}));
  }
  SUBCASE("embedded NUL and high bytes pass through") {
    w.Bytes(1, ArenaString("\0\xff", 2));
    CHECK_BYTES(out, Bytes({0x0a, 0x02, 0x00, 0xff}));
  }
  SUBCASE("300-byte string: two-byte length") {
    w.String(1, ArenaString(300, 'x'));
    REQUIRE(out.size() == 3 + 300);
    CHECK_BYTES(out.substr(0, 3), Bytes({0x0a, 0xac, 0x02}));
    CHECK(out.substr(3) == ArenaString(300, 'x'));
  }
}

TEST_CASE("protobuf: packed repeated varints") {
  ArenaString out;
  ProtoWriter w(out);
  SUBCASE("the spec's packed example: field 4 = [3, 270, 86942]") {
    const std::uint64_t v[] = {3, 270, 86942};
    w.PackedVarints(4, v, 3);
    CHECK_BYTES(out, Bytes({0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05}));
  }
  SUBCASE("signed elements are sign-extended, whatever their width") {
    const std::int64_t v64[] = {-1, 1};
    w.PackedVarints(2, v64, 2);
    const std::int32_t v32[] = {-1};
    w.PackedVarints(2, v32, 1);
    CHECK_BYTES(out, Bytes({0x12, 0x0b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                            0x01, 0x01, 0x12, 0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                            0xff, 0xff, 0x01}));
  }
  SUBCASE("empty list writes nothing") {
    const std::uint64_t* none = nullptr;
    w.PackedVarints(1, none, 0);
    CHECK(out.empty());
  }
  SUBCASE("a payload of 128 bytes takes a two-byte length") {
    const std::vector<std::uint64_t> v(64, 200);  // each 200 is 2 bytes: c8 01
    w.PackedVarints(1, v.data(), v.size());
    REQUIRE(out.size() == 3 + 128);
    CHECK_BYTES(out.substr(0, 5), Bytes({0x0a, 0x80, 0x01, 0xc8, 0x01}));
  }
}

TEST_CASE("protobuf: embedded messages") {
  ArenaString out;
  ProtoWriter w(out);
  SUBCASE("the spec's Test3 { c: Test1 { a: 150 } }") {
    w.Message(3, [&] { w.Uint64(1, 150); });
    CHECK_BYTES(out, Bytes({0x1a, 0x03, 0x08, 0x96, 0x01}));
  }
  SUBCASE("empty message") {
    w.Message(5, [] {});
    CHECK_BYTES(out, Bytes({0x2a, 0x00}));
  }
  SUBCASE("nested twice, with fields before and after") {
    w.Uint64(1, 1);
    w.Message(2, [&] {
      w.Uint64(1, 2);
      w.Message(3, [&] { w.String(1, "ab"); });
      w.Uint64(4, 3);
    });
    w.Uint64(5, 4);
    CHECK_BYTES(out, Bytes({0x08, 0x01,                                   //
                            0x12, 0x0a,                                   // 10-byte body
                            0x08, 0x02,                                   //
                            0x1a, 0x04, 0x0a, 0x02, 'a', 'b',             //
                            0x20, 0x03,                                   //
                            0x28, 0x04}));
  }
  SUBCASE("body of exactly 127 and 128 bytes: the one-byte placeholder boundary") {
    // String field 1 with n payload bytes has a body of n + 2 bytes.
    w.Message(1, [&] { w.String(1, ArenaString(125, 'a')); });
    REQUIRE(out.size() == 2 + 127);
    CHECK_BYTES(out.substr(0, 4), Bytes({0x0a, 0x7f, 0x0a, 0x7d}));
    out.clear();
    w.Message(1, [&] { w.String(1, ArenaString(125, 'a')); w.Uint64(2, 0); });
    REQUIRE(out.size() == 3 + 129);
    CHECK_BYTES(out.substr(0, 5), Bytes({0x0a, 0x81, 0x01, 0x0a, 0x7d}));
    CHECK_BYTES(out.substr(out.size() - 2), Bytes({0x10, 0x00}));
  }
  SUBCASE("large bodies at two levels shift correctly") {
    // inner body: tag + len(2) + 200 = 203 bytes; outer body: 2 + (1 + 2 + 203) + 2 = 210.
    const ArenaString payload(200, 'z');
    w.Message(1, [&] {
      w.Uint64(1, 7);
      w.Message(2, [&] { w.String(1, payload); });
      w.Uint64(3, 9);
    });
    ArenaString expected =
        Bytes({0x0a, 0xd2, 0x01, 0x08, 0x07, 0x12, 0xcb, 0x01, 0x0a, 0xc8, 0x01});
    expected += payload;
    expected += Bytes({0x18, 0x09});
    CHECK(out == expected);
  }
  SUBCASE("a body needing a three-byte length") {
    const ArenaString payload(20000, 'q');
    w.Message(1, [&] { w.Bytes(2, payload); });
    // body = 1 + 3 (20000 = a0 9c 01) + 20000 = 20004 = a4 9c 01
    ArenaString expected = Bytes({0x0a, 0xa4, 0x9c, 0x01, 0x12, 0xa0, 0x9c, 0x01});
    expected += payload;
    CHECK(out == expected);
  }
  SUBCASE("explicit Begin/End equals the lambda form") {
    const std::size_t mark = w.BeginMessage(3);
    w.Uint64(1, 150);
    w.EndMessage(mark);
    CHECK_BYTES(out, Bytes({0x1a, 0x03, 0x08, 0x96, 0x01}));
  }
}

TEST_CASE("protobuf: appends to what is already in the buffer") {
  ArenaString out = "prefix";
  ProtoWriter w(out);
  w.Message(1, [&] { w.String(1, ArenaString(130, 'c')); });
  CHECK(out.compare(0, 6, "prefix") == 0);
  CHECK_BYTES(out.substr(6, 5), Bytes({0x0a, 0x85, 0x01, 0x0a, 0x82}));
  CHECK(&w.buffer() == &out);
}

TEST_CASE("protobuf: the test decoder reads what the encoder wrote") {
  // A ValueType-shaped message encoded by hand through the writer, then read
  // back by the independent test decoder: both sides agree on the wire format.
  ArenaString out;
  ProtoWriter w(out);
  w.Message(1, [&] { w.Int64(1, 1); w.Int64(2, 2); });
  w.Message(2, [&] {
    const std::uint64_t ids[] = {1, 300, 1ull << 40};
    w.PackedVarints(1, ids, 3);
    const std::int64_t values[] = {-5, 0, INT64_MAX};
    w.PackedVarints(2, values, 3);
  });
  w.String(6, "");
  w.String(6, "type");
  w.String(6, "unit");
  heapprof_test::Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::DecodeProfile(std::string(out), p, &why), why);
  REQUIRE(p.sample_types.size() == 1);
  CHECK(p.sample_types[0].type == "type");
  CHECK(p.sample_types[0].unit == "unit");
  REQUIRE(p.samples.size() == 1);
  CHECK(p.samples[0].location_ids == std::vector<std::uint64_t>{1, 300, 1ull << 40});
  CHECK(p.samples[0].values == std::vector<std::int64_t>{-5, 0, INT64_MAX});
}
