// The retention profile and the leak report's reachability split
// (6_serving/retention.hpp), on known object graphs run in child processes
// (retention_scenarios.hpp), exact at rate 1.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "retention_scenarios.hpp"
#include "support/http_client.hpp"
#include "support/child_files.hpp"
#include "support/profile_io.hpp"

// heapprof_test_retention_outer (retention_scenarios.hpp): a symbol with a
// smaller one nested in it, as a member given a name of its own; then more
// symbols, so that the outer one is not among the module's last few.
asm(R"(
  .pushsection .data
  .balign 8
  .globl heapprof_test_retention_outer
  .type heapprof_test_retention_outer, @object
  .size heapprof_test_retention_outer, 64
heapprof_test_retention_outer:
  .zero 8
  .globl heapprof_test_retention_inner
  .type heapprof_test_retention_inner, @object
  .size heapprof_test_retention_inner, 8
heapprof_test_retention_inner:
  .zero 56
  .irp n, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
  .type heapprof_test_retention_after\n, @object
  .size heapprof_test_retention_after\n, 8
heapprof_test_retention_after\n:
  .zero 8
  .endr
  .popsection
)");

namespace {

using namespace heapprof_test;

std::string MakeRetentionDir() {
  const std::string dir = MakeTempDir("retention");
  REQUIRE(!dir.empty());
  return dir;
}

// Per sample of `p` whose leaf frame is `leaf`: its frames, leaf first, and
// its inuse_objects.
struct Path {
  std::vector<std::string> frames;
  std::int64_t objects = 0, bytes = 0;
};
std::vector<Path> PathsOf(const Profile& p, const std::string& leaf) {
  std::vector<Path> out;
  const int objects = SampleTypeIndex(p, "inuse_objects"), bytes = SampleTypeIndex(p, "inuse_space");
  for (const Sample& s : p.samples) {
    Path path;
    path.frames = FunctionNames(p, s);
    bool has_leaf = false;
    for (const std::string& f : path.frames) {
      if (f.find('[') == 0) break;  // only the object's own allocation stack
      has_leaf = has_leaf || f.find(leaf) != std::string::npos;
    }
    if (!has_leaf) continue;
    path.objects = s.values[static_cast<std::size_t>(objects)];
    path.bytes = s.values[static_cast<std::size_t>(bytes)];
    out.push_back(path);
  }
  return out;
}

// The MiB a retention profile's comment says the scan read ("scanned X MiB"); -1 if none.
double ScannedMiB(const Profile& p) {
  double scanned = -1;
  for (const std::int64_t c : p.comment_indices) {
    const std::string& text = p.string_table.at(static_cast<std::size_t>(c));
    const std::size_t at = text.find("scanned ");
    if (at != std::string::npos) scanned = std::strtod(text.c_str() + at + 8, nullptr);
  }
  return scanned;
}

bool Contains(const std::vector<std::string>& frames, const std::string& text) {
  for (const std::string& f : frames) {
    if (f.find(text) != std::string::npos) return true;
  }
  return false;
}

#if defined(HEAPPROF_ASAN) || defined(HEAPPROF_TSAN)
#define HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS()                                                              \
  do {                                                                                                          \
    MESSAGE("skipped under ASan/TSan: their allocators and fake stacks keep copies of pointers where the scan " \
            "cannot tell them from the program's, so the exact paths these tests demand do not hold");          \
    return;                                                                                                     \
  } while (0)
#else
#define HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS() \
  do {                                             \
  } while (0)
#endif

}  // namespace

