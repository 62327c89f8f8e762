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

// Runs `program` under the preload library with a dump at exit; reads the dump
// (and deletes it, unless `kept` is given: then it is left there, its path in `kept`).
bool RunPreloaded(const std::string& program, const std::string& extra_env, heapprof_test::Profile& p,
                  std::string& output, std::string* kept = nullptr) {
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
  if (kept != nullptr) *kept = path;
  else unlink(path.c_str());
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

// The library's start-up leaves glibc's mmap threshold alone (test_exact_stats.cpp
// has the compiled-in case): a plain C program still gets a 256 KiB block mmapped.
#if defined(__GLIBC__)
TEST_CASE("preload: glibc's mmap threshold is where the program would have it") {
  std::string out;
  REQUIRE(heapprof_test::RunCommand("env -u MALLOC_MMAP_THRESHOLD_ -u GLIBC_TUNABLES LD_PRELOAD=" +
                                        std::string(HEAPPROF_PRELOAD_PATH) + " timeout 60 " + HEAPPROF_PLAIN_C_PATH +
                                        " mmap_threshold 2>&1",
                                    out) == 0);
  CHECK(out == "plain_c: a 256 KiB block mmapped 1\n");
}

// Its start-up checked its chunk formula on a block of 70,000 bytes, which
// grew the fresh heap by 72 KiB that glibc then kept (it trims only past
// 128 KiB free at the top): every program started with a larger heap than
// without heapprof. The library brings libstdc++, whose start-up allocates
// its exception pool, so the baseline is the program with libstdc++ alone.
TEST_CASE("preload: a program starts with the heap it has with libstdc++ alone") {
  std::string alone, with;
  REQUIRE(heapprof_test::RunCommand("env -u HEAPPROF LD_PRELOAD=libstdc++.so.6 timeout 60 " +
                                        std::string(HEAPPROF_PLAIN_C_PATH) + " heap_at_start",
                                    alone) == 0);
  REQUIRE(heapprof_test::RunCommand("env -u HEAPPROF LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + " timeout 60 " +
                                        HEAPPROF_PLAIN_C_PATH + " heap_at_start",
                                    with) == 0);
  CHECK(alone.rfind("plain_c: heap ", 0) == 0);
  CHECK(with == alone);
}
#endif

// heapprof's lines at exit went to a stderr pipe whose reader had gone, and
// SIGPIPE ended the program (status 141 for a program that exits 0).
TEST_CASE("preload: a stderr pipe whose reader has gone does not end the program with SIGPIPE at exit") {
  const std::string prefix = heapprof_test::TempPath("-deadpipe");
  std::string out;
  const int rc = heapprof_test::RunCommand("LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) +
                                               " HEAPPROF=rate=1,dump_at_exit=1,leak_report=1,dump_prefix=" + prefix +
                                               " timeout -s KILL 60 " + HEAPPROF_PLAIN_C_PATH + " dead_stderr",
                                           out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out == "plain_c: stderr is a pipe nobody reads\n");
  heapprof_test::RunCommand("rm -f " + prefix + " " + prefix + ".*", out);
}

// glibc ends a process with exit(0) once its last thread has ended: with the
// dump thread or HEAPPROF=http's server running, a main() that called
// pthread_exit() never ended (killed at the timeout).
TEST_CASE("preload: a main() that ends with pthread_exit() ends once its thread has") {
  for (const char* env : {"dump_time=600", "http=127.0.0.1:0"}) {
    std::string out;
    const int rc = heapprof_test::RunCommand("LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + " HEAPPROF=log=none," +
                                                 env + " timeout -s KILL 30 " + HEAPPROF_PLAIN_C_PATH + " pthread_exit",
                                             out);
    INFO(env);
    INFO(out);
    CHECK(rc == 0);
    CHECK(out == "plain_c: worker done\n");
  }
}

// After main()'s pthread_exit() the process ends with exit(0) on one of the
// profiler's threads: the program's exit handlers run there, and their
// blocks were served from the profiler's arena (tls_profiler_thread),
// unrecorded: the leak report and the exit dump did not have them (a
// program that returns from main() has them).
TEST_CASE("preload: after main()'s pthread_exit(), what the program's exit handlers allocate is recorded") {
  const std::string prefix = heapprof_test::TempPath("-pexit");
  std::string out;
  const int rc = heapprof_test::RunCommand("LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) +
                                               " HEAPPROF=rate=1,dump_time=600,leak_report=1,dump_prefix=" + prefix +
                                               " timeout -s KILL 30 " + HEAPPROF_PLAIN_C_PATH + " pthread_exit_atexit",
                                           out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("plain_c: worker done\n") != std::string::npos);
  CHECK(out.find("plain_c_exit_handler") != std::string::npos);  // a row of the leak table
  heapprof_test::RunCommand("rm -f " + prefix + " " + prefix + ".*", out);
}

// HEAPPROF=log=FILE past RLIMIT_FSIZE: the line's write raised SIGXFSZ, which
// ended the program with a core dump (status 153) at start-up.
TEST_CASE("preload: a log file past the file size limit does not end the program with SIGXFSZ") {
  const std::string log = heapprof_test::TempPath("-fsize.log");
  std::string out;
  const int rc = heapprof_test::RunCommand("sh -c 'ulimit -f 0; exec env LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) +
                                               " HEAPPROF=log=" + log + ",rate=banana timeout -s KILL 60 " +
                                               HEAPPROF_PLAIN_C_PATH + " dead_stderr'",
                                           out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out == "plain_c: stderr is a pipe nobody reads\n");
  unlink(log.c_str());
}

TEST_CASE("preload: a stripped program without a debug file claims no functions; go tool pprof -symbolize=local names its frames from the unstripped copy") {
  using heapprof_test::RunCommand;
  std::string out;
  if (heapprof_test::GoBinary().empty() || RunCommand("command -v strip", out) != 0) {
    MESSAGE("go (Debian golang-go) or strip (binutils) missing: skipped");
    return;
  }
  // The stripped copy keeps the unstripped one's base name and build id
  // (strip copies .note.gnu.build-id), and has no debug file anywhere.
  char tmpl[] = "/tmp/heapprof_stripped_XXXXXX";
  const char* made = mkdtemp(tmpl);
  REQUIRE(made != nullptr);
  const std::string dir = made, full = HEAPPROF_PLAIN_C_PATH;
  const std::string stripped = dir + "/" + full.substr(full.rfind('/') + 1);
  REQUIRE(RunCommand("strip --strip-all -o " + stripped + " " + full, out) == 0);
  RunCommand("nm " + stripped, out);
  REQUIRE(out.find("no symbols") != std::string::npos);

  heapprof_test::Profile p;
  std::string output, path;
  REQUIRE(RunPreloaded(stripped, "", p, output, &path));
  INFO(output);
  const heapprof_test::Mapping* program = nullptr;
  for (const heapprof_test::Mapping& m : p.mappings) {
    if (m.filename == stripped) program = &m;
  }
  REQUIRE(program != nullptr);
  CHECK(program == &p.mappings.front());  // what the executable named to pprof replaces
  CHECK(program->build_id.size() == 40);
  CHECK_FALSE(program->has_functions);
  CHECK_FALSE(program->has_filenames);
  CHECK_FALSE(program->has_line_numbers);
  std::size_t own_locations = 0;
  for (const heapprof_test::Location& loc : p.locations) {
    if (loc.mapping_id != program->id) continue;
    ++own_locations;
    CHECK(loc.lines.empty());
  }
  CHECK(own_locations >= 3);
  CHECK(Sum(p, "plain_c_keep_malloc", "inuse_objects") == 0);  // unnamed in the profile

  // The profile alone: the program's frames are only "[heapprof_plain_c]".
  int rc = heapprof_test::GoPprof("-symbolize=none -top -sample_index=inuse_space", path, out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("plain_c_keep_malloc") == std::string::npos);
  CHECK(out.find("[heapprof_plain_c]") != std::string::npos);

  // Local symbolization with the unstripped copy named on the command line (for
  // a profile's first mapping, which is the program's). pprof symbolizes only
  // mappings whose flags are all clear, so a wrong has_functions fails here
  // too. (PPROF_BINARY_PATH finds a copy by <dir>/<build id>/<base name> or
  // <dir>/<base name>, but `go tool pprof` (Go 1.19) reports no build id for
  // any file it opens, so it rejects every such copy of a profile that
  // carries build ids: "build-id mismatch (<id> != )". The standalone pprof
  // reads build ids and takes them.)
  const std::string local = "-symbolize=local -top -sample_index=inuse_space " + full;
  rc = heapprof_test::GoPprof(local, path, out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("Local symbolization failed") == std::string::npos);
  CHECK(out.find("mismatch") == std::string::npos);
  auto row = [&out](const std::string& function) {
    const std::size_t at = out.find(" " + function + "\n");
    if (at == std::string::npos) return std::string();
    const std::size_t begin = out.rfind('\n', at);
    return out.substr(begin == std::string::npos ? 0 : begin + 1, at - (begin == std::string::npos ? 0 : begin + 1));
  };
  // flat == cum: each is a leaf of its own blocks (4,000 x 1000 B, 100 x 10,000 B, the 1 MiB realloc).
  CHECK(row("plain_c_keep_malloc").find("3906.25kB") != std::string::npos);
  CHECK(row("plain_c_keep_calloc").find("976.56kB") != std::string::npos);
  CHECK(row("plain_c_grow").find("1024kB") != std::string::npos);
  // main stays "[heapprof_plain_c]": Go 1.19's line-table search assumes
  // sequences in address order, and GCC puts main (.text.startup, below
  // .text) in a later one.

  unlink(path.c_str());
  RunCommand("rm -rf " + dir, out);
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

TEST_CASE("preload: listed after jemalloc or tcmalloc, it records nothing and the program runs as under that allocator") {
  for (const char* lib : {"/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
                          "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}) {
    if (access(lib, R_OK) != 0) {
      MESSAGE(lib << " not installed: skipped");
      continue;
    }
    CAPTURE(lib);
    // The allocator's malloc is the process's; plain_c's reallocarray,
    // pvalloc and free_sized, which it lacks, are the library's, and must
    // reach that allocator (glibc's realloc on a jemalloc block aborts:
    // "realloc(): invalid pointer").
    std::string output;
    const std::string cmd = "timeout -s KILL 120 env LD_PRELOAD=" + std::string(lib) + ":" + HEAPPROF_PRELOAD_PATH +
                            " HEAPPROF=rate=1 " + HEAPPROF_PLAIN_C_PATH + " 2>&1";
    const int rc = heapprof_test::RunCommand(cmd, output);
    INFO(output);
    CHECK(rc == 0);
    CHECK(output.find("records nothing") != std::string::npos);
    CHECK(output.find("plain_c: kept 4100 blocks") != std::string::npos);
  }
}

#endif

#if HEAPPROF_MALLOC_HOOKS && defined(HEAPPROF_PRELOAD_PATH) && defined(HEAPPROF_ONE_ENGINE_PATH)

TEST_CASE("preload: the engine's version-1 get_stats writes the Stats of that version and no more") {
  // A program built with an older heapprof (Stats of 17 fields) forwards
  // GetStats to the preloaded library's get_stats, which returns by value:
  // it wrote the library's whole Stats (18 fields), past the program's slot.
  std::string out;
  REQUIRE(heapprof_test::RunCommand("LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + " " +
                                        HEAPPROF_ONE_ENGINE_PATH + " old_stats",
                                    out) == 0);
  INFO(out);
  CHECK(out.find("one_engine: old copy's stats: allocs counted, the word after intact") != std::string::npos);
}

TEST_CASE("preload: a program with heapprof compiled in and also preloaded runs one engine") {
  // The profile from the API, then from the program's own heapprof::HttpServer
  // (which served the forwarding copy's empty profile before: 0 samples).
  for (const std::string how : {"api", "http"}) {
  CAPTURE(how);
  const std::string profile = heapprof_test::TempPath(".pb.gz");
  std::string alone, preloaded;
  REQUIRE(heapprof_test::RunCommand(std::string(HEAPPROF_ONE_ENGINE_PATH) + " " + profile + " " + how, alone) == 0);
  INFO(alone);
  // Alone: its operator new only (the mallocs are not hooked).
  CHECK(alone.find("one_engine: allocs 1000 live_objects 1000 rate 1") != std::string::npos);
  // Preloaded: the library records (its malloc sees both the program's
  // operator new, which calls malloc, and the mallocs), once each; the
  // program's API forwards to it.
  REQUIRE(heapprof_test::RunCommand("LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + " " +
                                        HEAPPROF_ONE_ENGINE_PATH + " " + profile + " " + how,
                                    preloaded) == 0);
  INFO(preloaded);
  CHECK(preloaded.find("forwards to it") != std::string::npos);
  CHECK(preloaded.find("one_engine: allocs 2000 live_objects 2000 rate 1") != std::string::npos);
  heapprof_test::Profile p;
  REQUIRE(heapprof_test::ReadProfileFile(profile, p));
  unlink(profile.c_str());
  // Each block once, its leaf the function that called new or malloc (the
  // program's operator new forwards to the library's cold hooks; before, it
  // called malloc and was the leaf), and the label the program set around it
  // (the library reads the program's labels; before, none).
  std::int64_t news = 0, mallocs = 0, news_labelled = 0, mallocs_labelled = 0;
  const int io = heapprof_test::SampleTypeIndex(p, "inuse_objects");
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> names = heapprof_test::FunctionNames(p, s);
    if (names.empty()) continue;
    std::string engine_label;
    for (const heapprof_test::Label& l : s.labels) {
      if (l.key == "engine") engine_label = l.str;
    }
    const std::int64_t v = s.values.at(static_cast<std::size_t>(io));
    if (names[0].find("OneEngineNew") != std::string::npos) {
      news += v;
      if (engine_label == "news") news_labelled += v;
    }
    if (names[0].find("OneEngineMalloc") != std::string::npos) {
      mallocs += v;
      if (engine_label == "mallocs") mallocs_labelled += v;
    }
  }
  CHECK(news == 1000);
  CHECK(news_labelled == 1000);
  CHECK(mallocs == 1000);
  CHECK(mallocs_labelled == 1000);
  }
}

#if defined(HEAPPROF_LABELS_PLUGIN_PATH)
TEST_CASE("preload: a dlopen'ed library that compiled heapprof in gives its labels, and stays loaded for them") {
  // The plugin's copy starts first and hands the library its label functions;
  // the program closes the plugin and allocates on: each sample then calls
  // the plugin's code, which must still be there (it pins itself).
  heapprof_test::Profile p;
  std::string output;
  REQUIRE(RunPreloaded(std::string(HEAPPROF_PLAIN_C_PATH) + " plugin " + HEAPPROF_LABELS_PLUGIN_PATH, "", p, output));
  CHECK(output.find("plain_c: the plugin kept 100 blocks") != std::string::npos);
  CHECK(output.find("plain_c: the plugin is loaded after dlclose") != std::string::npos);
  CHECK(output.find("plain_c: allocated after dlclose") != std::string::npos);
  const int io = heapprof_test::SampleTypeIndex(p, "inuse_objects");
  std::int64_t labelled = 0, plugin_blocks = 0, after = 0;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> names = heapprof_test::FunctionNames(p, s);
    if (names.empty()) continue;
    bool has_label = false;
    for (const heapprof_test::Label& l : s.labels) has_label |= l.key == "plugin" && l.str == "labels";
    const std::int64_t v = s.values.at(static_cast<std::size_t>(io));
    if (has_label) labelled += v;
    if (names[0] == "labels_plugin_alloc") plugin_blocks += v;
    if (names[0] == "plain_c_keep_malloc") {
      after += v;
      CHECK_FALSE(has_label);  // the plugin's scope had ended
    }
  }
  CHECK(plugin_blocks == 100);
  CHECK(labelled == 100);
  CHECK(after == 1000);
}
#endif

TEST_CASE("preload: a program with heapprof compiled in and an allocator preloaded after the library starts") {
  // tcmalloc's start-up (inside the library's) calls the program's operator
  // new, whose copy asks the library for its engine: that wait waited for
  // itself, and both programs hung at start-up (timeout 124).
  for (const char* lib : {"/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                          "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}) {
    if (access(lib, R_OK) != 0) {
      MESSAGE(lib << " not installed: skipped");
      continue;
    }
    CAPTURE(lib);
    const std::string preload = "timeout -s KILL 120 env LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + ":" + lib + " ";
    std::string output;
    // Replaces malloc itself: it records, the library stays off.
    int rc = heapprof_test::RunCommand(preload + heapprof_test::SelfExe() + " -tc='exact Stats: new char*' 2>&1", output);
    INFO(output);
    CHECK(rc == 0);
    CHECK(output.find("records nothing") != std::string::npos);
    CHECK(output.find("Status: SUCCESS") != std::string::npos);
    // Operator new only: the library records, the program forwards.
    const std::string profile = heapprof_test::TempPath(".pb.gz");
    std::string forwarded;
    rc = heapprof_test::RunCommand(preload + HEAPPROF_ONE_ENGINE_PATH + " " + profile + " api 2>&1", forwarded);
    INFO(forwarded);
    CHECK(rc == 0);
    CHECK(forwarded.find("one_engine: allocs 2000 live_objects 2000 rate 1") != std::string::npos);
    unlink(profile.c_str());
  }
}

TEST_CASE("preload: a program that replaces malloc itself records itself; the library stays off") {
  std::string output;
  const int rc = heapprof_test::RunCommand("LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + " " +
                                               heapprof_test::SelfExe() + " -tc='exact Stats: new char*'",
                                           output);
  INFO(output);
  CHECK(rc == 0);
  CHECK(output.find("records nothing") != std::string::npos);
  // The program is first in the lookup order: the line said to list the
  // library first in LD_PRELOAD, which cannot help (rustc, its own jemalloc).
  CHECK(output.find(", the program itself, so this library records nothing") != std::string::npos);
  CHECK(output.find("list libheapprof_preload.so first") == std::string::npos);
  CHECK(output.find("Status: SUCCESS") != std::string::npos);
}

// Real programs we did not write, when installed (a missing one is skipped).
// A thread created and joined leaves its stack, descriptor and DTV in glibc's
// cache: the DTV was an "unreachable" leak at rate 1, and leak_exit_code's
// status (retention.hpp: ExitedThreadDtvRoots).
TEST_CASE("preload: python3 with threads at rate 1 exits 0 with no unreachable object under leak_exit_code") {
  std::string out;
  if (heapprof_test::RunCommand("test -x /usr/bin/python3", out) != 0) {
    MESSAGE("/usr/bin/python3 missing: skipped");
    return;
  }
  const std::string prefix = heapprof_test::TempPath("-pythreads");
  const std::string cmd = "timeout -s KILL 60 env LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) +
                          " HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,leak_frames=1,dump_prefix=" + prefix +
                          " /usr/bin/python3 -c '\nimport threading\nout = []\n"
                          "ts = [threading.Thread(target=lambda i=i: out.append(len(bytes(1000 * i)))) for i in range(8)]\n"
                          "[t.start() for t in ts]; [t.join() for t in ts]\n"
                          // join() returns when a thread has released its lock, before its
                          // C thread has freed its state and exited: wait for the OS threads,
                          // else the report may find that state held by nothing (1 run in 6).
                          "import os\nwhile len(os.listdir(\"/proc/self/task\")) > 1: pass\n"
                          "print(sum(out))' 2>&1";
  const int rc = heapprof_test::RunCommand(cmd, out);
  INFO(cmd);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("28000\n") == 0);
  // One report, python3's (timeout and env are not preloaded), without a leak.
  const std::string none = "heapprof: leak report: unreachable (leaked): 0 objects, 0 B\n";
  const std::size_t at = out.find("unreachable (leaked): ");
  REQUIRE(at != std::string::npos);
  CHECK(out.find("unreachable (leaked): ", at + 1) == std::string::npos);
  CHECK(out.find(none) != std::string::npos);
  std::string rm;
  heapprof_test::RunCommand("rm -f " + prefix + " " + prefix + ".*", rm);
}

// Each JVM thread's first allocation is glibc's, inside pthread_getattr_np on
// itself, which holds the thread's lock: registering the thread there asked
// pthread_getattr_np again, and java -version hung at start-up (engine.hpp:
// DeferRegistration).
TEST_CASE("preload: java -version starts and exits 0") {
  std::string out;
  if (heapprof_test::RunCommand("command -v java", out) != 0) {
    MESSAGE("java missing: skipped");
    return;
  }
  const std::string cmd = "LD_PRELOAD=" + std::string(HEAPPROF_PRELOAD_PATH) + " timeout -s KILL 60 java -version 2>&1";
  const int rc = heapprof_test::RunCommand(cmd, out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("version") != std::string::npos);
  CHECK(out.find("heapprof") == std::string::npos);
}

#endif
