// libFuzzer target: the profile writer's output, read back by the test-side
// decoder. Two round trips per input:
//  - a ProfileData built from the input (samples with arbitrary return
//    addresses, values, flags and label strings) → EncodeProfile →
//    GzipCompress → our test inflater → DecodeProfile: must decode, Validate,
//    and give back every value, label and frame;
//  - the raw input bytes (and the input repeated, for long matches and
//    distances) → GzipCompress → inflater: must give back the same bytes.
//
//   ./build-fuzz/fuzz_profile_roundtrip -max_total_time=60
//
// Each input compresses up to three buffers (each GzipCompress sets up its
// 64K-entry hash tables): ~160 inputs/s under libFuzzer+ASan, so the smoke
// test (every build, sanitizers included) and CI's libFuzzer run use fewer:
// HEAPPROF_FUZZ_SMOKE_RUNS=5000 HEAPPROF_FUZZ_CI_RUNS=1200 (5-6 s)
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "heapprof/detail/5_encoding/gzip.hpp"
#include "heapprof/detail/5_encoding/profile_builder.hpp"
// A program of its own (libFuzzer, or the smoke runner): the helpers' definitions here.
#define HEAPPROF_TEST_SUPPORT_IMPLEMENTATION
#include "support/inflate.hpp"
#include "support/profile_decoder.hpp"

