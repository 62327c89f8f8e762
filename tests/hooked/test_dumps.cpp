// Automatic dumps, the leak report, profile files, the legacy text format and
// delta profiles (issue 4, without the HTTP server).
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <sys/stat.h>
#include <cstdint>
#include <fstream>
#include <climits>
#include <csignal>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "internals.hpp"
#include "support/child_files.hpp"
#include "support/profile_io.hpp"

namespace {

using heapprof_test::Profile;

using heapprof_test::ListDir;
using heapprof_test::Matching;
using heapprof_test::RemoveDir;

std::string DumpsTempDir() {
  const std::string dir = heapprof_test::MakeTempDir("dumps");
  REQUIRE(!dir.empty());
  return dir;
}

using heapprof_test::ReadFile;
using heapprof_test::ReadProfileFile;
using heapprof_test::RunSelf;
using heapprof_test::RunCommand;
using heapprof_test::SelfExe;

// Every dump in `dir` is a complete, valid profile and no temporary is left.
void CheckDumps(const std::string& dir, std::size_t want) {
  const std::vector<std::string> all = ListDir(dir);
  const std::vector<std::string> dumps = Matching(dir, R"(p\.[0-9]+\.[0-9]{4}\.heap\.pb\.gz)");
  INFO("files: " << all.size());
  CHECK(dumps.size() == want);
  CHECK(Matching(dir, R"(.*\.tmp\..*)").empty());
  for (const std::string& name : dumps) {
    Profile p;
    INFO(name);
    CHECK(ReadProfileFile(dir + "/" + name, p));
  }
}

__attribute__((noinline)) char* TextLeaf(std::size_t n) {
  char* p = new char[n];
  asm volatile("# TextLeaf" : : "r"(p) : "memory");  // distinct bodies: no identical-code folding
  return p;
}

__attribute__((noinline)) char* ZeroSizeTextLeaf() {
  char* p = new char[0];
  asm volatile("# ZeroSizeTextLeaf" : : "r"(p) : "memory");  // distinct bodies: no identical-code folding
  return p;
}

__attribute__((noinline)) char* DeltaBefore(std::size_t n) {
  char* p = new char[n];
  asm volatile("# DeltaBefore" : : "r"(p) : "memory");  // distinct bodies: no identical-code folding
  return p;
}

__attribute__((noinline)) char* DeltaDuring(std::size_t n) {
  char* p = new char[n];
  asm volatile("# DeltaDuring" : : "r"(p) : "memory");  // distinct bodies: no identical-code folding
  return p;
}

// The leaf pc of `function`'s records in our legacy text profile: the first
// address of a record whose first frame line names it.
std::uint64_t TextLeafPc(const std::string& text, const std::string& function) {
  std::smatch m;
  const std::regex record("@ 0x([0-9a-f]+)[^\\n]*\\n#\\t0x[0-9a-f]+\\t(?:[^\\n\\t]*::)?" + function + "[(+]");
  REQUIRE(std::regex_search(text, m, record));
  return std::stoull(m[1].str(), nullptr, 16);
}

// Column `column` (1-4: alloc_objects, alloc_space, inuse_objects,
// inuse_space) of `go tool pprof -raw`'s samples of `bytes` whose leaf is
// `leaf_pc`, summed. Only those: another object of that size sampled at the
// default rate (the profile's own work) is a sample of its own. pprof lists
// a legacy text's addresses less 1 (return addresses).
double PprofRawSum(const std::string& out, std::uint64_t leaf_pc, std::size_t bytes, int column) {
  std::map<std::string, std::uint64_t> location;
  const std::regex loc(R"(\n\s+([0-9]+): 0x([0-9a-f]+) )");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), loc); it != std::sregex_iterator(); ++it) {
    location[(*it)[1].str()] = std::stoull((*it)[2].str(), nullptr, 16);
  }
  const std::regex sample(R"(\n\s+(-?[0-9]+)\s+(-?[0-9]+)\s+(-?[0-9]+)\s+(-?[0-9]+): ([0-9]+)[ 0-9]*\n\s+bytes:\[)" +
                          std::to_string(bytes) + R"(\])");
  double sum = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), sample); it != std::sregex_iterator(); ++it) {
    const auto at = location.find((*it)[5].str());
    REQUIRE(at != location.end());
    if (at->second == leaf_pc - 1 || at->second == leaf_pc) sum += std::stod((*it)[column].str());
  }
  return sum;
}

}  // namespace

TEST_CASE("dump_interval: one dump per SIZE allocated, each a complete profile") {
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=rate=1,dump_prefix=" + dir + "/p,dump_interval=1m HEAPPROF_TEST_DIR=" + dir +
                              " HEAPPROF_TEST_CHILD=dump_bytes",
                          out);
  INFO(out);
  CHECK(rc == 0);
  CheckDumps(dir, 3);
  CHECK(out.find("(dump_interval)") != std::string::npos);
  // The third dump was triggered by the third MiB: at least two are in it
  // (Stats can count the third an instant before its sample is recorded).
  const std::vector<std::string> dumps = Matching(dir, R"(p\..*\.0003\.heap\.pb\.gz)");
  REQUIRE(dumps.size() == 1);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/" + dumps[0], p));
  const std::int64_t inuse = heapprof_test::SumForLeaf(p, "LeakedByTest", "inuse_space");
  const std::int64_t step = (1 << 20) + (64 << 10);
  CHECK((inuse == 2 * step || inuse == 3 * step));
  RemoveDir(dir);
}

TEST_CASE("inuse_interval: a dump each time the in-use high-water mark grows by SIZE") {
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=rate=1,dump_prefix=" + dir + "/p,inuse_interval=1m HEAPPROF_TEST_DIR=" + dir +
                              " HEAPPROF_TEST_CHILD=dump_bytes",
                          out);
  INFO(out);
  CHECK(rc == 0);
  CheckDumps(dir, 3);
  CHECK(out.find("(inuse_interval)") != std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("dump_time: dumps every SECONDS without any allocation") {
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=dump_prefix=" + dir + "/p,dump_time=1 HEAPPROF_TEST_DIR=" + dir +
                              " HEAPPROF_TEST_CHILD=dump_time",
                          out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(Matching(dir, R"(p\.[0-9]+\.000[12]\.heap\.pb\.gz)").size() == 2);
  CHECK(Matching(dir, R"(.*\.tmp\..*)").empty());
  RemoveDir(dir);
}

TEST_CASE("dump_signal: each signal gives one dump and the program carries on") {
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=SIGUSR1 HEAPPROF_TEST_DIR=" + dir +
                              " HEAPPROF_TEST_CHILD=dump_signal",
                          out);
  INFO(out);
  CHECK(rc == 0);
  CheckDumps(dir, 2);
  CHECK(out.find("(dump_signal)") != std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("dump_signal in a program that closed every descriptor it did not open: dumps, writes nothing into its files, sleeps") {
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("timeout -s KILL 120 env HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=USR1 HEAPPROF_TEST_DIR=" +
                             dir + " HEAPPROF_TEST_CHILD=dump_signal_closed_fds",
                         out);
  INFO(out);
  CHECK(rc == 0);  // 20: a byte in the program's files; 30: the dump thread spun
  CheckDumps(dir, 2);
  RemoveDir(dir);
}

TEST_CASE("the profiler's threads have stacks of their own size, not the program's small default") {
#if defined(HEAPPROF_TSAN)
  MESSAGE("skipped under TSan: its runtime refuses new threads after a multi-threaded fork");
  return;
#endif
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("timeout -s KILL 120 env HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=USR1 HEAPPROF_TEST_DIR=" +
                             dir + " HEAPPROF_TEST_CHILD=small_default_stack",
                         out);
  INFO(out);
  CHECK(rc == 0);  // 13: the forked child's dump thread overflowed its stack; a signal: the server's
  RemoveDir(dir);
}

TEST_CASE("dump_signal=TERM that does not end the process dumps at every signal") {
  // Before: the previous disposition was put back for good after the first
  // dump, so a TERM handled by the program dumped once.
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=TERM HEAPPROF_TEST_DIR=" + dir +
                             " HEAPPROF_TEST_CHILD=dump_signal_handler",
                         out);
  INFO(out);
  CHECK(rc == 0);
  CheckDumps(dir, 3);
  RemoveDir(dir);
}

TEST_CASE("dump_signal=TERM that is ignored at start-up stays ignored, in the programs it execs too") {
  // Before: heapprof's handler took the place of SIG_IGN (dumping at each
  // TERM), so the program saw a handler there, and every program it ran got
  // SIG_DFL from exec: `nohup sh -c 'sleep 9'` under dump_signal=HUP, the
  // sleep ended at a HUP (here: the child shell's own TERM ended it, 13).
  const std::string dir = DumpsTempDir();
  std::string out;
  // Ignored on entry, the signal stays ignored across exec (the shell's trap).
  const int rc = RunSelf("trap '' TERM; HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=TERM HEAPPROF_TEST_DIR=" + dir +
                             " HEAPPROF_TEST_CHILD=dump_signal_ignored",
                         out);
  INFO(out);
  CHECK(rc == 0);  // 13: the child shell ended by its TERM; 12: a handler in SIG_IGN's place
  CHECK(out.find("a child shell survived its TERM") != std::string::npos);
  CHECK(out.find("dump_signal=TERM: the signal is ignored") != std::string::npos);
  CheckDumps(dir, 0);
  RemoveDir(dir);
}

TEST_CASE("dump_signal=TERM forwards to the program's handler as the kernel would: sa_mask, SA_RESETHAND") {
  // Before: the handler ran without its sa_mask, and on every signal, though
  // SA_RESETHAND asked for the default action after the first.
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=TERM HEAPPROF_TEST_DIR=" + dir +
                             " HEAPPROF_TEST_CHILD=dump_signal_resethand",
                         out);
  INFO(out);
  CHECK(out.find("handled once, mask kept") != std::string::npos);
  CHECK(rc == 128 + SIGTERM);  // the shell's status for a child ended by TERM
  CheckDumps(dir, 2);
  RemoveDir(dir);
}

