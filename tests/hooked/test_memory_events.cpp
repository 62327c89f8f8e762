// Memory events (issue 16): the peak heap profile, dumps near the memory
// limit (dump_near_oom, rss_interval), the dump on allocation failure
// (oom_dump). Child processes: memory_scenarios.hpp.
#include <heapprof.hpp>
#include "heapprof/detail/2_sampling/peak.hpp"

#include <doctest/doctest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/http_client.hpp"
#include "support/child_files.hpp"
#include "support/profile_io.hpp"
#include "memory_scenarios.hpp"

namespace {

using namespace heapprof_test;

// The workloads' sizes are memory_scenarios.hpp's, which the children run.
constexpr std::int64_t kBigBytes = static_cast<std::int64_t>(kPeakBigBytes);

std::string MemoryEventsTempDir() {
  const std::string dir = heapprof_test::MakeTempDir("memev");
  REQUIRE(!dir.empty());
  return dir;
}

std::int64_t Total(const Profile& p, const std::string& type) {
  const int idx = SampleTypeIndex(p, type);
  std::int64_t t = 0;
  for (const Sample& s : p.samples) t += s.values.at(idx);
  return t;
}

std::vector<std::string> Comments(const Profile& p) {
  std::vector<std::string> out;
  for (std::int64_t i : p.comment_indices) out.push_back(p.string_table.at(static_cast<std::size_t>(i)));
  return out;
}

// The standard deviation of the estimated bytes of `count` objects of `size`
// sampled at `rate` (each kept with probability q = 1 - exp(-size/rate) and
// weighted size/q): sqrt(count q (1-q)) size/q.
double SampledSigma(std::size_t count, std::size_t size, double rate) {
  const double q = -std::expm1(-static_cast<double>(size) / rate);
  return std::sqrt(static_cast<double>(count) * q * (1 - q)) * static_cast<double>(size) / q;
}

void* g_window_keep;

__attribute__((noinline)) void WindowA(std::size_t n) {
  char* p = new char[n];
  asm volatile("# WindowA" : : "r"(p) : "memory");
  delete[] p;
}

__attribute__((noinline)) void WindowB(std::size_t n) {
  g_window_keep = new char[n];
  asm volatile("# WindowB" ::: "memory");
}

__attribute__((noinline)) void HttpPeakLeaf(std::size_t n) {
  char* p = new char[n];
  asm volatile("# HttpPeakLeaf" : : "r"(p) : "memory");
  delete[] p;
}

bool CapturePeak(Profile& p, std::string* gz_out = nullptr) {
  std::ostringstream os;
  if (!heapprof::WritePeakHeapProfile(os)) return false;
  std::string raw;
  if (gz_out) *gz_out = os.str();
  return Gunzip(os.str(), raw) && DecodeProfile(raw, p) && Validate(p);
}

// RLIMIT_AS cannot be set under ASan or TSan: their shadow memory is terabytes
// of address space. The plain and clang stages run these.
#if defined(HEAPPROF_ASAN) || defined(HEAPPROF_TSAN)
#define HEAPPROF_SKIP_UNDER_SANITIZERS()                                                  \
  do {                                                                                  \
    MESSAGE("skipped under ASan/TSan: RLIMIT_AS would cut their shadow memory");         \
    return;                                                                             \
  } while (0)
#else
#define HEAPPROF_SKIP_UNDER_SANITIZERS() \
  do {                                   \
  } while (0)
#endif

// Enough bytes that one block is a step of more than 10% of the estimate:
// the peak snapshot is then taken right at it.
std::size_t StepAboveTenPercent() { return heapprof::detail::g_peak.InuseEstimate() / 4 + (std::size_t{8} << 20); }

// The oom_dump scenarios' one dump: said once, for the allocation of
// `failed_bytes` that failed first; one file, holding OomHolder's 32 MiB; no
// temporary file left.
void CheckOneOomDump(const std::string& dir, const std::string& out, const std::string& failed_bytes) {
  CHECK(out.find("(oom_dump: an allocation of " + failed_bytes + " bytes failed") != std::string::npos);
  const std::size_t first = out.find("(oom_dump:");
  CHECK((first != std::string::npos && out.find("(oom_dump:", first + 1) == std::string::npos));
  const std::vector<std::string> oom = Matching(dir, R"(p\.[0-9]+\.oom\.pb\.gz)");
  REQUIRE(oom.size() == 1);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/" + oom[0], p));
  CHECK(SumForLeaf(p, "OomHolder", "inuse_space") == (std::int64_t{32} << 20));
  CHECK(Matching(dir, R"(.*\.tmp\..*)").empty());
}

}  // namespace

