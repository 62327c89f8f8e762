// Tests for heapprof's own gzip writer (include/heapprof/detail/gzip.hpp), read
// back by the test inflater (tests/support/inflate.hpp) and by the system gzip.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "heapprof/detail/4_symbolization/inflate.hpp"
#include "heapprof/detail/5_encoding/gzip.hpp"
#include "support/inflate.hpp"

namespace {

using heapprof::detail::GzipCompress;
using heapprof_test::Gunzip;

std::string Gzip(std::string_view in) {
  heapprof::detail::ArenaString out;
  GzipCompress(in, out);
  return std::string(out);
}

// SplitMix64: deterministic, so a failure reproduces.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::size_t Below(std::size_t n) { return static_cast<std::size_t>(Next() % n); }
  // Small values far more likely than large ones, like real symbol usage.
  std::size_t Skewed(std::size_t n) { return std::min(Below(n), std::min(Below(n), Below(n))); }

 private:
  std::uint64_t state_;
};

std::string RandomBytes(std::size_t size, std::uint64_t seed) {
  Rng rng(seed);
  std::string s(size, '\0');
  for (char& c : s) c = static_cast<char>(rng.Next());
  return s;
}

std::string Text(std::size_t size, std::uint64_t seed) {
  static const char* const kWords[] = {
      "the",     "heap",    "profile", "of",      "a",        "service", "allocates", "memory",
      "and",     "samples", "every",   "half",    "megabyte", "stack",   "frames",    "are",
      "symbols", "written", "as",      "pprof",   "protobuf", "gzip",    "deflate",   "window",
      "Huffman", "codes",   "length",  "limited", "to",       "fifteen", "bits",      "."};
  constexpr std::size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  Rng rng(seed);
  std::string s;
  while (s.size() < size) {
    s += kWords[rng.Skewed(kNumWords)];
    s += rng.Below(12) == 0 ? '\n' : ' ';
  }
  s.resize(size);
  return s;
}

// Runs of one byte, from 1 to 3000 long: matches at distance 1 and maximum
// length, plus the short leftovers between them.
std::string Runs(std::size_t size, std::uint64_t seed) {
  Rng rng(seed);
  std::string s;
  while (s.size() < size) {
    const std::size_t length = 1 + rng.Below(rng.Below(2) ? 3000 : 5);
    s.append(length, static_cast<char>(rng.Next()));
  }
  s.resize(size);
  return s;
}

// ---------------------------------------------------------------------------
// A synthetic pprof profile.proto: Go's field order (samples, mappings,
// locations, functions, string table), stacks drawn from a few hundred call paths
// the way real programs reuse them, demangled C++ names, PIE addresses.

class MiniProtoWriter {
 public:
  void Varint(std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) bytes_.push_back(static_cast<char>(v | 0x80));
    bytes_.push_back(static_cast<char>(v));
  }
  void Uint(int field, std::uint64_t v) {
    if (v == 0) return;  // proto3 omits zeros
    Varint(static_cast<std::uint64_t>(field) << 3);
    Varint(v);
  }
  void Bytes(int field, std::string_view s) {
    Varint(static_cast<std::uint64_t>(field) << 3 | 2);
    Varint(s.size());
    bytes_.append(s.data(), s.size());
  }
  void Packed(int field, const std::vector<std::uint64_t>& values) {
    MiniProtoWriter inner;
    for (std::uint64_t v : values) inner.Varint(v);
    Bytes(field, inner.bytes_);
  }
  void Message(int field, const MiniProtoWriter& m) { Bytes(field, m.bytes_); }
  const std::string& bytes() const { return bytes_; }
  std::size_t size() const { return bytes_.size(); }

 private:
  std::string bytes_;
};

class StringTable {
 public:
  std::uint64_t Intern(const std::string& s) {
    auto it = index_.find(s);
    if (it != index_.end()) return it->second;
    strings_.push_back(s);
    return index_[s] = strings_.size() - 1;
  }
  const std::vector<std::string>& strings() const { return strings_; }

 private:
  std::vector<std::string> strings_{""};
  std::map<std::string, std::uint64_t> index_{{"", 0}};
};

