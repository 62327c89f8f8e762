// The DWARF reader against binutils: tests/support/dwarf_fixture.cc is
// compiled by g++ and clang++ at -O0 and -O2, with -gdwarf-4 and -gdwarf-5,
// with and without -gz (and g++ -O3, g++ -flto, clang++ -gline-tables-only),
// and every address of its functions is symbolized by
// heapprof and by `addr2line -f -i -C`; the two must agree frame by frame.
// Split DWARF (-gsplit-dwarf) builds too, whose .dwo files binutils does not
// read: addr2line runs on the same build without -gsplit-dwarf (the same
// code at the same addresses), llvm-symbolizer on the split build itself.
// Then separate debug files (build id, .gnu_debuglink), a stripped binary, and
// the inflater on its own.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "heapprof/detail/4_symbolization/inflate.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "heapprof/detail/5_encoding/profile_builder.hpp"
#include "support/profile_decoder.hpp"
#include "support/profile_io.hpp"

namespace {

using heapprof::detail::LoadedObject;
using heapprof::detail::SymbolizedFrame;
using heapprof::detail::SymbolizedQuality;
using heapprof::detail::Symbolizer;
using heapprof_test::RunCommand;

using heapprof_test::HaveTool;

// tests/support/dwarf_fixture.cc, found from this file's own path, made
// absolute: meson compiles by relative paths (__FILE__ is
// "../tests/unit/test_dwarf.cpp"), and the split builds compile the fixture
// from a directory of their own.
std::string FixturePath() {
  std::string here = __FILE__;
  const std::size_t cut = here.rfind("/unit/");
  if (cut == std::string::npos) return "";
  const std::string path = here.substr(0, cut) + "/support/dwarf_fixture.cc";
  char* absolute = realpath(path.c_str(), nullptr);
  if (absolute == nullptr) return "";
  std::string result = absolute;
  free(absolute);
  return access(result.c_str(), R_OK) == 0 ? result : "";
}

std::string TempDir() {
  char tmpl[] = "/tmp/heapprof_dwarf_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  return dir != nullptr ? dir : "";
}

struct Frame {
  std::string function, location;  // "file:line", line "?" when unknown
  bool operator==(const Frame& o) const { return function == o.function && location == o.location; }
};
using Frames = std::vector<Frame>;

std::string Show(const Frames& frames) {
  std::string s;
  for (const Frame& f : frames) s += "[" + f.function + " @ " + f.location + "] ";
  return s;
}

// "file:12 (discriminator 3)" → "file:12"; ":0" → ":?" (addr2line's unknown).
std::string NormalLocation(std::string loc) {
  const std::size_t d = loc.find(" (discriminator");
  if (d != std::string::npos) loc.resize(d);
  if (loc.size() >= 2 && loc.compare(loc.size() - 2, 2, ":0") == 0) loc.replace(loc.size() - 1, 1, "?");
  return loc;
}

// Addresses of every byte of the fixture's own functions (nm's sized text symbols).
std::vector<std::uint64_t> FunctionAddresses(const std::string& binary) {
  std::string out;
  RunCommand("nm -S --defined-only " + binary, out);
  std::vector<std::uint64_t> addresses;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    char type = 0;
    unsigned long long value = 0, size = 0;
    char name[512];
    if (std::sscanf(line.c_str(), "%llx %llx %c %511s", &value, &size, &type, name) != 4) continue;
    if (type != 'T' && type != 't') continue;
    if (std::strncmp(name, "_start", 6) == 0 || std::strstr(name, "tm_clones") != nullptr ||
        std::strncmp(name, "__do_global", 11) == 0 || std::strcmp(name, "frame_dummy") == 0) {
      continue;  // crt code without DWARF: names only, compared elsewhere
    }
    for (unsigned long long a = value; a < value + size; ++a) addresses.push_back(a);
  }
  return addresses;
}

// `tool` run over the addresses; its output split per address (-a markers).
std::vector<Frames> Reference(const std::string& command, const std::string& binary,
                              const std::vector<std::uint64_t>& addresses, const std::string& dir) {
  std::string input;
  char buf[32];
  for (std::uint64_t a : addresses) {
    std::snprintf(buf, sizeof buf, "0x%llx\n", static_cast<unsigned long long>(a));
    input += buf;
  }
  const std::string in_path = dir + "/addresses.txt";
  heapprof_test::WriteFile(in_path, input);
  std::string out;
  RunCommand(command + " " + binary + " < " + in_path, out);
  std::vector<Frames> result;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("0x", 0) == 0) {
      result.emplace_back();
      continue;
    }
    if (result.empty()) continue;
    if (line.empty()) continue;
    std::string location;
    std::getline(lines, location);
    // llvm-symbolizer prints "file:line:column".
    const std::size_t last = location.rfind(':');
    if (last != std::string::npos && command.find("llvm") != std::string::npos) {
      const std::size_t prev = location.rfind(':', last - 1);
      if (prev != std::string::npos) location.resize(last);
    }
    result.back().push_back(Frame{line, NormalLocation(location)});
  }
  return result;
}

Frames Ours(Symbolizer& symbolizer, std::uint64_t address) {
  SymbolizedFrame frames[32];
  SymbolizedQuality quality;
  const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(address), frames, 32, &quality);
  Frames out;
  if (n == 0) out.push_back(Frame{"??", "??:?"});
  for (int i = 0; i < n; ++i) {
    const std::string file = frames[i].file.empty() ? "??" : std::string(frames[i].file);
    out.push_back(Frame{frames[i].full_name.empty() ? "??" : std::string(frames[i].full_name),
                        NormalLocation(file + ":" + std::to_string(frames[i].line))});
  }
  return out;
}

heapprof::detail::ArenaVector<LoadedObject> WholeFile(const std::string& path, const std::string& build_id = "") {
  // File addresses as memory addresses (bias 0): every address maps to it.
  LoadedObject o;
  o.start = 1;
  o.limit = ~std::uintptr_t{0} >> 1;
  o.path = path;
  o.build_id = build_id;
  return {o};
}

std::string BuildIdOf(const std::string& path) {
  heapprof::detail::elf::MappedFile file;
  heapprof::detail::elf::SectionTable sections;
  if (!file.Open(path.c_str()) || !sections.Init(file.view())) return "";
  return std::string(heapprof::detail::elf::FileBuildId(sections));
}

struct Tally {
  std::size_t addresses = 0, agree = 0, binutils_symtab_name = 0, llvm_agrees = 0, differ = 0;
};

}  // namespace