TEST_CASE("peak profile: a workload that peaks in one function and settles elsewhere, exact at rate 1") {
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1,peak_at_exit=1,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "peak_workload", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile peak, heap;
  REQUIRE(ReadProfileFile(dir + "/peak.pb.gz", peak));
  REQUIRE(ReadProfileFile(dir + "/heap.pb.gz", heap));
  // At the peak: all of PeakWorkload*, nothing of SettleWorkload; to the byte.
  CHECK(SumForLeaf(peak, "PeakWorkloadSmall", "inuse_space") == std::int64_t{kPeakSmallCount * kPeakSmallBytes});
  CHECK(SumForLeaf(peak, "PeakWorkloadSmall", "inuse_objects") == std::int64_t{kPeakSmallCount});
  CHECK(SumForLeaf(peak, "PeakWorkloadBig", "inuse_space") == kBigBytes);
  CHECK(SumForLeaf(peak, "SettleWorkload", "inuse_space") == 0);
  // Now: the other way round.
  CHECK(SumForLeaf(heap, "PeakWorkload", "inuse_space") == 0);
  CHECK(SumForLeaf(heap, "SettleWorkload", "inuse_space") == std::int64_t{kSettleCount * kSettleBytes});
  // The profile says when and how much: its total, exactly.
  const std::vector<std::string> comments = Comments(peak);
  REQUIRE(!comments.empty());
  INFO(comments[0]);
  CHECK(comments[0].find("heapprof peak: " + std::to_string(Total(peak, "inuse_space")) + " bytes") == 0);
  CHECK(comments[0].find("every allocation recorded") != std::string::npos);
  CHECK(peak.time_nanos > 0);
  CHECK(peak.time_nanos <= heap.time_nanos);
  // peak_at_exit: the same peak, at exit.
  const std::vector<std::string> at_exit = Matching(dir, R"(p\.[0-9]+\.peak\.pb\.gz)");
  REQUIRE(at_exit.size() == 1);
  Profile exit_peak;
  REQUIRE(ReadProfileFile(dir + "/" + at_exit[0], exit_peak));
  CHECK(SumForLeaf(exit_peak, "PeakWorkloadBig", "inuse_space") == kBigBytes);
  CHECK(out.find("(peak_at_exit)") != std::string::npos);
  // And go tool pprof shows the comments and the stacks.
  std::string go_out;
  const int go_rc = GoPprof("-comments", dir + "/peak.pb.gz", go_out);
  if (go_rc != -2) {
    INFO(go_out);
    CHECK(go_rc == 0);
    CHECK(go_out.find("heapprof peak: ") != std::string::npos);
    CHECK(GoPprof("-top -sample_index=inuse_space", dir + "/peak.pb.gz", go_out) == 0);
    INFO(go_out);
    CHECK(go_out.find("PeakWorkloadBig") != std::string::npos);
  }
  RemoveDir(dir);
}