TEST_CASE("dump_signal=TERM that arrives while the program exits still ends the process by the signal") {
  // Before: the dump thread was stopped with the signal not taken (or gone
  // when it came), and the process exited 0 (python3 -c that sends itself
  // TERM as its last statement: status 0, not 143, and no dump).
  for (const std::string child : {"dump_signal_term_exiting", "dump_signal_term_exited"}) {
    INFO(child);
    const std::string dir = DumpsTempDir();
    std::string out;
    const int rc = RunSelf("HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=TERM HEAPPROF_TEST_DIR=" + dir +
                               " HEAPPROF_TEST_CHILD=" + child,
                           out);
    INFO(out);
    CHECK(rc == 128 + SIGTERM);
    // Before heapprof's exit actions: the dump, then the signal; after them: the signal alone.
    CheckDumps(dir, child == "dump_signal_term_exiting" ? 1 : 0);
    RemoveDir(dir);
  }
}

TEST_CASE("a program that execs keeps its pid: the new image's dumps do not replace the old one's") {
  // Before: both numbered from 0001, and the new image's dump_at_exit was
  // written over the old image's dump_signal dump.
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=USR1,dump_at_exit=1 HEAPPROF_TEST_DIR=" + dir +
                             " HEAPPROF_TEST_CHILD=dump_then_exec",
                         out);
  INFO(out);
  CHECK(rc == 0);
  CheckDumps(dir, 2);
  CHECK(std::regex_search(out, std::regex(R"(wrote \S+/p\.([0-9]+)\.0001\.heap\.pb\.gz \(dump_signal\)\n)"
                                          R"((.*\n)*heapprof: wrote \S+/p\.\1\.0002\.heap\.pb\.gz \(dump_at_exit\))")));
  RemoveDir(dir);
}

TEST_CASE("a program that execs in the middle of a dump: the new image's write passes over the temporaries left") {
  // exec() keeps the pid and the new image numbers its temporaries from 0
  // again: before, the leftover "<name>.tmp.<pid>.0" made its first write
  // fail ("cannot create ...: File exists") and its dump_at_exit was lost.
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=dump_prefix=" + dir + "/p,dump_signal=USR1,dump_at_exit=1 HEAPPROF_TEST_DIR=" + dir +
                             " HEAPPROF_TEST_STALE_TMP=1 HEAPPROF_TEST_CHILD=dump_then_exec",
                         out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("cannot create") == std::string::npos);
  CHECK(Matching(dir, R"(p\.[0-9]+\.[0-9]{4}\.heap\.pb\.gz)").size() == 2);
  CHECK(std::regex_search(out, std::regex(R"(wrote \S+/p\.([0-9]+)\.0002\.heap\.pb\.gz \(dump_at_exit\))")));
  // The leftovers stay: another pid namespace sharing the directory could own them.
  CHECK(Matching(dir, R"(p\.[0-9]+\.0002\.heap\.pb\.gz\.tmp\.[0-9]+\.[0-3])").size() == 4);
  RemoveDir(dir);
}

TEST_CASE("HEAPPROF log= sends every heapprof line to a file or nowhere; stderr stays the program's") {
  // A build under the preload library (configure, try_compile, tests that
  // compare stderr) must be able to keep heapprof's lines out of stderr.
  // Before, there was no way: every line went to fd 2.
  const std::string dir = DumpsTempDir();
  const std::string common = "dump_prefix=" + dir + "/p,dump_at_exit=1,leak_report=1,rate=1,no_such_key=1";
  std::string out;
  // A file, given after the bad key: the bad key's line goes to the file
  // too. Two processes: the second appends.
  int rc = 0;
  for (int i = 0; i < 2; ++i) {
    rc = RunSelf("HEAPPROF=" + common + ",log=" + dir + "/h.log HEAPPROF_TEST_DIR=" + dir +
                     " HEAPPROF_TEST_CHILD=dump_exit",
                 out);
    CHECK(rc == 0);
    CHECK(out.find("heapprof") == std::string::npos);
  }
  {
    const std::string log = ReadFile(dir + "/h.log");
    INFO(log);
    CHECK(log.find("heapprof: HEAPPROF: unknown key 'no_such_key'") != std::string::npos);
    const std::regex wrote(R"(heapprof: wrote \S+/p\.[0-9]+\.0001\.heap\.pb\.gz \(dump_at_exit\))");
    CHECK(std::distance(std::sregex_iterator(log.begin(), log.end(), wrote), std::sregex_iterator()) == 2);
    CHECK(log.find("heapprof: leak report: ") != std::string::npos);  // the table (ReportRaw) too
    CHECK(log.find("LeakedByTest") != std::string::npos);
  }
  RemoveDir(dir);
  const std::string dir2 = DumpsTempDir();
  const std::string common2 = "dump_prefix=" + dir2 + "/p,dump_at_exit=1,leak_report=1,rate=1,no_such_key=1";
  rc = RunSelf("HEAPPROF=log=none," + common2 + " HEAPPROF_TEST_DIR=" + dir2 + " HEAPPROF_TEST_CHILD=dump_exit", out);
  CHECK(rc == 0);
  CHECK(out.find("heapprof") == std::string::npos);
  CHECK(Matching(dir2, R"(p\.[0-9]+\.0001\.heap\.pb\.gz)").size() == 1);  // the dump is still written
  // A file that cannot be opened: stderr, not nowhere. A bad value: said on
  // stderr, and the lines stay there.
  rc = RunSelf("HEAPPROF=log=" + dir2 + "/no/such/dir/h.log," + common2 +
                   " HEAPPROF_TEST_DIR=" + dir2 + " HEAPPROF_TEST_CHILD=dump_exit",
               out);
  CHECK(rc == 0);
  CHECK(out.find("heapprof: wrote ") != std::string::npos);
  rc = RunSelf("HEAPPROF=log=," + common2 + " HEAPPROF_TEST_DIR=" + dir2 + " HEAPPROF_TEST_CHILD=dump_exit", out);
  CHECK(rc == 0);
  CHECK(out.find("heapprof: HEAPPROF: bad value for log") != std::string::npos);
  CHECK(out.find("heapprof: wrote ") != std::string::npos);
  // Relative: to the working directory at start-up.
  rc = RunSelf("cd " + dir2 + " && HEAPPROF=log=rel.log," + common2 + " HEAPPROF_TEST_DIR=" + dir2 +
                   " HEAPPROF_TEST_CHILD=dump_exit",
               out);
  CHECK(rc == 0);
  CHECK(out.find("heapprof") == std::string::npos);
  CHECK(ReadFile(dir2 + "/rel.log").find("heapprof: wrote ") != std::string::npos);
  RemoveDir(dir2);
}