namespace hd = heapprof::detail;

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint64_t U64(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(U8()) << (8 * i);
    return v;
  }
  std::string Str() {
    const std::size_t n = U8() % 24;
    std::string s;
    for (std::size_t i = 0; i < n && pos_ < size_; ++i) s.push_back(static_cast<char>(data_[pos_++]));
    return s;
  }
  bool Empty() const { return pos_ >= size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

void RoundTripGzip(const std::string& in) {
  hd::ArenaString gz;  // the encoder's output lives on the profiler's arena
  hd::GzipCompress(in, gz);
  std::string back;
  Check(heapprof_test::Gunzip(std::string(gz.data(), gz.size()), back));
  Check(back == in);
}

// The reference for the profile's strings (proto3 strings are UTF-8): each
// byte that starts no well-formed character (decoded here by code point:
// overlong forms, surrogates and values past U+10FFFF are not well-formed)
// becomes U+FFFD.
std::string AsUtf8(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    std::size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    std::uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
    for (std::size_t k = 1; k < n; ++k) {
      if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
        n = 0;
        break;
      }
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
    }
    const std::uint32_t min_of[] = {0, 0, 0x80, 0x800, 0x10000};
    if (n == 0 || cp < min_of[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

std::string MarkerName(const heapprof_test::Profile& p, std::uint64_t location_id) {
  const heapprof_test::Location* loc = heapprof_test::FindLocation(p, location_id);
  if (loc == nullptr || loc->lines.size() != 1) return "";
  const heapprof_test::Function* fn = heapprof_test::FindFunction(p, loc->lines[0].function_id);
  return fn != nullptr ? fn->name : "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Gzip: the input as is, and (one input in 16) repeated past the 32 KiB
  // window, for long matches and the largest distances.
  const std::string raw_input(reinterpret_cast<const char*>(data), size);
  RoundTripGzip(raw_input);
  if (size > 1 && size < 4096 && data[0] % 16 == 0) {
    std::string repeated;
    while (repeated.size() < 40000) repeated += raw_input;
    RoundTripGzip(repeated);
  }

  // A profile built from the input.
  Bytes in(data, size);
  hd::ProfileData prof;
  const std::uint8_t head = in.U8();
  prof.allocs_default = head & 1;
  prof.period = static_cast<std::int64_t>(in.U64(head & 2 ? 8 : 3));
  prof.time_nanos = static_cast<std::int64_t>(in.U64(8));
  prof.duration_nanos = head & 4 ? static_cast<std::int64_t>(in.U64(4)) : 0;
  const std::size_t samples = in.U8() % 12;
  // A small pool of return addresses, so samples share locations.
  std::uintptr_t pool[8];
  for (auto& pc : pool) pc = static_cast<std::uintptr_t>(in.U64(in.U8() % 9));
  for (std::size_t i = 0; i < samples && !in.Empty(); ++i) {
    hd::ProfileSample s;
    const std::uint8_t flags = in.U8();
    s.truncated = flags & 1;
    s.overflow = flags & 2;
    const std::size_t depth = s.overflow ? 0 : in.U8() % 40;
    for (std::size_t f = 0; f < depth; ++f) {
      const std::uint8_t pick = in.U8();
      s.pcs.push_back(pick < 200 ? pool[pick % 8] : static_cast<std::uintptr_t>(in.U64(8)));
    }
    s.alloc_objects = static_cast<std::int64_t>(in.U64(flags & 4 ? 8 : 2));
    s.alloc_bytes = static_cast<std::int64_t>(in.U64(flags & 8 ? 8 : 3));
    s.inuse_objects = static_cast<std::int64_t>(in.U64(2));
    s.inuse_bytes = static_cast<std::int64_t>(in.U64(flags & 16 ? 8 : 3));
    s.object_size = static_cast<std::int64_t>(in.U64(flags & 32 ? 8 : 2));
    const std::size_t labels = in.U8() % 5;
    for (std::size_t l = 0; l < labels; ++l) {
      std::string key = in.Str();
      std::string value = in.Str();
      s.labels.emplace_back(std::move(key), std::move(value));
    }
    prof.samples.push_back(std::move(s));
  }

  const hd::ArenaVector<hd::LoadedObject> objects;
  hd::Symbolizer symbolizer(objects);
  const hd::ArenaString encoded_arena = hd::EncodeProfile(prof, objects, symbolizer);
  const std::string encoded(encoded_arena.data(), encoded_arena.size());
  hd::ArenaString gz;
  hd::GzipCompress(encoded, gz);
  std::string back;
  Check(heapprof_test::Gunzip(std::string(gz.data(), gz.size()), back));
  Check(back == encoded);
  heapprof_test::Profile p;
  Check(heapprof_test::DecodeProfile(back, p));
  Check(heapprof_test::Validate(p));

  Check(p.period == prof.period);
  Check(p.time_nanos == prof.time_nanos);
  Check(p.duration_nanos == prof.duration_nanos);
  Check(p.default_sample_type == (prof.allocs_default ? "alloc_space" : ""));
  Check(p.sample_types.size() == 4);
  Check(p.samples.size() == prof.samples.size());
  for (std::size_t i = 0; i < prof.samples.size(); ++i) {
    const hd::ProfileSample& want = prof.samples[i];
    const heapprof_test::Sample& got = p.samples[i];
    Check(got.values.size() == 4);
    Check(got.values[0] == want.alloc_objects && got.values[1] == want.alloc_bytes &&
          got.values[2] == want.inuse_objects && got.values[3] == want.inuse_bytes);
    // Frames: one location per pc (address pc - 1), then the markers.
    const std::size_t frames = want.pcs.size() + (want.truncated ? 1 : 0) + (want.overflow ? 1 : 0);
    Check(got.location_ids.size() == frames);
    for (std::size_t f = 0; f < want.pcs.size(); ++f) {
      const heapprof_test::Location* loc = heapprof_test::FindLocation(p, got.location_ids[f]);
      Check(loc != nullptr);
      Check(loc->address == (want.pcs[f] != 0 ? want.pcs[f] - 1 : 0));
    }
    std::size_t at = want.pcs.size();
    if (want.truncated) {
      Check(MarkerName(p, got.location_ids[at++]) ==
            "[heapprof: stack truncated at " + std::to_string(want.pcs.size()) + " frames]");
    }
    if (want.overflow) Check(MarkerName(p, got.location_ids[at++]) == "[heapprof: stack table full]");
    // Labels: the numeric "bytes" first, then the string labels in order.
    Check(got.labels.size() == want.labels.size() + 1);
    Check(got.labels[0].key == "bytes" && got.labels[0].num == want.object_size && got.labels[0].num_unit == "bytes");
    for (std::size_t l = 0; l < want.labels.size(); ++l) {
      // A key "bytes", "label_bytes", "label_label_bytes"... gets one more "label_"
      // (apart from the numeric "bytes" label, and from each other).
      std::string key(want.labels[l].first.data(), want.labels[l].first.size());
      std::string rest = key;
      while (rest.compare(0, 6, "label_") == 0) rest.erase(0, 6);
      if (rest == "bytes") key = "label_" + key;
      Check(got.labels[l + 1].key == AsUtf8(key));
      Check(got.labels[l + 1].str == AsUtf8(std::string(want.labels[l].second.data(), want.labels[l].second.size())));
    }
  }
  return 0;
}