TEST_CASE("dwarf: frame-by-frame agreement with addr2line -f -i -C (gcc, clang; -O0, -O2, -O3, -flto; DWARF 4, 5; -gz; -gline-tables-only; -gsplit-dwarf)") {
  const std::string fixture = FixturePath();
  if (fixture.empty() || !HaveTool("addr2line") || !HaveTool("nm")) {
    MESSAGE("fixture source, addr2line or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const bool have_llvm = HaveTool("llvm-symbolizer");
  struct Variant {
    const char* compiler;
    const char* flags;
    const char* split = nullptr;  // -gsplit-dwarf and its options, if a split build
  };
  const Variant variants[] = {
      {"g++", "-O0 -gdwarf-4"},   {"g++", "-O0 -gdwarf-5"},          {"g++", "-O2 -gdwarf-4"},
      {"g++", "-O2 -gdwarf-5"},   {"g++", "-O2 -gdwarf-5 -gz"},      {"g++", "-O0 -gdwarf-4 -gz"},
      {"clang++", "-O0 -gdwarf-4"}, {"clang++", "-O0 -gdwarf-5"},    {"clang++", "-O2 -gdwarf-4"},
      {"clang++", "-O2 -gdwarf-5"}, {"clang++", "-O2 -gdwarf-5 -gz"},
      {"g++", "-O3 -gdwarf-5"},   {"g++", "-O2 -g -flto"},           {"clang++", "-O2 -gline-tables-only"},
      {"g++", "-O0 -gdwarf-4", "-gsplit-dwarf"},     {"g++", "-O2 -gdwarf-4", "-gsplit-dwarf"},
      {"g++", "-O0 -gdwarf-5", "-gsplit-dwarf"},     {"g++", "-O2 -gdwarf-5", "-gsplit-dwarf"},
      {"clang++", "-O0 -gdwarf-4", "-gsplit-dwarf"}, {"clang++", "-O2 -gdwarf-4", "-gsplit-dwarf"},
      {"clang++", "-O0 -gdwarf-5", "-gsplit-dwarf"}, {"clang++", "-O2 -gdwarf-5", "-gsplit-dwarf"},
      {"clang++", "-O2 -gdwarf-5", "-gsplit-dwarf -fsplit-dwarf-inlining"},
  };
  int built = 0;
  for (const Variant& v : variants) {
    if (!HaveTool(v.compiler)) continue;
    const std::string compiler = v.compiler, flags = v.flags;
    // binutils 2.40 reads GCC's LTO units as file "<artificial>" (their
    // DW_AT_name) at every address: there llvm-symbolizer alone decides.
    const bool lto = flags.find("-flto") != std::string::npos;
    if (lto && !have_llvm) continue;
    const std::string split = v.split != nullptr ? v.split : "";
    CAPTURE(compiler);
    CAPTURE(flags);
    CAPTURE(split);
    const std::string binary = dir + "/fixture_" + std::to_string(built++);
    std::string out;
    const int rc = RunCommand(std::string(v.compiler) + " -std=c++17 " + v.flags + " " + fixture + " -o " + binary, out);
    REQUIRE_MESSAGE(rc == 0, out);
    std::string reference_binary = binary;
    std::string split_binary;
    if (!split.empty()) {
      // Each split build in a directory of its own: clang names the .dwo
      // after the source, and the builds would overwrite each other's.
      const std::string split_dir = binary + "_split";
      split_binary = split_dir + "/fixture";
      REQUIRE_MESSAGE(RunCommand("mkdir -p " + split_dir + " && cd " + split_dir + " && " + compiler +
                                     " -std=c++17 " + flags + " " + split + " " + fixture + " -o " + split_binary,
                                 out) == 0,
                      out);
    }
    const std::vector<std::uint64_t> addresses = FunctionAddresses(binary);
    REQUIRE(addresses.size() > 100);
    if (!split.empty()) REQUIRE(FunctionAddresses(split_binary) == addresses);  // the same code
    const std::vector<Frames> ref = Reference("addr2line -f -i -C -a -e", reference_binary, addresses, dir);
    REQUIRE(ref.size() == addresses.size());
    std::vector<Frames> llvm;
    if (have_llvm) llvm = Reference("llvm-symbolizer -f -i -C -a -e", reference_binary, addresses, dir);
    // llvm-symbolizer reading the .dwo itself: told, not decisive. Version 14
    // misses clang's DWARF 5 split inline chains (their range lists' offset
    // pairs are not based on the skeleton's DW_AT_low_pc) that it finds in
    // the same build without -gsplit-dwarf.
    std::vector<Frames> llvm_split;
    if (have_llvm && !split.empty()) llvm_split = Reference("llvm-symbolizer -f -i -C -a -e", split_binary, addresses, dir);
    std::size_t llvm_split_agree = 0;

    heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(split.empty() ? binary : split_binary);
    Symbolizer symbolizer(objects);
    CHECK(symbolizer.HasDebugInfo(0));
    Tally t;
    for (std::size_t i = 0; i < addresses.size(); ++i) {
      const Frames ours = Ours(symbolizer, addresses[i]);
      ++t.addresses;
      if (i < llvm_split.size() && llvm_split[i] == ours) ++llvm_split_agree;
      if (ours == ref[i]) {
        ++t.agree;
        continue;
      }
      // binutils names an inlined frame at the very start of its caller by
      // the caller's symbol (its ELF symbol starts there): same chain, same
      // lines, only the innermost name differs and repeats the outermost.
      const Frames& r = ref[i];
      if (r.size() == ours.size() && r.size() >= 2 && r[0].function == r.back().function &&
          r[0].location == ours[0].location) {
        bool rest_equal = true;
        for (std::size_t k = 1; k < r.size(); ++k) rest_equal = rest_equal && r[k] == ours[k];
        if (rest_equal) {
          ++t.binutils_symtab_name;
          continue;
        }
      }
      // binutils 2.40 misses clang's DWARF 5 inline chains (DW_FORM_rnglistx
      // and addrx ranges); llvm-symbolizer reads them, and decides.
      if (have_llvm && i < llvm.size() && llvm[i] == ours) {
        ++t.llvm_agrees;
        continue;
      }
      ++t.differ;
      if (t.differ <= 5) {
        MESSAGE("address 0x" << std::hex << addresses[i] << std::dec << ": addr2line " << Show(ref[i])
                             << "| heapprof " << Show(ours));
      }
    }
    const std::string variant = std::string(v.compiler) + " " + v.flags + (split.empty() ? "" : " " + split);
    MESSAGE(variant << ": " << t.addresses << " addresses, " << t.agree
                       << " identical to addr2line, " << t.binutils_symtab_name
                       << " differ only by binutils' symbol-table name for an inlined frame at a function start, "
                       << t.llvm_agrees << " identical to llvm-symbolizer where addr2line differs, " << t.differ
                       << " wrong"
                       << (split.empty() ? std::string()
                                         : "; " + std::to_string(llvm_split_agree) +
                                               " identical to llvm-symbolizer on the split build"));
    CHECK(t.differ == 0);
    CHECK((t.agree + (lto ? t.llvm_agrees : 0)) * 2 > t.addresses);
  }
  std::string ignored;
  RunCommand("rm -rf " + dir, ignored);
}

TEST_CASE("dwarf: separate debug files by build id and .gnu_debuglink; a stripped binary without one") {
  const std::string fixture = FixturePath();
  if (fixture.empty() || !HaveTool("g++") || !HaveTool("objcopy") || !HaveTool("strip")) {
    MESSAGE("fixture, g++, objcopy or strip missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  std::string out;
  const std::string full = dir + "/full";
  REQUIRE(RunCommand("g++ -std=c++17 -O2 -g -Wl,--build-id " + fixture + " -o " + full, out) == 0);
  const std::string build_id = BuildIdOf(full);
  REQUIRE(build_id.size() > 2);
  REQUIRE(RunCommand("objcopy --only-keep-debug " + full + " " + dir + "/full.debug", out) == 0);
  REQUIRE(RunCommand("strip --strip-all " + full + " -o " + dir + "/stripped", out) == 0);
  const std::string debug_root = dir + "/debugroot";
  const std::string id_dir = debug_root + "/.build-id/" + build_id.substr(0, 2);
  REQUIRE(RunCommand("mkdir -p " + id_dir + " && cp " + dir + "/full.debug " + id_dir + "/" +
                         build_id.substr(2) + ".debug",
                     out) == 0);
  // .gnu_debuglink: the debug file beside the stripped binary.
  REQUIRE(RunCommand("mkdir -p " + dir + "/linked && cp " + dir + "/full.debug " + dir + "/linked/fixture.debug && " +
                         "objcopy --add-gnu-debuglink=" + dir + "/linked/fixture.debug " + dir + "/stripped " + dir +
                         "/linked/fixture",
                     out) == 0);

  // The reference: the unstripped binary itself.
  heapprof::detail::ArenaVector<LoadedObject> full_objects = WholeFile(full, build_id);
  Symbolizer reference(full_objects);
  const std::vector<std::uint64_t> addresses = FunctionAddresses(full);
  REQUIRE(!addresses.empty());

  SUBCASE("build id") {
    heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(dir + "/stripped", build_id);
    Symbolizer symbolizer(objects, debug_root.c_str());
    CHECK(symbolizer.HasDebugInfo(0));
    CHECK(symbolizer.HasSymbols(0));  // .symtab from the debug file too
    std::size_t same = 0;
    for (std::uint64_t a : addresses) same += Ours(symbolizer, a) == Ours(reference, a);
    CHECK(same == addresses.size());
  }
  SUBCASE(".gnu_debuglink") {
    heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(dir + "/linked/fixture", build_id);
    Symbolizer symbolizer(objects, "/nonexistent");
    CHECK(symbolizer.HasDebugInfo(0));
    std::size_t with_lines = 0;
    for (std::uint64_t a : addresses) {
      SymbolizedFrame frames[32];
      SymbolizedQuality q;
      with_lines += symbolizer.Symbolize(static_cast<std::uintptr_t>(a), frames, 32, &q) > 0 && q.line;
    }
    CHECK(with_lines * 10 > addresses.size() * 9);
  }
  SUBCASE("stripped, no debug file: nothing claimed") {
    heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(dir + "/stripped", build_id);
    Symbolizer symbolizer(objects, "/nonexistent");
    CHECK_FALSE(symbolizer.HasDebugInfo(0));
    std::size_t named = 0;
    for (std::uint64_t a : addresses) {
      SymbolizedFrame frames[32];
      SymbolizedQuality q;
      named += symbolizer.Symbolize(static_cast<std::uintptr_t>(a), frames, 32, &q) > 0 && q.function;
    }
    CHECK(named == 0);  // only .dynsym is left, and it names none of these
  }
  RunCommand("rm -rf " + dir, out);
}

namespace {

// The object as the loader would map it at `bias`: its executable PT_LOAD.
bool MapLikeLoader(const std::string& path, std::uintptr_t bias, LoadedObject& o) {
  heapprof::detail::elf::MappedFile file;
  if (!file.Open(path.c_str())) return false;
  const heapprof::detail::elf::ByteView v = file.view();
  Elf64_Ehdr eh;
  if (!v.Read(0, &eh)) return false;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    if (!v.Read(eh.e_phoff + i * sizeof ph, &ph)) return false;
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    o.start = bias + (ph.p_vaddr & ~std::uint64_t{4095});
    o.limit = bias + ph.p_vaddr + ph.p_memsz;
    o.file_offset = ph.p_offset & ~std::uint64_t{4095};
    o.bias = bias;
    o.path = path;
    return true;
  }
  return false;
}

std::uint64_t SymbolAddress(const std::string& binary, const std::string& name) {
  std::string out;
  RunCommand("nm --defined-only " + binary + " | grep ' " + name + "$'", out);
  return std::strtoull(out.c_str(), nullptr, 16);
}

}  // namespace

TEST_CASE("dwarf: a stripped binary without debug info claims no functions; its addresses name the frames in an unstripped copy") {
  const std::string fixture = FixturePath();
  if (fixture.empty() || !HaveTool("g++") || !HaveTool("strip") || !HaveTool("addr2line")) {
    MESSAGE("fixture, g++, strip or addr2line missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  std::string out;
  const std::string full = dir + "/fixture", stripped = dir + "/stripped/fixture";
  REQUIRE(RunCommand("g++ -std=c++17 -O0 -g -Wl,--build-id " + fixture + " -o " + full + " && mkdir -p " + dir +
                         "/stripped && strip --strip-all " + full + " -o " + stripped,
                     out) == 0);
  const std::uint64_t compute = SymbolAddress(full, "_Z7Computei");
  const std::uint64_t fill = SymbolAddress(full, "_ZN7fixture6Buffer4FillEi");
  REQUIRE(compute != 0);
  REQUIRE(fill != 0);

  const std::uintptr_t bias = 0x555555554000u;
  heapprof::detail::ArenaVector<LoadedObject> objects(1);
  REQUIRE(MapLikeLoader(stripped, bias, objects[0]));
  objects[0].build_id = BuildIdOf(stripped);
  REQUIRE(!objects[0].build_id.empty());
  Symbolizer symbolizer(objects, "/nonexistent");
  heapprof::detail::ProfileData data;
  data.period = 1;
  heapprof::detail::ProfileSample sample;
  sample.pcs = {bias + fill + 9, bias + compute + 20};  // return addresses inside the two
  sample.alloc_objects = sample.inuse_objects = 1;
  sample.alloc_bytes = sample.inuse_bytes = sample.object_size = 4096;
  data.samples.push_back(sample);
  const std::string bytes(heapprof::detail::EncodeProfile(data, objects, symbolizer));
  heapprof_test::Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::DecodeProfile(bytes, p, &why), why);
  REQUIRE(p.mappings.size() == 1);
  CHECK_FALSE(p.mappings[0].has_functions);
  CHECK_FALSE(p.mappings[0].has_line_numbers);
  CHECK_FALSE(p.mappings[0].has_inline_frames);
  for (const auto& loc : p.locations) CHECK(loc.lines.empty());

  // What a symbolizer given the unstripped copy does with the profile (the
  // standalone pprof runs binutils so): the mapping turns each location into
  // a file address, and the copy names it. (`go tool pprof -symbolize=local`
  // on a real stripped program: tests/malloc/test_preload.cpp.)
  std::string input;
  for (const auto& loc : p.locations) {
    char buf[32];
    const std::uint64_t file_address = loc.address - p.mappings[0].memory_start + p.mappings[0].file_offset;
    std::snprintf(buf, sizeof buf, "0x%llx\n", static_cast<unsigned long long>(file_address));
    input += buf;
  }
  REQUIRE(heapprof_test::WriteFile(dir + "/addresses.txt", input));
  RunCommand("addr2line -f -C -e " + full + " < " + dir + "/addresses.txt", out);
  INFO(out);
  CHECK(out.find("fixture::Buffer::Fill(int)") != std::string::npos);
  CHECK(out.find("Compute(int)") != std::string::npos);
  if (std::getenv("HEAPPROF_TEST_KEEP") == nullptr) RunCommand("rm -rf " + dir, out);
  else MESSAGE("kept " << dir);
}

TEST_CASE("inflate: a zlib stream from zlib itself, and corrupt ones refused") {
  using heapprof::detail::inflate::ZlibInflate;
  // "hello hello hello\n" compressed by zlib (level 9): a back reference.
  const unsigned char packed[] = {0x78, 0xda, 0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0x57, 0xc8, 0x40,
                                  0x90, 0x5c, 0x00, 0x40, 0xb5, 0x06, 0x87};
  unsigned char out[18];
  const bool ok = ZlibInflate(packed, sizeof packed, out, sizeof out);
  CHECK(ok);
  if (ok) CHECK(std::memcmp(out, "hello hello hello\n", 18) == 0);
  // Wrong size, truncation, a flipped checksum: refused, never a fault.
  unsigned char small[10];
  CHECK_FALSE(ZlibInflate(packed, sizeof packed, small, sizeof small));
  CHECK_FALSE(ZlibInflate(packed, sizeof packed - 3, out, sizeof out));
  unsigned char bad[sizeof packed];
  std::memcpy(bad, packed, sizeof packed);
  bad[sizeof bad - 1] ^= 1;
  CHECK_FALSE(ZlibInflate(bad, sizeof bad, out, sizeof out));
  std::uint64_t rng = 7;
  for (int round = 0; round < 2000; ++round) {
    unsigned char noise[64];
    for (auto& b : noise) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<unsigned char>(rng >> 56);
    }
    noise[0] = 0x78;
    noise[1] = 0x9c;
    unsigned char sink[256];
    (void)ZlibInflate(noise, sizeof noise, sink, sizeof sink);
  }
}

namespace {

std::string Short(const char* full) {
  char buf[512];
  const std::size_t n = heapprof::detail::ShortFunctionName(full, buf, sizeof buf);
  return std::string(buf, n);
}

}  // namespace

TEST_CASE("ShortFunctionName: return types, templates, and qualifiers after any parameter list") {
  CHECK(Short("void std::vector<int, std::allocator<int> >::_M_realloc_insert<int>(int&&)") ==
        "std::vector::_M_realloc_insert");
  CHECK(Short("app::Cache::Fill() const") == "app::Cache::Fill");
  CHECK(Short("int app::Cache::Get(int) const &") == "app::Cache::Get");
  // A lambda in a qualified method: the qualifiers end no return type, and
  // two lambdas of two methods keep two names.
  CHECK(Short("app::Cache::Fill() const::{lambda()#1}::operator()() const") ==
        "app::Cache::Fill::{lambda()#1}::operator()");
  CHECK(Short("app::Cache::Drain() const::{lambda()#1}::operator()() const") ==
        "app::Cache::Drain::{lambda()#1}::operator()");
  CHECK(Short("app::Cache::Fill() &&::{lambda()#1}::operator()() const") ==
        "app::Cache::Fill::{lambda()#1}::operator()");
  CHECK(Short("app::Cache::Fill() &::{lambda()#1}::operator()() const") ==
        "app::Cache::Fill::{lambda()#1}::operator()");
  CHECK(Short("app::Cache::Fill() const volatile::{lambda()#1}::operator()() const") ==
        "app::Cache::Fill::{lambda()#1}::operator()");
  CHECK(Short("app::Cache::Fill() noexcept::{lambda()#1}::operator()() const") ==
        "app::Cache::Fill::{lambda()#1}::operator()");
  CHECK(Short("Encode(char const*, unsigned long)::{lambda()#4}::operator()() const::{lambda()#1}::operator()() "
              "const") == "Encode::{lambda()#4}::operator()::{lambda()#1}::operator()");
  // A function template returning a pointer or a reference to a function
  // or an array has its name inside the declarator (the demangled names of
  // g++'s ns::Pick<int> and ns::Row<int>); the short name was the return
  // type's last word ("void", "[4]").
  CHECK(Short("void (*ns::Pick<int>(int))(int)") == "ns::Pick");
  CHECK(Short("int (&ns::Row<int>(int (&) [4], int)) [4]") == "ns::Row");
  CHECK(Short("void (*ns::Holder<int>::Get() const)(int)") == "ns::Holder::Get");
  CHECK(Short("void (*(*ns::Chain<int>())(int))(char)") == "ns::Chain");
  CHECK(Short("ns::Foo::operator void (*)()() const") == "ns::Foo::operator void");
  // A literal operator keeps its name (it was "_kb").
  CHECK(Short("ns::lit::operator\"\" _kb(unsigned long long)") == "ns::lit::operator\"\" _kb");
  CHECK(Short("operator new[](unsigned long)") == "operator new[]");
  CHECK(Short("bool operator==<char>(S const&, S const&)") == "operator==");
}

TEST_CASE("dwarf: --gc-sections leaves the discarded function's ranges under a zero base; they name no live code") {
  // ld.bfd sets the DW_RLE_base_address of a discarded section to 0; the
  // DW_RLE_offset_pair entries after it become small ranges over live code.
  // Here the unused Dead inlines Helper `count` times; each inlined Helper's
  // else branch is laid out at Dead's end, in ranges reaching past 0x1000,
  // where main and LiveAlloc are. Where they land depends on the compiler's
  // code size: several counts (with GCC 12, 60 to 120 overlap).
  if (!HaveTool("g++") || !HaveTool("nm")) {
    MESSAGE("g++ or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  for (int count : {60, 80, 100, 120}) {
    CAPTURE(count);
    std::string source =
        "#include <cstdlib>\n"
        "char* volatile g_sink;\n"
        "int volatile g_n;\n"
        "static inline __attribute__((always_inline)) void Helper(int i) {\n"
        "  if (g_n > i) { g_sink = static_cast<char*>(std::malloc(static_cast<unsigned>(i))); }\n"
        "  else { g_n = i; g_n = i * 3; g_n = i * 5; g_n = i * 7; g_n = i * 9; g_n = i * 11; }\n"
        "}\n"
        "void Dead(int i) {\n";  // line 8
    for (int k = 0; k < count; ++k) source += "  Helper(i + " + std::to_string(k) + ");\n";
    source +=
        "}\n"
        "__attribute__((noinline)) void LiveAlloc(int n) {\n"
        "  g_sink = new char[static_cast<unsigned>(n)];\n"  // line count + 11
        "}\n"
        "int main(int argc, char**) {\n"
        "  LiveAlloc(argc + 11);\n"
        "  return 0;\n"
        "}\n";
    REQUIRE(heapprof_test::WriteFile(dir + "/gc.cc", source));
    const std::string binary = dir + "/gc_" + std::to_string(count);
    std::string out;
    REQUIRE_MESSAGE(RunCommand("g++ -std=c++17 -O2 -gdwarf-5 -ffunction-sections -Wl,--gc-sections " + dir +
                                   "/gc.cc -o " + binary,
                               out) == 0,
                    out);
    REQUIRE(SymbolAddress(binary, "_Z4Deadi") == 0);  // really discarded
    heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
    Symbolizer symbolizer(objects);
    REQUIRE(symbolizer.HasDebugInfo(0));
    const std::vector<std::uint64_t> addresses = FunctionAddresses(binary);
    REQUIRE(!addresses.empty());
    const std::string alloc_line = "gc.cc:" + std::to_string(count + 11);
    std::size_t wrong = 0, alloc = 0;
    for (std::uint64_t a : addresses) {
      const Frames ours = Ours(symbolizer, a);
      bool bad = false;
      for (const Frame& f : ours) bad = bad || f.function.find("Helper") != std::string::npos;
      alloc += ours.size() == 1 && ours[0].function == "LiveAlloc(int)" &&
               ours[0].location.find(alloc_line) != std::string::npos;
      if (bad && ++wrong <= 3) MESSAGE("address 0x" << std::hex << a << std::dec << ": " << Show(ours));
    }
    CHECK(wrong == 0);
    CHECK(alloc > 0);
  }
  std::string out;
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: an inline chain deeper than the frames asked for keeps the real function and its call line") {
  // F<40> inlines F<39> ... F<0>: 42 frames with Outer. The frames asked
  // for are 32: the innermost, a marker for the middle, and the outermost
  // ones, Outer last with the line that called F<40>.
  if (!HaveTool("g++") || !HaveTool("nm")) {
    MESSAGE("g++ or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source =
      "char* volatile g_sink;\n"
      "template <int N>\n"
      "__attribute__((always_inline)) inline void F() {\n"
      "  if constexpr (N == 0) {\n"
      "    g_sink = new char[16];\n"  // line 5
      "  } else {\n"
      "    F<N - 1>();\n"  // line 7
      "  }\n"
      "}\n"
      "__attribute__((noinline)) void Outer() {\n"
      "  F<40>();\n"  // line 11
      "}\n"
      "int main() {\n"
      "  Outer();\n"
      "  return 0;\n"
      "}\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/deep.cc", source));
  const std::string binary = dir + "/deep";
  std::string out;
  REQUIRE_MESSAGE(RunCommand("g++ -std=c++17 -O2 -g " + dir + "/deep.cc -o " + binary, out) == 0, out);
  heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
  Symbolizer symbolizer(objects);
  REQUIRE(symbolizer.HasDebugInfo(0));
  const std::uint64_t outer = SymbolAddress(binary, "_Z5Outerv");
  REQUIRE(outer != 0);
  // The deepest chain in Outer: the call to operator new.
  Frames deepest;
  for (std::uint64_t a = outer; a < outer + 64; ++a) {
    Frames f = Ours(symbolizer, a);
    if (f.size() > deepest.size()) deepest = f;
  }
  INFO(Show(deepest));
  REQUIRE(deepest.size() == 32);
  CHECK(deepest.front().function == "void F<0>()");
  CHECK(deepest.front().location.find("deep.cc:5") != std::string::npos);
  CHECK(deepest[1].function == "void F<1>()");
  CHECK(deepest[1].location.find("deep.cc:7") != std::string::npos);
  CHECK(deepest.back().function == "Outer()");
  CHECK(deepest.back().location.find("deep.cc:11") != std::string::npos);
  CHECK(deepest[deepest.size() - 2].function == "void F<40>()");
  CHECK(deepest[deepest.size() - 2].location.find("deep.cc:7") != std::string::npos);
  std::size_t markers = 0;
  for (const Frame& f : deepest) markers += f.function == "[heapprof: inline frames omitted]";
  CHECK(markers == 1);
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: dwz -m's references into the shared file are read there; without it, unnamed frames keep their lines") {
  // dwz -m moves the DIEs two binaries share (inline functions' abstract
  // origins among them) into one file (.gnu_debugaltlink), and refers to
  // them with DW_FORM_GNU_ref_alt: an offset in that file, not in ours.
  // With the shared file beside the binary, every frame is named as in the
  // original; without it, those frames have their lines but no name, and
  // must not take another DIE's.
  const std::string fixture = FixturePath();
  if (fixture.empty() || !HaveTool("g++") || !HaveTool("dwz") || !HaveTool("nm")) {
    MESSAGE("fixture, g++, dwz or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  std::string out;
  const std::string a = dir + "/a", b = dir + "/b";
  REQUIRE(RunCommand("g++ -std=c++17 -O2 -gdwarf-4 " + fixture + " -o " + a + " && g++ -std=c++17 -O1 -gdwarf-4 " +
                         fixture + " -o " + b + " && cp " + a + " " + a + ".orig && cd " + dir +
                         " && dwz -m common.debug -M common.debug a b && mkdir alone && cp a alone/a",
                     out) == 0);
  RunCommand("readelf -wi " + a + " | grep -c 'DW_AT_abstract_origin: <alt'", out);
  REQUIRE(std::atoi(out.c_str()) > 0);  // the case under test is there

  heapprof::detail::ArenaVector<LoadedObject> orig_objects = WholeFile(a + ".orig");
  Symbolizer reference(orig_objects);
  const std::vector<std::uint64_t> addresses = FunctionAddresses(a);
  REQUIRE(!addresses.empty());
  {
    // With the shared file: the same frames as the original, all named.
    heapprof::detail::ArenaVector<LoadedObject> with_objects = WholeFile(a);
    Symbolizer with(with_objects);
    REQUIRE(with.HasDebugInfo(0));
    std::size_t differ = 0;
    for (std::uint64_t address : addresses) {
      const Frames ours = Ours(with, address), ref = Ours(reference, address);
      if (Show(ours) != Show(ref) && ++differ <= 5) {
        MESSAGE("address 0x" << std::hex << address << std::dec << ": dwz " << Show(ours) << "| original "
                             << Show(ref));
      }
    }
    CHECK(differ == 0);
  }
  // A copy alone in another directory: no shared file.
  heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(dir + "/alone/a");
  Symbolizer symbolizer(objects);
  REQUIRE(symbolizer.HasDebugInfo(0));
  std::size_t wrong = 0, unnamed = 0;
  std::vector<std::uint64_t> unnamed_addresses;
  for (std::uint64_t address : addresses) {
    const Frames ours = Ours(symbolizer, address), ref = Ours(reference, address);
    bool same = ours.size() == ref.size();
    bool has_unnamed = false;
    for (std::size_t k = 0; same && k < ours.size(); ++k) {
      // The line, and the name when it is known: never another function's.
      const std::string& loc = ours[k].location;
      const std::string& ref_loc = ref[k].location;
      same = loc.substr(loc.rfind(':')) == ref_loc.substr(ref_loc.rfind(':'));
      if (ours[k].function == "??") has_unnamed = true;
      else same = same && ours[k].function == ref[k].function;
    }
    if (has_unnamed) {
      ++unnamed;
      if (unnamed_addresses.size() < 16) unnamed_addresses.push_back(address);
    }
    if (!same && ++wrong <= 5) {
      MESSAGE("address 0x" << std::hex << address << std::dec << ": dwz " << Show(ours) << "| original "
                           << Show(ref));
    }
  }
  CHECK(wrong == 0);
  REQUIRE(unnamed > 0);

  // In a profile, an unnamed frame is a "??" Line: the location keeps every
  // frame's line, the allocating one first.
  heapprof::detail::ProfileData data;
  data.period = 1;
  heapprof::detail::ProfileSample sample;
  for (std::uint64_t address : unnamed_addresses) sample.pcs.push_back(static_cast<std::uintptr_t>(address + 1));
  sample.alloc_objects = sample.inuse_objects = 1;
  sample.alloc_bytes = sample.inuse_bytes = sample.object_size = 16;
  data.samples.push_back(sample);
  const std::string bytes(heapprof::detail::EncodeProfile(data, objects, symbolizer));
  heapprof_test::Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::DecodeProfile(bytes, p, &why), why);
  REQUIRE(p.locations.size() == unnamed_addresses.size());
  for (std::size_t i = 0; i < p.locations.size(); ++i) {
    const Frames ref = Ours(reference, p.locations[i].address);
    CAPTURE(Show(ref));
    CHECK(p.locations[i].lines.size() == ref.size());
  }
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: a function without a linkage name keeps its (anonymous namespace) in pprof's display") {
  // GCC writes no linkage name for Pool::Grow (a class with internal
  // linkage); the profile names it from its enclosing scopes. pprof takes a
  // name equal to the system name for one still to demangle, and simplifies
  // it, cutting "(anonymous namespace)": the system name must differ.
  if (!HaveTool("g++")) {
    MESSAGE("g++ missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source =
      "char* volatile g;\n"
      "namespace {\n"
      "struct Pool {\n"
      "  __attribute__((always_inline)) inline void Grow(int n) { g = new char[n]; }\n"
      "};\n"
      "__attribute__((noinline)) void Caller(int n) { Pool p; p.Grow(n); }\n"
      "}  // namespace\n"
      "int main(int argc, char**) { Caller(argc + 5); return 0; }\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/anon.cc", source));
  const std::string binary = dir + "/anon";
  std::string out;
  REQUIRE_MESSAGE(RunCommand("g++ -std=c++17 -O2 -g " + dir + "/anon.cc -o " + binary, out) == 0, out);
  const std::uint64_t caller = SymbolAddress(binary, "_ZN12_GLOBAL__N_16CallerEi");
  REQUIRE(caller != 0);
  heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
  Symbolizer symbolizer(objects);
  heapprof::detail::ProfileData data;
  data.period = 1;
  heapprof::detail::ProfileSample sample;
  for (std::uint64_t a = caller; a < caller + 32; ++a) sample.pcs.push_back(static_cast<std::uintptr_t>(a + 1));
  sample.alloc_objects = sample.inuse_objects = 1;
  sample.alloc_bytes = sample.inuse_bytes = sample.object_size = 4096;
  data.samples.push_back(sample);
  const std::string bytes(heapprof::detail::EncodeProfile(data, objects, symbolizer));
  heapprof_test::Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::DecodeProfile(bytes, p, &why), why);
  bool found = false;
  for (const auto& fn : p.functions) {
    if (fn.name != "(anonymous namespace)::Pool::Grow") continue;
    found = true;
    CHECK(fn.system_name != fn.name);
  }
  CHECK(found);
  if (!heapprof_test::GoBinary().empty()) {
    const std::string path = dir + "/anon.pb";
    REQUIRE(heapprof_test::WriteFile(path, bytes));
    REQUIRE(heapprof_test::GoPprof("-top -lines", path, out) == 0);
    INFO(out);
    CHECK(out.find("(anonymous namespace)::Pool::Grow ") != std::string::npos);
    CHECK(out.find(" ::Pool::Grow") == std::string::npos);
  }
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: GCC's inlined lambdas are named by the function that wrote them and their line") {
  // GCC gives an inlined lambda's operator() no linkage name: its DWARF name
  // is "operator()", which made pprof merge every lambda of a file into one
  // function. The closure type is an unnamed struct inside the function that
  // wrote the lambda; the frame is named from there.
  if (!HaveTool("g++")) {
    MESSAGE("g++ missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source =
      "char* volatile g;\n"
      "namespace app {\n"
      "__attribute__((noinline)) void Fill(int n) {\n"
      "  auto first = [](int k) { g = new char[k]; };\n"                           // line 4
      "  auto second = [](int k) { g = new char[k + 1]; };\n"                      // line 5
      "  auto outer = [](int k) {\n"                                               // line 6
      "    auto inner = [](int j) { g = new char[j + 2]; };\n"                     // line 7
      "    inner(k);\n"
      "  };\n"
      "  first(n); second(n); outer(n);\n"
      "}\n"
      "}  // namespace app\n"
      "namespace {\n"
      "__attribute__((noinline)) void Local(int n) { [](int k) { g = new char[k + 3]; }(n); }\n"  // line 14
      "}  // namespace\n"
      "int main(int argc, char**) { app::Fill(argc + 5); Local(argc); return 0; }\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/lambdas.cc", source));
  const std::string binary = dir + "/lambdas";
  std::string out;
  REQUIRE_MESSAGE(RunCommand("g++ -std=c++17 -O2 -g " + dir + "/lambdas.cc -o " + binary, out) == 0, out);
  heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
  Symbolizer symbolizer(objects);
  std::set<std::string> names;
  for (const char* symbol : {"_ZN3app4FillEi", "_ZN12_GLOBAL__N_15LocalEi"}) {
    const std::uint64_t start = SymbolAddress(binary, symbol);
    REQUIRE_MESSAGE(start != 0, symbol);
    for (std::uint64_t a = start; a < start + 160; ++a) {
      SymbolizedFrame frames[32];
      SymbolizedQuality quality;
      const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(a), frames, 32, &quality);
      for (int i = 0; i < n; ++i) names.emplace(frames[i].name);
    }
  }
  std::string all;
  for (const std::string& n : names) all += n + "\n";
  INFO(all);
  CHECK(names.count("app::Fill::{lambda at lambdas.cc:4}::operator()") == 1);
  CHECK(names.count("app::Fill::{lambda at lambdas.cc:5}::operator()") == 1);
  CHECK(names.count("app::Fill::{lambda at lambdas.cc:6}::operator()") == 1);
  CHECK(names.count("app::Fill::{lambda at lambdas.cc:6}::operator()::{lambda at lambdas.cc:7}::operator()") == 1);
  CHECK(names.count("(anonymous namespace)::Local::{lambda at lambdas.cc:14}::operator()") == 1);
  CHECK(names.count("operator()") == 0);
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: GCC's generic lambda with code of its own keeps its linkage name") {
  // GCC writes neither a linkage name nor a scope for a generic lambda's
  // operator() that has code of its own: only DW_AT_name "operator()<int>".
  // The symbol there was refused as not the DWARF's function, its short name
  // having no template arguments, so the frame lost the symbol's name (what
  // addr2line and llvm-symbolizer print) for "operator()<int>" as the
  // system and full name.
  if (!HaveTool("g++") || !HaveTool("nm")) {
    MESSAGE("g++ or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source =
      "char* volatile g;\n"
      "namespace app {\n"
      "__attribute__((noinline)) void Sorted(int n) {\n"
      "  auto make = [](auto k) { g = new char[k]; };\n"  // line 4
      "  make(n);\n"
      "}\n"
      "}  // namespace app\n"
      "int main(int argc, char**) { app::Sorted(argc); return 0; }\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/generic.cc", source));
  const std::string binary = dir + "/generic";
  std::string out;
  REQUIRE_MESSAGE(RunCommand("g++ -std=c++17 -O0 -g " + dir + "/generic.cc -o " + binary, out) == 0, out);
  const char* const symbol = "_ZZN3app6SortedEiENKUlT_E_clIiEEDaS0_";  // operator()<int>, GCC 12's mangling
  const std::uint64_t start = SymbolAddress(binary, symbol);
  if (start == 0) {
    MESSAGE("this g++ mangles the lambda otherwise: skipped");
    RunCommand("rm -rf " + dir, out);
    return;
  }
  heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
  Symbolizer symbolizer(objects);
  REQUIRE(symbolizer.HasDebugInfo(0));
  for (std::uint64_t a = start; a < start + 12; ++a) {
    SymbolizedFrame frames[32];
    SymbolizedQuality quality;
    const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(a), frames, 32, &quality);
    REQUIRE(n == 1);
    CHECK(frames[0].name == "app::Sorted::{lambda(auto:1)#1}::operator()");
    CHECK(frames[0].system_name == symbol);
    CHECK(frames[0].full_name == "auto app::Sorted(int)::{lambda(auto:1)#1}::operator()<int>(int) const");
    CHECK(frames[0].file == dir + "/generic.cc");
    CHECK(frames[0].line == 4);
  }
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: a function named from its DWARF scopes has no template arguments, as one named from its linkage name") {
  // GCC writes no linkage name for a member of a template instantiated with
  // a type of an anonymous namespace (internal linkage): hello_heap's
  // std::map<std::string, Document> node allocations were named
  // "std::__new_allocator<std::_Rb_tree_node<std::pair<...Document> > >::allocate"
  // beside "std::__new_allocator::allocate" for the other instantiations, one
  // function split in two rows of go tool pprof -top.
  if (!HaveTool("g++") || !HaveTool("nm")) {
    MESSAGE("g++ or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source =
      "#include <vector>\n"
      "char* volatile g;\n"
      "void* volatile gv;\n"
      "namespace {\n"
      "struct Doc { int x[4]; };\n"
      "template <class T> struct Pool {\n"
      "  __attribute__((always_inline)) inline void Grow(int n) { g = new char[n * sizeof(T)]; }\n"
      "  template <class U> __attribute__((always_inline)) inline void Fill(U n) { g = new char[n]; }\n"
      "};\n"
      "__attribute__((noinline)) void Caller(int n) {\n"
      "  Pool<int> p; p.Grow(n);\n"
      "  Pool<Doc> q; q.Fill<short>(static_cast<short>(n));\n"
      "}\n"
      "__attribute__((noinline)) void Vec(int n) { gv = new std::vector<Doc>(static_cast<unsigned>(n)); }\n"
      "}  // namespace\n"
      "int main(int argc, char**) { Caller(argc + 5); Vec(argc + 5); return 0; }\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/tmpl.cc", source));
  const std::string binary = dir + "/tmpl";
  std::string out;
  REQUIRE_MESSAGE(RunCommand("g++ -std=c++17 -O2 -g " + dir + "/tmpl.cc -o " + binary, out) == 0, out);
  heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
  Symbolizer symbolizer(objects);
  REQUIRE(symbolizer.HasDebugInfo(0));
  std::map<std::string, std::string> names;  // name -> its system name
  for (std::uint64_t address : FunctionAddresses(binary)) {
    SymbolizedFrame frames[32];
    SymbolizedQuality quality;
    const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(address), frames, 32, &quality);
    for (int i = 0; i < n; ++i) names[std::string(frames[i].name)] = std::string(frames[i].system_name);
  }
  std::string all;
  for (const auto& entry : names) all += "  " + entry.first + " (" + entry.second + ")\n";
  INFO("names:\n" << all);
  CHECK(names.count("(anonymous namespace)::Pool::Grow") == 1);
  CHECK(names.count("(anonymous namespace)::Pool::Fill") == 1);
  CHECK(names.count("std::__new_allocator::allocate") == 1);
  for (const auto& entry : names) {
    const std::string& name = entry.first;
    CAPTURE(name);
    CHECK((name.find('<') == std::string::npos || name.find("operator<") != std::string::npos));
    // pprof takes a name equal to its system name for one still to demangle.
    if (name.find("(anonymous namespace)") != std::string::npos) CHECK(name != entry.second);
  }
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: a function's start line comes from its declaration when the linkage name is on its definition") {
  // clang puts a method defined in its class (and a lambda's operator()) at a
  // DIE with the linkage name and a DW_AT_specification; decl_file and
  // decl_line are only on the declaration. The reader stopped at the linkage
  // name, so these functions had start_line 0 in every profile.
  if (!HaveTool("clang++") || !HaveTool("nm")) {
    MESSAGE("clang++ or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source =
      "char* volatile g;\n"
      "struct Widget {\n"
      "  __attribute__((noinline)) ~Widget() { g = new char[3]; }\n"              // line 3
      "  __attribute__((noinline)) void Grow(int n) { g = new char[n]; }\n"       // line 4
      "};\n"
      "__attribute__((noinline)) void Local(int n) {\n"                          // line 6
      "  struct L { __attribute__((noinline)) static void F(int k) { g = new char[k]; } };\n"  // line 7
      "  L::F(n);\n"
      "  auto lambda = [](int k) __attribute__((noinline)) { g = new char[k + 1]; };\n"  // line 9
      "  lambda(n);\n"
      "}\n"
      "int main(int argc, char**) { { Widget w; w.Grow(argc); } Local(argc); return 0; }\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/decl.cc", source));
  const std::string binary = dir + "/decl";
  std::string out;
  REQUIRE_MESSAGE(RunCommand("clang++ -std=c++17 -O0 -g " + dir + "/decl.cc -o " + binary, out) == 0, out);
  heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
  Symbolizer symbolizer(objects);
  REQUIRE(symbolizer.HasDebugInfo(0));
  const struct {
    const char* symbol;
    std::uint32_t line;
  } expected[] = {
      {"_ZN6WidgetD2Ev", 3}, {"_ZN6Widget4GrowEi", 4}, {"_Z5Locali", 6},
      {"_ZZ5LocaliEN1L1FEi", 7}, {"_ZZ5LocaliENK3$_0clEi", 9},
  };
  for (const auto& e : expected) {
    CAPTURE(e.symbol);
    const std::uint64_t address = SymbolAddress(binary, e.symbol);
    REQUIRE(address != 0);
    SymbolizedFrame frames[32];
    SymbolizedQuality quality;
    const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(address + 4), frames, 32, &quality);
    REQUIRE(n >= 1);
    CHECK(frames[n - 1].system_name == e.symbol);
    CHECK(frames[n - 1].start_line == e.line);
    CHECK(frames[n - 1].function_file == dir + "/decl.cc");
  }
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: -gline-tables-only and -g1 name an ABI-tagged function from its symbol, as with -g") {
  // clang's -gline-tables-only and -g1 write DW_AT_name only ("Build"; and
  // a subprogram DIE only for a function with inlined calls, hence Make), so
  // the outermost frame is named from the symbol table, once the symbol is
  // known to be the same function. The check compared "app::Build[abi:v2]"
  // with "...::Build" and failed on the ABI tag: every function returning a
  // std::string (tag cxx11) was named plain "Build", without its namespace
  // or class, where addr2line and llvm-symbolizer print
  // "app::Build[abi:cxx11](int)".
  if (!HaveTool("clang++") || !HaveTool("nm")) {
    MESSAGE("clang++ or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source =
      "char* volatile g;\n"
      "namespace app {\n"
      "__attribute__((always_inline)) inline char* Make(int n) { return g = new char[n]; }\n"  // line 3
      "struct Shop {\n"
      "  __attribute__((noinline, abi_tag(\"v2\"))) char* Name(int n) const { return Make(n + 2); }\n"
      "};\n"
      "__attribute__((noinline, abi_tag(\"v2\"))) char* Build(int n) { return Make(n + 1); }\n"
      "}  // namespace app\n"
      "int main(int argc, char**) { app::Shop s; s.Name(argc); app::Build(argc); return 0; }\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/tag.cc", source));
  std::string out;
  for (const char* flags : {"-gline-tables-only", "-g1", "-g"}) {
    const std::string flag_text = flags;
    CAPTURE(flag_text);
    const std::string binary = dir + "/tag" + std::to_string(std::strlen(flags));
    REQUIRE_MESSAGE(
        RunCommand(std::string("clang++ -std=c++17 -O2 ") + flags + " " + dir + "/tag.cc -o " + binary, out) == 0, out);
    heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
    Symbolizer symbolizer(objects);
    REQUIRE(symbolizer.HasDebugInfo(0));
    const struct {
      const char* symbol;
      const char* name;
      const char* full_name;
    } expected[] = {
        {"_ZN3app5BuildB2v2Ei", "app::Build[abi:v2]", "app::Build[abi:v2](int)"},
        {"_ZNK3app4Shop4NameB2v2Ei", "app::Shop::Name[abi:v2]", "app::Shop::Name[abi:v2](int) const"},
    };
    for (const auto& e : expected) {
      const std::string symbol = e.symbol;
      CAPTURE(symbol);
      const std::uint64_t address = SymbolAddress(binary, e.symbol);
      REQUIRE(address != 0);
      int inlined = 0;
      for (std::uint64_t a = address; a < address + 12; ++a) {  // both functions are longer
        SymbolizedFrame frames[32];
        SymbolizedQuality quality;
        const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(a), frames, 32, &quality);
        REQUIRE(n >= 1);
        CHECK(frames[n - 1].name == e.name);
        CHECK(frames[n - 1].full_name == e.full_name);
        CHECK(frames[n - 1].system_name == e.symbol);
        CHECK(frames[0].file == dir + "/tag.cc");
        if (n == 2) {
          ++inlined;
          CHECK(frames[0].line == 3);
        }
      }
      CHECK(inlined > 0);
    }
  }
  RunCommand("rm -rf " + dir, out);
}

