// Which file the symbolizer reads for a loaded object, in the situations where
// the loader's name for it does not lead there: the executable or a library
// deleted or replaced on disk while running (a deploy), a library dlopen'ed by
// a relative name before a chdir (with a decoy of the same name in the new
// directory), a program started through ld.so, and a stripped binary whose
// .symtab is in the file its .gnu_debuglink names.
//
// The situations need a process of their own: a small program, compiled here
// against include/, sets one up (renames files over itself, dlopens, changes
// directory) and then prints what CollectProfileObjects and the Symbolizer say.
#include <doctest/doctest.h>

#include <elf.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "support/profile_io.hpp"

namespace {

using heapprof_test::HaveTool;
using heapprof_test::RunCommand;

// The program: each argument pair or triple is a step ("dlopen <path>",
// "chdir <dir>", "rename <from> <to>", "whole <file> <build id> <hex address>"),
// then one report for probe_main_fn and, after a dlopen, one for probe_lib_fn.
constexpr const char kProbeSource[] = R"(
#include <dlfcn.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
using namespace heapprof::detail;
extern "C" __attribute__((noinline)) int probe_main_fn(int x) {
  volatile int s = 0;
  for (int i = 0; i < x; ++i) s = s + i;
  return s;
}
static void PrintFrame(const char* what, Symbolizer& symbolizer, std::uintptr_t pc) {
  SymbolizedFrame frames[8];
  SymbolizedQuality q;
  const int n = symbolizer.Symbolize(pc, frames, 8, &q);
  const std::string_view name = n > 0 ? frames[n - 1].name : std::string_view();
  std::printf("%s name=%.*s line=%u\n", what, static_cast<int>(name.size()), name.data(),
              n > 0 ? frames[0].line : 0u);
}
static void Report(const char* what, std::uintptr_t pc) {
  const ArenaVector<LoadedObject> objects = CollectProfileObjects();
  Symbolizer symbolizer(objects);
  for (std::size_t i = 0; i < objects.size(); ++i) {
    if (pc >= objects[i].start && pc < objects[i].limit)
      std::printf("%s path=%s symbols=%d\n", what, objects[i].path.c_str(), symbolizer.HasSymbols(i) ? 1 : 0);
  }
  PrintFrame(what, symbolizer, pc);
}
int main(int argc, char** argv) {
  void* lib = nullptr;
  for (int i = 1; i < argc; ++i) {
    const char* op = argv[i];
    if (std::strcmp(op, "dlopen") == 0 && i + 1 < argc) {
      lib = dlopen(argv[++i], RTLD_NOW);
      if (lib == nullptr) return 2;
    } else if (std::strcmp(op, "chdir") == 0 && i + 1 < argc) {
      if (chdir(argv[++i]) != 0) return 3;
    } else if (std::strcmp(op, "rename") == 0 && i + 2 < argc) {
      if (rename(argv[i + 1], argv[i + 2]) != 0) return 4;
      i += 2;
    } else if (std::strcmp(op, "whole") == 0 && i + 3 < argc) {
      // A file on its own (an absolute name), file addresses as memory addresses.
      ArenaVector<LoadedObject> objects(1);
      objects[0].start = 1;
      objects[0].limit = ~std::uintptr_t{0} >> 1;
      objects[0].path = argv[i + 1];
      objects[0].build_id = argv[i + 2];
      Symbolizer symbolizer(objects, "/nonexistent");
      std::printf("whole symbols=%d\n", symbolizer.HasSymbols(0) ? 1 : 0);
      PrintFrame("whole", symbolizer, static_cast<std::uintptr_t>(std::strtoull(argv[i + 3], nullptr, 16)));
      return 0;
    } else {
      return 5;
    }
  }
  Report("main", reinterpret_cast<std::uintptr_t>(&probe_main_fn) + 1);
  if (lib != nullptr) Report("lib", reinterpret_cast<std::uintptr_t>(dlsym(lib, "probe_lib_fn")) + 1);
  return 0;
}
)";

// The library, and its decoy: the same code under a name of the same length
// (so at the same address), linked without a build id.
constexpr const char kLibSource[] = R"(
#ifdef DECOY
#define probe_lib_fn decoy_lib_fn
#endif
extern "C" __attribute__((noinline)) int probe_lib_fn(int x) {
  volatile int s = 0;
  for (int i = 0; i < x; ++i) s = s + i;
  return s;
}
)";