TEST_CASE("peak profile: at a sampling rate, within 5 sigma of the workload") {
  // At 64 KiB, not the default 512 KiB: there the 4096 small objects gave ~31
  // samples (sigma 18%), so the bound (4.5 sigma, 80%) let a peak missing half
  // of them pass, and the count's skewed tail went past it about once in 53,000
  // runs (binomial, not the normal's 6.8e-6). Here ~242 samples: 5 sigma is 31%
  // of the truth, and the binomial tail past it 7.7e-7.
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=65536,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "peak_workload", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile peak;
  REQUIRE(ReadProfileFile(dir + "/peak.pb.gz", peak));
  CHECK(peak.period == 65536);
  // The 64 MiB block is sampled with probability 1 - e^-1024 and weighs its size.
  CHECK(SumForLeaf(peak, "PeakWorkloadBig", "inuse_space") == kBigBytes);
  const double sigma = SampledSigma(kPeakSmallCount, kPeakSmallBytes, 65536.0);  // ~1.0 MB, 6.2% of 16.4 MB
  const double small = static_cast<double>(SumForLeaf(peak, "PeakWorkloadSmall", "inuse_space"));
  INFO("PeakWorkloadSmall " << small << ", sigma " << sigma);
  CHECK(std::fabs(small - static_cast<double>(kPeakSmallCount * kPeakSmallBytes)) <= 5 * sigma);
  CHECK(SumForLeaf(peak, "SettleWorkload", "inuse_space") == 0);
  const std::vector<std::string> comments = Comments(peak);
  REQUIRE(!comments.empty());
  CHECK(comments[0].find("estimated from samples") != std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("peak profile: ResetPeak starts a new window") {
  RateScope rate(1);
  heapprof::ResetPeak();
  const std::size_t a = StepAboveTenPercent();
  WindowA(a);
  Profile p;
  REQUIRE(CapturePeak(p));
  CHECK(SumForLeaf(p, "WindowA", "inuse_space") == static_cast<std::int64_t>(a));
  heapprof::ResetPeak();  // A's peak is gone: the window starts at the heap now
  REQUIRE(CapturePeak(p));
  CHECK(SumForLeaf(p, "WindowA", "inuse_space") == 0);
  const std::size_t b = StepAboveTenPercent() / 2 + (std::size_t{4} << 20);
  WindowB(b);
  REQUIRE(CapturePeak(p));
  CHECK(SumForLeaf(p, "WindowA", "inuse_space") == 0);
  CHECK(SumForLeaf(p, "WindowB", "inuse_space") == static_cast<std::int64_t>(b));
  delete[] static_cast<char*>(g_window_keep);
}

TEST_CASE("peak profile: a peak reached while the tracker is held elsewhere is snapshotted when it is let go") {
  // Another thread's snapshot or a writer's copy holds the tracker; a sample
  // that crosses the 10% mark meanwhile skips its snapshot (the sampled path
  // never waits). Before, nothing took it later unless another sample crossed
  // the mark again: two threads allocating 64 MiB each at once, at rate 1, got
  // a peak profile with one block in it. Held here is what those holders use;
  // the block is freed before any other allocation could cross the mark.
  RateScope rate(1);
  heapprof::ResetPeak();
  const std::size_t n = StepAboveTenPercent();
  {
    heapprof::detail::PeakTracker::Held busy(heapprof::detail::g_peak);
    WindowB(n);  // crosses the mark: its snapshot is skipped
  }
  delete[] static_cast<char*>(g_window_keep);
  Profile p;
  REQUIRE(CapturePeak(p));
  CHECK(SumForLeaf(p, "WindowB", "inuse_space") == static_cast<std::int64_t>(n));
  const std::vector<std::string> comments = Comments(p);
  REQUIRE(!comments.empty());
  INFO(comments[0]);
  CHECK(comments[0].find("heapprof peak: " + std::to_string(Total(p, "inuse_space")) + " bytes") == 0);
}

TEST_CASE("http: /debug/pprof/peak is listed, read by go tool pprof, and takes /heap's queries") {
  RateScope rate(1);
  heapprof::HttpServer server("127.0.0.1:0");
  heapprof::ResetPeak();
  // 64 MiB more than a step: the peak must stay HttpPeakLeaf's while the test
  // decodes the profiles it fetches. Run in one process after the other
  // suites (./hooked_tests, not ctest's one file a process), a decoded rate-1
  // profile took 10 MB, the window's peak moved to DecodeProfile, and the go
  // tool pprof checks below missed HttpPeakLeaf.
  const std::size_t n = StepAboveTenPercent() + (std::size_t{64} << 20);
  HttpPeakLeaf(n);

  const HttpResponse index = HttpGet(server.port(), "/debug/pprof/");
  CHECK(index.status == 200);
  CHECK(index.body.find("<a href='peak?debug=1'>peak</a>") != std::string::npos);

  const HttpResponse r = HttpGet(server.port(), "/debug/pprof/peak");
  REQUIRE(r.status == 200);
  CHECK(r.body.size() > 0);
  std::string raw;
  Profile p;
  REQUIRE(Gunzip(r.body, raw));
  REQUIRE(DecodeProfile(raw, p));
  CHECK(Validate(p));
  CHECK(SumForLeaf(p, "HttpPeakLeaf", "inuse_space") == static_cast<std::int64_t>(n));

  CHECK(HttpGet(server.port(), "/debug/pprof/peak?seconds=0").status == 400);

  // The text last: this process's ?debug=1 text is large (the stacks of every
  // earlier test), and at rate 1 its buffer can become the new peak.
  struct TextCheck {
    std::uint16_t port;
    ~TextCheck() {
      const HttpResponse text = HttpGet(port, "/debug/pprof/peak?debug=1");
      CHECK(text.status == 200);
      CHECK(text.body.find("heap profile: ") == 0);
      CHECK(text.body.find("# heapprof.Peak\n# heapprof peak: ") != std::string::npos);
    }
  } text_check{server.port()};

  const std::string go = GoBinary();
  if (go.empty()) {
    MESSAGE("go not installed (Debian golang-go): skipped the go tool pprof part");
    return;
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port()) + "/debug/pprof/peak";
  const std::string env = "PPROF_TMPDIR=/tmp/heapprof-pprof-tmp HOME=${HOME:-/tmp} GOCACHE=${GOCACHE:-/tmp/heapprof-gocache} ";
  std::string out;
  int rc = RunCommand(env + go + " tool pprof -top -sample_index=inuse_space '" + url + "'", out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("Type: inuse_space") != std::string::npos);
  CHECK(out.find("HttpPeakLeaf") != std::string::npos);
  rc = RunCommand(env + go + " tool pprof -comments '" + url + "'", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("heapprof peak: " + std::to_string(Total(p, "inuse_space")) + " bytes") != std::string::npos);
  rc = RunCommand(env + go + " tool pprof -raw -symbolize=remote '" + url + "?debug=1'", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("HttpPeakLeaf") != std::string::npos);
  // -seconds: a new window of 1 s, in which HttpPeakLeaf's block was not live
  // (the profile still counts its allocation in alloc_space, as /heap does).
  rc = RunCommand(env + go + " tool pprof -top -sample_index=inuse_space -seconds 1 '" + url + "'", out);
  INFO(out);
  CHECK(rc == 0);
  const double seconds = PprofDurationSeconds(out);  // at least the 1 s asked for
  CHECK(seconds >= 1.0);
  CHECK(seconds < 30.0);
  CHECK(out.find("HttpPeakLeaf") == std::string::npos);
}

TEST_CASE("dump_near_oom: under RLIMIT_AS, a dump at 80% of the limit and one at each halving of the headroom") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=dump_near_oom=0.8,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "near_oom", out);
  INFO(out);
  CHECK(rc == 0);
  const std::vector<std::string> dumps = Matching(dir, R"(p\.[0-9]+\.[0-9]{4}\.heap\.pb\.gz)");
  CHECK(dumps.size() >= 2);
  for (const std::string& name : dumps) {
    Profile p;
    INFO(name);
    CHECK(ReadProfileFile(dir + "/" + name, p));
  }
  CHECK(out.find("(dump_near_oom: address space ") != std::string::npos);
  CHECK(out.find(" of RLIMIT_AS ") != std::string::npos);
  CHECK(out.find("threshold 80.0%)") != std::string::npos);
  CHECK(out.find("threshold 90.0% (headroom halved))") != std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("dump_near_oom: under RLIMIT_DATA and a looser RLIMIT_AS the limit is RLIMIT_DATA with the data size") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=dump_near_oom=0.8,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "near_oom_data", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(Matching(dir, R"(p\.[0-9]+\.0001\.heap\.pb\.gz)").size() == 1);
  const std::regex line(R"(\(dump_near_oom: data .* of RLIMIT_DATA .* \(8[0-9]\.[0-9]%\), threshold 80\.0%\))");
  CHECK(std::regex_search(out, line));
  RemoveDir(dir);
}

TEST_CASE("dump_near_oom: a dump that stands for several thresholds names them all") {
  // One step from below 80% to 95.5%: the line said "threshold 80.0%" only,
  // and the next dump's "threshold 97.5%" read as if 90% and 95% had none.
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=dump_near_oom=0.8,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "near_oom_jump", out);
  INFO(out);
  CHECK(rc == 0);
  // To 95.0% (97.5% too, should a thread's arena have added 64 MiB meanwhile).
  const std::regex line(R"(\(dump_near_oom: address space .* of RLIMIT_AS .* \(9[5-9]\.[0-9]%\), thresholds 80\.0% to 9[57]\.[05]%\))");
  CHECK(std::regex_search(out, line));
  RemoveDir(dir);
}