std::string ProfileLike(std::size_t target_size, std::uint64_t seed) {
  Rng rng(seed);
  StringTable strings;
  MiniProtoWriter profile;
  for (const char* type : {"alloc_objects", "alloc_space", "inuse_objects", "inuse_space"}) {
    MiniProtoWriter value_type;
    value_type.Uint(1, strings.Intern(type));
    value_type.Uint(2, strings.Intern(type[6] == 'o' || type[6] == 'b' ? "count" : "bytes"));
    profile.Message(1, value_type);
  }

  static const char* const kNamespaces[] = {"std::", "std::__detail::", "myapp::", "myapp::storage::",
                                            "absl::lts_20230125::container_internal::",
                                            "google::protobuf::internal::", "folly::", "boost::asio::detail::"};
  static const char* const kTypes[] = {
      "vector<int, std::allocator<int> >",
      "basic_string<char, std::char_traits<char>, std::allocator<char> >",
      "unordered_map<std::string, long, std::hash<std::string>, std::equal_to<std::string>, "
      "std::allocator<std::pair<std::string const, long> > >",
      "map<int, std::string, std::less<int>, std::allocator<std::pair<int const, std::string> > >",
      "_Hashtable<unsigned long, std::pair<unsigned long const, myapp::Entry>, "
      "std::allocator<std::pair<unsigned long const, myapp::Entry> > >",
      "vector<myapp::Row, std::allocator<myapp::Row> >",
      "RepeatedPtrField<myapp::Row>",
      "deque<std::function<void ()>, std::allocator<std::function<void ()> > >",
      "LruCache<std::string, myapp::Entry>",
      "RequestHandler",
      "Arena",
      "raw_hash_set<absl::container_internal::FlatHashMapPolicy<int, int>, absl::hash_internal::Hash<int> >"};
  static const char* const kMethods[] = {"_M_realloc_insert", "_M_create", "_M_default_append", "push_back",
                                         "emplace_back<int const&>", "reserve", "operator[]", "Allocate",
                                         "HandleRequest", "Parse", "Serialize", "_M_rehash", "insert",
                                         "resize", "AddAllocated", "New", "Run", "operator()"};
  static const char* const kArgs[] = {
      "(unsigned long)", "(std::string const&)", "(int&&)", "()", " const",
      "(myapp::Request const&, myapp::Response*)",
      "(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)",
      "(unsigned long, unsigned long)"};
  static const char* const kFiles[] = {"/usr/include/c++/12/bits/stl_vector.h",
                                       "/usr/include/c++/12/bits/vector.tcc",
                                       "/usr/include/c++/12/bits/basic_string.tcc",
                                       "/usr/include/c++/12/bits/hashtable.h",
                                       "/usr/include/c++/12/bits/new_allocator.h",
                                       "src/server/handler.cc",
                                       "src/storage/table.cc",
                                       "src/storage/lru_cache.h",
                                       "third_party/abseil/absl/container/internal/raw_hash_set.h"};
  auto pick = [&rng](const auto& array) { return array[rng.Skewed(std::size(array))]; };

  constexpr std::size_t kNumFunctions = 1500;
  std::vector<MiniProtoWriter> functions;
  for (std::size_t id = 1; functions.size() < kNumFunctions; ++id) {
    // One draw per statement: the order operands of + are evaluated in is
    // unspecified, and the data must not depend on the compiler.
    const std::string name_space = pick(kNamespaces);
    const std::string type = pick(kTypes);
    const std::string method = pick(kMethods);
    const std::string args = pick(kArgs);
    std::string name = name_space + type + "::" + method + args;
    if (rng.Below(3) == 0) name = "myapp::Worker" + std::to_string(id) + "::" + method + args;
    MiniProtoWriter function;
    function.Uint(1, id);
    function.Uint(2, strings.Intern(name));
    function.Uint(3, strings.Intern(name));
    function.Uint(4, strings.Intern(pick(kFiles)));
    function.Uint(5, 10 + rng.Below(3000));
    functions.push_back(function);
  }

  constexpr std::size_t kNumLocations = 3000;
  std::vector<MiniProtoWriter> locations;
  std::uint64_t address = 0x55d4c3a00000ull + (rng.Next() & 0xFFFFF000ull);
  for (std::size_t id = 1; id <= kNumLocations; ++id) {
    address += 4 + rng.Below(600);
    MiniProtoWriter location;
    location.Uint(1, id);
    location.Uint(2, 1);
    location.Uint(3, address);
    for (std::size_t inlined = rng.Below(4) == 0 ? 2 : 1; inlined > 0; --inlined) {
      MiniProtoWriter line;
      line.Uint(1, 1 + rng.Below(kNumFunctions));
      line.Uint(2, 10 + rng.Below(3000));
      location.Message(4, line);
    }
    locations.push_back(location);
  }

  // Call paths, leaf first, all ending in the same program entry frames.
  std::vector<std::vector<std::uint64_t>> paths(300);
  for (auto& path : paths) {
    for (std::size_t depth = 4 + rng.Below(25); depth > 0; --depth) path.push_back(1 + rng.Below(kNumLocations));
    for (std::uint64_t root : {4, 3, 2, 1}) path.push_back(root);
  }
  static const std::uint64_t kObjectSizes[] = {16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 4096, 65536};
  const std::uint64_t strings_estimate = 150000;
  while (profile.size() + strings_estimate < target_size) {
    std::vector<std::uint64_t> stack = paths[rng.Skewed(paths.size())];
    for (std::size_t extra = rng.Below(3); extra > 0; --extra) {
      stack.insert(stack.begin(), 1 + rng.Below(kNumLocations));
    }
    const std::uint64_t size = pick(kObjectSizes);
    const std::uint64_t objects = 1 + rng.Skewed(40) * (524288 / size + 1);
    const std::uint64_t inuse = rng.Below(3) == 0 ? 0 : objects / (1 + rng.Below(4));
    MiniProtoWriter sample;
    sample.Packed(1, stack);
    sample.Packed(2, {objects, objects * size, inuse, inuse * size});
    MiniProtoWriter label;
    label.Uint(1, strings.Intern("bytes"));
    label.Uint(3, size);
    sample.Message(3, label);
    profile.Message(2, sample);
  }

  MiniProtoWriter mapping;
  mapping.Uint(1, 1);
  mapping.Uint(2, 0x55d4c3a00000ull);
  mapping.Uint(3, 0x55d4c5a00000ull);
  mapping.Uint(5, strings.Intern("/srv/myapp/bin/myapp-server"));
  mapping.Uint(6, strings.Intern("3f2a9c0e5b7d41a8c6e0f9b2d4a7c1e5f8b3a0d2"));
  mapping.Uint(7, 1);
  profile.Message(3, mapping);
  for (const auto& location : locations) profile.Message(4, location);
  for (const auto& function : functions) profile.Message(5, function);
  for (const auto& s : strings.strings()) profile.Bytes(6, s);
  profile.Uint(9, 1700000000123456789ull);
  profile.Uint(12, 524288);
  return profile.bytes();
}

