// The real reader: `go tool pprof` (Debian's golang-go) must read our profiles.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include "support/profile_io.hpp"

namespace {

void* g_pprof_keep[64];

__attribute__((noinline)) void GoPprofVisibleLeaf() {
  for (int i = 0; i < 64; ++i) g_pprof_keep[i] = new char[1000];
  asm volatile("" ::: "memory");
}

void* g_lines_keep[32];
void* g_inline_keep[32];

constexpr int kLeafAllocLine = __LINE__ + 2;
__attribute__((noinline)) void LineVisibleLeaf() {
  for (int i = 0; i < 32; ++i) g_lines_keep[i] = new char[2000];
  asm volatile("" ::: "memory");
}

constexpr int kInlinedAllocLine = __LINE__ + 2;
__attribute__((always_inline)) inline void InlinedAllocator(int i) {
  g_inline_keep[i] = new char[3000];
}

constexpr int kCallOfInlinedLine = __LINE__ + 3;
__attribute__((noinline)) void CallsInlined() {
  for (int i = 0; i < 32; ++i) {
    InlinedAllocator(i);
  }
  asm volatile("" ::: "memory");
}

}  // namespace

TEST_CASE("go tool pprof -lines -top, -list and -traces show file:line and inlined frames from the profile alone") {
  using namespace heapprof_test;
  if (GoBinary().empty()) {
    MESSAGE("go not installed (Debian golang-go): skipped");
    return;
  }
  RateScope rate(1);
  LineVisibleLeaf();
  CallsInlined();
  std::string gz;
  Profile p;
  REQUIRE(CaptureProfile(p, false, &gz));
  const std::string path = TempPath(".pb.gz");
  REQUIRE(WriteFile(path, gz));
  const std::string file = "test_pprof_go.cpp:";

  // -symbolize=none: pprof uses only what the profile says, as when it is
  // scraped by a service that has no copy of the binary.
  std::string out;
  int rc = GoPprof("-symbolize=none -lines -top -nodecount=400 -sample_index=inuse_space", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  auto line_with = [&out](const std::string& a, const std::string& b) {
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find(a) != std::string::npos && line.find(b) != std::string::npos) return true;
    }
    return false;
  };
  CHECK(line_with("(anonymous namespace)::LineVisibleLeaf ", file + std::to_string(kLeafAllocLine)));
  CHECK(line_with("(anonymous namespace)::InlinedAllocator ", file + std::to_string(kInlinedAllocLine)));

  // The inlined callee, then its caller at the call's line, in one stack.
  rc = GoPprof("-symbolize=none -lines -traces -sample_index=inuse_space -focus=InlinedAllocator", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t callee = out.find("InlinedAllocator " );
  const std::size_t caller = out.find("CallsInlined ");
  CHECK(callee != std::string::npos);
  CHECK(caller != std::string::npos);
  CHECK(callee < caller);
  CHECK(line_with("(anonymous namespace)::CallsInlined ", file + std::to_string(kCallOfInlinedLine)));

  // -list reads the source file named by the profile's Function.
  rc = GoPprof("-symbolize=none -list=LineVisibleLeaf -sample_index=inuse_space", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("ROUTINE") != std::string::npos);
  CHECK(out.find("new char[2000]") != std::string::npos);

  // Without -lines, names are short and consistent: no parameter lists.
  rc = GoPprof("-symbolize=none -top -nodecount=400", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("LineVisibleLeaf()") == std::string::npos);
  CHECK(out.find("(anonymous namespace)::LineVisibleLeaf") != std::string::npos);

  for (void*& q : g_lines_keep) delete[] static_cast<char*>(q);
  for (void*& q : g_inline_keep) delete[] static_cast<char*>(q);
  std::remove(path.c_str());
}

TEST_CASE("go tool pprof reads our profiles (-raw, -top, -traces)") {
  using namespace heapprof_test;
  if (GoBinary().empty()) {
    MESSAGE("go not installed (Debian golang-go): skipped");
    return;
  }
  heapprof_test::RateScope rate(1);
  GoPprofVisibleLeaf();
  std::string gz;
  Profile p;
  REQUIRE(CaptureProfile(p, false, &gz));
  const std::string path = TempPath(".pb.gz");
  REQUIRE(WriteFile(path, gz));

  std::string out;
  int rc = GoPprof("-raw", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("PeriodType: space bytes") != std::string::npos);
  CHECK(out.find("alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes") !=
        std::string::npos);
  CHECK(out.find("GoPprofVisibleLeaf") != std::string::npos);
  CHECK(out.find("64      64000         64      64000") != std::string::npos);  // the sample's values
  CHECK(out.find("bytes:[1000 bytes]") != std::string::npos);                          // numeric label

  rc = GoPprof("-top -nodecount=200 -sample_index=inuse_space", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("GoPprofVisibleLeaf") != std::string::npos);
  CHECK(out.find("Type: inuse_space") != std::string::npos);

  // Filtering on the numeric label works as for Go's own heap profiles.
  rc = GoPprof("-top -tagfocus=bytes=1000B -sample_index=alloc_objects", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("GoPprofVisibleLeaf") != std::string::npos);

  // The allocs variant opens on alloc_space.
  std::ostringstream allocs;
  REQUIRE(heapprof::WriteAllocsProfile(allocs));
  const std::string allocs_path = TempPath(".pb.gz");
  REQUIRE(WriteFile(allocs_path, allocs.str()));
  rc = GoPprof("-top", allocs_path, out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("Type: alloc_space") != std::string::npos);

  for (void* q : g_pprof_keep) delete[] static_cast<char*>(q);
  std::remove(path.c_str());
  std::remove(allocs_path.c_str());
}