TEST_CASE("retention profile at rate 1: global container, another thread's stack, a leak, a dropped cycle") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_paths", out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t at = out.find("holder_tid=");
  REQUIRE(at != std::string::npos);
  const long tid = std::strtol(out.c_str() + at + 11, nullptr, 10);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));

  // Each owner's buffer: held by its owner (allocated in MakeRetentionOwner),
  // held by the vector's storage, held by the global vector.
  std::int64_t owned = 0;
  for (const Path& path : PathsOf(p, "MakeOwnedBuffer")) {
    CHECK(path.frames.back() == "[global] heapprof_test::g_retention_owners");
    CHECK(Contains(path.frames, "[held by] heapprof_test::MakeRetentionOwner"));
    CHECK(Contains(path.frames, "[held by] heapprof_test::RunRetentionPaths"));
    owned += path.objects;
    CHECK(path.bytes == path.objects * static_cast<std::int64_t>(kOwnedBufferBytes));
  }
  CHECK(owned == static_cast<std::int64_t>(kRetentionOwners));
  // The owners themselves: held by the vector's storage, then the global.
  std::int64_t owners = 0;
  for (const Path& path : PathsOf(p, "MakeRetentionOwner")) {
    if (Contains(path.frames, "MakeOwnedBuffer")) continue;
    CHECK(path.frames.back() == "[global] heapprof_test::g_retention_owners");
    owners += path.objects;
  }
  CHECK(owners == static_cast<std::int64_t>(kRetentionOwners));

  // Held only by a local of the thread blocked in read(2).
  const std::vector<Path> stack_held = PathsOf(p, "MakeStackHeldBuffer");
  REQUIRE(stack_held.size() == 1);
  CHECK(stack_held[0].objects == 1);
  CHECK(stack_held[0].frames.back() == "[stack] thread " + std::to_string(tid));

  // Leaked, and a cycle nothing else points at: unreachable, each of them.
  std::int64_t leaked = 0;
  for (const Path& path : PathsOf(p, "MakeLeakedBuffer")) {
    CHECK(path.frames.back() == "[unreachable]");
    CHECK_FALSE(Contains(path.frames, "[held by]"));
    leaked += path.objects;
  }
  CHECK(leaked == static_cast<std::int64_t>(kLeakedCount));
  std::int64_t cycle = 0;
  for (const Path& path : PathsOf(p, "MakeCycleNode")) {
    CHECK(path.frames.back() == "[unreachable]");
    cycle += path.objects;
  }
  CHECK(cycle == 2);

  // go tool pprof reads it: -traces shows the root frames, -top their totals.
  std::string traces;
  const int go = GoPprof("-symbolize=none -traces -sample_index=inuse_space", dir + "/retention.pb.gz", traces);
  if (go == -2) {
    MESSAGE("go not installed: go tool pprof not run");
  } else {
    INFO(traces);
    CHECK(go == 0);
    CHECK(traces.find("[global] heapprof_test::g_retention_owners") != std::string::npos);
    CHECK(traces.find("[held by] heapprof_test::MakeRetentionOwner") != std::string::npos);
    CHECK(traces.find("[stack] thread " + std::to_string(tid)) != std::string::npos);
    CHECK(traces.find("[unreachable]") != std::string::npos);
    CHECK(traces.find("heapprof retention: ") != std::string::npos);  // the comments
    std::string top;
    CHECK(GoPprof("-symbolize=none -top -cum -nodecount=500 -sample_index=inuse_objects", dir + "/retention.pb.gz",
                  top) == 0);
    INFO(top);
    CHECK(top.find("[unreachable]") != std::string::npos);
  }
  RemoveDir(dir);
}

TEST_CASE("retention profile: a thread still running when the scan starts and blocked soon after is scanned") {
  // The kernel's syscall file says "running" for a thread on a CPU or
  // runnable; the scan used to look once, and a thread that blocked a moment
  // later (a poller between two sleeps) was not scanned: what only its stack
  // held was "[unreachable]".
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_busy_holder", out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t at = out.find("holder_tid=");
  REQUIRE(at != std::string::npos);
  const long tid = std::strtol(out.c_str() + at + 11, nullptr, 10);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  const std::vector<Path> held = PathsOf(p, "MakeBusyHeldBuffer");
  REQUIRE(held.size() == 1);
  CHECK(held[0].objects == 1);
  CHECK(held[0].frames.back() == "[stack] thread " + std::to_string(tid));
  RemoveDir(dir);
}

TEST_CASE("retention profile: a leak whose address the writing thread's dead frames still hold is unreachable") {
  // The scan reads the writing thread's stack from its own frame up, over
  // the profiler's frames, built where the program's dead frames were: a
  // slot they left unwritten kept the stale address, and the leak was
  // "[stack] thread N" (examples/retention: 19 of its 20 log lines).
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_stale_stack", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  const std::vector<Path> leaked = PathsOf(p, "MakeLeakedBuffer");
  REQUIRE(leaked.size() == 1);
  CHECK(leaked[0].objects == 1);
  CHECK(leaked[0].frames.back() == "[unreachable]");
  RemoveDir(dir);
}