TEST_CASE("rss_interval: a dump at each new RSS high SIZE above the last") {
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rss_interval=16m,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "rss_interval", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(Matching(dir, R"(p\.[0-9]+\.[0-9]{4}\.heap\.pb\.gz)").size() >= 3);
  CHECK(out.find("(rss_interval: RSS ") != std::string::npos);
  // The first dump measures from the RSS at start-up, the later ones from the last such dump.
  const std::size_t first = out.find(" above the RSS at start-up)");
  const std::size_t later = out.find(" above the last rss_interval dump's)");
  CHECK(first != std::string::npos);
  CHECK(later != std::string::npos);
  CHECK(first < later);
  RemoveDir(dir);
}

TEST_CASE("dump_near_oom and rss_interval: a check that finds nothing allocates nothing") {
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario(
      "HEAPPROF=dump_near_oom=0.99,rss_interval=1g,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir, "quiet_watch",
      out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("polls=") != std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("a write whose encoding with names runs out of memory keeps the names, from the symbol tables") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
#if !HEAPPROF_EXCEPTIONS
  MESSAGE("skipped without exceptions: the write is refused up front (write_headroom.hpp)");
  return;
#endif
  // A first write caches this program's DWARF (tens of MB, and the file
  // mapped); the second, with no address space left, runs out of memory in
  // its encoding with lines (forced, as loading a large debug file does).
  // Before: it went on to an encoding without any name, and the cache kept
  // its memory (an oom dump under libc6-dbg then failed outright). Now the
  // cache is given back and the names come from the symbol tables.
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc =
      RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_ROOM_MIB=0 HEAPPROF_TEST_DIR=" + dir, "tight_after_warm", out);
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(out.find("tight_after_warm=1") != std::string::npos);
  CHECK(out.find("profile written with function names but without files or lines") != std::string::npos);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/tight.pb.gz", p));
  CHECK(Validate(p));
  bool commented = false;
  for (const std::string& c : Comments(p)) commented |= c.find("heapprof: out of memory reading debug info") == 0;
  CHECK(commented);
  // Rate 1: every byte of the holder, under its name.
  CHECK(SumForLeaf(p, "TightHolder", "inuse_space") == static_cast<std::int64_t>(kTightCount * kTightBytes));
  std::int64_t max_line = 0;  // no files or lines anywhere
  for (const Location& loc : p.locations) {
    for (const Line& l : loc.lines) max_line = std::max(max_line, l.line);
  }
  CHECK(max_line == 0);
  RemoveDir(dir);
}

TEST_CASE("a write without the memory it needs fails and the program goes on, with or without exceptions") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "tight_write", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("tight_write=0") != std::string::npos);
  CHECK(out.find("terminate") == std::string::npos);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/tight.pb.gz", p));
  // Rate 1: every byte of the holder, exactly, in the write that had room.
  CHECK(SumForLeaf(p, "TightHolder", "inuse_space") == static_cast<std::int64_t>(kTightCount * kTightBytes));
  CHECK(Matching(dir, R"(.*\.tmp\..*)").empty());
  RemoveDir(dir);
}