TEST_CASE("a program that closed stderr: heapprof's lines do not go into the file or socket that took fd 2") {
  // A daemon closes fd 2 and its next descriptor takes the number. Before,
  // the exit's "wrote" line and leak table were written into the program's
  // own data file, and a line into an accepted client's socket.
  const std::string dir = DumpsTempDir();
  const std::string env = "HEAPPROF=dump_prefix=" + dir + "/p,dump_at_exit=1,leak_report=1,rate=1 HEAPPROF_TEST_DIR=" +
                          dir + " HEAPPROF_TEST_CHILD=stderr_reused HEAPPROF_TEST_STDERR=";
  std::string out;
  int rc = RunSelf(env + "file", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(ReadFile(dir + "/data.db") == "DATA\n");
  CHECK(Matching(dir, R"(p\.[0-9]+\.0001\.heap\.pb\.gz)").size() == 1);  // the dump itself is written
  // A file opened for appending is where the program sends its stderr: the lines follow.
  rc = RunSelf(env + "append", out);
  CHECK(rc == 0);
  const std::string log = ReadFile(dir + "/app.log");
  CHECK(log.rfind("DATA\nheapprof: ", 0) == 0);
  CHECK(log.find("heapprof: wrote ") != std::string::npos);
  CHECK(log.find("heapprof: leak report: ") != std::string::npos);
  // A socket: nothing reaches the peer. A pipe that stderr was moved to: the line does.
  CHECK(RunSelf(env + "socket", out) == 0);
  CHECK(RunSelf(env + "pipe", out) == 0);
  RemoveDir(dir);
}

TEST_CASE("without /proc (a chroot or a minimal container): the program's frames are named and no object is called a leak") {
  // Before: the program's own frames were nameless ([hooked_tests] and bare
  // addresses in the leak table), since its file was found only through
  // /proc/self/exe; and the retention scan, which needs /proc/self/maps,
  // called every object unreachable: 7 false leaks and leak_exit_code's status.
  // A mount namespace with an empty tmpfs over /proc stands for it.
#if defined(HEAPPROF_ASAN)
  // LeakSanitizer cannot work without /proc: it fails the program at exit
  // ("Can't open /proc/<pid>/task"); and ASAN_OPTIONS cannot turn it off
  // there, since the runtime reads its options from /proc/self/environ.
  MESSAGE("skipped under ASan: LeakSanitizer needs /proc");
  return;
#endif
  std::string out;
  if (RunCommand("unshare -m sh -c 'mount -t tmpfs none /proc && test ! -e /proc/self/maps'", out) != 0) {
    MESSAGE("skipped: cannot unmount /proc in a mount namespace here (unshare -m needs root): " << out);
    return;
  }
  const std::string dir = DumpsTempDir();
  // (A stack limit of 8 MiB: above 128 MiB the main thread's bounds are
  // glibc's again, which cannot be found without /proc.)
  const int rc = RunCommand("cd " + dir + " && unshare -m sh -c 'mount -t tmpfs none /proc && ulimit -s 8192 && exec env HEAPPROF=rate=1,"
                                "dump_prefix=" + dir + "/p,dump_at_exit=1,leak_report=1,leak_exit_code=23,dump_near_oom=0.9,rss_interval=1m "
                                "HEAPPROF_TEST_DIR=" + dir + " HEAPPROF_TEST_CHILD=dump_exit " + SelfExe() + "'",
                            out);
  INFO(out);
  CHECK(rc == 0);  // 23: the objects were called leaks
  CHECK(out.find("leak report: /proc/self/maps cannot be read (is /proc mounted?)") != std::string::npos);
  CHECK(out.find("leak report: unreachable (leaked): 0 objects") != std::string::npos);
  // The rows name the program's functions, with file and line, and the
  // callers too: the main thread's stack bounds need no /proc (they came
  // from glibc's pthread_getattr_np, which reads /proc/self/maps: the stack
  // was the leaf alone).
  CHECK(std::regex_search(out, std::regex(R"(heapprof:\s+14\.65 KiB\s+5\s+heapprof_test::LeakedByTest \(dump_scenarios\.hpp:[0-9]+\) < heapprof_test::RunDumpExit \(dump_scenarios\.hpp:[0-9]+\) < [^\n]*<== \[not scanned)")));
  CHECK(Matching(dir, R"(p\.[0-9]+\.0001\.heap\.pb\.gz)").size() == 1);
  // Memory use cannot be read: the memory triggers say they cannot work (before: nothing).
  CHECK(out.find("heapprof: dump_near_oom and rss_interval: /proc/self/statm cannot be read (is /proc mounted?)") !=
        std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("dump_prefix ending in a slash names a directory: heapprof.<pid>... files in it") {
  // Before: "<dir>/.<pid>.0001.heap.pb.gz", hidden from ls and *.pb.gz globs.
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=dump_prefix=" + dir + "/,dump_at_exit=1,leak_report=1,peak_at_exit=1 HEAPPROF_TEST_DIR=" +
                             dir + " HEAPPROF_TEST_CHILD=dump_exit",
                         out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(Matching(dir, R"(heapprof\.[0-9]+\.0001\.heap\.pb\.gz)").size() == 1);
  CHECK(Matching(dir, R"(heapprof\.[0-9]+\.leaks\.pb\.gz)").size() == 1);
  CHECK(Matching(dir, R"(heapprof\.[0-9]+\.peak\.pb\.gz)").size() == 1);
  CHECK(Matching(dir, R"(\..*)").empty());
  RemoveDir(dir);
}

TEST_CASE("dump_at_exit and leak_report: the last dump, the leak profile and the stderr table") {
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=rate=1,dump_prefix=" + dir + "/p,dump_at_exit=1,leak_report=1 HEAPPROF_TEST_DIR=" +
                              dir + " HEAPPROF_TEST_CHILD=dump_exit",
                          out);
  INFO(out);
  CHECK(rc == 0);
  CheckDumps(dir, 1);
  const std::vector<std::string> leaks = Matching(dir, R"(p\.[0-9]+\.leaks\.pb\.gz)");
  REQUIRE(leaks.size() == 1);
  Profile p;
  REQUIRE(ReadProfileFile(dir + "/" + leaks[0], p));
  // Rate 1: exact. 5 x 3000 B still live, 50 x 100 B freed.
  CHECK(heapprof_test::SumForLeaf(p, "LeakedByTest", "inuse_space") == 15000);
  CHECK(heapprof_test::SumForLeaf(p, "LeakedByTest", "inuse_objects") == 5);
  CHECK(heapprof_test::SumForLeaf(p, "LeakedByTest", "alloc_objects") == 55);
  // The table: a header line and a row for the leaking function with its totals.
  CHECK(out.find("heapprof: leak report: ") != std::string::npos);
  CHECK(out.find("every allocation recorded") != std::string::npos);
  // The row starts at the program's own frame, with its file and line.
  const std::regex row(R"(heapprof:\s+14\.65 KiB\s+5\s+heapprof_test::LeakedByTest \(dump_scenarios\.hpp:[0-9]+\))");
  CHECK(std::regex_search(out, row));
  const std::regex vector_row(R"(heapprof:\s+3\.93 KiB\s+2\s+heapprof_test::LeakedVectorByTest \(dump_scenarios\.hpp:[0-9]+\))");
  CHECK(std::regex_search(out, vector_row));
  CHECK(out.find("leak profile: " + dir + "/" + leaks[0]) != std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("HEAPPROF lines=0: names from the symbol tables only; no file or line anywhere in the profiles or the leak table") {
  // Reading DWARF is a process's first profile's largest cost (a compressed
  // debug file inflated whole): many short processes each dumping at exit ran
  // 10-20 times as long as without. lines=0 reads none.
  for (const bool lines : {true, false}) {
    CAPTURE(lines);
    const std::string dir = DumpsTempDir();
    std::string out;
    const int rc = RunSelf(std::string("HEAPPROF=rate=1,dump_at_exit=1,leak_report=1,") + (lines ? "" : "lines=0,") +
                               "dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir + " HEAPPROF_TEST_CHILD=dump_exit",
                           out);
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.find("HEAPPROF:") == std::string::npos);  // no problem with the variable
    const std::vector<std::string> dumps = Matching(dir, R"(p\.[0-9]+\.0001\.heap\.pb\.gz)");
    const std::vector<std::string> leaks = Matching(dir, R"(p\.[0-9]+\.leaks\.pb\.gz)");
    REQUIRE(dumps.size() == 1);
    REQUIRE(leaks.size() == 1);
    for (const std::string& name : {dumps[0], leaks[0]}) {
      CAPTURE(name);
      Profile p;
      REQUIRE(ReadProfileFile(dir + "/" + name, p));
      CHECK(heapprof_test::SumForLeaf(p, "LeakedByTest", "inuse_space") == 15000);  // named either way
      std::size_t with_line = 0, with_file = 0, mappings_with_lines = 0;
      for (const heapprof_test::Location& loc : p.locations) {
        for (const heapprof_test::Line& l : loc.lines) with_line += l.line != 0;
      }
      for (const heapprof_test::Function& fn : p.functions) with_file += !fn.filename.empty();
      for (const heapprof_test::Mapping& m : p.mappings) mappings_with_lines += m.has_line_numbers;
      if (lines) {
        CHECK(with_line > 0);
        CHECK(with_file > 0);
        // (A mapping says it has lines only when all its locations have: not
        // this binary's, whose start-up code has none, nor libc's without
        // Debian's libc6-dbg; so nothing is asked of mappings here.)
      } else {
        CHECK(with_line == 0);
        CHECK(with_file == 0);
        CHECK(mappings_with_lines == 0);
      }
    }
    // The table's row for the leak: "(dump_scenarios.hpp:N)" only with lines.
    const std::regex row(R"(heapprof:\s+14\.65 KiB\s+5\s+heapprof_test::LeakedByTest( \(dump_scenarios\.hpp:[0-9]+\))?)");
    std::smatch m;
    REQUIRE(std::regex_search(out, m, row));
    CHECK(m[1].matched == lines);
    RemoveDir(dir);
  }
}

TEST_CASE("exit files of an earlier process with the same pid are kept: the leak and peak profiles take the next number") {
  // A container's main process is pid 1 at every start: each restart's leak
  // report, writing into the same volume, replaced the one before.
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=rate=1,dump_prefix=" + dir + "/p,leak_report=1,peak_at_exit=1 HEAPPROF_TEST_DIR=" + dir +
                             " HEAPPROF_TEST_CHILD=dump_exit_pid_reused",
                         out);
  INFO(out);
  CHECK(rc == 0);
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex(R"(leak profile: \S+/p\.([0-9]+)\.2\.leaks\.pb\.gz )")));
  const std::string pid = m[1].str();
  CHECK(out.find("retention profile: " + dir + "/p." + pid + ".2.retention.pb.gz ") != std::string::npos);
  CHECK(out.find("wrote " + dir + "/p." + pid + ".2.peak.pb.gz (peak_at_exit)") != std::string::npos);
  for (const char* kind : {"leaks", "retention", "peak"}) {
    CAPTURE(kind);
    CHECK(ReadFile(dir + "/p." + pid + "." + kind + ".pb.gz") == "earlier");
    Profile p;
    CHECK(ReadProfileFile(dir + "/p." + pid + ".2." + kind + ".pb.gz", p));
  }
  Profile leaks;
  REQUIRE(ReadProfileFile(dir + "/p." + pid + ".2.leaks.pb.gz", leaks));
  CHECK(heapprof_test::SumForLeaf(leaks, "LeakedByTest", "inuse_space") == 15000);
  CHECK(Matching(dir, R"(.*\.tmp\..*)").empty());
  RemoveDir(dir);
}

