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
// "chdir <dir>", "rename <from> <to>", "whole <file> <build id> <hex address>",
// "scan <file> <build id> <debug directory> <hex address> <hex size>"),
// then one report for probe_main_fn and, after a dlopen, one for probe_lib_fn.
constexpr const char kProbeSource[] = R"(
#include <dlfcn.h>
#include <unistd.h>
#include <cstdio>
#include <string>
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
    } else if (std::strcmp(op, "scan") == 0 && i + 5 < argc) {
      // A file on its own under debug directory argv[i + 3]: the inline chain
      // of every address of [lo, lo + size), each distinct chain once, as
      // "name[function file:start line]@file:line < caller... " (base names).
      ArenaVector<LoadedObject> objects(1);
      objects[0].start = 1;
      objects[0].limit = ~std::uintptr_t{0} >> 1;
      objects[0].path = argv[i + 1];
      objects[0].build_id = argv[i + 2];
      Symbolizer symbolizer(objects, argv[i + 3]);
      const std::uintptr_t lo = static_cast<std::uintptr_t>(std::strtoull(argv[i + 4], nullptr, 16));
      const std::uintptr_t size = static_cast<std::uintptr_t>(std::strtoull(argv[i + 5], nullptr, 16));
      std::string seen = "\n";
      for (std::uintptr_t pc = lo; pc < lo + size; ++pc) {
        SymbolizedFrame frames[8];
        SymbolizedQuality q;
        const int n = symbolizer.Symbolize(pc, frames, 8, &q);
        auto base = [](std::string_view f) {
          const std::size_t slash = f.rfind('/');
          return std::string(slash == std::string_view::npos ? f : f.substr(slash + 1));
        };
        std::string chain = "chain";
        for (int k = 0; k < n; ++k) {
          chain += (k == 0 ? " " : " < ") + std::string(frames[k].name) + "[" + base(frames[k].function_file) + ":" +
                   std::to_string(frames[k].start_line) + "]@" + base(frames[k].file) + ":" +
                   std::to_string(frames[k].line);
        }
        if (seen.find("\n" + chain + "\n") != std::string::npos) continue;
        seen += chain + "\n";
        std::printf("%s\n", chain.c_str());
      }
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

namespace {

// Two programs sharing a header's inline functions: what dwz -m moves to the
// common file (the class, the functions' declarations and abstract DIEs,
// their names in its .debug_str), referred to from each program's DWARF by
// DW_FORM_GNU_ref_alt / GNU_strp_alt (or DWARF 5's ref_sup4 / strp_sup).
constexpr const char kDwzHeader[] = R"(namespace shared_ns {
struct Widget {
  int v;
  __attribute__((always_inline)) inline int Grow(int x) {
    volatile int s = v;
    for (int i = 0; i < x; ++i) s = s + i * 3;
    return s;
  }
  __attribute__((noinline)) int Slow(int x) {
    volatile int s = x;
    return s * 5;
  }
};
__attribute__((always_inline)) inline int Twice(Widget& w, int x) { return w.Grow(x) + w.Grow(x + 1); }
}  // namespace shared_ns
)";

std::string DwzProgram(const char* name) {
  return std::string("#include \"shared.h\"\n") + "extern \"C\" __attribute__((noinline)) int outer_" + name +
         "(int x) {\n  shared_ns::Widget w{x};\n  return shared_ns::Twice(w, x) + w.Slow(x);\n}\n" +
         "int main(int argc, char**) { return outer_" + name + "(argc) & 1; }\n";
}

// Every inline chain in outer_a and Widget::Slow of `file` (see "scan").
std::string ScanDwzProgram(const Programs& p, const std::string& file, const std::string& debug_directory) {
  std::string id, ranges;
  RunCommand("readelf -n '" + file + "' | sed -n 's/.*Build ID: *//p'", id);
  RunCommand("nm -S '" + file + "' | awk '$4 == \"outer_a\" || $4 ~ /Widget4Slow/ {print $1 \" \" $2}'", ranges);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  std::string out;
  std::size_t at = 0;
  for (std::size_t end; (end = ranges.find('\n', at)) != std::string::npos; at = end + 1) {
    out += Run(p.dir, "./probe scan '" + file + "' '" + id + "' '" + debug_directory + "' " +
                          ranges.substr(at, end - at));
  }
  return out;
}

}  // namespace