TEST_CASE("leak report: a leak whose address the frames of exit() still hold is unreachable, and sets the status") {
  // Once main has returned, exit()'s own frames (libc's) are built over the
  // program's dead frames; slots they leave unwritten kept the address, and
  // the leak was reachable from "[stack] thread N", with exit status 0
  // despite leak_exit_code. The report's scan of this thread now starts
  // above them, at exit()'s caller (libc's start-up code here).
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,dump_prefix=" + dir + "/s",
                                  "retention_stale_stack_main", out);
  INFO(out);
  CHECK(rc == 42);
  const std::size_t unreachable = out.find("unreachable (leaked):");
  const std::size_t reachable = out.find("reachable (held by a root");
  REQUIRE(unreachable != std::string::npos);
  REQUIRE(reachable != std::string::npos);
  CHECK(out.substr(unreachable, reachable - unreachable).find("MakeLeakedBuffer") != std::string::npos);
  CHECK(out.substr(reachable).find("MakeLeakedBuffer") == std::string::npos);
  RemoveDir(dir);
}

#if defined(__x86_64__)
TEST_CASE("leak report: a buffer held only in a register of exit()'s caller is reachable") {
  // The report's scan skips exit()'s own frames (above), where libc may
  // have saved that register: the registers come from the unwinder instead.
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,dump_prefix=" + dir + "/r",
                                  "retention_exit_register", out);
  INFO(out);
  CHECK(rc == 0);
  const std::size_t reachable = out.find("reachable (held by a root");
  REQUIRE(reachable != std::string::npos);
  CHECK(out.substr(reachable).find("MakeKeptBuffer") != std::string::npos);
  RemoveDir(dir);
}
#endif

TEST_CASE("leak report at rate 1: unreachable vs reachable, leak_exit_code, leak_suppressions") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  int rc = RunChildScenario("HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,dump_prefix=" + dir + "/a",
                            "retention_leaks", out);
  INFO(out);
  CHECK(rc == 42);  // unreachable objects remain
  const std::size_t unreachable = out.find("unreachable (leaked):");
  const std::size_t reachable = out.find("reachable (held by a root");
  REQUIRE(unreachable != std::string::npos);
  REQUIRE(reachable != std::string::npos);
  REQUIRE(unreachable < reachable);
  const std::string leaked_part = out.substr(unreachable, reachable - unreachable);
  const std::string held_part = out.substr(reachable);
  CHECK(leaked_part.find("MakeLeakedBuffer") != std::string::npos);
  CHECK(leaked_part.find("MakeCycleNode") != std::string::npos);
  CHECK(leaked_part.find("MakeKeptBuffer") == std::string::npos);
  CHECK(held_part.find("MakeKeptBuffer") != std::string::npos);
  CHECK(held_part.find("<== [global] heapprof_test::g_retention_kept") != std::string::npos);
  CHECK(out.find("retention profile: " + dir + "/a.") != std::string::npos);

  // Without the key: the exit status is the program's own.
  rc = RunChildScenario("HEAPPROF=rate=1,leak_report=1,dump_prefix=" + dir + "/b", "retention_leaks", out);
  CHECK(rc == 0);

  // Suppressed: LSan's format; the leak and the cycle no longer fail the exit.
  const std::string supp = dir + "/lsan.supp";
  REQUIRE(WriteFile(supp, "# LeakSanitizer's format\nleak:MakeLeakedBuffer\n\nleak:heapprof_test::MakeCycle*\n"));
  rc = RunChildScenario(
      "HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,leak_suppressions=" + supp + ",dump_prefix=" + dir + "/c",
      "retention_leaks", out);
  CHECK(rc == 0);
  CHECK(out.find("unreachable (leaked): 0 objects") != std::string::npos);
  CHECK(out.find("suppressed (leak_suppressions): " + std::to_string(kLeakedCount + 2) + " objects") !=
        std::string::npos);

  // A suppression that matches nothing changes nothing.
  REQUIRE(WriteFile(supp, "leak:NoSuchFunction\n"));
  rc = RunChildScenario(
      "HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,leak_suppressions=" + supp + ",dump_prefix=" + dir + "/d",
      "retention_leaks", out);
  CHECK(rc == 42);
  RemoveDir(dir);
}