TEST_CASE("leak_suppressions naming a FIFO, a directory or an empty file: one line, and the report is still written") {
  const std::string dir = DumpsTempDir();
  const std::string fifo = dir + "/fifo", empty = dir + "/empty.supp";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::FILE* f = std::fopen(empty.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fclose(f);
  // The FIFO has no writer: open() used to wait for one, and the exit hung
  // (/dev/zero, also not a regular file, was read until 16 GiB were taken).
  for (const std::string& supp : {fifo, dir, empty}) {
    CAPTURE(supp);
    std::string out;
    const int rc = RunSelf("timeout -s KILL 60 env HEAPPROF=rate=1,leak_report=1,leak_suppressions=" + supp +
                               ",dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir + " HEAPPROF_TEST_CHILD=dump_exit",
                           out);
    INFO(out);
    CHECK(rc == 0);  // 137: the exit hung
    if (supp == empty) {
      CHECK(out.find("leak_suppressions:") == std::string::npos);  // no patterns, no error
    } else {
      CHECK(out.find("leak report: leak_suppressions: cannot read " + supp + ": not a regular file") !=
            std::string::npos);
    }
    CHECK(out.find("leak profile: " + dir + "/p.") != std::string::npos);
  }
  RemoveDir(dir);
}

TEST_CASE("leak_report without dump_prefix writes heapprof.<pid>.leaks.pb.gz in the working directory") {
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = heapprof_test::RunCommand("cd " + dir + " && HEAPPROF=rate=1,leak_report=1 HEAPPROF_TEST_DIR=" + dir +
                                               " HEAPPROF_TEST_CHILD=dump_exit " + heapprof_test::SelfExe(),
                                           out);
  INFO(out);
  CHECK(rc == 0);
  const std::vector<std::string> leaks = Matching(dir, R"(heapprof\.[0-9]+\.leaks\.pb\.gz)");
  REQUIRE(leaks.size() == 1);
  Profile p;
  CHECK(ReadProfileFile(dir + "/" + leaks[0], p));
  CHECK(heapprof_test::SumForLeaf(p, "LeakedByTest", "inuse_space") == 15000);
  RemoveDir(dir);
}

TEST_CASE("leak report: its first line says 'every allocation recorded' only when every sample was taken at rate 1") {
  // It read the rate of the moment: objects estimated from samples at 4096
  // were "every allocation recorded" after a SetSampleRate(1), and "sampling
  // off" after a SetSampleRate(0). At 4096, 100 objects of 10000 B give
  // samples unless all 100 are missed: e^(-10000/4096 * 100), never.
  struct Case {
    const char* rate_after;
    const char* how;
  };
  for (const Case& c : {Case{"1", "(estimated from samples, rates 1 to 4096 bytes)"},
                        Case{"0", "(estimated from samples, rate 4096 bytes; sampling off now)"},
                        Case{"4096", "(estimated from samples, rate 4096 bytes)"}}) {
    CAPTURE(c.rate_after);
    std::string out;
    const int rc = RunSelf(std::string("HEAPPROF=rate=4096,leak_report=1,dump_prefix=/nonexistent-heapprof-dir/p "
                                       "HEAPPROF_TEST_RATE_AFTER=") +
                               c.rate_after + " HEAPPROF_TEST_CHILD=leak_rate_change",
                           out);
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.find(" still in use at exit " + std::string(c.how) + "\n") != std::string::npos);
    CHECK(out.find("every allocation recorded") == std::string::npos);
  }
  std::string out;  // rate 1 throughout: exact
  CHECK(RunSelf("HEAPPROF=rate=1,leak_report=1,dump_prefix=/nonexistent-heapprof-dir/p HEAPPROF_TEST_RATE_AFTER=1 "
                "HEAPPROF_TEST_CHILD=leak_rate_change",
                out) == 0);
  CHECK(out.find(" still in use at exit (every allocation recorded)\n") != std::string::npos);
}

TEST_CASE("leak report: a thread running during its scan is said on stderr") {
  // Its stack cannot be read, so its buffer is "unreachable": the report
  // now says why, where before only the retention profile's comment did.
  std::string out;
  const int rc = RunSelf("timeout -s KILL 60 env HEAPPROF=rate=1,leak_report=1,dump_prefix=/nonexistent-heapprof-dir/p "
                         "HEAPPROF_TEST_CHILD=leak_running_thread",
                         out);
  INFO(out);
  CHECK(rc == 0);
  // (1 thread: the spinning one; a sanitizer's own thread may add one.)
  const std::regex line(R"(heapprof: leak report: [1-9][0-9]* threads? (was|were) running during the scan: (its|their) )"
                        R"(stacks? and registers were not read, so what only (it|they) holds? is counted as unreachable\n)");
  CHECK(std::regex_search(out, line));
}