// The split-DWARF programs: Make inlined into Build; and another program
// whose .dwo has the same name and another dwo_id.
const char* const kSplitSource =
    "char* volatile g;\n"
    "__attribute__((always_inline)) inline char* Make(int n) { return g = new char[n]; }\n"  // line 2
    "__attribute__((noinline)) char* Build(int n) { return Make(n + 1); }\n"                 // line 3
    "int main(int argc, char**) { Build(argc); return 0; }\n";
const char* const kSplitOther = "int main() { return 3; }\n";

TEST_CASE("dwarf: split DWARF reads the .dwo by comp_dir or beside the program; missing or mismatched or corrupt gives names only") {
  // g++/clang++ -gsplit-dwarf leave in the program a skeleton unit naming
  // its .dwo (DW_AT_dwo_name, DW_AT_GNU_dwo_name), with the line table but
  // none of the functions. The .dwo was not read: names only, from the
  // symbol table. It is now, found relative to DW_AT_comp_dir or beside the
  // program, and used only when its split unit has the skeleton's dwo_id.
  // Without it (gone, another build's, damaged) names only, as before: the
  // line table alone would put the inlined call's line in the function it
  // was inlined into ("Build" at line 2, which is Make's). A skeleton that
  // describes its inline chains itself (clang's -fsplit-dwarf-inlining)
  // still gives them without the .dwo.
  if (!HaveTool("nm")) {
    MESSAGE("nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source = kSplitSource;
  const std::string other = kSplitOther;
  std::string out;
  const struct {
    const char* compiler;
    const char* flags;
    bool skeleton_chains;
  } variants[] = {
      {"g++", "-O2 -gdwarf-4 -gsplit-dwarf", false},
      {"g++", "-O2 -gdwarf-5 -gsplit-dwarf", false},
      {"clang++", "-O2 -gdwarf-4 -gsplit-dwarf", false},
      {"clang++", "-O2 -gdwarf-5 -gsplit-dwarf", false},
      {"clang++", "-O2 -gdwarf-4 -gsplit-dwarf -fsplit-dwarf-inlining", true},
  };
  enum Expect { kChain, kNamesOnly, kNoCrash };
  int built = 0;
  for (const auto& v : variants) {
    if (!HaveTool(v.compiler)) continue;
    const std::string what = std::string(v.compiler) + " " + v.flags;
    CAPTURE(what);
    const std::string d = dir + "/v" + std::to_string(built++);
    REQUIRE(RunCommand("mkdir -p " + d + "/other " + d + "/moved " + d + "/gone " + d + "/bad", out) == 0);
    REQUIRE(heapprof_test::WriteFile(d + "/split.cc", source));
    REQUIRE(heapprof_test::WriteFile(d + "/other/split.cc", other));
    // From the directory, where the .dwo files go (GCC: prog-split.dwo, clang: split.dwo).
    REQUIRE_MESSAGE(RunCommand("cd " + d + " && " + what + " split.cc -o prog", out) == 0, out);
    REQUIRE_MESSAGE(RunCommand("cd " + d + "/other && " + what + " split.cc -o prog", out) == 0, out);
    const std::uint64_t build = SymbolAddress(d + "/prog", "_Z5Buildi");
    REQUIRE(build != 0);
    // A new path for each case: the debug-info cache keys objects by path.
    auto check = [&](const std::string& binary, Expect expect) {
      CAPTURE(binary);
      heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
      Symbolizer symbolizer(objects);
      int chains = 0;
      for (std::uint64_t a = build; a < build + 12; ++a) {
        SymbolizedFrame frames[32];
        SymbolizedQuality quality;
        const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(a), frames, 32, &quality);
        REQUIRE(n >= 1);
        CHECK(frames[n - 1].name == "Build");
        if (expect == kNoCrash) continue;
        if (expect == kNamesOnly && !v.skeleton_chains) {
          CHECK(n == 1);
          CHECK(!quality.line);
          CHECK(frames[0].file.empty());
          CHECK(frames[0].line == 0);
          continue;
        }
        CHECK(quality.line);
        CHECK(frames[n - 1].line == 3);
        if (n == 2) {
          ++chains;
          CHECK(frames[0].name == "Make");
          CHECK(frames[0].line == 2);
        }
      }
      if (expect != kNoCrash && (expect == kChain || v.skeleton_chains)) CHECK(chains > 0);
    };
    check(d + "/prog", kChain);  // the .dwo where DW_AT_comp_dir says
    // The oom dump's reads (a reserve sized for names: only DWARF already
    // read): the program's DWARF loaded, its .dwo not yet opened. The .dwo is
    // not opened then (names only), and is by the next profile (before: it
    // was opened cold under the reserve, and a failure there for want of
    // memory lost the unit's lines for good).
    REQUIRE(RunCommand("mkdir " + d + "/cold && cp " + d + "/prog " + d + "/cold/prog", out) == 0);
    {
      heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(d + "/cold/prog");
      Symbolizer symbolizer(objects);
      const std::uint64_t start = SymbolAddress(d + "/cold/prog", "_start");
      REQUIRE(start != 0);
      SymbolizedFrame frames[32];
      SymbolizedQuality quality;
      symbolizer.Symbolize(static_cast<std::uintptr_t>(start), frames, 32, &quality);  // loads the DWARF (no unit)
      struct CachedOnly {
        CachedOnly() { heapprof::detail::tls_symbolize_cached_debug_only = true; }
        ~CachedOnly() { heapprof::detail::tls_symbolize_cached_debug_only = false; }
      };
      {
        CachedOnly cached_only;
        check(d + "/cold/prog", kNamesOnly);
      }
      check(d + "/cold/prog", kChain);
    }
    // Program and .dwo moved together: found beside the program.
    REQUIRE(RunCommand("cd " + d + " && cp prog moved/prog && mv *.dwo moved/", out) == 0);
    check(d + "/moved/prog", kChain);
    // No .dwo anywhere.
    REQUIRE(RunCommand("cp " + d + "/prog " + d + "/gone/prog", out) == 0);
    check(d + "/gone/prog", kNamesOnly);
    // Beside it, another build's .dwo of the same name: its dwo_id differs.
    REQUIRE(RunCommand("cp " + d + "/prog " + d + "/other/prog_copy", out) == 0);
    check(d + "/other/prog_copy", kNamesOnly);
    // The right .dwo, damaged: its .debug_info.dwo cut short (the unit's
    // length past the section), then garbage over its DIEs.
    REQUIRE(RunCommand("cp " + d + "/prog " + d + "/bad/prog && cp " + d + "/moved/*.dwo " + d + "/bad/", out) == 0);
    REQUIRE(RunCommand("cd " + d + "/bad && f=$(ls *.dwo) && objcopy --dump-section .debug_info.dwo=info $f && "
                       "head -c 30 info > cut && objcopy --update-section .debug_info.dwo=cut $f",
                       out) == 0);
    check(d + "/bad/prog", kNamesOnly);
    REQUIRE(RunCommand("mkdir " + d + "/bad2 && cp " + d + "/prog " + d + "/bad2/prog && cp " + d + "/moved/*.dwo " +
                           d + "/bad2/ && cd " + d + "/bad2 && f=$(ls *.dwo) && "
                           "objcopy --dump-section .debug_info.dwo=info $f && size=$(stat -c %s info) && "
                           "(head -c 24 info; tail -c +4097 ../prog | head -c $((size - 24))) > junk && "
                           "objcopy --update-section .debug_info.dwo=junk $f",
                       out) == 0);
    check(d + "/bad2/prog", kNoCrash);
    // A FIFO where the .dwo should be: open() waited for a writer, and the
    // profile write with it, forever. In a child with a deadline: a hang
    // fails the test (exit status 0: names only, at once).
    REQUIRE(RunCommand("mkdir " + d + "/fifo && cp " + d + "/prog " + d + "/fifo/prog && cd " + d +
                           "/moved && for f in *.dwo; do mkfifo ../fifo/$f; done",
                       out) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      alarm(30);
      heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(d + "/fifo/prog");
      Symbolizer symbolizer(objects);
      SymbolizedFrame frames[32];
      SymbolizedQuality quality;
      const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(build), frames, 32, &quality);
      _exit(n >= 1 && frames[n - 1].name == "Build" ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(status == 0);
  }
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: a .dwp package beside the program gives the split units' inline chains; another build's gives names only") {
  // dwp (binutils, DWARF 4) and llvm-dwp (DWARF 4 and 5) pack a program's
  // .dwo files into "<program>.dwp", indexed by dwo_id (.debug_cu_index).
  // Without the .dwo files, the package was not read: names only.
  if (!HaveTool("nm") || !HaveTool("objcopy")) {
    MESSAGE("nm or objcopy missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source = kSplitSource;
  const std::string other = kSplitOther;
  std::string out;
  const struct {
    const char* compiler;
    const char* flags;
    const char* packer;
  } variants[] = {
      {"g++", "-O2 -gdwarf-4 -gsplit-dwarf", "dwp"},
      {"g++", "-O2 -gdwarf-4 -gsplit-dwarf", "llvm-dwp"},
      {"g++", "-O2 -gdwarf-5 -gsplit-dwarf", "llvm-dwp"},
      {"clang++", "-O2 -gdwarf-4 -gsplit-dwarf", "llvm-dwp"},
      {"clang++", "-O2 -gdwarf-5 -gsplit-dwarf", "llvm-dwp"},
  };
  int built = 0;
  for (const auto& v : variants) {
    if (!HaveTool(v.compiler) || !HaveTool(v.packer)) continue;
    const std::string what = std::string(v.compiler) + " " + v.flags;
    const std::string pack = std::string(v.packer) + " -e prog -o prog.dwp && rm -f *.dwo";
    const std::string packer = v.packer;
    CAPTURE(what);
    CAPTURE(packer);
    const std::string d = dir + "/v" + std::to_string(built++);
    REQUIRE(RunCommand("mkdir -p " + d + "/other", out) == 0);
    REQUIRE(heapprof_test::WriteFile(d + "/split.cc", source));
    REQUIRE(heapprof_test::WriteFile(d + "/other/split.cc", other));
    REQUIRE_MESSAGE(RunCommand("cd " + d + " && " + what + " split.cc -o prog && " + pack, out) == 0, out);
    REQUIRE_MESSAGE(RunCommand("cd " + d + "/other && " + what + " split.cc -o prog && " + pack, out) == 0, out);
    const std::uint64_t build = SymbolAddress(d + "/prog", "_Z5Buildi");
    REQUIRE(build != 0);
    // How many of Build's first 12 bytes give the inline chain; `lined`:
    // how many have a line at all (none: names only).
    auto chains_of = [&](const std::string& binary, int* lined) {
      CAPTURE(binary);
      heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
      Symbolizer symbolizer(objects);
      int chains = 0;
      *lined = 0;
      for (std::uint64_t a = build; a < build + 12; ++a) {
        SymbolizedFrame frames[32];
        SymbolizedQuality quality;
        const int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(a), frames, 32, &quality);
        REQUIRE(n >= 1);
        CHECK(frames[n - 1].name == "Build");
        if (quality.line) ++*lined;
        if (n == 1) {
          if (quality.line) CHECK(frames[0].line == 3);
          continue;
        }
        CHECK(n == 2);
        CHECK(frames[0].name == "Make");
        CHECK(frames[0].line == 2);
        CHECK(frames[1].line == 3);
        ++chains;
      }
      return chains;
    };
    int lined = 0;
    CHECK(chains_of(d + "/prog", &lined) > 0);
    // Another build's package under this program's name: no unit with its ids.
    REQUIRE(RunCommand("cp " + d + "/prog " + d + "/other/mine && cp " + d + "/other/prog.dwp " + d + "/other/mine.dwp",
                       out) == 0);
    CHECK(chains_of(d + "/other/mine", &lined) == 0);
    CHECK(lined == 0);
    // The package's index overwritten (its signatures and rows): no crash.
    REQUIRE(RunCommand("cd " + d + " && cp prog bad && objcopy --dump-section .debug_cu_index=index prog.dwp && "
                       "size=$(stat -c %s index) && (head -c 16 index; tail -c +4097 prog | head -c $((size - 16))) "
                       "> junk && objcopy --update-section .debug_cu_index=junk prog.dwp bad.dwp",
                       out) == 0);
    (void)chains_of(d + "/bad", &lined);
  }
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("dwarf: a program of many units built -gsplit-dwarf -gz gives inline chains in every unit") {
  // -gz compresses the .dwo files' sections too; each is inflated into debug
  // memory. A fixed table of 24 inflated sections (enough for one file and
  // its dwz file) filled after a dozen .dwo files: the units past them got
  // names only (12 of 16 here).
  if (!HaveTool("g++") || !HaveTool("nm")) {
    MESSAGE("g++ or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  constexpr int kUnits = 16;
  std::string out, objects, calls;
  for (int i = 0; i < kUnits; ++i) {
    const std::string n = std::to_string(i);
    REQUIRE(heapprof_test::WriteFile(
        dir + "/t" + n + ".cc",
        "char* volatile g" + n + ";\n"
        "__attribute__((always_inline)) inline char* Make" + n + "(int n) { return g" + n + " = new char[n]; }\n"
        "__attribute__((noinline)) char* Build" + n + "(int n) { return Make" + n + "(n + " + n + "); }\n"));
    REQUIRE_MESSAGE(RunCommand("cd " + dir + " && g++ -g -O2 -gsplit-dwarf -gz -c t" + n + ".cc", out) == 0, out);
    objects += " t" + n + ".o";
    calls += "char* Build" + n + "(int); ";
  }
  calls += "int main(int c, char**) {";
  for (int i = 0; i < kUnits; ++i) calls += " Build" + std::to_string(i) + "(c);";
  calls += " return 0; }\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/main.cc", calls));
  REQUIRE_MESSAGE(RunCommand("cd " + dir + " && g++ -g -O2 -gsplit-dwarf -gz main.cc" + objects + " -o prog", out) == 0,
                  out);
  heapprof::detail::ArenaVector<LoadedObject> objects_loaded = WholeFile(dir + "/prog");
  Symbolizer symbolizer(objects_loaded);
  int chains = 0;
  for (int i = 0; i < kUnits; ++i) {
    const std::string n = std::to_string(i);
    CAPTURE(n);
    const std::uint64_t build = SymbolAddress(dir + "/prog", "_Z" + std::to_string(5 + n.size()) + "Build" + n + "i");
    REQUIRE(build != 0);
    bool chain = false;
    for (std::uint64_t a = build; a < build + 12 && !chain; ++a) {
      SymbolizedFrame frames[32];
      SymbolizedQuality quality;
      const int k = symbolizer.Symbolize(static_cast<std::uintptr_t>(a), frames, 32, &quality);
      chain = k == 2 && frames[0].name == "Make" + n && frames[0].line == 2 && frames[1].name == "Build" + n &&
              frames[1].line == 3;
    }
    CHECK(chain);
    chains += chain ? 1 : 0;
  }
  CHECK(chains == kUnits);
  RunCommand("rm -rf " + dir, out);
}

TEST_CASE("symbols: a return address at a function's first byte after padding names that function") {
  // A signal handler returns to glibc's __restore_rt, a makecontext
  // coroutine to __start_context: return addresses nobody's call pushed, at
  // the function's first byte. The instruction looked up, one byte before,
  // is padding in no symbol: those frames were unnamed ([libc.so.6]).
  if (!HaveTool("g++") || !HaveTool("nm")) {
    MESSAGE("g++ or nm missing: skipped");
    return;
  }
  const std::string dir = TempDir();
  REQUIRE(!dir.empty());
  const std::string source =
      "asm(\".text\\n.p2align 4\\n"
      ".globl before_gap\\n.type before_gap,@function\\nbefore_gap: ret\\n.size before_gap, 1\\n"
      "nop\\nnop\\n"
      ".globl trampoline\\n.type trampoline,@function\\ntrampoline: nop\\nret\\n.size trampoline, 2\\n\");\n"
      "int main() { return 0; }\n";
  REQUIRE(heapprof_test::WriteFile(dir + "/gap.cc", source));
  const std::string binary = dir + "/gap";
  std::string out;
  REQUIRE_MESSAGE(RunCommand("g++ -O1 " + dir + "/gap.cc -o " + binary, out) == 0, out);
  const std::uint64_t trampoline = SymbolAddress(binary, "trampoline");
  const std::uint64_t before = SymbolAddress(binary, "before_gap");
  REQUIRE(trampoline != 0);
  REQUIRE(trampoline == before + 3);
  heapprof::detail::ArenaVector<LoadedObject> objects = WholeFile(binary);
  Symbolizer symbolizer(objects);
  SymbolizedFrame frames[4];
  SymbolizedQuality quality;
  // The return address `trampoline`: the frame's address is one byte before.
  int n = symbolizer.Symbolize(static_cast<std::uintptr_t>(trampoline - 1), frames, 4, &quality);
  REQUIRE(n == 1);
  CHECK(frames[0].name == "trampoline");
  CHECK(frames[0].system_name == "trampoline");
  // Inside the function, as before; the other padding byte names nothing.
  n = symbolizer.Symbolize(static_cast<std::uintptr_t>(trampoline), frames, 4, &quality);
  REQUIRE(n == 1);
  CHECK(frames[0].name == "trampoline");
  CHECK(symbolizer.Symbolize(static_cast<std::uintptr_t>(before + 1), frames, 4, &quality) == 0);
  n = symbolizer.Symbolize(static_cast<std::uintptr_t>(before), frames, 4, &quality);
  REQUIRE(n == 1);
  CHECK(frames[0].name == "before_gap");
  RunCommand("rm -rf " + dir, out);
}