TEST_CASE("retention profile at the default rate: a chain through unsampled objects ends in [unsampled heap]") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF_TEST_DIR=" + dir, "retention_sampled", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  // The 64-byte holders are sampled with probability ~1e-4 each: a buffer
  // whose holder was not sampled is held from unsampled heap; one whose holder
  // was is held through it by the global.
  std::int64_t via_unsampled = 0;
  const std::vector<Path> paths = PathsOf(p, "MakeSampledBuffer");
  REQUIRE_FALSE(paths.empty());
  for (const Path& path : paths) {
    if (path.frames.back() == "[unsampled heap]") {
      CHECK_FALSE(Contains(path.frames, "[held by]"));
      via_unsampled += path.objects;
    } else if (path.frames.back().rfind("[stack] thread ", 0) == 0) {
      // A dead slot of the child's stack still pointing at a buffer (seen with
      // clang -fno-exceptions): the scan is conservative, as documented.
      CHECK(path.objects > 0);
    } else {
      CHECK(Contains(path.frames, "[held by] heapprof_test::MakeSampledHolder"));
      CHECK(path.frames.back() == "[global] heapprof_test::g_sampled_holders");
    }
  }
  CHECK(via_unsampled > 0);
  RemoveDir(dir);
}

TEST_CASE("retention profile: a word inside a symbol that has a nested one is named after it") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_nested", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  // The word at offset 40 of the 64-byte symbol, past the 8-byte one at 8.
  const std::vector<Path> nested = PathsOf(p, "MakeNestedHeldBuffer");
  REQUIRE(nested.size() == 1);
  CHECK(nested[0].frames.back() == "[global] heapprof_test_retention_outer");
  RemoveDir(dir);
}

TEST_CASE("retention profile: zero-size objects, one sample each as in the heap profile") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_zero_size", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile p, heap;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  REQUIRE(ReadProfileFile(dir + "/heap.pb.gz", heap));
  // new char[0] kept by a global array (a pointer to each one's start).
  std::int64_t zero = 0;
  for (const Path& path : PathsOf(p, "MakeZeroSizeBuffer")) {
    CHECK(path.frames.back() == "[global] heapprof_test::g_retention_zero");
    CHECK(path.bytes == 0);
    zero += path.objects;
  }
  CHECK(zero == static_cast<std::int64_t>(kZeroSizeCount));
  CHECK(SumForLeaf(heap, "MakeZeroSizeBuffer", "inuse_objects") == zero);
  RemoveDir(dir);
}

TEST_CASE("retention profile: the unsampled-heap pass reads only the touched pages of a reservation") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_reservation", out);
  INFO(out);
  if (rc == 9) {  // vm.overcommit_memory=2 refuses even MAP_NORESERVE
    MESSAGE("a 1 GiB MAP_NORESERVE mapping was refused: skipped");
    RemoveDir(dir);
    return;
  }
  REQUIRE(rc == 0);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  // Found in the one touched page (only operator new is hooked here: the pass runs).
  const std::vector<Path> held = PathsOf(p, "MakeReservedHeldBuffer");
  REQUIRE(held.size() == 1);
  CHECK(held[0].frames.back() == "[unsampled heap]");
  // "scanned X MiB": the process's heap and roots, not the 1 GiB reservation.
  const double scanned = ScannedMiB(p);
  INFO("scanned MiB: " << scanned);
  CHECK(scanned >= 0);
  CHECK(scanned < 256);
  RemoveDir(dir);
}

TEST_CASE("retention profile: a global root's untouched pages are not read (a 256 MiB static array)") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_bss", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  // Found in the one touched page of the array, named after it.
  const std::vector<Path> held = PathsOf(p, "MakeBssHeldBuffer");
  REQUIRE(held.size() == 1);
  CHECK(held[0].frames.back().find("g_retention_big_bss") != std::string::npos);
  // Before, the whole array was read: "scanned" was above 256 MiB.
  const double scanned = ScannedMiB(p);
  INFO("scanned MiB: " << scanned);
  CHECK(scanned >= 0);
  CHECK(scanned < 128);
  RemoveDir(dir);
}