TEST_CASE("oom_dump without its reserve (it could not be mapped) says so, and still writes the profile") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
#if !HEAPPROF_EXCEPTIONS
  // Without the reserve and without exceptions, the write past its headroom
  // at the address-space limit ends the process (README: "A dump on
  // allocation failure"): the clang stage's -fno-exceptions build did.
  MESSAGE("skipped without exceptions: the write has no reserve to draw from there");
  return;
#endif
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  // 1 TiB: refused under the default overcommit heuristic; where the host
  // overcommits anything (vm.overcommit_memory=1) it is mapped, and there
  // is nothing to check.
  const int rc = RunChildScenario("HEAPPROF=oom_dump=1,oom_reserve=1024g,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "oom_dump", out);
  INFO(out);
  if (out.find("oom_dump: cannot map the") == std::string::npos) {
    CHECK(rc == 0);
    MESSAGE("the 1 TiB reserve was mapped here: nothing to check");
  } else {
    CHECK(out.find("(oom_dump: an allocation of 16777216 bytes failed; no reserve (it could not be mapped))") !=
          std::string::npos);
    CHECK(out.find("0-byte reserve") == std::string::npos);
    // Without a reserve the dump has what the last 16 MiB block left: less
    // than 16 MiB, and how much less moves with the binary's layout. The
    // profile is written when that is room enough (without names, if not for
    // them); else the write says so (README: a write that runs out of memory
    // fails, says so, and the program runs on). Either way the program goes
    // on: its new_handler runs once (exit 12 is the scenario's "no dump").
    if (out.find("out of memory building the profile") == std::string::npos) {
      CHECK(rc == 0);
      CHECK(Matching(dir, R"(p\.[0-9]+\.oom\.pb\.gz)").size() == 1);
    } else {
      MESSAGE("no room for the dump here without a reserve: it said so");
      CHECK((rc == 0 || rc == 12));
      CHECK(out.find("handler_calls=1") != std::string::npos);
      CHECK(Matching(dir, R"(p\.[0-9]+\.oom\.pb\.gz)").empty());
      CHECK(Matching(dir, R"(.*\.tmp\..*)").empty());
    }
  }
  RemoveDir(dir);
}

