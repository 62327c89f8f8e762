// The profiler never uses the host's heap: writing a profile to a path, a
// dump and an HTTP profile take their memory from the profiler's arena
// (Stats::profiler_bytes), so Stats' alloc counters do not move; repeated
// writes reuse that memory. And hooks compiled into a dlopen'ed plugin, which
// never take effect, are reported.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <elf.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "support/profile_io.hpp"

namespace {

using heapprof_test::RateScope;

__attribute__((noinline)) char* OwnMemoryLeaf(std::size_t n) {
  char* p = new char[n];
  asm volatile("" ::"r"(p) : "memory");
  return p;
}

// Live objects from a few stacks, so a profile has samples to symbolize.
struct Heap {
  std::vector<char*> blocks;
  explicit Heap(int n) {
    blocks.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) blocks.push_back(OwnMemoryLeaf(64 + static_cast<std::size_t>(i % 7) * 700));
  }
  ~Heap() {
    for (char* p : blocks) delete[] p;
  }
};

void CheckNoHostHeap(const heapprof::Stats& before, const heapprof::Stats& after) {
  CHECK(after.alloc_objects == before.alloc_objects);
  CHECK(after.alloc_bytes == before.alloc_bytes);
  CHECK(after.free_objects == before.free_objects);
}

}  // namespace

TEST_CASE("WriteHeapProfile(path) takes nothing from the host's heap, at rate 1 and at the default rate") {
  for (std::size_t rate : {std::size_t{1}, std::size_t{524288}}) {
    CAPTURE(rate);
    RateScope scope(rate);
    Heap heap(3000);
    const std::string path = heapprof_test::TempPath(".pb.gz");
    for (int write = 0; write < 3; ++write) {  // the first also reads symbols and DWARF
      CAPTURE(write);
      const heapprof::Stats before = heapprof::GetStats();
      const bool ok = heapprof::WriteHeapProfile(path) && heapprof::WriteAllocsProfile(path);
      const heapprof::Stats after = heapprof::GetStats();
      REQUIRE(ok);
      CheckNoHostHeap(before, after);
    }
    heapprof_test::Profile p;
    REQUIRE(heapprof_test::ReadProfileFile(path, p));
    CHECK(heapprof_test::Validate(p));
    CHECK(!p.samples.empty());
    std::remove(path.c_str());
  }
}

TEST_CASE("repeated writes reuse the profiler's memory: profiler_bytes stays bounded") {
  RateScope scope(1);
  Heap heap(5000);
  const std::string path = heapprof_test::TempPath(".pb.gz");
  for (int i = 0; i < 3; ++i) REQUIRE(heapprof::WriteHeapProfile(path));
  const std::uint64_t warm = heapprof::GetStats().profiler_bytes;
  std::ostringstream sink;  // the stream's buffer is the caller's; the writer's is not
#if defined(HEAPPROF_TSAN)
  // TSan looks for races, not growth (the other builds do 40 rounds), and each
  // instrumented round of a one-thread encode and gzip costs 0.2 s.
  constexpr int kRounds = 10;
#else
  constexpr int kRounds = 40;
#endif
  for (int i = 0; i < kRounds; ++i) {
    REQUIRE(heapprof::WriteHeapProfile(path));
    sink.str(std::string());
    REQUIRE(heapprof::WriteAllocsProfile(sink));
  }
  const std::uint64_t after = heapprof::GetStats().profiler_bytes;
  MESSAGE("profiler_bytes after 3 writes " << warm << ", after " << 2 * kRounds << " more " << after);
  CHECK(after <= warm + (std::uint64_t{1} << 20));  // at most one more arena chunk
  std::remove(path.c_str());
}