TEST_CASE("retention profile: a thread whose stack is a heap block is scanned over that block only") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc =
      RunChildScenario("MALLOC_ARENA_MAX=1 HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_heap_stack", out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t at = out.find("heap_stack_tid=");
  REQUIRE(at != std::string::npos);
  const std::string stack = "[stack] thread " + std::to_string(std::strtol(out.c_str() + at + 15, nullptr, 10));
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  // The dropped cycles, some of them in the heap above the thread's stack:
  // unreachable, none of them that thread's stack.
  std::int64_t cycle = 0;
  for (const Path& path : PathsOf(p, "MakeCycleNode")) {
    CHECK(path.frames.back() != stack);
    CHECK(path.frames.back() == "[unreachable]");
    cycle += path.objects;
  }
  CHECK(cycle >= 2);
  RemoveDir(dir);
}

TEST_CASE("retention: writes and the leak report on a coroutine of 16 KiB; the thread's own stack is a root there") {
  // Before: SIGSEGV in each write (the build took 30-60 KiB of the
  // coroutine's stack), and main()'s local, on the thread's own stack, was
  // unreachable.
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1,leak_report=1,dump_prefix=" + dir + "/a HEAPPROF_TEST_DIR=" + dir,
                                  "retention_coroutine", out);
  INFO(out);
  REQUIRE(rc == 0);  // 139 before
  const std::size_t at = out.find("coroutine_tid=");
  REQUIRE(at != std::string::npos);
  const std::string stack = "[stack] thread " + std::to_string(std::strtol(out.c_str() + at + 14, nullptr, 10));
  CHECK(out.find("heap=1 peak=1 retention=1 stream=1") != std::string::npos);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  for (const char* leaf : {"MakeCoroutineBuffer", "MakeCoroutineMainBuffer"}) {
    INFO(leaf);
    const std::vector<Path> held = PathsOf(p, leaf);
    REQUIRE(held.size() == 1);
    CHECK(held[0].objects == 1);
    CHECK(held[0].frames.back() == stack);
  }
  // The leaks: none held by the profiler's stack, where their samples ran
  // (one was "[unsampled heap]": its dead frames were read as the program's
  // memory). A copy of an address in the coroutine's own dead frames may
  // still hold one: the scan is conservative.
  std::int64_t leaks = 0, unreachable = 0;
  for (const Path& path : PathsOf(p, "MakeCoroutineLeak")) {
    CHECK(path.frames.back() != "[unsampled heap]");
    CHECK(path.frames.back().find("[anonymous mapping]") == std::string::npos);
    leaks += path.objects;
    if (path.frames.back() == "[unreachable]") unreachable += path.objects;
  }
  CHECK(leaks == 3);
  CHECK(unreachable >= 1);
  Profile heap;
  CHECK(ReadProfileFile(dir + "/heap.pb.gz", heap));
  // The leak report at exit: both held, from the coroutine's frame and the thread's stack.
  CHECK(out.find("leak report: unreachable (leaked): 0 objects") == std::string::npos);
  std::size_t lines = 0;
  std::istringstream report(out);
  for (std::string line; std::getline(report, line);) {
    const bool held = line.find("MakeCoroutineBuffer") != std::string::npos ||
                      line.find("MakeCoroutineMainBuffer") != std::string::npos;
    if (held && line.find("<== " + stack) != std::string::npos) ++lines;
  }
  CHECK(lines == 2);
  RemoveDir(dir);
}