// ---------------------------------------------------------------------------

int FirstBlockType(const std::string& gz) { return (static_cast<unsigned char>(gz.at(10)) >> 1) & 3; }

std::uint32_t ReadLe32(const std::string& s, std::size_t pos) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s.at(pos + i));
  return v;
}

// Compresses, decodes with the test inflater, and compares without printing
// megabytes on failure.
std::string CheckRoundTrip(std::string_view in) {
  const std::string gz = Gzip(in);
  std::string back;
  const bool decoded = Gunzip(gz, back);
  CHECK(decoded);
  const bool same = back == in;
  CHECK_MESSAGE(same, "input size " << in.size() << ", decoded size " << back.size());
  return gz;
}

bool HaveSystemGzip() {
  static const bool have = std::system("gzip --version >/dev/null 2>&1") == 0;
  return have;
}

class TempFile {
 public:
  TempFile() {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/heapprof_gzip_XXXXXX";
    const int fd = mkstemp(&path_[0]);
    REQUIRE(fd >= 0);
    close(fd);
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void Write(std::string_view bytes) const {
    FILE* f = std::fopen(path_.c_str(), "wb");
    REQUIRE(f != nullptr);
    const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    REQUIRE(std::fclose(f) == 0);
    REQUIRE(written);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs `command` with `input` on stdin; returns stdout, sets `ok` on exit code 0.
std::string RunFilter(const std::string& command, std::string_view input, bool* ok) {
  TempFile file;
  file.Write(input);
  FILE* pipe = popen((command + " < '" + file.path() + "'").c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[65536];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  *ok = pclose(pipe) == 0;
  return output;
}

}  // namespace

TEST_SUITE("gzip") {

TEST_CASE("header and trailer follow RFC 1952, CRC-32 matches the check value") {
  const std::string gz = Gzip("123456789");
  REQUIRE(gz.size() >= 18);
  CHECK(static_cast<unsigned char>(gz[0]) == 0x1f);
  CHECK(static_cast<unsigned char>(gz[1]) == 0x8b);
  CHECK(gz[2] == 8);  // deflate
  CHECK(gz[3] == 0);  // no optional fields
  CHECK(ReadLe32(gz, 4) == 0);  // MTIME 0: output depends on the input only
  // 0xCBF43926 is the published check value of this CRC-32 (CRC of "123456789").
  CHECK(ReadLe32(gz, gz.size() - 8) == 0xCBF43926u);
  CHECK(ReadLe32(gz, gz.size() - 4) == 9);
}

TEST_CASE("CRC-32 of long input agrees with the bytewise reference") {
  // The encoder folds 8 bytes per step; lengths 0..40 cover every tail.
  const std::string data = RandomBytes(1000, 42);
  for (std::size_t n = 0; n <= 40; ++n) {
    const auto* p = reinterpret_cast<const unsigned char*>(data.data());
    CHECK(heapprof::detail::deflate::Crc32Update(0, p, n) == heapprof_test::inflate_detail::Crc32(p, n));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  // Chaining: CRC(a + b) from CRC(a).
  CHECK(heapprof::detail::deflate::Crc32Update(heapprof::detail::deflate::Crc32Update(0, p, 333), p + 333, 667) ==
        heapprof_test::inflate_detail::Crc32(p, 1000));
}

TEST_CASE("empty input is one tiny final block") {
  const std::string gz = CheckRoundTrip("");
  CHECK(gz.size() == 20);  // 10 header + 2 (fixed block holding only end-of-block) + 8 trailer
  CHECK(FirstBlockType(gz) == 1);
  CHECK((static_cast<unsigned char>(gz[10]) & 1) == 1);  // BFINAL
}

TEST_CASE("every single byte") {
  for (int b = 0; b < 256; ++b) {
    CAPTURE(b);
    CheckRoundTrip(std::string(1, static_cast<char>(b)));
  }
}

TEST_CASE("all short inputs, where fewer than four bytes remain to hash") {
  const std::string text = Text(400, 7);
  const std::string random = RandomBytes(400, 8);
  for (std::size_t n = 0; n <= 300; ++n) {
    CAPTURE(n);
    CheckRoundTrip(std::string_view(text).substr(0, n));
    CheckRoundTrip(std::string_view(random).substr(0, n));
    CheckRoundTrip(std::string(n, 'a'));
  }
}

TEST_CASE("highly repetitive input compresses through long matches") {
  const std::string zeros(1 << 20, '\0');
  const std::string gz = CheckRoundTrip(zeros);
  // Literals alone cost at least one bit a byte (128 KiB); 258-byte matches
  // at distance 1 take about two bits each, ~1 KiB in all.
  CHECK(gz.size() < 2048);

  std::string pattern;
  while (pattern.size() < (1u << 20)) pattern += "abcdefghijklmnopqrstuvwxyz0123456789-";
  CHECK(CheckRoundTrip(pattern).size() < 8192);
}

TEST_CASE("random input falls back to stored blocks") {
  for (std::size_t size : {100u, 5000u, 200000u}) {
    CAPTURE(size);
    const std::string data = RandomBytes(size, size);
    const std::string gz = CheckRoundTrip(data);
    CHECK(FirstBlockType(gz) == 0);
    // 18 bytes of gzip framing plus 5 bytes per stored block, never more.
    const std::size_t blocks = size / heapprof::detail::deflate::kMaxBlockSymbols + 2;
    CHECK(gz.size() <= size + 18 + 5 * blocks);
  }
}

TEST_CASE("text uses dynamic Huffman blocks and compresses well") {
  const std::string text = Text(300000, 3);
  const std::string gz = CheckRoundTrip(text);
  CHECK(FirstBlockType(gz) == 2);
  MESSAGE("text: " << text.size() << " -> " << gz.size());
  CHECK(gz.size() < text.size() / 3);
}

TEST_CASE("long runs of single bytes") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const std::string data = Runs(300000, seed);
    const std::string gz = CheckRoundTrip(data);
    CHECK(gz.size() < data.size() / 20);
  }
}

TEST_CASE("inputs larger than the 32 KiB window and 64 KiB stored-block limit") {
  for (std::size_t size : {32767u, 32768u, 32769u, 65535u, 65536u, 65537u, 131071u, 131072u, 1000003u}) {
    CAPTURE(size);
    CheckRoundTrip(Text(size, size));
    CheckRoundTrip(RandomBytes(size, size));
    CheckRoundTrip(ProfileLike(size, size));
  }
  // Matches at the far edge of the window: the same random 40 KiB twice, so
  // every match is 40 KiB back, out of reach, mixed with reachable ones.
  const std::string chunk = RandomBytes(40000, 5);
  const std::string near_chunk = RandomBytes(32000, 6);
  CheckRoundTrip(chunk + chunk + near_chunk + near_chunk + chunk);
}

TEST_CASE("match tables restart cleanly at segment boundaries") {
  // Real segments are 1 GiB; the encoder takes a smaller size so the restart
  // (tables cleared, no match reaching into the previous segment) is testable.
  auto gzip_with_segments = [](std::string_view in, std::size_t segment) {
    const auto* data = reinterpret_cast<const unsigned char*>(in.data());
    const auto& header = heapprof::detail::deflate::kGzipHeader;
    heapprof::detail::ArenaString gz(header.data(), header.size());
    heapprof::detail::deflate::Encoder(gz, segment).Compress(data, in.size());
    const auto size = static_cast<std::uint32_t>(in.size());
    for (std::uint32_t word : {heapprof::detail::deflate::Crc32Update(0, data, in.size()), size}) {
      for (int shift = 0; shift < 32; shift += 8) gz.push_back(static_cast<char>(word >> shift));
    }
    return std::string(gz);
  };
  const std::string data = ProfileLike(300000, 9) + RandomBytes(50000, 9) + Text(200000, 9);
  CHECK(gzip_with_segments(data, std::size_t{1} << 30) == Gzip(data));
  for (std::size_t segment : {1000u, 16383u, 16384u, 65536u, 100000u, 549999u}) {
    CAPTURE(segment);
    const std::string gz = gzip_with_segments(data, segment);
    std::string back;
    CHECK(Gunzip(gz, back));
    CHECK((back == data));
    // Each restart loses the window (and ends a block), which at 1 GiB is noise.
    CHECK(gz.size() < data.size() * 3 / 4);
  }
  for (std::size_t segment = 1; segment <= 6; ++segment) {
    CAPTURE(segment);
    const std::string small = "abcabcabcabcabcabcabcabc" + Text(40, 1);
    std::string back;
    CHECK(Gunzip(gzip_with_segments(small, segment), back));
    CHECK(back == small);
  }
}

TEST_CASE("sizes around block boundaries") {
  const std::size_t block = heapprof::detail::deflate::kMaxBlockSymbols;
  // Random bytes are one literal symbol each, so these sizes put the end of the
  // input just before, on, and just after a block flush.
  for (std::size_t size : {block - 2, block - 1, block, block + 1, block + 2, 2 * block - 1, 2 * block,
                           2 * block + 1, 4 * block, std::size_t{2 * 65535}, std::size_t{2 * 65535 + 1}}) {
    CAPTURE(size);
    CheckRoundTrip(RandomBytes(size, size + 1));
    CheckRoundTrip(Text(size, size + 2));
    // Half compressible, half not: stored and Huffman blocks follow each other.
    CheckRoundTrip(Text(size / 2, size) + RandomBytes(size - size / 2, size + 3));
  }
}

TEST_CASE("Huffman code lengths stay within the limits and form complete codes") {
  using heapprof::detail::deflate::BuildCodeLengths;
  // Fibonacci frequencies make the deepest possible Huffman trees: depth n-1.
  auto check = [](const std::vector<std::uint32_t>& freqs, int max_length) {
    std::vector<std::uint8_t> lengths(freqs.size());
    BuildCodeLengths(freqs.data(), static_cast<int>(freqs.size()), max_length, lengths.data());
    std::uint64_t kraft = 0;  // in units of 2^-max_length
    int used = 0;
    for (std::size_t s = 0; s < freqs.size(); ++s) {
      CHECK(lengths[s] <= max_length);
      CHECK((freqs[s] == 0 || lengths[s] > 0));
      if (lengths[s] > 0) {
        kraft += std::uint64_t{1} << (max_length - lengths[s]);
        ++used;
      }
    }
    CHECK(used >= 2);
    CHECK(kraft == (std::uint64_t{1} << max_length));
  };
  std::vector<std::uint32_t> fibonacci = {1, 1};
  while (fibonacci.size() < 30) fibonacci.push_back(fibonacci[fibonacci.size() - 1] + fibonacci[fibonacci.size() - 2]);
  check(fibonacci, 15);
  check(std::vector<std::uint32_t>(fibonacci.begin(), fibonacci.begin() + 19), 7);
  std::vector<std::uint32_t> wide(286, 0);
  for (std::size_t i = 0; i < 30; ++i) wide[i * 9] = fibonacci[i];
  check(wide, 15);
  check(std::vector<std::uint32_t>(30, 0), 15);  // no distances: still two codes
  check(std::vector<std::uint32_t>{0, 0, 5, 0}, 15);  // one symbol
  Rng rng(11);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::uint32_t> freqs(286);
    for (auto& f : freqs) {
      if (rng.Below(4) == 0) {
        f = 0;
        continue;
      }
      f = 1u << rng.Below(20);
      f += static_cast<std::uint32_t>(rng.Below(5));
    }
    check(freqs, 15);
    freqs.resize(19);
    check(freqs, 7);
  }
}

TEST_CASE("skewed literal statistics that need length-limited codes") {
  // Each byte value i appears about fib(i) times, shuffled so few matches form:
  // an unlimited Huffman code would need more than 15 bits.
  std::vector<std::uint32_t> fibonacci = {1, 2};
  while (fibonacci.size() < 24) fibonacci.push_back(fibonacci[fibonacci.size() - 1] + fibonacci[fibonacci.size() - 2]);
  std::string data;
  for (std::size_t i = 0; i < fibonacci.size(); ++i) data.append(fibonacci[i], static_cast<char>(i * 7));
  Rng rng(99);
  for (std::size_t i = data.size() - 1; i > 0; --i) std::swap(data[i], data[rng.Below(i + 1)]);
  const std::string gz = CheckRoundTrip(data);
  if (HaveSystemGzip()) {
    bool ok = false;
    const bool same = RunFilter("gzip -dc", gz, &ok) == data;
    CHECK(ok);
    CHECK(same);
  }
}

TEST_CASE("output is deterministic and appended to what the string holds") {
  const std::string data = ProfileLike(200000, 1);
  heapprof::detail::ArenaString out = "prefix";
  GzipCompress(data, out);
  CHECK(out.compare(0, 6, "prefix") == 0);
  CHECK(out.substr(6) == Gzip(data));
  std::string back;
  CHECK(Gunzip(std::string_view(out).substr(6), back));
  CHECK((back == data));
}

TEST_CASE("system gzip decodes our output byte-exactly") {
  if (!HaveSystemGzip()) {
    MESSAGE("gzip not found on PATH: skipped");
    return;
  }
  const std::string inputs[] = {"",
                                "x",
                                std::string(100000, 'z'),
                                Text(250000, 21),
                                RandomBytes(150000, 22),
                                Runs(250000, 23),
                                ProfileLike(600000, 24),
                                Text(70000, 25) + RandomBytes(70000, 26) + Text(70000, 27)};
  for (const std::string& in : inputs) {
    CAPTURE(in.size());
    bool ok = false;
    const std::string out = RunFilter("gzip -dc", Gzip(in), &ok);
    CHECK(ok);
    const bool same = out == in;
    CHECK(same);
  }
}

TEST_CASE("test inflater reads what system gzip writes") {
  if (!HaveSystemGzip()) {
    MESSAGE("gzip not found on PATH: skipped");
    return;
  }
  const std::string inputs[] = {"", Text(200000, 31), RandomBytes(100000, 32), ProfileLike(300000, 33)};
  for (const std::string& in : inputs) {
    for (const char* level : {"-1", "-6", "-9"}) {
      CAPTURE(in.size());
      CAPTURE(level);
      bool ok = false;
      const std::string gz = RunFilter(std::string("gzip -c ") + level, in, &ok);
      REQUIRE(ok);
      std::string back;
      CHECK(Gunzip(gz, back));
      CHECK((back == in));
    }
  }
}

TEST_CASE("test inflater: optional header fields and concatenated members") {
  const std::string plain = Gzip("hello, ");
  // FEXTRA + FNAME + FCOMMENT + FHCRC around the same deflate data.
  std::string header = plain.substr(0, 10);
  header[3] = 4 | 8 | 16 | 2;
  header += std::string("\x03\x00" "abc", 5);
  header += std::string("name.txt\0", 9);
  header += std::string("a comment\0", 10);
  const std::uint32_t crc = heapprof_test::inflate_detail::Crc32(
      reinterpret_cast<const unsigned char*>(header.data()), header.size());
  header.push_back(static_cast<char>(crc & 0xFF));
  header.push_back(static_cast<char>((crc >> 8) & 0xFF));
  const std::string fancy = header + Gzip("world").substr(10);
  std::string out;
  CHECK(Gunzip(fancy, out));
  CHECK(out == "world");
  CHECK(Gunzip(plain + fancy, out));
  CHECK(out == "hello, world");

  std::string bad_header_crc = fancy;
  bad_header_crc[header.size() - 1] ^= 1;
  CHECK_FALSE(Gunzip(bad_header_crc, out));
  CHECK(out.empty());
}

// The test's own inflater (tests/support/inflate.hpp) on 10,000 damaged
// inputs, on one thread: nothing for TSan to check, and half a minute under
// it. The plain, clang and ASan+UBSan builds run it (ASan checks the bounds).
#if defined(HEAPPROF_TSAN)
constexpr bool kSkipUnderTsan = true;
#else
constexpr bool kSkipUnderTsan = false;
#endif

TEST_CASE("test inflater rejects malformed input without crashing" * doctest::skip(kSkipUnderTsan)) {
  std::string out;
  CHECK_FALSE(Gunzip("", out));
  CHECK_FALSE(Gunzip("not gzip at all, not even close", out));

  const std::string data = Text(20000, 41) + RandomBytes(3000, 42) + Text(3000, 43);
  const std::string gz = Gzip(data);
  REQUIRE(Gunzip(gz, out));

  // Every truncation fails.
  int accepted = 0;
  for (std::size_t n = 0; n < gz.size(); ++n) accepted += Gunzip(std::string_view(gz).substr(0, n), out);
  CHECK(accepted == 0);

  auto corrupt = [&gz](std::size_t pos, unsigned char mask) {
    std::string bad = gz;
    bad[pos] = static_cast<char>(bad[pos] ^ mask);
    return bad;
  };
  CHECK_FALSE(Gunzip(corrupt(0, 1), out));                  // magic
  CHECK_FALSE(Gunzip(corrupt(2, 1), out));                  // method
  CHECK_FALSE(Gunzip(corrupt(3, 0x20), out));               // reserved flag
  CHECK_FALSE(Gunzip(corrupt(gz.size() - 8, 1), out));      // CRC-32
  CHECK_FALSE(Gunzip(corrupt(gz.size() - 1, 0x80), out));   // ISIZE
  CHECK_FALSE(Gunzip(gz + '\0', out));                      // trailing garbage
  CHECK_FALSE(Gunzip(gz + gz.substr(0, 15), out));          // truncated second member
  // BTYPE 3 is reserved.
  CHECK_FALSE(Gunzip(corrupt(10, static_cast<unsigned char>((FirstBlockType(gz) ^ 3) << 1)), out));

  // Random damage anywhere: decoding must end (the sanitizer builds check it
  // never reads out of bounds) and, thanks to the CRC, essentially never succeed.
  Rng rng(7);
  accepted = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bad = gz;
    for (int flips = 1 + static_cast<int>(rng.Below(3)); flips > 0; --flips) {
      bad[rng.Below(bad.size())] ^= static_cast<char>(1 << rng.Below(8));
    }
    accepted += Gunzip(bad, out) && out != data;
  }
  CHECK(accepted == 0);
  // Random bytes after a valid header, for the block parsers.
  for (int round = 0; round < 3000; ++round) {
    const std::string bad = gz.substr(0, 10) + RandomBytes(1 + rng.Below(200), static_cast<std::uint64_t>(round));
    accepted += Gunzip(bad, out);
  }
  CHECK(accepted == 0);
}

TEST_CASE("profile-like data: size within 1.3x of gzip -1") {
  const std::string profile = ProfileLike(1 << 20, 2024);
  const auto start = std::chrono::steady_clock::now();
  const std::string ours = CheckRoundTrip(profile);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("profile-like input " << profile.size() << " bytes -> heapprof " << ours.size()
                                << " bytes (compress + test inflate " << seconds * 1e3 << " ms)");
  CHECK(ours.size() < profile.size() / 3);
  if (!HaveSystemGzip()) {
    MESSAGE("gzip not found on PATH: ratio check skipped");
    return;
  }
  bool ok = false;
  const std::string reference = RunFilter("gzip -1 -c", profile, &ok);
  REQUIRE(ok);
  MESSAGE("gzip -1: " << reference.size() << " bytes; ratio heapprof / gzip -1 = "
                      << static_cast<double>(ours.size()) / static_cast<double>(reference.size()));
  CHECK(static_cast<double>(ours.size()) <= 1.3 * static_cast<double>(reference.size()));
}

TEST_CASE("the debug-section inflater decodes our deflate streams of every shape exactly, and writes nothing past the output") {
  // ZlibInflate (4_symbolization/inflate.hpp) reads 8 input bytes at a time
  // and copies back references 8 bytes at a time, up to 7 bytes past the
  // copy: checked here on stored, fixed and dynamic blocks, on copies that
  // overlap their own output at every distance from 1 to 17, on outputs of
  // every length around those steps, and with guard bytes after the buffer.
  // Our gzip member's deflate data, rewrapped as a zlib stream (RFC 1950).
  auto zlib_of = [](const std::string& input) {
    const std::string gz = Gzip(input);
    REQUIRE(gz.size() >= 18);
    std::string z = "\x78\x9c" + gz.substr(10, gz.size() - 18);
    std::uint32_t a = 1, b = 0;
    for (unsigned char c : input) {
      a = (a + c) % 65521u;
      b = (b + a) % 65521u;
    }
    const std::uint32_t adler = (b << 16) | a;
    for (int shift = 24; shift >= 0; shift -= 8) z += static_cast<char>((adler >> shift) & 0xff);
    return z;
  };
  std::vector<std::string> inputs;
  Rng rng(11);
  for (std::size_t n = 0; n <= 80; ++n) inputs.push_back(std::string(n, 'a'));
  for (std::size_t period = 2; period <= 17; ++period) {
    std::string unit;
    for (std::size_t i = 0; i < period; ++i) unit += static_cast<char>('a' + (rng.Next() % 26));
    for (std::size_t n : {period * 3 + 1, std::size_t{300}, std::size_t{70000}}) {
      std::string s;
      while (s.size() < n) s += unit;
      inputs.push_back(s.substr(0, n));
    }
  }
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{9}, std::size_t{1000}, std::size_t{100000}}) {
    std::string noise(n, '\0');
    for (char& c : noise) c = static_cast<char>(rng.Next());
    inputs.push_back(noise);  // stored blocks
  }
  std::string text;
  while (text.size() < 300000) {
    text += "heapprof::detail::Symbolizer::Symbolize " + std::to_string(rng.Next() % 1000) + " ";
    text += std::string(rng.Next() % 40, static_cast<char>('x' + rng.Next() % 3));
  }
  inputs.push_back(text);
  for (std::size_t cut = 1; cut <= 20; ++cut) inputs.push_back(text.substr(0, 4096 + cut));
  for (const std::string& input : inputs) {
    CAPTURE(input.size());
    const std::string z = zlib_of(input);
    std::vector<unsigned char> out(input.size() + 16, 0xA5);
    const bool ok = heapprof::detail::inflate::ZlibInflate(reinterpret_cast<const unsigned char*>(z.data()), z.size(),
                                                          out.data(), input.size());
    REQUIRE(ok);
    CHECK(std::memcmp(out.data(), input.data(), input.size()) == 0);
    CHECK(std::count(out.begin() + static_cast<std::ptrdiff_t>(input.size()), out.end(), 0xA5) == 16);
  }
}

}  // TEST_SUITE("gzip")
