// Exact Stats at the default rate: whatever mix of sized, unsized and array
// deletes and malloc/free a program uses, live_objects and live_bytes return
// exactly to their baseline once everything is freed. (The bug this guards:
// new char[256] x 1M then delete[] drove live_bytes to 0, because the
// allocation counted 256 bytes and the unsized delete[] malloc_usable_size.)
#include "common.hpp"

#include <new>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace {

using malloc_test::Delta;
using malloc_test::g_sink;
using malloc_test::RateScope;

}  // namespace

TEST_CASE("exact Stats: new char[] / delete[] x 1M at the default rate") {
  RateScope rate(524288);
  Delta d;
  for (int i = 0; i < 1000000; ++i) {
    char* p = new char[256];
    g_sink = p;
    delete[] p;  // unsized: GCC's sized deallocation does not cover char[]
  }
  d.Stop();
  CHECK(d.allocs() == 1000000);
  CHECK(d.frees() == 1000000);
  CHECK(d.alloc_bytes() == d.free_bytes());
  CHECK(d.live_bytes() == 0);
  CHECK(d.live_objects() == 0);
  CHECK(d.after.live_bytes > 0);  // the process still holds memory: never reads 0
}

TEST_CASE("exact Stats: a mix of every delete form, unique_ptr<char[]> and malloc/calloc/realloc/free, at several rates") {
  for (std::size_t r : {std::size_t{524288}, std::size_t{4096}, std::size_t{1}}) {
    CAPTURE(r);
    RateScope rate(r);
    Delta d;
    std::vector<std::unique_ptr<char[]>> arrays;
    std::vector<void*> c_blocks;
    std::vector<std::string*> strings;
    for (int i = 0; i < 20000; ++i) {
      const std::size_t n = static_cast<std::size_t>(i % 1500 + 1);
      arrays.emplace_back(new char[n]);
      // calloc(n, 1) for every fourth: its hot path asks for calloc(1, n).
      // realloc(nullptr, n) for every eighth (malloc's hot path).
      void* m = (i % 4 == 1)   ? std::calloc(n, 1)
                : (i % 2)      ? std::malloc(n)
                : (i % 8 == 6) ? std::realloc(nullptr, n)
                               : ::operator new(n);
      if (i % 4 == 1) REQUIRE((static_cast<unsigned char*>(m)[0] | static_cast<unsigned char*>(m)[n - 1]) == 0);
      if (i % 6 == 3) {  // realloc's own hot path: grow (the block moves) or shrink (in place on glibc)
        const std::size_t to = (i % 12 == 3) ? 2 * n + 100 : n / 2 + 1;
        static_cast<unsigned char*>(m)[0] = 0x5a;
        m = std::realloc(m, to);
        REQUIRE(m != nullptr);
        REQUIRE(static_cast<unsigned char*>(m)[0] == 0x5a);
      }
      c_blocks.push_back(m);
      strings.push_back(new std::string(n, 'x'));
      if (i % 3 == 0) {
        int* one = new int(i);
        g_sink = one;
        delete one;  // sized delete
      }
      if (i % 5 == 0) {
        void* a = ::operator new(n, std::align_val_t{64});
        ::operator delete(a, n, std::align_val_t{64});
      }
      if (i % 7 == 0) {  // the nothrow forms share the hot paths of the throwing ones
        void* t = ::operator new(n, std::nothrow);
        ::operator delete(t, std::nothrow);
        void* u = ::operator new[](n, std::align_val_t{32}, std::nothrow);
        CHECK(reinterpret_cast<std::uintptr_t>(u) % 32 == 0);
        ::operator delete[](u, std::align_val_t{32}, std::nothrow);
      }
    }
    for (std::size_t i = 0; i < c_blocks.size(); ++i) {
      // malloc'd blocks freed by operator delete and new'd ones by free, on
      // purpose: glibc allows it and the counts must still balance. (Not
      // under ASan/TSan, where malloc is not hooked: there only new'd blocks
      // are counted, so each block goes back the way it came.)
      if (!HEAPPROF_MALLOC_HOOKS) {
        if (i % 2) {
          std::free(c_blocks[i]);
        } else {
          ::operator delete(c_blocks[i]);
        }
      } else if (i % 4 == 1) {
        ::operator delete(c_blocks[i]);
      } else if (i % 4 == 2) {
        std::free(c_blocks[i]);
      } else if (i % 2) {
        std::free(c_blocks[i]);
      } else {
        ::operator delete(c_blocks[i], static_cast<std::size_t>(i % 1500 + 1));
      }
    }
    for (std::string* s : strings) delete s;
    arrays.clear();
    decltype(arrays)().swap(arrays);
    c_blocks.clear();
    decltype(c_blocks)().swap(c_blocks);
    strings.clear();
    decltype(strings)().swap(strings);
    d.Stop();
    CHECK(d.live_objects() == 0);
    CHECK(d.live_bytes() == 0);
  }
}