TEST_CASE("an HTTP /debug/pprof/heap or /cmdline fetch takes nothing from the host's heap") {
  heapprof::HttpServer server("127.0.0.1:0");
  REQUIRE(server.serving());
  RateScope scope(1);
  Heap heap(2000);
  // The client side allocates nothing either: a socket, a fixed request, a static buffer.
  static char response[8 << 20];
  static const char kHeap[] = "GET /debug/pprof/heap HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  static const char kCmdline[] = "GET /debug/pprof/cmdline HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  for (int fetch = 0; fetch < 4; ++fetch) {
    CAPTURE(fetch);
    const char* const request = fetch < 2 ? kHeap : kCmdline;
    const std::size_t request_size = std::strlen(request);
    const heapprof::Stats before = heapprof::GetStats();
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server.port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                           ::send(fd, request, request_size, MSG_NOSIGNAL) == static_cast<ssize_t>(request_size);
    std::size_t got = 0;
    while (connected && got < sizeof response) {
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, 30000) <= 0) break;
      const ssize_t n = ::recv(fd, response + got, sizeof response - got, 0);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    ::close(fd);
    const heapprof::Stats after = heapprof::GetStats();
    REQUIRE(connected);
    REQUIRE(got > 12);
    CHECK(std::memcmp(response, "HTTP/1.1 200", 12) == 0);
    CheckNoHostHeap(before, after);
  }
}

TEST_CASE("a dump (HEAPPROF=dump_signal) takes nothing from the host's heap") {
  char dir_template[] = "/tmp/heapprof_own_memory_XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  std::string out;
  const int rc = heapprof_test::RunSelf("HEAPPROF=rate=1,dump_prefix=" + dir + "/p,dump_signal=USR1 HEAPPROF_TEST_DIR=" +
                                            dir + " HEAPPROF_TEST_CHILD=dump_no_host_heap timeout -s KILL 120",
                                        out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("wrote " + dir + "/p.") != std::string::npos);
  std::string ignored;
  heapprof_test::RunCommand("rm -rf '" + dir + "'", ignored);
}

#if defined(HEAPPROF_HOOKS_PLUGIN_PATH)
namespace {
// The size of an ELF64 file's PT_TLS segment (0: none, or unreadable).
std::uint64_t TlsSegmentBytes(const char* path) {
  std::FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return 0;
  std::uint64_t bytes = 0;
  Elf64_Ehdr eh{};
  if (std::fread(&eh, sizeof eh, 1, f) == 1 && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0) {
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph{};
      if (std::fseek(f, static_cast<long>(eh.e_phoff + std::uint64_t{i} * eh.e_phentsize), SEEK_SET) != 0 ||
          std::fread(&ph, sizeof ph, 1, f) != 1)
        break;
      if (ph.p_type == PT_TLS) bytes = ph.p_memsz;
    }
  }
  std::fclose(f);
  return bytes;
}
}  // namespace
#endif

TEST_CASE("hooks compiled into a dlopen'ed plugin never take effect: said once on stderr") {
#if !defined(HEAPPROF_HOOKS_PLUGIN_PATH)
  MESSAGE("no hooks plugin built: skipped");
#else
  // A library with heapprof compiled in keeps its thread state in static TLS
  // (initial-exec): dlopen fails when it does not fit in what glibc leaves
  // for dlopen'ed objects (about 1.6 KiB in all with glibc 2.36's defaults,
  // the executable's and other libraries' included). This library took 1,680
  // bytes, and the test failed whenever the executable's TLS grew by 16.
  const std::uint64_t tls = TlsSegmentBytes(HEAPPROF_HOOKS_PLUGIN_PATH);
  CAPTURE(tls);
  CHECK(tls > 0);
  CHECK(tls <= 1280);
  std::string out;
  const int rc = heapprof_test::RunSelf("HEAPPROF_TEST_CHILD=plugin_hooks timeout -s KILL 60", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("plugin_hooks: loaded") != std::string::npos);
  const std::string needle = "hooks compiled into ";
  const std::size_t at = out.find(needle);
  REQUIRE(at != std::string::npos);
  CHECK(out.find(needle, at + 1) == std::string::npos);  // once
  CHECK(out.find("heapprof_hooks_plugin", at) != std::string::npos);  // names the plugin
  CHECK(out.find("never take effect") != std::string::npos);
  CHECK(out.find("in a .cpp file of the executable") != std::string::npos);
  // The executable's own hooks take effect: no such line without the plugin.
  std::string plain;
  REQUIRE(heapprof_test::RunSelf("HEAPPROF_TEST_CHILD=print_rate", plain) == 0);
  CHECK(plain.find("never take effect") == std::string::npos);
#endif
}