TEST_CASE("oom_dump: under RLIMIT_AS the first failed allocation writes one profile, then fails as before") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=oom_dump=1,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "oom_dump", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("handler_calls=1 dump_before_handler=1") != std::string::npos);
  // Once: the later failures (512 MiB, thrown and nothrow) wrote nothing.
  CheckOneOomDump(dir, out, "16777216");
  RemoveDir(dir);
}

TEST_CASE("oom_dump: threads failing together wait for the one dump before the process ends") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=oom_dump=1,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "oom_dump_threads", out);
  INFO(out);
  CHECK(rc == 0);
  // Once, for the first thread's 1 GiB: the others waited for it.
  CheckOneOomDump(dir, out, "1073741824");
  RemoveDir(dir);
}

TEST_CASE("oom_dump: a child forked while another thread writes the oom dump fails its allocations at once") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=oom_dump=1,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
                                  "oom_dump_fork", out);
  INFO(out);
  REQUIRE(rc == 0);
  // The fork came while the dump was being written (the dump reads symbols
  // cold: it takes tens of milliseconds; the fork follows within microseconds).
  CHECK(out.find("fork_mid_dump=1") != std::string::npos);
  // The child's failed malloc returned within 5 s: before, 30 s (exit 21).
  CHECK(out.find("child_exit=0") != std::string::npos);
  // The parent's one dump, for its 2^62-byte new.
  CheckOneOomDump(dir, out, "4611686018427387904");
  RemoveDir(dir);
}