TEST_CASE("retention profile written by another thread: the main thread's thread_local is a root") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  const std::string dir = MakeRetentionDir();
  std::string out;
  int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_main_tls", out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t at = out.find("main_tid=");
  REQUIRE(at != std::string::npos);
  const std::string root = "[tls] thread " + std::to_string(std::strtol(out.c_str() + at + 9, nullptr, 10));
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  const std::vector<Path> held = PathsOf(p, "MakeMainTlsBuffer");
  REQUIRE(held.size() == 1);
  CHECK(held[0].objects == 1);
  CHECK(held[0].frames.back() == root);

  // The leak report, run by exit() on a worker thread: held, not leaked.
  rc = RunChildScenario("HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,dump_prefix=" + dir + "/a",
                        "retention_main_tls_exit", out);
  INFO(out);
  CHECK(rc == 0);
  const std::size_t exit_at = out.find("main_tid=");
  REQUIRE(exit_at != std::string::npos);
  const std::string exit_root = "[tls] thread " + std::to_string(std::strtol(out.c_str() + exit_at + 9, nullptr, 10));
  const std::size_t reachable = out.find("reachable (held by a root");
  REQUIRE(reachable != std::string::npos);
  const std::size_t row = out.find("MakeMainTlsBuffer", reachable);
  REQUIRE(row != std::string::npos);
  CHECK(out.substr(row, out.find('\n', row) - row).find("<== " + exit_root) != std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("retention profile written by another thread: the main thread's thread_local in a dlopen'ed library is a root") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
#ifndef HEAPPROF_HOOKED_DSO_PATH
  MESSAGE("no test library (HEAPPROF_HOOKED_DSO_PATH)");
#else
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_main_dso_tls", out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t at = out.find("main_tid=");
  REQUIRE(at != std::string::npos);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  // Its TLS block is in the main thread's DTV only, which ld.so allocated at
  // start-up and no root covers: "[unsampled heap]" before.
  const std::vector<Path> held = PathsOf(p, "DsoTlsBuffer");
  REQUIRE(held.size() == 1);
  CHECK(held[0].objects == 1);
  CHECK(held[0].bytes == static_cast<std::int64_t>(kDsoTlsBytes));
  CHECK(held[0].frames.back() == "[tls] thread " + std::to_string(std::strtol(out.c_str() + at + 9, nullptr, 10)));
  RemoveDir(dir);
#endif
}

TEST_CASE("retention profile: a global of a library dlopen'ed by a relative path is named after a chdir") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
#ifndef HEAPPROF_HOOKED_DSO_PATH
  MESSAGE("no test library (HEAPPROF_HOOKED_DSO_PATH)");
#else
  const std::string dir = MakeRetentionDir();
  std::string out;
  const int rc = RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_relative_dso", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/retention.pb.gz", p));
  // The symbols are read from the file that was mapped, not from the string
  // given to dlopen: "[global] libheapprof_hooked_dso.so+0x..." before.
  const std::vector<Path> held = PathsOf(p, "heapprof_hooked_dso_global_keep");
  REQUIRE(held.size() == 1);
  CHECK(held[0].objects == 1);
  CHECK(held[0].bytes == static_cast<std::int64_t>(kDsoGlobalBytes));
  CHECK(held[0].frames.back() == "[global] heapprof_hooked_dso_global");
  RemoveDir(dir);
#endif
}

TEST_CASE("WriteRetentionProfile to a stream gives a valid profile") {
  std::ostringstream os;
  REQUIRE(heapprof::WriteRetentionProfile(os));
  std::string raw;
  Profile p;
  REQUIRE(Gunzip(os.str(), raw));
  REQUIRE(DecodeProfile(raw, p));
  CHECK(Validate(p));
  CHECK_FALSE(heapprof::WriteRetentionProfile("/nonexistent-dir/retention.pb.gz"));
}

namespace {
char* volatile g_http_retention_kept;
__attribute__((noinline)) char* HttpRetentionLeaf() {
  char* p = new char[6543];
  asm volatile("" : : "r"(p) : "memory");
  return p;
}
}  // namespace

TEST_CASE("http: /debug/pprof/retention is listed and serves the retention profile") {
  HEAPPROF_RETENTION_SKIP_UNDER_SANITIZERS();
  RateScope rate(1);
  g_http_retention_kept = HttpRetentionLeaf();
  heapprof::HttpServer server("127.0.0.1:0");
  const HttpResponse index = HttpGet(server.port(), "/debug/pprof/");
  CHECK(index.status == 200);
  CHECK(index.body.find("<a href='retention'>retention</a>") != std::string::npos);

  const HttpResponse r = HttpGet(server.port(), "/debug/pprof/retention");
  REQUIRE(r.status == 200);
  CHECK(r.Header("content-disposition") == "attachment; filename=\"retention\"");
  std::string raw;
  Profile p;
  REQUIRE(Gunzip(r.body, raw));
  REQUIRE(DecodeProfile(raw, p));
  CHECK(Validate(p));
  const std::vector<Path> kept = PathsOf(p, "HttpRetentionLeaf");
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].objects == 1);
  // This process has run other tests: a stale global pointer to memory since
  // reused may name another global (the exact names are checked in children).
  CHECK(kept[0].frames.back().rfind("[global] ", 0) == 0);
  CHECK(HttpGet(server.port(), "/debug/pprof/retention?seconds=5").status == 400);
  delete[] g_http_retention_kept;
}