TEST_CASE("gzip: the system gzip reads our profile and we stay within 1.3x of gzip -1") {
  using namespace heapprof_test;
  std::string gz;
  Profile p;
  REQUIRE(CaptureProfile(p, false, &gz));
  std::string raw;
  REQUIRE(Gunzip(gz, raw));
  const std::string gz_path = TempPath(".gz");
  REQUIRE(WriteFile(gz_path, gz));
  std::string out;
  if (RunCommand("gzip -t " + gz_path, out) != 0) {
    FAIL("gzip -t rejected our output: " << out);
  }
  const std::string raw_path = TempPath(".pb");
  REQUIRE(WriteFile(raw_path, raw));
  REQUIRE(RunCommand("gzip -1 -c " + raw_path + " | wc -c", out) == 0);
  const double gzip1 = std::stod(out);
  MESSAGE("profile: raw " << raw.size() << " B, ours " << gz.size() << " B, gzip -1 " << gzip1 << " B");
  CHECK(static_cast<double>(gz.size()) <= 1.3 * gzip1);
  std::remove(gz_path.c_str());
  std::remove(raw_path.c_str());
}

namespace {
// A stream buffer that accepts `limit` bytes, then fails every write.
class FailingBuf : public std::streambuf {
 public:
  explicit FailingBuf(std::size_t limit) : limit_(limit) {}

 protected:
  std::streamsize xsputn(const char*, std::streamsize n) override {
    if (written_ + static_cast<std::size_t>(n) > limit_) return 0;
    written_ += static_cast<std::size_t>(n);
    return n;
  }
  int_type overflow(int_type c) override { return xsputn(nullptr, 1) == 1 ? c : traits_type::eof(); }

 private:
  std::size_t limit_;
  std::size_t written_ = 0;
};
}  // namespace

TEST_CASE("a stream that fails makes Write*Profile return false") {
  std::ofstream bad_dir("/nonexistent-heapprof-dir/heap.pb.gz", std::ios::binary);
  CHECK_FALSE(heapprof::WriteHeapProfile(bad_dir));
  FailingBuf midway(100);
  std::ostream out(&midway);
  CHECK_FALSE(heapprof::WriteAllocsProfile(out));
  std::ostringstream good;
  CHECK(heapprof::WriteHeapProfile(good));
}

namespace {
std::vector<void*> g_tagged;
__attribute__((noinline)) void TaggedBytesLeaf() {
  heapprof::ScopedLabels scope{{"bytes", "huge"}, {"label_bytes", "own"}, {"user", "alice"}};
  for (int i = 0; i < 8; ++i) g_tagged.push_back(new char[3000]);
}
}  // namespace

TEST_CASE("a user label named bytes stays apart from the numeric bytes label in go tool pprof -tags") {
  using namespace heapprof_test;
  if (GoBinary().empty()) {
    MESSAGE("go not installed (Debian golang-go): skipped");
    return;
  }
  heapprof_test::RateScope rate(1);
  TaggedBytesLeaf();
  std::string gz;
  Profile p;
  REQUIRE(CaptureProfile(p, false, &gz));
  const std::string path = TempPath(".pb.gz");
  REQUIRE(WriteFile(path, gz));
  std::string out;
  const int rc = GoPprof("-tags -tagfocus=user=alice -sample_index=inuse_objects", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  // The numeric label: only sizes. The user's: only its string.
  const std::size_t numeric = out.find(" bytes: Total ");
  const std::size_t user = out.find(" label_bytes: Total ");
  REQUIRE(numeric != std::string::npos);
  REQUIRE(user != std::string::npos);
  const std::string numeric_part = out.substr(numeric, user > numeric ? user - numeric : std::string::npos);
  CHECK(numeric_part.find("huge") == std::string::npos);
  CHECK(numeric_part.find("2.93kB") != std::string::npos);  // 3000 bytes
  CHECK(out.find("huge") != std::string::npos);
  // A user's own "label_bytes" is one more "label_" on: not merged with the renamed "bytes".
  const std::size_t own = out.find(" label_label_bytes: Total ");
  CHECK(own != std::string::npos);
  if (user != std::string::npos && own != std::string::npos) {
    const std::string renamed = out.substr(user, own > user ? own - user : std::string::npos);
    CHECK(renamed.find("own") == std::string::npos);
  }
  for (void* q : g_tagged) delete[] static_cast<char*>(q);
  std::remove(path.c_str());
}