TEST_CASE("oom_dump under an RLIMIT_AS set before start: the reserve is what a dump with names needs, not 64 MiB") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  // The same child, under the same `ulimit -v` (256 MiB above its address
  // space at start without HEAPPROF), fills 1 MiB blocks until one fails:
  // without oom_dump, then with it at rate 1 (the dump counts the blocks it
  // saw exactly). The dump is written at the first failure, so the blocks in
  // it are where the first failure came with oom_dump.
  constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  REQUIRE(RunChildScenario("env -u HEAPPROF HEAPPROF_TEST_ONLY_SIZE=1", "oom_first_failure", out) == 0);
  unsigned long long base = 0;
  REQUIRE(std::sscanf(out.c_str() + out.find("address_space="), "address_space=%llu", &base) == 1);
  const std::string ulimit =
      "sh -c 'ulimit -v " + std::to_string((base + 256 * MiB) / 1024) + " && exec \"$@\"' sh env ";
  std::string off_out, on_out;
  // One glibc arena: a second thread's allocation meeting the main arena's
  // lock held (the start-up warm-up's, more often on a loaded machine) makes
  // glibc map a 64 MiB arena for it, address space that moved the first
  // failure by up to 64 MiB from run to run (seen under ctest -j2).
  REQUIRE(RunChildScenario(ulimit + "-u HEAPPROF MALLOC_ARENA_MAX=1", "oom_first_failure", off_out) == 0);
  INFO(off_out);
  const int on_rc = RunChildScenario(
      ulimit + "MALLOC_ARENA_MAX=1 HEAPPROF=oom_dump=1,rate=1,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir,
      "oom_first_failure", on_out);
  INFO(on_out);
  REQUIRE(on_rc == 0);
  unsigned long long off_blocks = 0, on_blocks = 0, reserve = 0;
  REQUIRE(std::sscanf(off_out.c_str() + off_out.find("obtained="), "obtained=%llu", &off_blocks) == 1);
  REQUIRE(std::sscanf(on_out.c_str() + on_out.find("obtained="), "obtained=%llu", &on_blocks) == 1);
  const std::size_t released = on_out.find("failed; released the ");
  REQUIRE(released != std::string::npos);
  REQUIRE(std::sscanf(on_out.c_str() + released, "failed; released the %llu-byte reserve", &reserve) == 1);
  // The reserve: the largest loaded file (this test binary) + the margin
  // (8 MiB; 16 without exceptions), in whole pages (dumps.hpp:
  // DefaultOomReserve). Before: 64 MiB.
  struct stat st {};
  REQUIRE(::stat(SelfExe().c_str(), &st) == 0);
  const std::uint64_t floor =
      (static_cast<std::uint64_t>(st.st_size) + heapprof::detail::kOomReserveMargin) & ~std::uint64_t{4095};
  CHECK(reserve == floor);
  CHECK(on_out.find("less than the") == std::string::npos);  // 128 MiB is room enough: no warning
  // The dump names the allocating function, and has every block it saw.
  const std::vector<std::string> oom = Matching(dir, R"(p\.[0-9]+\.oom\.pb\.gz)");
  REQUIRE(oom.size() == 1);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/" + oom[0], p));
  const std::int64_t dumped = SumForLeaf(p, "OomFillBlocks", "inuse_space");
  REQUIRE(dumped > 0);
  CHECK(dumped % static_cast<std::int64_t>(MiB) == 0);
  // Where the first failure comes: at most the reserve + kOverhead earlier
  // than without oom_dump. kOverhead: the dump thread (its 8 MiB stack and
  // guard page) and what the first write keeps; measured 9 MiB here.
  constexpr std::uint64_t kOverhead = 16 * MiB;
  const std::uint64_t off_bytes = off_blocks * MiB;
  CHECK(static_cast<std::uint64_t>(dumped) + reserve + kOverhead >= off_bytes);
  // The program's own first failure (the reserve was released for the dump
  // and what the dump did not keep came back): no earlier.
  CHECK((on_blocks + 1) * MiB >= static_cast<std::uint64_t>(dumped));
  CHECK(on_blocks * MiB + reserve + kOverhead >= off_bytes);
  MESSAGE("without oom_dump: " << off_blocks << " MiB; with it: the dump at " << dumped / static_cast<std::int64_t>(MiB)
                               << " MiB, the failure at " << on_blocks << " MiB; reserve " << reserve);
  RemoveDir(dir);
}