TEST_CASE("a dump that cannot be written prints one line and the program exits normally") {
  std::string out;
  const int rc = RunSelf(
      "HEAPPROF=rate=1,dump_prefix=/nonexistent-heapprof-dir/p,dump_at_exit=1,leak_report=1 HEAPPROF_TEST_DIR=/tmp "
      "HEAPPROF_TEST_CHILD=dump_exit",
      out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("heapprof: cannot write heap profile (dump_at_exit): cannot create /nonexistent-heapprof-dir/p.") !=
        std::string::npos);
  CHECK(out.find("No such file or directory") != std::string::npos);
  CHECK(out.find("heapprof: cannot write the leak profile: ") != std::string::npos);
  CHECK(out.find("heapprof: leak report: ") != std::string::npos);  // the table still prints
}

TEST_CASE("a relative dump_prefix stays under the start-up directory after the program's chdir") {
  // Before: resolved against the working directory at each dump, so after a
  // daemon's chdir("/") the exit dump and the leak profile failed ("cannot
  // create sub/p....") or went to /.
  const std::string dir = DumpsTempDir();
  REQUIRE(::mkdir((dir + "/sub").c_str(), 0755) == 0);
  std::string out;
  const int rc = heapprof_test::RunChildScenario(
      "cd '" + dir + "' && HEAPPROF=rate=1,dump_at_exit=1,leak_report=1,dump_prefix=sub/p", "dump_after_chdir", out);
  INFO(out);
  CHECK(rc == 0);
  const std::vector<std::string> dumps = Matching(dir + "/sub", R"(p\.[0-9]+\.0001\.heap\.pb\.gz)");
  REQUIRE(dumps.size() == 1);
  CHECK(Matching(dir + "/sub", R"(p\.[0-9]+\.leaks\.pb\.gz)").size() == 1);
  CHECK(out.find("heapprof: wrote " + dir + "/sub/" + dumps[0] + " (dump_at_exit)") != std::string::npos);
  Profile p;
  CHECK(ReadProfileFile(dir + "/sub/" + dumps[0], p));
  CHECK(heapprof_test::SumForLeaf(p, "LeakedByTest", "inuse_space") == 5 * 3000);
  RemoveDir(dir);
}

TEST_CASE("a relative leak_suppressions is read from the start-up directory after the program's chdir") {
  // Read at exit, it was opened against the working directory of the moment:
  // after a daemon's chdir("/") the report said "cannot read sub/leaks.supp"
  // and reported every leak the file suppresses (and leak_exit_code's status).
  const std::string dir = DumpsTempDir();
  REQUIRE(::mkdir((dir + "/sub").c_str(), 0755) == 0);
  {
    std::ofstream supp(dir + "/sub/leaks.supp");
    supp << "leak:NoFrameIsNamedThis\n";
  }
  std::string out;
  const int rc = heapprof_test::RunChildScenario(
      "cd '" + dir + "' && HEAPPROF=rate=1,leak_report=1,leak_suppressions=sub/leaks.supp,dump_prefix=sub/p",
      "dump_after_chdir", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("cannot read") == std::string::npos);
  // The line that only a loaded file with patterns prints.
  CHECK(out.find("heapprof: leak report: suppressed (leak_suppressions): 0 objects") != std::string::npos);
  RemoveDir(dir);
}

TEST_CASE("a write past RLIMIT_FSIZE fails with EFBIG instead of ending the process") {
  // Before: SIGXFSZ's default action killed the program ("File size limit
  // exceeded", status 128 + 25) in WriteHeapProfile(path), leaving the
  // temporary file behind.
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = heapprof_test::RunChildScenario(
      "HEAPPROF=rate=1,dump_at_exit=1,dump_prefix=" + dir + "/p HEAPPROF_TEST_DIR=" + dir, "file_size_limit", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("still running after the write") != std::string::npos);
  CHECK(out.find("heapprof: cannot write heap profile (dump_at_exit): cannot write " + dir + "/p.") !=
        std::string::npos);
  CHECK(out.find("File too large") != std::string::npos);
  CHECK(ListDir(dir).empty());  // no temporary left behind
  RemoveDir(dir);
}

TEST_CASE("bad dump and http values in HEAPPROF are reported one line each and ignored") {
  std::string out;
  const int rc = RunSelf(
      "HEAPPROF='dump_interval=0,inuse_interval=lots,dump_time=-1,dump_signal=KILL,dump_at_exit=yes,"
      "leak_report=2,dump_prefix=,http=,rate=4k' HEAPPROF_TEST_CHILD=print_rate",
      out);
  INFO(out);
  CHECK(rc == 0);
  for (const char* key : {"dump_interval", "inuse_interval", "dump_time", "dump_signal", "dump_at_exit", "leak_report",
                          "dump_prefix", "http"}) {
    CHECK(out.find(std::string("bad value for ") + key) != std::string::npos);
  }
  CHECK(out.find("rate=4096") != std::string::npos);  // the good pair still applies
}

TEST_CASE("leak_exit_code, leak_suppressions or leak_frames without leak_report=1: one line says they do nothing") {
  for (const char* pair : {"leak_exit_code=23", "leak_suppressions=/dev/null", "leak_frames=3"}) {
    CAPTURE(pair);
    std::string out;
    const int rc = RunSelf(std::string("HEAPPROF=rate=4k,") + pair + " HEAPPROF_TEST_CHILD=print_rate", out);
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.find("heapprof: HEAPPROF: leak_exit_code, leak_suppressions and leak_frames have no effect without "
                   "leak_report=1\n") != std::string::npos);
  }
  // With it: no such line. The report is written in the working directory,
  // so the child runs in a directory of its own (it left
  // heapprof.<pid>.leaks.pb.gz and .retention.pb.gz in the build tree).
  const std::string dir = DumpsTempDir();
  std::string out;
  CHECK(heapprof_test::RunCommand("cd " + dir + " && HEAPPROF=rate=4k,leak_frames=3,leak_report=1 " +
                                      "HEAPPROF_TEST_CHILD=print_rate " + heapprof_test::SelfExe(),
                                  out) == 0);
  CHECK(out.find("have no effect") == std::string::npos);
  CHECK(Matching(dir, R"(heapprof\.[0-9]+\.leaks\.pb\.gz)").size() == 1);
  RemoveDir(dir);
}