TEST_CASE("exact Stats: threads that exit after allocating and freeing") {
  RateScope rate(524288);
  // glibc keeps the stacks of exited threads for reuse, with the thread's
  // TLS vector (calloc'd, now seen by the hooks): round 0 fills that cache
  // before the measurement starts, so the rounds measured reuse it.
  Delta d;
  for (int round = 0; round < 5; ++round) {
    if (round == 1) d = Delta{};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([] {
        std::vector<std::unique_ptr<char[]>> v;
        for (int i = 0; i < 5000; ++i) v.emplace_back(new char[static_cast<std::size_t>(i % 700 + 1)]);
        for (int i = 0; i < 5000; ++i) std::free(std::malloc(static_cast<std::size_t>(i)));
      });
    }
    for (auto& th : threads) th.join();
  }
  d.Stop();
  CHECK(d.live_objects() == 0);
  CHECK(d.live_bytes() == 0);
}

#if defined(HEAPPROF_GETATTR_NOPIE_PATH) && defined(__GLIBC__)
// glibc raises its mmap threshold for good to the size of an mmapped block
// that is freed (up to 32 MiB): heapprof's start-up check of the chunk formula
// freed a 1 MiB one, so every program with heapprof then kept blocks of 128 KiB
// to 1 MiB in its heap (and trimmed it at 2 MiB, not 128 KiB), where the same
// program without heapprof mmapped them. A program with heapprof compiled in
// (programs/getattr_nopie.cpp) reports a 256 KiB malloc, which glibc's default
// threshold (128 KiB) mmaps, after heapprof's start-up and after a profile.
TEST_CASE("glibc's mmap threshold is where the program left it after heapprof's start-up and a profile") {
  if (std::getenv("LD_PRELOAD") != nullptr && *std::getenv("LD_PRELOAD") != '\0') {
    MESSAGE("another allocator is preloaded: the check reads glibc's chunk header, skipped");
    return;
  }
  const std::string profile = heapprof_test::TempPath("-threshold.pb.gz");
  std::string out;
  REQUIRE(heapprof_test::RunCommand("env -u MALLOC_MMAP_THRESHOLD_ -u GLIBC_TUNABLES timeout 60 " +
                                        std::string(HEAPPROF_GETATTR_NOPIE_PATH) + " mmap_threshold " + profile,
                                    out) == 0);
  CHECK(out == "getattr_nopie: a 256 KiB block mmapped 1, after writing a profile (1) 1\n");
  // Under an address-space limit below the check's 64 MiB block, that one
  // check is skipped and the program starts and runs as before. (Whether its
  // profile can be written in that little address space is not the point: the
  // write may also say it could not map some object files for their names.)
  REQUIRE(heapprof_test::RunCommand("ulimit -v 60000 && env -u MALLOC_MMAP_THRESHOLD_ -u GLIBC_TUNABLES timeout 60 " +
                                        std::string(HEAPPROF_GETATTR_NOPIE_PATH) + " mmap_threshold " + profile,
                                    out) == 0);
  std::remove(profile.c_str());
  INFO(out);
  CHECK(out.find("getattr_nopie: a 256 KiB block mmapped 1, after writing a profile (") != std::string::npos);
}