TEST_CASE("oom_dump under a tight RLIMIT_AS: an oom_reserve that cannot be mapped, and a default short of names, say why") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
  constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
  std::string out;
  REQUIRE(RunChildScenario("env -u HEAPPROF HEAPPROF_TEST_ONLY_SIZE=1", "oom_first_failure", out) == 0);
  unsigned long long base = 0;
  REQUIRE(std::sscanf(out.c_str() + out.find("address_space="), "address_space=%llu", &base) == 1);
  auto under = [base](std::uint64_t room) {
    return "sh -c 'ulimit -v " + std::to_string((base + room) / 1024) + " && exec \"$@\"' sh env ";
  };
  // 512 MiB asked for, ~256 MiB left: refused, and the line names the key
  // and the limit (before: "cannot map the 512.0 MiB reserve: Cannot
  // allocate memory", as if the machine were out of memory).
  std::string explicit_out;
  REQUIRE(RunChildScenario(under(256 * MiB) + "HEAPPROF=oom_dump=1,oom_reserve=512m HEAPPROF_TEST_ONLY_SIZE=1",
                           "oom_first_failure", explicit_out) == 0);
  INFO(explicit_out);
  const std::regex refused(
      R"(heapprof: oom_dump: cannot map the 512\.0 MiB reserve \(oom_reserve\): Cannot allocate memory \(RLIMIT_AS [0-9.]+ MiB, 2[0-9][0-9]\.[0-9] MiB left\); the dump will be written without it)");
  CHECK(std::regex_search(explicit_out, refused));
  // 40 MiB left: the default is half of it, less than this binary + 8 MiB
  // needs for names, and it says so (before: 64 MiB refused, no reserve).
  std::string tight_out;
  REQUIRE(RunChildScenario(under(40 * MiB) + "HEAPPROF=oom_dump=1 HEAPPROF_TEST_ONLY_SIZE=1", "oom_first_failure",
                           tight_out) == 0);
  INFO(tight_out);
  // (What is left is read at start-up, before main: a little more than 40 MiB.)
  const std::size_t at = tight_out.find("heapprof: oom_dump: RLIMIT_AS leaves ");
  REQUIRE(at != std::string::npos);
  double left = 0, reserve = 0, needed = 0;
  REQUIRE(std::sscanf(tight_out.c_str() + at,
                      "heapprof: oom_dump: RLIMIT_AS leaves %lf MiB of address space: a reserve of %lf MiB, less than "
                      "the %lf MiB a dump with function names needs here (oom_reserve=SIZE sets it)",
                      &left, &reserve, &needed) == 3);
  CHECK(left >= 40.0);
  CHECK(left <= 48.0);
  CHECK(std::fabs(reserve - left / 2) <= 0.1);  // half, in whole pages, printed to 0.1 MiB
  struct stat st {};
  REQUIRE(::stat(SelfExe().c_str(), &st) == 0);
  CHECK(std::fabs(needed - static_cast<double>(st.st_size + heapprof::detail::kOomReserveMargin) / MiB) <= 0.1);
  CHECK(tight_out.find("(oom_reserve=SIZE sets it)\n") != std::string::npos);
  CHECK(tight_out.find("cannot map") == std::string::npos);
}

TEST_CASE("a profile whose object files could not be mapped for want of memory says why it has no names") {
  HEAPPROF_SKIP_UNDER_SANITIZERS();
#if !HEAPPROF_EXCEPTIONS
  // There the first write maps 64 MiB of headroom first (write_headroom.hpp):
  // with 6 MiB left it is refused before it maps anything.
  MESSAGE("skipped without exceptions: the write is refused up front");
  return;
#endif
  // 6 MiB of address space left for the first write: the snapshot and the
  // encoder fit, mapping this 31 MB binary to read its symbols does not
  // (what oom_reserve=4k gave an oom dump). Before: a profile without a
  // single name, no comment, no stderr line.
  const std::string dir = MemoryEventsTempDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_ROOM_MIB=6 HEAPPROF_TEST_DIR=" + dir, "tight_names", out);
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(out.find("tight_names=1") != std::string::npos);
  CHECK(out.find("heapprof: out of memory mapping ") != std::string::npos);
  CHECK(out.find(" object or debug file(s): profile written without their names or lines") != std::string::npos);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/names.pb.gz", p));
  bool commented = false;
  for (const std::string& c : Comments(p)) {
    commented |= c.find("heapprof: out of memory mapping object files: frames in them have no names") == 0;
  }
  CHECK(commented);
  // Nothing else is lost: rate 1, TightHolder's 1000 blocks of 200 bytes are in it.
  CHECK(Total(p, "inuse_space") >= static_cast<std::int64_t>(kTightCount * kTightBytes));
  RemoveDir(dir);
}