TEST_CASE("HEAPPROF=http=127.0.0.1:0 serves from start-up, says where, and stops before the leak report") {
  std::string out;
  const int rc = RunSelf("HEAPPROF=rate=1,http=127.0.0.1:0,leak_report=1,dump_prefix=/tmp/heapprof_http_env "
                          "HEAPPROF_TEST_CHILD=http_env",
                          out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(std::regex_search(out, std::regex(R"(heapprof: serving http://127\.0\.0\.1:[0-9]+/debug/pprof/ )")));
  CHECK(std::regex_search(out, std::regex(R"(heapprof:\s+14\.65 KiB\s+5\s+heapprof_test::LeakedByTest)")));
  std::smatch m;
  if (std::regex_search(out, m, std::regex(R"(leak profile: (\S+))"))) std::remove(m[1].str().c_str());
  if (std::regex_search(out, m, std::regex(R"(retention profile: (\S+))"))) std::remove(m[1].str().c_str());
}

TEST_CASE("HEAPPROF=http in a program that closed every descriptor it did not open: the server stops, writes nothing into its files, the exit does not hang") {
  const std::string dir = DumpsTempDir();
  std::string tsan;
#if defined(HEAPPROF_TSAN)
  // The program closes the server's descriptors and opens its files under
  // their numbers while the server thread checks them (fstat): the race this
  // test is about, which TSan reports as one on the descriptor.
  REQUIRE(heapprof_test::WriteFile(dir + "/tsan.supp", "race:heapprof::detail::http::Server::FileId::Is\n"));
  tsan = " TSAN_OPTIONS=\"${TSAN_OPTIONS:+$TSAN_OPTIONS:}suppressions=" + dir + "/tsan.supp\"";
#endif
  std::string out;
  const int rc = RunSelf("timeout -s KILL 60 env HEAPPROF=http=127.0.0.1:0 HEAPPROF_TEST_DIR=" + dir + tsan +
                             " HEAPPROF_TEST_CHILD=http_env_closed_fds",
                         out);
  INFO(out);
  CHECK(rc == 0);  // 137: the exit hung
  for (int i = 0; i < 4; ++i) {
    struct stat st {};
    const std::string file = dir + "/program." + std::to_string(i);
    INFO(file);
    REQUIRE(::stat(file.c_str(), &st) == 0);
    CHECK(st.st_size == 0);
  }
  RemoveDir(dir);
}

TEST_CASE("HEAPPROF=http with a bad address: one line, no server, the program runs") {
  std::string out;
  const int rc = RunSelf("HEAPPROF=http=localhost:99999 HEAPPROF_TEST_CHILD=print_rate", out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("heapprof: HEAPPROF http=localhost:99999: ") != std::string::npos);
  CHECK(out.find("port out of range") != std::string::npos);
  CHECK(out.find("; not serving\n") != std::string::npos);
  CHECK(out.find("rate=524288") != std::string::npos);
}

TEST_CASE("WriteHeapProfile(path): atomic replace; a reader never sees a partial file") {
  const std::string dir = DumpsTempDir();
  const std::string path = dir + "/heap.pb.gz";
  REQUIRE(heapprof::WriteHeapProfile(path));
  Profile first;
  REQUIRE(ReadProfileFile(path, first));
  CHECK(first.default_sample_type.empty());
  REQUIRE(heapprof::WriteAllocsProfile(path));
  Profile allocs;
  REQUIRE(ReadProfileFile(path, allocs));
  CHECK(allocs.default_sample_type == "alloc_space");

  // A reader opens and parses the file while it is rewritten over and over.
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, bad{0};
  std::thread reader([&] {
    while (!done.load()) {
      Profile p;
      if (!ReadProfileFile(path, p)) bad.fetch_add(1);
      reads.fetch_add(1);
    }
  });
  std::vector<char*> grow;
  for (int i = 0; i < 40; ++i) {
    grow.push_back(TextLeaf(1000 + static_cast<std::size_t>(i)));  // the file changes each time
    CHECK(heapprof::WriteHeapProfile(path));
  }
  while (reads.load() < 5) std::this_thread::yield();  // at least a few reads overlapped
  done = true;
  reader.join();
  for (char* p : grow) delete[] p;
  CHECK(bad.load() == 0);
  CHECK(ListDir(dir).size() == 1);  // no temporaries left behind

  // A path that cannot be written: false, nothing created, old file untouched.
  const std::string before = ReadFile(path);
  CHECK_FALSE(heapprof::WriteHeapProfile(dir + "/missing/heap.pb.gz"));
  CHECK(ListDir(dir).size() == 1);
  CHECK(ReadFile(path) == before);
  RemoveDir(dir);
}

TEST_CASE("WriteHeapProfile(path) over an existing file keeps its permissions") {
  // Before: the replacement was always created 0644, so a profile the owner
  // had made private (chmod 600) became readable by every user at the next write.
  const std::string dir = DumpsTempDir();
  const std::string path = dir + "/heap.pb.gz";
  const auto mode_of = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? static_cast<unsigned>(st.st_mode & 07777) : 0u;
  };
  struct UmaskScope {
    mode_t saved = ::umask(022);
    ~UmaskScope() { ::umask(saved); }
  } umask_022;
  REQUIRE(heapprof::WriteHeapProfile(path));
  CHECK(mode_of(path) == 0644u);  // a new file: 0644 less the umask
  for (unsigned mode : {0600u, 0640u, 0444u}) {
    INFO(mode);
    REQUIRE(::chmod(path.c_str(), mode) == 0);
    CHECK(heapprof::WriteHeapProfile(path));
    CHECK(mode_of(path) == mode);
    Profile p;
    CHECK(ReadProfileFile(path, p));
  }
  // Through a symlink: the target keeps its mode, the link stays a link.
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  const std::string link = dir + "/link.pb.gz";
  REQUIRE(::symlink("heap.pb.gz", link.c_str()) == 0);
  CHECK(heapprof::WriteAllocsProfile(link));
  CHECK(mode_of(path) == 0600u);
  struct stat lst {};
  CHECK((::lstat(link.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)));
  CHECK(ListDir(dir).size() == 2);  // no temporary left
  RemoveDir(dir);
}

TEST_CASE("a file name of up to NAME_MAX bytes is written; errors name the file that failed") {
  // Before: the temporary (name + ".tmp.<pid>.<n>") went over NAME_MAX for a
  // legal name of 240-255 bytes, and the error named the final path.
  const std::string dir = DumpsTempDir();
  for (std::size_t len : {std::size_t{200}, std::size_t{245}, std::size_t{NAME_MAX}}) {
    INFO(len);
    const std::string path = dir + "/" + std::string(len - 7, 'n') + ".pb.gz";
    std::string error;
    CHECK(heapprof_test::WriteFileAtomically(path, "bytes", error));
    CHECK(error.empty());
    CHECK(ReadFile(path) == "bytes");
    CHECK(ListDir(dir).size() == 1);  // the final name only, no temporary left
    CHECK(heapprof::WriteHeapProfile(path));  // the public API, over the file
    Profile p;
    CHECK(ReadProfileFile(path, p));
    ::unlink(path.c_str());
  }
  // One byte over: refused, and the message names the rename that failed.
  const std::string too_long = dir + "/" + std::string(NAME_MAX + 1, 'n');
  std::string error;
  CHECK_FALSE(heapprof_test::WriteFileAtomically(too_long, "bytes", error));
  INFO(error);
  CHECK(error.find("cannot rename " + dir + "/") == 0);
  CHECK(error.find(" to " + too_long + ": ") != std::string::npos);
  CHECK(ListDir(dir).empty());
  // A directory that does not exist: the message names the file it could not create.
  const std::string missing = dir + "/missing/heap.pb.gz";
  CHECK_FALSE(heapprof_test::WriteFileAtomically(missing, "bytes", error));
  CHECK(error.find("cannot create " + missing + ".tmp.") == 0);
  RemoveDir(dir);
}

TEST_CASE("legacy text heap format (debug=1): exact at rate 1 and parsed by go tool pprof") {
  heapprof_test::RateScope rate(1);
  std::vector<char*> keep;
  HEAPPROF_TEST_NO_UNROLL
  for (int i = 0; i < 10; ++i) keep.push_back(TextLeaf(4000));  // one call site: one stack
  for (int i = 0; i < 3; ++i) {
    delete[] keep.back();
    keep.pop_back();
  }
  std::string text;
  REQUIRE(heapprof_test::BuildTextProfile(text, "# extra = 1\n"));
  CHECK(text.rfind("heap profile: ", 0) == 0);
  CHECK(text.find(" @ heap/2\n") != std::string::npos);  // Go writes 2*rate
  // The record for TextLeaf: 7 live of 10 allocated, 4000 B each.
  const std::regex record(R"(\n7: 28000 \[10: 40000\] @ 0x[0-9a-f]+( 0x[0-9a-f]+)*\n#\t0x[0-9a-f]+\t[^\n]*TextLeaf)");
  CHECK(std::regex_search(text, record));
  // Each frame line as Go writes it: "#<tab>pc<tab>function+offset<tab>file:line".
  CHECK(std::regex_search(text, std::regex(R"(\n#\t0x[0-9a-f]+\t[^\n\t]*TextLeaf[^\n\t]*\+0x[0-9a-f]+\t/[^\n]*test_dumps\.cpp:[0-9]+\n)")));
  CHECK(text.find("# extra = 1\n") != std::string::npos);
  CHECK(text.find("\nMAPPED_LIBRARIES:\n") != std::string::npos);
  for (char* p : keep) delete[] p;

  const std::string file = heapprof_test::TempPath(".txt");
  REQUIRE(heapprof_test::WriteFile(file, text));
  std::string out;
  // -symbolize=none: the values are what is checked here; without it pprof
  // runs addr2line/nm over every binary in MAPPED_LIBRARIES (this test
  // program's debug info included), which took over a minute on a busy CI box.
  const int rc = heapprof_test::GoPprof("-symbolize=none -raw", file, out);
  if (rc == -2) {
    MESSAGE("go not installed: skipping the go tool pprof part");
  } else {
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.find("alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes") != std::string::npos);
    // pprof does not scale at period 1: the values come back exactly.
    CHECK(std::regex_search(out, std::regex(R"(\n\s+10\s+40000\s+7\s+28000: )")));
  }
  std::remove(file.c_str());
}