// include/, found from this file's own path.
std::string IncludeDir() {
  const std::string here = __FILE__;
  const std::size_t cut = here.rfind("/tests/unit/");
  if (cut == std::string::npos) return "";
  const std::string dir = here.substr(0, cut) + "/include";
  return access((dir + "/heapprof/detail/4_symbolization/symbolizer.hpp").c_str(), R_OK) == 0 ? dir : "";
}

// The programs, built once for all the cases below; the directory goes at exit.
struct Programs {
  std::string dir;  // real path: the kernel's names are compared with it
  std::string why;  // not built: why
  ~Programs() {
    std::string out;
    if (!dir.empty()) RunCommand("rm -rf '" + dir + "'", out);
  }
};

const Programs& Built() {
  static Programs programs;
  static bool tried = false;
  if (tried) return programs;
  tried = true;
  const std::string include = IncludeDir();
  if (include.empty() || !HaveTool("g++")) {
    programs.why = "include/ or g++ not found";
    return programs;
  }
  char tmpl[] = "/tmp/heapprof_symfiles_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    programs.why = "mkdtemp failed";
    return programs;
  }
  std::unique_ptr<char, decltype(&std::free)> real(realpath(tmpl, nullptr), &std::free);
  programs.dir = real ? real.get() : tmpl;
  const std::string& d = programs.dir;
  std::string out;
  if (!heapprof_test::WriteFile(d + "/probe.cc", kProbeSource) || !heapprof_test::WriteFile(d + "/lib.cc", kLibSource) ||
      RunCommand("g++ -std=c++17 -O1 -g -Wl,--build-id -I'" + include + "' '" + d + "/probe.cc' -o '" + d +
                     "/probe' -ldl -pthread && g++ -O1 -g -shared -fPIC -Wl,--build-id '" + d + "/lib.cc' -o '" + d +
                     "/libprobe.so' && g++ -O1 -g -shared -fPIC -DDECOY -Wl,--build-id=none '" + d + "/lib.cc' -o '" +
                     d + "/decoy.so'",
                 out) != 0) {
    programs.why = "build failed: " + out;
  }
  return programs;
}

// Runs `command` in `dir` with a timeout; its output.
std::string Run(const std::string& dir, const std::string& command) {
  std::string out;
  const int status = RunCommand("cd '" + dir + "' && timeout -s KILL 60 " + command, out);
  if (status != 0) out += "\n(exit status " + std::to_string(status) + ")";
  return out;
}

std::string Copy(const std::string& from, const std::string& to) {
  std::string out;
  RunCommand("mkdir -p \"$(dirname '" + to + "')\" && cp '" + from + "' '" + to + "'", out);
  return to;
}

std::string Interpreter(const std::string& binary) {
  const std::string image = heapprof_test::ReadFile(binary);
  Elf64_Ehdr eh;
  if (image.size() < sizeof eh) return "";
  std::memcpy(&eh, image.data(), sizeof eh);
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    if (eh.e_phoff + (i + 1) * sizeof ph > image.size()) return "";
    std::memcpy(&ph, image.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
    if (ph.p_type == PT_INTERP && ph.p_offset + ph.p_filesz <= image.size() && ph.p_filesz > 1) {
      return std::string(image.data() + ph.p_offset, ph.p_filesz - 1);
    }
  }
  return "";
}

}  // namespace

#define HEAPPROF_SYMFILES_PROGRAMS(p)    \
  const Programs& p = Built();           \
  if (!p.why.empty()) {                  \
    MESSAGE("skipped: " << p.why);       \
    return;                              \
  }

TEST_CASE("symbol files: an executable replaced on disk while running keeps its name and symbols") {
  HEAPPROF_SYMFILES_PROGRAMS(p);
  const std::string prog = Copy(p.dir + "/probe", p.dir + "/deploy1/prog");
  Copy(p.dir + "/decoy.so", p.dir + "/deploy1/new");
  // The program itself moves the new file over its own: no timing between processes.
  const std::string out = Run(p.dir + "/deploy1", "./prog rename new prog");
  INFO(out);
  CHECK(out.find("main path=" + prog + " symbols=1\n") != std::string::npos);
  CHECK(out.find("main name=probe_main_fn line=") != std::string::npos);
  CHECK(out.find("(deleted)") == std::string::npos);
}

TEST_CASE("symbol files: a library replaced on disk while loaded is read from what was mapped") {
  HEAPPROF_SYMFILES_PROGRAMS(p);
  const std::string lib = Copy(p.dir + "/libprobe.so", p.dir + "/deploy2/libprobe.so");
  Copy(p.dir + "/decoy.so", p.dir + "/deploy2/new.so");
  const std::string out = Run(p.dir + "/deploy2", "../probe dlopen '" + lib + "' rename new.so libprobe.so");
  INFO(out);
  CHECK(out.find("lib path=" + lib + " symbols=1\n") != std::string::npos);
  CHECK(out.find("lib name=probe_lib_fn line=") != std::string::npos);
  CHECK(out.find("decoy") == std::string::npos);
}