// glibc gives each thread that mallocs an arena of its own (a 64 MiB
// reservation, one more arena in malloc_stats and among those the program's
// threads share): the HTTP server's builder made one when __cxa_demangle
// allocated the names of a profile (the dump thread too). A program with
// heapprof compiled in counts glibc's arenas before and after a profile
// served over HTTP.
TEST_CASE("the profiler's threads make no glibc arena of their own") {
  if (std::getenv("LD_PRELOAD") != nullptr && *std::getenv("LD_PRELOAD") != '\0') {
    MESSAGE("another allocator is preloaded: glibc's arenas are not the program's, skipped");
    return;
  }
  std::string out;
  REQUIRE(heapprof_test::RunCommand("env -u MALLOC_ARENA_MAX -u GLIBC_TUNABLES timeout 60 " +
                                        std::string(HEAPPROF_GETATTR_NOPIE_PATH) + " arenas",
                                    out) == 0);
  CHECK(out == "getattr_nopie: glibc arenas 1, after a profile served over HTTP (1) 1\n");
}
#endif

#if defined(HEAPPROF_STARTUP_BLOCKS_PATH)
// Blocks a library's constructor allocated before the allocator's own
// start-up (under LD_PRELOAD, every library's constructor runs before the
// preloaded allocator's): gperftools' malloc_usable_size answered 0 then, so
// they were counted 0 bytes when allocated (live_bytes 0 below) and their
// real size when freed. The program prints what its constructor counted,
// what the allocator says now, and what main's frees counted; it inherits
// this run's LD_PRELOAD (ctest: malloc_tests_jemalloc, malloc_tests_tcmalloc,
// malloc_tests_tcmalloc_debug: gperftools' debug allocator answers 0 until its
// own initializer, later than tcmalloc's, registers its extension; and the
// program's first free hung there, block_hooks.hpp: InAllocatorCode).
TEST_CASE("exact Stats for blocks allocated by a library's constructor, before the allocator's start-up") {
  for (const char* stats : {"", "MALLOCSTATS=1 "}) {
    CAPTURE(stats);
    std::string out;
    REQUIRE(heapprof_test::RunCommand(std::string(stats) + "timeout 60 " + HEAPPROF_STARTUP_BLOCKS_PATH, out) == 0);
    INFO(out);
    const std::regex line(
        R"(startup_blocks: constructor allocs ([0-9]+) frees ([0-9]+) live_bytes ([0-9]+); usable ([0-9]+) in ([0-9]+) blocks; main frees ([0-9]+) free_bytes ([0-9]+)\n)");
    std::smatch m;
    REQUIRE(std::regex_search(out, m, line));
    CHECK(m[1].str() == "280");  // 200 blocks, 80 of them through realloc (a free and an allocation)
    CHECK(m[2].str() == "130");  // 80 reallocs' old blocks, 50 blocks freed
    CHECK(m[5].str() == "150");
    CHECK(std::stoull(m[4].str()) > 150);
    CHECK(m[3].str() == m[4].str());  // counted when allocated = the allocator's size now
    CHECK(m[6].str() == "150");
    CHECK(m[7].str() == m[4].str());  // counted when freed
    // gperftools prints its statistics at exit once (heapprof ran its
    // start-up early and ends it at exit: block_hooks.hpp).
    const std::string preload = std::getenv("LD_PRELOAD") != nullptr ? std::getenv("LD_PRELOAD") : "";
    if (*stats != '\0' && preload.find("tcmalloc") != std::string::npos) {
      std::size_t printed = 0;
      for (std::size_t at = out.find("Bytes in use by application"); at != std::string::npos;
           at = out.find("Bytes in use by application", at + 1)) {
        ++printed;
      }
      CHECK(printed == 1);
    }
  }
}
#endif