TEST_CASE("Write*(path) that fail say why in errno") {
  // They returned false with errno as the last internal call had left it
  // (for a directory or /dev/null: 0, whatever the reason).
  const std::string dir = DumpsTempDir();
  struct Case {
    std::string path;
    int err;
  };
  const std::vector<Case> cases = {
      {dir + "/missing/heap.pb.gz", ENOENT},  // no such directory
      {dir, EISDIR},                          // a directory: not replaced
      {"/dev/null", EINVAL},                  // not a regular file: not replaced
  };
  for (const Case& c : cases) {
    CAPTURE(c.path);
    errno = 0;
    CHECK_FALSE(heapprof::WriteHeapProfile(c.path));
    CHECK(errno == c.err);
    errno = 0;
    CHECK_FALSE(heapprof::WriteAllocsProfile(c.path.c_str()));
    CHECK(errno == c.err);
    errno = 0;
    CHECK_FALSE(heapprof::WritePeakHeapProfile(c.path));
    CHECK(errno == c.err);
    errno = 0;
    CHECK_FALSE(heapprof::WriteRetentionProfile(c.path));
    CHECK(errno == c.err);
  }
  errno = 0;
  CHECK_FALSE(heapprof::WriteHeapProfile(static_cast<const char*>(nullptr)));
  CHECK(errno == EINVAL);
  RemoveDir(dir);
}

TEST_CASE("legacy text heap format (debug=1): zero-size objects counted as in the heap profile") {
  heapprof_test::RateScope rate(1);
  std::vector<char*> keep;
  HEAPPROF_TEST_NO_UNROLL
  for (int i = 0; i < 5; ++i) keep.push_back(ZeroSizeTextLeaf());  // one call site: one stack
  delete[] keep.back();
  keep.pop_back();
  std::string text;
  REQUIRE(heapprof_test::BuildTextProfile(text));
  Profile proto;
  REQUIRE(heapprof_test::CaptureProfile(proto));
  CHECK(heapprof_test::SumForLeaf(proto, "ZeroSizeTextLeaf", "inuse_objects") == 4);
  // 4 live of 5 allocated, 0 bytes.
  const std::regex record(R"(\n4: 0 \[5: 0\] @ 0x[0-9a-f]+( 0x[0-9a-f]+)*\n#\t0x[0-9a-f]+\t[^\n]*ZeroSizeTextLeaf)");
  CHECK(std::regex_search(text, record));
  for (char* p : keep) delete[] p;
}

TEST_CASE("legacy text format at a sampling rate: go tool pprof scales the counts back to estimates") {
  heapprof_test::RateScope rate(65536);
  std::vector<char*> keep;
  // 32 MiB of 64 KiB objects: about 320 samples.
  for (int i = 0; i < 512; ++i) keep.push_back(TextLeaf(65536));
  // Some freed: pprof's legacy parser reads a text whose header totals have
  // in-use equal to allocated (nothing ever freed, as when this case runs
  // alone) as a profile without alloc values (two sample types, not four).
  for (int i = 0; i < 64; ++i) {
    delete[] keep.back();
    keep.pop_back();
  }
  std::string text;
  REQUIRE(heapprof_test::BuildTextProfile(text));
  // The header has the lowest rate of the records: 65536 (Go's 2*rate), or 1
  // when an earlier case of this process recorded at rate 1 (then the counts
  // are estimates, which pprof does not scale). pprof's values agree either way.
  CHECK(std::regex_search(text, std::regex(R"( @ heap/(131072|2)\n)")));
  const std::string file = heapprof_test::TempPath(".txt");
  REQUIRE(heapprof_test::WriteFile(file, text));
  Profile proto;
  REQUIRE(heapprof_test::CaptureProfile(proto));
  const std::int64_t proto_inuse = heapprof_test::SumForLeaf(proto, "TextLeaf", "inuse_space");
  for (char* p : keep) delete[] p;
  std::string out;
  const int rc = heapprof_test::GoPprof("-symbolize=none -raw", file, out);
  if (rc == -2) {
    MESSAGE("go not installed: skipping");
  } else {
    INFO(out);
    REQUIRE(rc == 0);
    // pprof scales the text's raw counts itself (period 65536 from heap/131072):
    // the 64 KiB objects' in-use bytes must agree with our own estimate in the
    // protobuf profile, to pprof's truncation (< 1 object per record).
    const double pprof_inuse = PprofRawSum(out, TextLeafPc(text, "TextLeaf"), 65536, 4);
    CHECK(proto_inuse > 16 << 20);
    CHECK(pprof_inuse == doctest::Approx(static_cast<double>(proto_inuse)).epsilon(0.01));
  }
  std::remove(file.c_str());
}

__attribute__((noinline)) char* MixedRateTextLeaf(std::size_t n) {
  char* p = new char[n];
  asm volatile("# MixedRateTextLeaf" : : "r"(p) : "memory");  // distinct bodies: no identical-code folding
  return p;
}

TEST_CASE("legacy text format after a rate change: objects recorded at rate 1 keep their counts") {
  // 1000 objects of 48 B recorded exactly at rate 1 (800 still live), then
  // the default rate again. The text format has one rate for every record:
  // converted to the default's raw counts these were 800 * 48/524288 = 0.07
  // samples, written as 0 (and so 0 in go tool pprof), while the protobuf
  // profile has them all.
  std::vector<char*> keep;
  {
    heapprof_test::RateScope exact(1);
    HEAPPROF_TEST_NO_UNROLL
    for (int i = 0; i < 1000; ++i) keep.push_back(MixedRateTextLeaf(48));
    for (int i = 0; i < 200; ++i) {  // (in-use != allocated: see the case above)
      delete[] keep.back();
      keep.pop_back();
    }
  }
  heapprof_test::RateScope rate(524288);
  std::string text;
  REQUIRE(heapprof_test::BuildTextProfile(text));
  const std::regex record(R"(\n800: 38400 \[1000: 48000\] @ 0x[0-9a-f]+( 0x[0-9a-f]+)*\n#\t0x[0-9a-f]+\t[^\n]*MixedRateTextLeaf)");
  CHECK(std::regex_search(text, record));
  const std::string file = heapprof_test::TempPath(".txt");
  REQUIRE(heapprof_test::WriteFile(file, text));
  for (char* p : keep) delete[] p;
  std::string out;
  const int rc = heapprof_test::GoPprof("-symbolize=none -raw", file, out);
  if (rc == -2) {
    MESSAGE("go not installed: skipping the go tool pprof part");
  } else {
    INFO(out);
    REQUIRE(rc == 0);
    const std::uint64_t leaf = TextLeafPc(text, "MixedRateTextLeaf");
    const double inuse_objects = PprofRawSum(out, leaf, 48, 3);
    const double inuse_bytes = PprofRawSum(out, leaf, 48, 4);
    CHECK(inuse_objects == 800);
    CHECK(inuse_bytes == 38400);
  }
  std::remove(file.c_str());
}

__attribute__((noinline)) char* UnsymbolizedLeaf(std::size_t n) {
  char* p = new char[n];
  asm volatile("" ::: "memory");  // no tail call: this frame is the leaf
  return p;
}

