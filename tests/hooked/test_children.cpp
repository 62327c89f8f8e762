// Scenarios that need their own process (see child_scenarios.hpp).
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/profile_io.hpp"

using heapprof_test::ReadProfileFile;
using heapprof_test::RunSelf;

TEST_CASE("allocations before main and in static destructors are recorded") {
  using namespace heapprof_test;
  const std::string out = TempPath("");
  std::string output;
  const int rc = RunSelf("HEAPPROF=rate=1 HEAPPROF_TEST_CHILD=static_exit HEAPPROF_TEST_OUT=" + out, output);
  INFO(output);
  REQUIRE(rc == 0);
  Profile at_main, at_exit;
  REQUIRE(ReadProfileFile(out + ".main", at_main));
  REQUIRE(ReadProfileFile(out + ".exit", at_exit));
  CHECK(at_main.period == 1);  // HEAPPROF=rate=1 applied at the first allocation
  CHECK(SumForLeaf(at_main, "EarlyAllocatorBeforeMain", "inuse_objects") == 10);
  CHECK(SumForLeaf(at_main, "EarlyAllocatorBeforeMain", "inuse_space") == 3330);
  CHECK(SumForLeaf(at_exit, "LateAllocatorAtExit", "alloc_objects") == 7);
  CHECK(SumForLeaf(at_exit, "LateAllocatorAtExit", "inuse_space") == 4 * 4444);
  std::remove(out.c_str());
  std::remove((out + ".main").c_str());
  std::remove((out + ".exit").c_str());
}

TEST_CASE("fork while threads allocate and a profile is being written: the child allocates and writes") {
#if defined(HEAPPROF_ASAN)
  // GCC 12's ASan allocator does not take its own locks around fork: a child
  // forked while another thread is inside malloc waits forever on ASan's
  // size-class mutex (seen in CI, no heapprof lock in the stack). The plain
  // and TSan builds run this test.
  MESSAGE("skipped under ASan: its allocator is not fork-safe with other threads allocating");
  return;
#endif
#if defined(HEAPPROF_TSAN)
  // GCC 12's TSan allocator has the same problem: about one run in twenty a
  // child waited forever in SizeClassAllocator64::GetFromAllocator (a size
  // class's region mutex, held by a parent thread at fork time) under
  // operator new from the child's profile write; no heapprof lock in the
  // stack (gdb). The plain gcc and clang builds run this test.
  MESSAGE("skipped under TSan: its allocator is not fork-safe with other threads allocating");
  return;
#endif
  std::string output;
  const int rc = RunSelf("HEAPPROF_TEST_CHILD=fork", output);
  INFO(output);
  CHECK(rc == 0);
}

TEST_CASE("HEAPPROF: bad keys and values are reported on one line each and ignored") {
  std::string output;
  const int rc = RunSelf("HEAPPROF='bogus=1,rate=12q,rate=64k,novalue' HEAPPROF_TEST_CHILD=print_rate", output);
  INFO(output);
  CHECK(rc == 0);
  CHECK(output.find("heapprof: HEAPPROF: unknown key 'bogus' ignored") != std::string::npos);
  CHECK(output.find("'12q' ignored") != std::string::npos);
  CHECK(output.find("'novalue' ignored") != std::string::npos);
  CHECK(output.find("rate=65536") != std::string::npos);  // the good pair still applied
}

TEST_CASE("HEAPPROF is ignored in a setuid program") {
  // As glibc ignores MALLOC_* there (secure_getenv): an unprivileged user
  // must not make a privileged program write dumps where they like.
#if defined(HEAPPROF_ASAN) || defined(HEAPPROF_TSAN)
  MESSAGE("skipped under sanitizers (their runtimes treat setuid programs specially)");
#else
  if (geteuid() != 0 || std::system("command -v setpriv >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: needs root and setpriv to run a setuid-root copy as nobody");
    return;
  }
  using namespace heapprof_test;
  char tmpl[] = "/tmp/heapprof_setuid_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  REQUIRE(dir != nullptr);
  const std::string bin = std::string(dir) + "/hooked_tests";
  std::string output;
  REQUIRE(RunCommand("cp '" + SelfExe() + "' '" + bin + "' && chmod 0755 '" + dir + "' && chmod 4755 '" + bin + "'",
                     output) == 0);
  // Control: the same copy, not setuid for this user (run as root), reads it.
  REQUIRE(RunCommand("HEAPPROF=rate=12345 HEAPPROF_TEST_CHILD=print_rate '" + bin + "'", output) == 0);
  CHECK(output.find("rate=12345") != std::string::npos);
  // As nobody, the binary runs with euid root: AT_SECURE, HEAPPROF ignored.
  const int rc = RunCommand("setpriv --reuid=65534 --regid=65534 --clear-groups env HEAPPROF=rate=12345 "
                            "HEAPPROF_TEST_CHILD=print_rate '" + bin + "'",
                            output);
  INFO(output);
  CHECK(rc == 0);
  CHECK(output.find("rate=524288") != std::string::npos);
  RunCommand("rm -rf '" + std::string(dir) + "'", output);
#endif
}

TEST_CASE("a small block the countdown samples is padded to 1 KiB; every free of a sampled block is found") {
  using namespace heapprof_test;
  for (const char* child : {"padded_samples", "padding_off"}) {
    const std::string out = TempPath("");
    std::string output;
    const int rc = RunSelf(std::string("HEAPPROF=rate=65536 HEAPPROF_TEST_CHILD=") + child + " HEAPPROF_TEST_OUT=" + out,
                           output);
    INFO(std::string(child) << ": " << output);
    CHECK(rc == 0);
    std::remove(out.c_str());
  }
}
