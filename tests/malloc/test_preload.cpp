// libheapprof_preload.so on programs that know nothing of heapprof: a plain C
// program, and this C++ test program itself re-run as a child. Configured by
// HEAPPROF alone (here: rate=1 and a dump at exit), so every allocation of
// the child is in the dump, exactly.
#include "common.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#if HEAPPROF_MALLOC_HOOKS && defined(HEAPPROF_PRELOAD_PATH) && defined(HEAPPROF_PLAIN_C_PATH)

namespace {

// Runs `program` under the preload library with a dump at exit; reads the dump.
bool RunPreloaded(const std::string& program, const std::string& extra_env, heapprof_test::Profile& p,
                  std::string& output) {
  const std::string prefix = heapprof_test::TempPath("-preload");
  const std::string cmd = "LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + " HEAPPROF=rate=1,dump_at_exit=1,dump_prefix=" +
                          prefix + " " + extra_env + " " + program + " 2>&1";
  const int rc = heapprof_test::RunCommand(cmd, output);
  INFO(cmd);
  INFO(output);
  CHECK(rc == 0);
  // The one dump: <prefix>.<pid>.0001.heap.pb.gz, its name in the output.
  const std::size_t at = output.find("wrote " + prefix);
  REQUIRE(at != std::string::npos);
  const std::size_t end = output.find(' ', at + 6);
  const std::string path = output.substr(at + 6, end - at - 6);
  const bool ok = heapprof_test::ReadProfileFile(path, p);
  unlink(path.c_str());
  unlink(prefix.c_str());
  return ok;
}

std::int64_t Sum(const heapprof_test::Profile& p, const std::string& leaf, const char* type) {
  return heapprof_test::SumForLeaf(p, leaf, type);
}

}  // namespace

TEST_CASE("preload: a plain C program's mallocs, callocs and reallocs, exactly, at rate 1") {
  heapprof_test::Profile p;
  std::string output;
  REQUIRE(RunPreloaded(HEAPPROF_PLAIN_C_PATH, "", p, output));
  CHECK(output.find("plain_c: kept 4100 blocks") != std::string::npos);
  CHECK(Sum(p, "plain_c_keep_malloc", "inuse_objects") == 4000);
  CHECK(Sum(p, "plain_c_keep_malloc", "inuse_space") == 4000 * 1000);
  CHECK(Sum(p, "plain_c_keep_calloc", "inuse_objects") == 100);
  CHECK(Sum(p, "plain_c_keep_calloc", "inuse_space") == 100 * 10000);
  // 1 KiB, 2 KiB, ... 1 MiB: 11 allocations, the last one live.
  CHECK(Sum(p, "plain_c_grow", "alloc_objects") == 11);
  CHECK(Sum(p, "plain_c_grow", "inuse_objects") == 1);
  CHECK(Sum(p, "plain_c_grow", "inuse_space") == 1 << 20);
  // strdup's malloc: libc's strdup is the leaf, plain_c_churn its caller.
  CHECK(Sum(p, "strdup", "alloc_objects") >= 200000);
  CHECK(Sum(p, "plain_c_churn", "inuse_objects") == 0);
  CHECK(Sum(p, "plain_c_churn", "alloc_objects") == 200000);
}

TEST_CASE("preload: under jemalloc and tcmalloc preloaded after it") {
  for (const char* lib : {"/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
                          "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}) {
    if (access(lib, R_OK) != 0) {
      MESSAGE(lib << " not installed: skipped");
      continue;
    }
    CAPTURE(lib);
    heapprof_test::Profile p;
    std::string output;
    // LD_PRELOAD lists heapprof first: its malloc is the process's, and the
    // allocator after it (RTLD_NEXT) does the allocating.
    const std::string prefix = heapprof_test::TempPath("-preload");
    const std::string cmd = "LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + ":" + lib +
                            " HEAPPROF=rate=1,dump_at_exit=1,dump_prefix=" + prefix + " " + HEAPPROF_PLAIN_C_PATH + " 2>&1";
    REQUIRE(heapprof_test::RunCommand(cmd, output) == 0);
    INFO(output);
    const std::size_t at = output.find("wrote " + prefix);
    REQUIRE(at != std::string::npos);
    const std::size_t end = output.find(' ', at + 6);
    const std::string path = output.substr(at + 6, end - at - 6);
    REQUIRE(heapprof_test::ReadProfileFile(path, p));
    unlink(path.c_str());
    unlink(prefix.c_str());
    CHECK(Sum(p, "plain_c_keep_malloc", "inuse_objects") == 4000);
    CHECK(Sum(p, "plain_c_keep_calloc", "inuse_space") == 100 * 10000);
    CHECK(Sum(p, "plain_c_grow", "inuse_space") == 1 << 20);
    CHECK(Sum(p, "plain_c_churn", "inuse_objects") == 0);
  }
}

#endif