TEST_CASE("a profile whose symbolization runs out of memory is written without names, not lost") {
#if !HEAPPROF_EXCEPTIONS
  MESSAGE("built without exceptions: the write's headroom decides before it symbolizes (test_memory_events.cpp)");
#else
  heapprof_test::RateScope rate(1);
  std::vector<char*> keep;
  keep.reserve(5);
  HEAPPROF_TEST_NO_UNROLL
  for (int i = 0; i < 5; ++i) keep.push_back(UnsymbolizedLeaf(3000));  // one call site: one stack
  const std::string bare_file = heapprof_test::TempPath(".pb.gz");
  const std::string named_file = heapprof_test::TempPath(".pb.gz");
  heapprof_test::FailNextSymbolization();
  REQUIRE(heapprof::WriteHeapProfile(bare_file));  // without the fallback: false, no file
  REQUIRE(heapprof::WriteHeapProfile(named_file));  // the next write symbolizes again
  for (char* q : keep) delete[] q;
  Profile bare, named;
  REQUIRE(heapprof_test::ReadProfileFile(bare_file, bare));
  REQUIRE(heapprof_test::ReadProfileFile(named_file, named));
  CHECK(heapprof_test::Validate(bare));
  // No names, and it says so: in a comment, and in every mapping.
  CHECK(bare.functions.empty());
  bool commented = false;
  for (std::int64_t i : bare.comment_indices) {
    commented |= bare.string_table.at(static_cast<std::size_t>(i)).find("out of memory encoding with function names") !=
                 std::string::npos;
  }
  CHECK(commented);
  REQUIRE_FALSE(bare.mappings.empty());
  for (const heapprof_test::Mapping& m : bare.mappings) CHECK_FALSE(m.has_functions);
  bool named_has_functions = false;  // (the flag is written: the same build's names set it)
  for (const heapprof_test::Mapping& m : named.mappings) named_has_functions |= m.has_functions;
  CHECK(named_has_functions);
  // Nothing else is lost: the sample of UnsymbolizedLeaf (found by name in
  // the second profile) is in the first, with the same addresses and values
  // (rate 1 counts exactly: 5 objects of 3000 bytes).
  auto addresses = [](const Profile& p, const heapprof_test::Sample& s) {
    std::vector<std::uint64_t> out;
    for (std::uint64_t id : s.location_ids) {
      for (const heapprof_test::Location& l : p.locations) {
        if (l.id == id) out.push_back(l.address);
      }
    }
    return out;
  };
  const int inuse = heapprof_test::SampleTypeIndex(named, "inuse_space");
  REQUIRE(inuse >= 0);
  const heapprof_test::Sample* leaf = nullptr;
  for (const heapprof_test::Sample& s : named.samples) {
    const std::vector<std::string> names = heapprof_test::FunctionNames(named, s);
    if (!names.empty() && names[0].find("UnsymbolizedLeaf") != std::string::npos) leaf = &s;
  }
  REQUIRE(leaf != nullptr);
  CHECK(leaf->values.at(static_cast<std::size_t>(inuse)) == 15000);
  const std::vector<std::uint64_t> want = addresses(named, *leaf);
  bool found = false;
  for (const heapprof_test::Sample& s : bare.samples) {
    if (addresses(bare, s) == want) {
      found = true;
      CHECK(s.values == leaf->values);
    }
  }
  CHECK(found);
  // go tool pprof reads it.
  std::string out;
  const int rc = heapprof_test::GoPprof("-symbolize=none -raw", bare_file, out);
  if (rc == -2) {
    MESSAGE("go not installed: skipping the go tool pprof part");
  } else {
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.find("inuse_space/bytes") != std::string::npos);
  }
  std::remove(bare_file.c_str());
  std::remove(named_file.c_str());
#endif
}

TEST_CASE("a DWARF load that ran out of memory is tried again by the next write") {
#if !HEAPPROF_EXCEPTIONS
  MESSAGE("built without exceptions: the write's headroom decides before it loads DWARF");
#else
  // In a child: this process has loaded its DWARF long ago. In its first 16
  // writes every load that finds DWARF fails at its end (so they fall back
  // to profiles with names from the symbol tables, without lines); the next
  // must find file and line of the
  // leaf. Before, an object whose load failed stayed marked loaded, as far
  // as its load had got (without its DWARF when that was not read yet:
  // names from the symbol table, line 0, in every later profile).
  const std::string dir = DumpsTempDir();
  std::string out;
  const int rc = RunSelf("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir + " HEAPPROF_TEST_CHILD=debug_retry", out);
  INFO(out);
  REQUIRE(rc == 0);
  Profile first, second;
  REQUIRE(ReadProfileFile(dir + "/first.pb.gz", first));
  REQUIRE(ReadProfileFile(dir + "/second.pb.gz", second));
  // The injected failure still fired at the 16th write: that profile has
  // names from the symbol tables only (EncodeGzippedSymbolized's second
  // step), and no line anywhere.
  bool names_only = false;
  for (std::int64_t i : first.comment_indices) {
    names_only |= first.string_table.at(static_cast<std::size_t>(i)).find("out of memory reading debug info") !=
                  std::string::npos;
  }
  CHECK(names_only);
  std::int64_t first_max_line = 0;
  for (const heapprof_test::Location& loc : first.locations) {
    for (const heapprof_test::Line& l : loc.lines) first_max_line = l.line > first_max_line ? l.line : first_max_line;
  }
  CHECK(first_max_line == 0);
  // Each failed load gave back all it had taken (its DWARF, inflated sections, the mapping).
  std::size_t after_one = 0, after_all = 0;
  REQUIRE(out.find("debug_bytes") != std::string::npos);
  REQUIRE(std::sscanf(out.c_str() + out.find("debug_bytes"), "debug_bytes after_one=%zu after_all=%zu", &after_one,
                      &after_all) == 2);
  CHECK(after_one > 0);
  CHECK(after_all == after_one);
  const heapprof_test::Sample* leaf = nullptr;
  for (const heapprof_test::Sample& s : second.samples) {
    const std::vector<std::string> names = heapprof_test::FunctionNames(second, s);
    if (!names.empty() && names[0].find("DebugRetryLeaf") != std::string::npos) leaf = &s;
  }
  REQUIRE(leaf != nullptr);
  REQUIRE_FALSE(leaf->location_ids.empty());
  const heapprof_test::Location* loc = heapprof_test::FindLocation(second, leaf->location_ids[0]);
  REQUIRE(loc != nullptr);
  REQUIRE_FALSE(loc->lines.empty());
  CHECK(loc->lines[0].line > 0);
  const heapprof_test::Function* fn = heapprof_test::FindFunction(second, loc->lines[0].function_id);
  REQUIRE(fn != nullptr);
  CHECK(fn->filename.find("dump_scenarios.hpp") != std::string::npos);
  RemoveDir(dir);
#endif
}

TEST_CASE("delta profile: only what happened after the baseline, with duration_nanos") {
  heapprof_test::RateScope rate(1);
  std::vector<char*> before;
  for (int i = 0; i < 4; ++i) before.push_back(DeltaBefore(2000));
  const std::uint64_t t0 = heapprof_test::MonotonicNanos();
  const heapprof_test::Baseline base;
  const std::uint64_t t1 = heapprof_test::MonotonicNanos();
  std::vector<char*> during;
  for (int i = 0; i < 6; ++i) during.push_back(DeltaDuring(3000));
  delete[] before.back();  // freed in the window: -1 in use, no alloc
  before.pop_back();
  std::string gz;  // filled after the build, as before
  const std::uint64_t t2 = heapprof_test::MonotonicNanos();
  REQUIRE(base.BuildDeltaProfile(gz));
  const std::uint64_t t3 = heapprof_test::MonotonicNanos();
  std::string raw;
  REQUIRE(heapprof_test::Gunzip(gz, raw));
  Profile p;
  REQUIRE(heapprof_test::DecodeProfile(raw, p));
  CHECK(heapprof_test::Validate(p));
  // The window on the monotonic clock: from inside TakeBaseline to inside
  // BuildProfileBytes.
  CHECK(static_cast<std::uint64_t>(p.duration_nanos) >= t2 - t1);
  CHECK(static_cast<std::uint64_t>(p.duration_nanos) <= t3 - t0);
  CHECK(p.time_nanos > base.time_nanos());
  CHECK(p.default_sample_type == "alloc_space");
  CHECK(heapprof_test::SumForLeaf(p, "DeltaDuring", "alloc_objects") == 6);
  CHECK(heapprof_test::SumForLeaf(p, "DeltaDuring", "alloc_space") == 18000);
  CHECK(heapprof_test::SumForLeaf(p, "DeltaDuring", "inuse_space") == 18000);
  CHECK(heapprof_test::SumForLeaf(p, "DeltaBefore", "alloc_objects") == 0);
  CHECK(heapprof_test::SumForLeaf(p, "DeltaBefore", "inuse_objects") == -1);
  CHECK(heapprof_test::SumForLeaf(p, "DeltaBefore", "inuse_space") == -2000);
  // No sample for an unchanged stack: every sample has a non-zero value.
  for (const heapprof_test::Sample& s : p.samples) {
    bool any = false;
    for (std::int64_t v : s.values) any = any || v != 0;
    CHECK(any);
  }
  for (char* q : before) delete[] q;
  for (char* q : during) delete[] q;
}