TEST_CASE("symbol files: inline frames named from the common file of dwz -m (.gnu_debugaltlink, .debug_sup)") {
  HEAPPROF_SYMFILES_PROGRAMS(p);
  if (!HaveTool("dwz") || !HaveTool("nm") || !HaveTool("readelf") || !HaveTool("awk")) {
    MESSAGE("dwz, nm, readelf or awk missing: skipped (apt-get install dwz)");
    return;
  }
  const std::string d = p.dir + "/dwz";
  std::string out;
  REQUIRE(RunCommand("mkdir -p '" + d + "'", out) == 0);
  REQUIRE(heapprof_test::WriteFile(d + "/shared.h", kDwzHeader));
  REQUIRE(heapprof_test::WriteFile(d + "/a.cc", DwzProgram("a")));
  REQUIRE(heapprof_test::WriteFile(d + "/b.cc", DwzProgram("b")));
  // The common file named relative to the programs (dwz -M), as gdb reads it:
  // from the directory of the file holding the link, not the current one.
  const std::string build = "cd '" + d + "' && g++ -O2 -g -Wl,--build-id a.cc -o a && " +
                            "g++ -O2 -g -Wl,--build-id b.cc -o b && mkdir gnu v5 byid wrong && " +
                            "cp a b gnu/ && cp a b v5/ && (cd gnu && dwz -m common.debug -M common.debug a b) && " +
                            "(cd v5 && dwz -5 -m sup.debug -M sup.debug a b) && cp gnu/a byid/a && cp gnu/a wrong/a && " +
                            "cp v5/sup.debug wrong/common.debug";
  INFO(out);
  REQUIRE(RunCommand(build, out) == 0);
  std::string common_id;
  RunCommand("readelf -n '" + d + "/gnu/common.debug' | sed -n 's/.*Build ID: *//p'", common_id);
  while (!common_id.empty() && (common_id.back() == '\n' || common_id.back() == ' ')) common_id.pop_back();
  REQUIRE(common_id.size() > 2);
  REQUIRE(RunCommand("mkdir -p '" + d + "/debug/.build-id/" + common_id.substr(0, 2) + "' && cp '" + d +
                         "/gnu/common.debug' '" + d + "/debug/.build-id/" + common_id.substr(0, 2) + "/" +
                         common_id.substr(2) + ".debug'",
                     out) == 0);

  // The program as the compiler wrote it: the frames the others must match.
  const std::string whole = ScanDwzProgram(p, d + "/a", "/nonexistent");
  INFO("before dwz:\n" << whole);
  REQUIRE(whole.find("chain shared_ns::Widget::Grow[shared.h:4]@shared.h:6 < shared_ns::Twice[shared.h:14]@shared.h:14 "
                     "< outer_a[a.cc:2]@a.cc:4\n") != std::string::npos);
  REQUIRE(whole.find("chain shared_ns::Widget::Slow[shared.h:9]@shared.h:11\n") != std::string::npos);
  // .gnu_debugaltlink with DW_FORM_GNU_ref_alt / GNU_strp_alt.
  CHECK(ScanDwzProgram(p, d + "/gnu/a", "/nonexistent") == whole);
  // DWARF 5: .debug_sup with DW_FORM_ref_sup4 / strp_sup.
  CHECK(ScanDwzProgram(p, d + "/v5/a", "/nonexistent") == whole);
  // Not beside it: by its build id under the debug directory.
  CHECK(ScanDwzProgram(p, d + "/byid/a", d + "/debug") == whole);
  // A file of that name with another build id (none, here) is not used: the
  // names it would give are not trusted; the lines stay.
  const std::string wrong = ScanDwzProgram(p, d + "/wrong/a", "/nonexistent");
  INFO("with the wrong common file:\n" << wrong);
  CHECK(wrong.find("Widget::Grow") == std::string::npos);
  CHECK(wrong.find("@shared.h:6 < ") != std::string::npos);
  CHECK(wrong.find("< outer_a[a.cc:2]@a.cc:4\n") != std::string::npos);
}