TEST_CASE("symbol files: dlopen by a relative name, then chdir to a decoy of that name") {
  HEAPPROF_SYMFILES_PROGRAMS(p);
  const std::string lib = Copy(p.dir + "/libprobe.so", p.dir + "/old/libprobe.so");
  Copy(p.dir + "/decoy.so", p.dir + "/new/libprobe.so");
  const std::string out = Run(p.dir + "/old", "../probe dlopen ./libprobe.so chdir ../new");
  INFO(out);
  CHECK(out.find("lib path=" + lib + " symbols=1\n") != std::string::npos);
  CHECK(out.find("lib name=probe_lib_fn line=") != std::string::npos);
  CHECK(out.find("decoy") == std::string::npos);
}

TEST_CASE("symbol files: a program started through ld.so is named and read as itself") {
  HEAPPROF_SYMFILES_PROGRAMS(p);
  const std::string interp = Interpreter(p.dir + "/probe");
  if (interp.empty() || access(interp.c_str(), X_OK) != 0) {
    MESSAGE("no runnable PT_INTERP: skipped");
    return;
  }
  const std::string out = Run(p.dir, "'" + interp + "' ./probe");
  INFO(out);
  CHECK(out.find("main path=" + p.dir + "/probe symbols=1\n") != std::string::npos);
  CHECK(out.find("main name=probe_main_fn line=") != std::string::npos);
}

TEST_CASE("symbol files: a file without a build id does not stand in for an object that has one") {
  HEAPPROF_SYMFILES_PROGRAMS(p);
  if (!HaveTool("readelf") || !HaveTool("nm")) {
    MESSAGE("readelf or nm missing: skipped");
    return;
  }
  std::string id, address;
  RunCommand("readelf -n '" + p.dir + "/libprobe.so' | sed -n 's/.*Build ID: *//p'", id);
  RunCommand("nm '" + p.dir + "/decoy.so' | sed -n 's/ T decoy_lib_fn//p'", address);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  while (!address.empty() && address.back() == '\n') address.pop_back();
  REQUIRE(id.size() > 2);
  REQUIRE(!address.empty());
  // The decoy as itself (no build id expected): its names are its own.
  const std::string itself = Run(p.dir, "./probe whole '" + p.dir + "/decoy.so' '' " + address);
  CHECK(itself.find("whole name=decoy_lib_fn") != std::string::npos);
  // The decoy where the loaded object had libprobe.so's id: neither its
  // symbols nor its DWARF.
  const std::string out = Run(p.dir, "./probe whole '" + p.dir + "/decoy.so' " + id + " " + address);
  INFO(out);
  CHECK(out.find("whole symbols=0\n") != std::string::npos);
  CHECK(out.find("whole name= line=0\n") != std::string::npos);
}

TEST_CASE("symbol files: a stripped binary reads the .symtab of its .gnu_debuglink file") {
  HEAPPROF_SYMFILES_PROGRAMS(p);
  if (!HaveTool("objcopy") || !HaveTool("strip") || !HaveTool("nm") || !HaveTool("readelf")) {
    MESSAGE("objcopy, strip, nm or readelf missing: skipped");
    return;
  }
  const std::string d = p.dir + "/linked";
  std::string out, id, start;
  REQUIRE(RunCommand("mkdir -p '" + d + "' && cd '" + d + "' && objcopy --only-keep-debug ../probe probe.debug && " +
                         "strip --strip-all ../probe -o stripped && " +
                         "objcopy --add-gnu-debuglink=probe.debug stripped probe",
                     out) == 0);
  RunCommand("readelf -n '" + d + "/probe' | sed -n 's/.*Build ID: *//p'", id);
  RunCommand("nm '" + p.dir + "/probe' | sed -n 's/ T _start$//p'", start);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  while (!start.empty() && start.back() == '\n') start.pop_back();
  REQUIRE(id.size() > 2);
  REQUIRE(!start.empty());
  // _start has no DWARF: only a symbol table names it, and the stripped
  // file's .dynsym does not.
  out = Run(d, "../probe whole '" + d + "/probe' " + id + " " + start);
  INFO(out);
  CHECK(out.find("whole symbols=1\n") != std::string::npos);
  CHECK(out.find("whole name=_start line=0\n") != std::string::npos);
}
