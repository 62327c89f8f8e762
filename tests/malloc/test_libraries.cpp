// Libraries we did not write allocate through the replaced malloc family:
// libc's own strdup, getline, opendir, and zlib. At rate 1 their allocations
// appear in the profile with their stacks, and Stats return to the baseline.
#include "common.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <malloc.h>
#include <string>
#include <unistd.h>

#if defined(HEAPPROF_TEST_HAVE_ZLIB)
#include <zlib.h>
#endif

#if HEAPPROF_MALLOC_HOOKS

namespace {

using malloc_test::Delta;
using malloc_test::g_sink;
using malloc_test::ProfileTotals;
using malloc_test::RateScope;
using malloc_test::Totals;

__attribute__((noinline)) char* CallStrdup(const char* s) {
  char* p = strdup(s);
  g_sink = p;
  return p;
}

__attribute__((noinline)) std::size_t ReadLines(FILE* f, std::size_t* lines) {
  char* line = nullptr;
  std::size_t cap = 0, total = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, f)) > 0) {
    total += static_cast<std::size_t>(n);
    ++*lines;
  }
  g_sink = line;
  std::free(line);
  return total;
}

__attribute__((noinline)) int CountEntries(const char* path) {
  DIR* d = opendir(path);
  if (d == nullptr) return -1;
  int n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

}  // namespace

TEST_CASE("libc: strdup, getline and opendir allocate through the hooks and balance") {
  RateScope rate(1);
  SUBCASE("strdup") {
    const Totals t0 = ProfileTotals("CallStrdup", false);
    Delta d;
    char* s = CallStrdup("a string of 30 characters ...");
    d.Stop();
    CHECK(d.allocs() == 1);
    CHECK(d.alloc_bytes() == malloc_usable_size(s));
    const Totals t1 = ProfileTotals("CallStrdup", false) - t0;
    CHECK(t1.inuse_objects == 1);
    CHECK(t1.inuse_space == 30);  // strlen + 1, what strdup asked malloc for
    std::free(s);
    d.Stop();
    CHECK(d.live_bytes() == 0);
    CHECK(d.live_objects() == 0);
  }
  SUBCASE("getline") {
    const std::string path = heapprof_test::TempPath(".txt");
    {
      FILE* f = std::fopen(path.c_str(), "w");
      REQUIRE(f != nullptr);
      for (int i = 0; i < 200; ++i) std::fprintf(f, "%0*d\n", 50 + i * 7, i);  // lines up to ~1.4 KB: getline grows
      std::fclose(f);
    }
    const Totals t0 = ProfileTotals("ReadLines", false);
    Delta d;
    FILE* f = std::fopen(path.c_str(), "r");  // fopen's FILE and the stdio buffer are malloc'd too
    REQUIRE(f != nullptr);
    std::size_t lines = 0;
    CHECK(ReadLines(f, &lines) > 0);
    std::fclose(f);
    d.Stop();
    CHECK(lines == 200);
    CHECK(d.allocs() >= 4);  // FILE, its buffer, getline's first buffer and its reallocs
    CHECK(d.live_bytes() == 0);
    CHECK(d.live_objects() == 0);
    const Totals t1 = ProfileTotals("ReadLines", false) - t0;
    CHECK(t1.alloc_objects >= 3);  // the stdio buffer (first read) and getline's
    CHECK(t1.alloc_objects <= static_cast<std::int64_t>(d.allocs()) - 1);  // not fopen's FILE
    CHECK(t1.inuse_objects == 0);
    unlink(path.c_str());
  }
  SUBCASE("opendir") {
    const Totals t0 = ProfileTotals("CountEntries", false);
    Delta d;
    CHECK(CountEntries("/") > 2);
    d.Stop();
    CHECK(d.allocs() >= 1);
    CHECK(d.live_bytes() == 0);
    CHECK(d.live_objects() == 0);
    const Totals t1 = ProfileTotals("CountEntries", false) - t0;
    CHECK(t1.alloc_objects == static_cast<std::int64_t>(d.allocs()));
    CHECK(t1.inuse_objects == 0);
  }
}

#if defined(HEAPPROF_TEST_HAVE_ZLIB)

namespace {

__attribute__((noinline)) int StartDeflate(z_stream* z) {
  const int rc = deflateInit(z, Z_BEST_COMPRESSION);
  asm volatile("" ::: "memory");
  return rc;
}

__attribute__((noinline)) int StartInflate(z_stream* z) {
  const int rc = inflateInit(z);
  asm volatile("" ::: "memory");
  return rc;
}

}  // namespace

TEST_CASE("zlib: deflateInit and inflate allocate through the hooks, with their stacks") {
  RateScope rate(1);
  std::string input;
  for (int i = 0; i < 20000; ++i) input += "heapprof sees zlib " + std::to_string(i % 97) + "\n";
  std::string packed(compressBound(static_cast<uLong>(input.size())), '\0');
  std::string unpacked(input.size(), '\0');

  const Totals d0 = ProfileTotals("StartDeflate", false);
  const Totals i0 = ProfileTotals("StartInflate", false);
  Delta d;
  z_stream z{};
  REQUIRE(StartDeflate(&z) == Z_OK);
  Delta during;
  during.before = d.before;
  during.Stop();
  // deflate's window, hash chains and pending buffer: ~256 KiB at level 9.
  CHECK(during.live_objects() >= 4);
  CHECK(during.live_bytes() >= 200 * 1024);
  const Totals dd = ProfileTotals("StartDeflate", false) - d0;
  CHECK(dd.inuse_objects == during.live_objects());
  CHECK(dd.inuse_space >= 200 * 1024);
  CHECK(dd.inuse_space <= during.live_bytes());  // requested <= usable
  z.next_in = reinterpret_cast<Bytef*>(&input[0]);
  z.avail_in = static_cast<uInt>(input.size());
  z.next_out = reinterpret_cast<Bytef*>(&packed[0]);
  z.avail_out = static_cast<uInt>(packed.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  const std::size_t packed_size = z.total_out;
  deflateEnd(&z);

  z_stream u{};
  REQUIRE(StartInflate(&u) == Z_OK);
  u.next_in = reinterpret_cast<Bytef*>(&packed[0]);
  u.avail_in = static_cast<uInt>(packed_size);
  u.next_out = reinterpret_cast<Bytef*>(&unpacked[0]);
  u.avail_out = static_cast<uInt>(unpacked.size());
  REQUIRE(inflate(&u, Z_FINISH) == Z_STREAM_END);  // allocates its window here, inside inflate
  CHECK(unpacked == input);
  const Totals in_use = ProfileTotals("inflate", false);
  CHECK(in_use.inuse_objects >= 1);  // inflate's window: allocated by inflate itself
  inflateEnd(&u);
  d.Stop();
  CHECK(d.live_objects() == 0);
  CHECK(d.live_bytes() == 0);
  const Totals de = ProfileTotals("StartDeflate", false) - d0;
  CHECK(de.inuse_objects == 0);
  CHECK(de.alloc_objects == dd.alloc_objects);
  const Totals ie = ProfileTotals("StartInflate", false) - i0;
  CHECK(ie.alloc_objects >= 1);
  CHECK(ie.inuse_objects == 0);
}

#endif  // HEAPPROF_TEST_HAVE_ZLIB

#endif  // HEAPPROF_MALLOC_HOOKS
