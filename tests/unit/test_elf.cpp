// Loaded objects and in-process symbolization, checked against what the kernel
// (/proc/self/maps), binutils (readelf -n, objcopy) and the compiler (function
// addresses) say about this very test process.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "support/profile_io.hpp"

// Hand-written functions with and without .size, to pin down the rules for
// size-0 symbols: one is trusted up to the next symbol, a sized function is
// never stretched past its end.
#if defined(__x86_64__) || defined(__aarch64__)
#define HEAPPROF_TEST_HAVE_ASM_SYMBOLS 1
asm(R"(
  .pushsection .text
  .p2align 4
  .globl heapprof_test_elf_nosize
  .type heapprof_test_elf_nosize, %function
heapprof_test_elf_nosize:
  nop
  nop
  nop
  nop
  nop
  nop
  nop
  nop
  .globl heapprof_test_elf_sized
  .type heapprof_test_elf_sized, %function
heapprof_test_elf_sized:
  nop
  nop
  nop
  nop
  .size heapprof_test_elf_sized, . - heapprof_test_elf_sized
  nop
  nop
  nop
  nop
  nop
  nop
  nop
  nop
  ret
  .p2align 4
  .globl heapprof_test_elf_outer
  .type heapprof_test_elf_outer, %function
heapprof_test_elf_outer:
  nop
  nop
  nop
  nop
  .globl heapprof_test_elf_inner
  .type heapprof_test_elf_inner, %function
heapprof_test_elf_inner:
  nop
  nop
  nop
  nop
  .size heapprof_test_elf_outer, . - heapprof_test_elf_outer
  nop
  nop
  nop
  nop
  nop
  nop
  nop
  nop
  ret
  .popsection
)");
// Every instruction above is one nop (or the final ret): offsets below count
// instructions of this size.
#if defined(__x86_64__)
constexpr std::uintptr_t kInsn = 1;
#else
constexpr std::uintptr_t kInsn = 4;
#endif
extern "C" void heapprof_test_elf_nosize();
extern "C" void heapprof_test_elf_sized();
extern "C" void heapprof_test_elf_outer();
extern "C" void heapprof_test_elf_inner();
#endif

namespace {

using heapprof::detail::CollectProfileObjects;
using heapprof::detail::LoadedObject;
using heapprof::detail::Symbolizer;

volatile int g_sink = 0;

__attribute__((noinline)) int elf_test_anonymous_fn(int x) {
  for (int i = 0; i < x; ++i) g_sink = g_sink + i;
  return g_sink;
}

}  // namespace

// Internal linkage through `static` rather than the unnamed namespace: mangled
// with _ZL, demangled without a namespace prefix.
static __attribute__((noinline)) int elf_test_static_fn(int x) {
  for (int i = 0; i < x; ++i) g_sink = g_sink + 3 * i;
  return g_sink;
}

namespace mytest {
template <class T>
struct Foo {
  static __attribute__((noinline)) T bar(T x) {
    for (T i = 0; i < x; ++i) g_sink = g_sink + static_cast<int>(i);
    return x;
  }
};
template struct Foo<int>;
}  // namespace mytest

namespace {

template <class Fn>
std::uintptr_t AddressOf(Fn* fn) {
  return reinterpret_cast<std::uintptr_t>(fn);
}

std::string RealPath(const std::string& path) {
  std::unique_ptr<char, heapprof::detail::elf::FreeDeleter> real(::realpath(path.c_str(), nullptr));
  return real ? std::string(real.get()) : std::string();
}

std::string BaseName(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

using heapprof_test::HaveTool;

std::string RunCommand(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  ::pclose(pipe);
  return out;
}

// The id as binutils prints it, or "" when readelf shows none.
std::string ReadelfBuildId(const std::string& path) {
  const std::string out = RunCommand("readelf -n '" + path + "' 2>/dev/null");
  const std::string key = "Build ID: ";
  const std::size_t at = out.find(key);
  if (at == std::string::npos) return std::string();
  std::size_t end = at + key.size();
  while (end < out.size() && std::isxdigit(static_cast<unsigned char>(out[end]))) ++end;
  return out.substr(at + key.size(), end - at - key.size());
}

const LoadedObject* FindByBaseName(const heapprof::detail::ArenaVector<LoadedObject>& objects, const char* name) {
  for (const LoadedObject& o : objects) {
    if (BaseName(std::string(o.path)) == name) return &o;
  }
  return nullptr;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A file in a private temporary directory, removed with it.
class ElfTempDir {
 public:
  ElfTempDir() {
    char tmpl[] = "/tmp/heapprof_elf_XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~ElfTempDir() {
    if (!path_.empty()) RunCommand("rm -rf '" + path_ + "'");
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string file = path_ + "/" + name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return file;
  }

 private:
  std::string path_;
};

// A stand-in for the main program whose file is `path`: lookups of the test's
// own functions land in this object and so read that file.
LoadedObject MainProgramAt(const std::string& path) {
  LoadedObject o = CollectProfileObjects().at(0);
  o.path = path;
  o.build_id.clear();
  return o;
}

// One /proc/self/maps line.
struct MapsLine {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  std::string perms;
  std::uint64_t offset = 0;
  std::string path;
};

std::vector<MapsLine> ReadMaps() {
  std::vector<MapsLine> lines;
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    fields >> range >> perms >> offset >> dev >> inode;
    std::getline(fields >> std::ws, path);
    const std::size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    MapsLine m;
    m.start = static_cast<std::uintptr_t>(std::stoull(range.substr(0, dash), nullptr, 16));
    m.end = static_cast<std::uintptr_t>(std::stoull(range.substr(dash + 1), nullptr, 16));
    m.perms = perms;
    m.offset = std::stoull(offset, nullptr, 16);
    m.path = path;
    lines.push_back(m);
  }
  return lines;
}

}  // namespace

TEST_CASE("CollectProfileObjects: main program first, with its real path and code") {
  const heapprof::detail::ArenaVector<LoadedObject> objects = CollectProfileObjects();
  REQUIRE(!objects.empty());
  const LoadedObject& main = objects[0];
  CHECK(main.path == RealPath("/proc/self/exe"));
  const std::uintptr_t fn = AddressOf(&elf_test_static_fn);
  CHECK(main.start <= fn);
  CHECK(fn < main.limit);
  CHECK(FindByBaseName(objects, "libc.so.6") != nullptr);

  const long page = ::sysconf(_SC_PAGESIZE);
  for (const LoadedObject& o : objects) {
    INFO("object ", o.path);
    CHECK(!o.path.empty());
    CHECK(o.path[0] == '/');
    CHECK(o.start < o.limit);
    CHECK(o.start % static_cast<std::uintptr_t>(page) == 0);
    CHECK(o.file_offset % static_cast<std::uint64_t>(page) == 0);
    CHECK(o.bias <= o.start);
    CHECK(o.build_id.size() % 2 == 0);
    CHECK(o.build_id.find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(o.path.find("vdso") == std::string::npos);
  }
}

TEST_CASE("CollectProfileObjects: every entry is an executable mapping the kernel agrees on") {
  const heapprof::detail::ArenaVector<LoadedObject> objects = CollectProfileObjects();
  const std::vector<MapsLine> maps = ReadMaps();
  REQUIRE(!maps.empty());
  for (const LoadedObject& o : objects) {
    INFO("object ", o.path);
    bool matched = false;
    for (const MapsLine& m : maps) {
      if (m.start != o.start) continue;
      CHECK(m.perms.find('x') != std::string::npos);
      CHECK(m.offset == o.file_offset);
      CHECK(RealPath(m.path) == RealPath(std::string(o.path)));
      // The segment's tail shares its last page; the mapping ends on that page.
      CHECK(o.limit <= m.end);
      CHECK(m.end - o.limit < static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE)));
      matched = true;
    }
    CHECK(matched);
  }
}

TEST_CASE("CollectProfileObjects: build ids match readelf -n") {
  if (!HaveTool("readelf")) {
    MESSAGE("readelf not installed: build-id cross-check skipped");
    return;
  }
  const heapprof::detail::ArenaVector<LoadedObject> objects = CollectProfileObjects();
  REQUIRE(!objects.empty());
  const LoadedObject* libc = FindByBaseName(objects, "libc.so.6");
  REQUIRE(libc != nullptr);
  for (const LoadedObject* o : {&objects[0], libc}) {
    INFO("object ", o->path);
    const std::string expected = ReadelfBuildId(std::string(o->path));
    // Debian links with --build-id by default; without one the test has nothing to compare.
    REQUIRE(!expected.empty());
    CHECK(o->build_id == expected);
  }
}

TEST_CASE("Symbolizer: static, namespaced, templated and libc functions") {
  const heapprof::detail::ArenaVector<LoadedObject> objects = CollectProfileObjects();
  Symbolizer symbolizer(objects);
  REQUIRE(symbolizer.HasSymbols(0));
  CHECK_FALSE(symbolizer.HasSymbols(objects.size()));

  heapprof::detail::ArenaString name;
  std::uintptr_t start = 0;

  SUBCASE("a static function, found by an address inside it") {
    const std::uintptr_t fn = AddressOf(&elf_test_static_fn);
    REQUIRE(symbolizer.Lookup(fn + 3, name, start));
    CHECK(name == "elf_test_static_fn(int)");
    CHECK(start == fn);
    // The second lookup comes from the cache and must agree.
    heapprof::detail::ArenaString again;
    std::uintptr_t again_start = 0;
    REQUIRE(symbolizer.Lookup(fn + 1, again, again_start));
    CHECK(again == name);
    CHECK(again_start == fn);
    REQUIRE(symbolizer.Lookup(fn, again, again_start));
    CHECK(again == name);
  }
  SUBCASE("a function in the unnamed namespace") {
    const std::uintptr_t fn = AddressOf(&elf_test_anonymous_fn);
    REQUIRE(symbolizer.Lookup(fn + 2, name, start));
    CHECK(name == "(anonymous namespace)::elf_test_anonymous_fn(int)");
    CHECK(start == fn);
  }
  SUBCASE("a member of a class template") {
    const std::uintptr_t fn = AddressOf(&mytest::Foo<int>::bar);
    REQUIRE(symbolizer.Lookup(fn + 4, name, start));
    CHECK(name == "mytest::Foo<int>::bar(int)");
    CHECK(start == fn);
  }
  SUBCASE("qsort in libc (its .dynsym, or the .symtab of an installed libc debug file)") {
    // dlsym on libc's own handle: in a non-PIE test a plain &qsort could be a
    // PLT stub in the executable.
    void* libc = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    REQUIRE(libc != nullptr);
    const std::uintptr_t fn = reinterpret_cast<std::uintptr_t>(::dlsym(libc, "qsort"));
    ::dlclose(libc);
    REQUIRE(fn != 0);
    REQUIRE(symbolizer.Lookup(fn + 1, name, start));
    CHECK(name == "qsort");
    CHECK(start == fn);
  }
  SUBCASE("a mangled libstdc++ export demangles") {
    void* libstdcxx = ::dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (libstdcxx == nullptr) {
      MESSAGE("libstdc++ linked statically: skipped");
      return;
    }
    const std::uintptr_t fn =
        reinterpret_cast<std::uintptr_t>(::dlsym(libstdcxx, "_ZSt9terminatev"));
    ::dlclose(libstdcxx);
    REQUIRE(fn != 0);
    REQUIRE(symbolizer.Lookup(fn, name, start));
    CHECK(name == "std::terminate()");
    CHECK(start == fn);
  }
  SUBCASE("addresses outside every object") {
    int on_stack = 0;
    std::unique_ptr<int> on_heap(new int(0));
    for (const std::uintptr_t pc :
         {std::uintptr_t{0}, std::uintptr_t{1}, reinterpret_cast<std::uintptr_t>(&on_stack),
          reinterpret_cast<std::uintptr_t>(on_heap.get()), ~std::uintptr_t{0}}) {
      name = "untouched";
      start = 42;
      CHECK_FALSE(symbolizer.Lookup(pc, name, start));
      CHECK(name == "untouched");
      CHECK(start == 42);
    }
  }
#if defined(HEAPPROF_TEST_HAVE_ASM_SYMBOLS)
  SUBCASE("a size-0 symbol covers up to the next symbol, a sized one only its size") {
    const std::uintptr_t nosize = AddressOf(&heapprof_test_elf_nosize);
    const std::uintptr_t sized = AddressOf(&heapprof_test_elf_sized);
    REQUIRE(sized == nosize + 8 * kInsn);
    REQUIRE(symbolizer.Lookup(nosize + 5 * kInsn, name, start));
    CHECK(name == "heapprof_test_elf_nosize");
    CHECK(start == nosize);
    REQUIRE(symbolizer.Lookup(sized + 3 * kInsn, name, start));
    CHECK(name == "heapprof_test_elf_sized");
    CHECK(start == sized);
    // Past the sized function's end: the nearest symbol is sized and does not
    // cover it, and the earlier size-0 one must not be stretched over it.
    name = "untouched";
    CHECK_FALSE(symbolizer.Lookup(sized + 6 * kInsn, name, start));
    CHECK(name == "untouched");
  }
  SUBCASE("a size-0 symbol inside a sized function claims nothing past that function") {
    const std::uintptr_t outer = AddressOf(&heapprof_test_elf_outer);
    REQUIRE(AddressOf(&heapprof_test_elf_inner) == outer + 4 * kInsn);
    // Inside the sized function the sized name wins over the label in it.
    REQUIRE(symbolizer.Lookup(outer + 6 * kInsn, name, start));
    CHECK(name == "heapprof_test_elf_outer");
    CHECK(start == outer);
    // Past it, the label is the nearest symbol, but the sized function around
    // its start says the label is not a function boundary to trust.
    name = "untouched";
    CHECK_FALSE(symbolizer.Lookup(outer + 10 * kInsn, name, start));
    CHECK(name == "untouched");
  }
#endif
}

TEST_CASE("SymbolTable: .dynsym alone names exported functions") {
  const heapprof::detail::ArenaVector<LoadedObject> objects = CollectProfileObjects();
  const LoadedObject* libc = FindByBaseName(objects, "libc.so.6");
  REQUIRE(libc != nullptr);
  void* handle = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  REQUIRE(handle != nullptr);
  const std::uintptr_t qsort_at = reinterpret_cast<std::uintptr_t>(::dlsym(handle, "qsort"));
  const std::uintptr_t malloc_at = reinterpret_cast<std::uintptr_t>(::dlsym(handle, "malloc"));
  ::dlclose(handle);
  REQUIRE(qsort_at != 0);
  REQUIRE(malloc_at != 0);

  // No debug directory: a stripped libc (Debian's) has only .dynsym. An
  // unstripped one goes through .symtab, which must give the same answers.
  heapprof::detail::elf::SymbolTable table;
  REQUIRE(table.Load(libc->path, libc->build_id, nullptr));
  std::size_t index = 0;
  REQUIRE(table.Find(qsort_at + 2 - libc->bias, &index));
  CHECK(table.Name(index) == "qsort");
  CHECK(table.Value(index) == qsort_at - libc->bias);
  // glibc exports malloc and __libc_malloc at one address: the public name wins.
  REQUIRE(table.Find(malloc_at - libc->bias, &index));
  CHECK(table.Name(index) == "malloc");
}

TEST_CASE("SymbolTable: keeps only its file's string table mapped, and names still resolve") {
  namespace elf = heapprof::detail::elf;
  const heapprof::detail::ArenaVector<LoadedObject> objects = CollectProfileObjects();
  REQUIRE_FALSE(objects.empty());
  const LoadedObject& self = objects.front();  // this test program, unstripped: it has a .symtab
  // Its .strtab's size, from the section headers.
  elf::MappedFile whole;
  REQUIRE(whole.Open(self.path.c_str()));
  elf::SectionTable sections;
  REQUIRE(sections.Init(whole.view()));
  std::uint64_t strtab_size = 0;
  for (std::uint64_t i = 1; i < sections.count(); ++i) {
    Elf64_Shdr sh{};
    if (!sections.Get(i, &sh) || sh.sh_type != SHT_SYMTAB) continue;
    Elf64_Shdr names{};
    REQUIRE(sections.Get(sh.sh_link, &names));
    strtab_size = names.sh_size;
  }
  REQUIRE(strtab_size != 0);
  const std::size_t file_size = whole.view().size;
  whole.Reset();

  elf::SymbolTable table;
  REQUIRE(table.Load(self.path, self.build_id, nullptr));
  INFO("file " << file_size << " B, .strtab " << strtab_size << " B, kept " << table.mapped_bytes() << " B");
  // The string table's pages (one more where it straddles a page boundary), not the file.
  CHECK(table.mapped_bytes() >= strtab_size);
  CHECK(table.mapped_bytes() <= ((strtab_size + 4095) & ~std::uint64_t{4095}) + 4096);
  // Every name is read from those pages after the rest was unmapped.
  const auto here = reinterpret_cast<std::uintptr_t>(&CollectProfileObjects);
  std::size_t index = 0;
  REQUIRE(table.Find(here - self.bias, &index));
  CHECK(table.Name(index).find("CollectProfileObjects") != std::string::npos);
  CHECK(table.RawName(index).find("CollectProfileObjects") != std::string_view::npos);
}

TEST_CASE("Demangle: C++ names demangled, C names and junk unchanged, versions dropped") {
  using heapprof::detail::elf::Demangle;
  const auto d = [](const std::string& raw) { return Demangle(raw.c_str(), raw.size()); };
  CHECK(d("_ZN6mytest3FooIiE3barEi") == "mytest::Foo<int>::bar(int)");
  CHECK(d("_ZL18elf_test_static_fni") == "elf_test_static_fn(int)");
  CHECK(d("_Z3fooi.cold") == "foo(int) [clone .cold]");
  CHECK(d("qsort") == "qsort");
  CHECK(d("memcpy@@GLIBC_2.14") == "memcpy");
  CHECK(d("memcpy@GLIBC_2.2.5") == "memcpy");
  CHECK(d("_ZSt9terminatev@@GLIBCXX_3.4") == "std::terminate()");
  CHECK(d("_Zjunk") == "_Zjunk");
  CHECK(d("_Z") == "_Z");
}

TEST_CASE("SegmentMapping: a segment that does not start on a page boundary") {
  // lld and gold lay out segments like this: the executable segment starts
  // mid-page, sharing its first page with the previous segment's tail.
  Elf64_Phdr ph{};
  ph.p_type = PT_LOAD;
  ph.p_flags = PF_R | PF_X;
  ph.p_vaddr = 0x11640;
  ph.p_offset = 0x10640;
  ph.p_memsz = 0x2345;
  ph.p_filesz = 0x2345;
  const std::uintptr_t bias = 0x7f0000000000;
  const LoadedObject o = heapprof::detail::elf::SegmentMapping(ph, bias, 0xfff);
  CHECK(o.start == bias + 0x11000);
  CHECK(o.limit == bias + 0x11640 + 0x2345);
  CHECK(o.file_offset == 0x10000);
  CHECK(o.bias == bias);

  // 64 KiB pages (aarch64): offset and address stay congruent modulo the page.
  ph.p_vaddr = 0x21640;
  ph.p_offset = 0x11640;
  const LoadedObject big_pages = heapprof::detail::elf::SegmentMapping(ph, bias, 0xffff);
  CHECK(big_pages.start == bias + 0x20000);
  CHECK(big_pages.file_offset == 0x10000);
}

TEST_CASE("Symbolizer: several segments of one object share its table") {
  heapprof::detail::ArenaVector<LoadedObject> objects = CollectProfileObjects();
  REQUIRE(!objects.empty());
  // Split the main program's segment in two, as a linker with separate
  // executable segments would lay it out.
  LoadedObject head = objects[0];
  LoadedObject tail = objects[0];
  const std::uintptr_t fn = AddressOf(&elf_test_static_fn);
  head.limit = fn;
  tail.start = fn;
  objects[0] = head;
  objects.insert(objects.begin() + 1, tail);
  Symbolizer symbolizer(objects);
  CHECK(symbolizer.HasSymbols(0));
  CHECK(symbolizer.HasSymbols(1));
  heapprof::detail::ArenaString name;
  std::uintptr_t start = 0;
  REQUIRE(symbolizer.Lookup(fn + 2, name, start));
  CHECK(name == "elf_test_static_fn(int)");
}

TEST_CASE("Symbolizer: unreadable, truncated and corrupt files give no symbols and no crash") {
  ElfTempDir dir;
  REQUIRE(!dir.path().empty());
  const std::string self = RealPath("/proc/self/exe");
  const std::string image = ReadFile(self);
  REQUIRE(image.size() > 4096);

  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  std::string bad_shoff = image;
  const std::uint64_t past_end = image.size() - 10;
  std::memcpy(&bad_shoff[offsetof(Elf64_Ehdr, e_shoff)], &past_end, sizeof past_end);
  std::string huge_shnum = image;
  const std::uint16_t many = 0xfeff;
  std::memcpy(&huge_shnum[offsetof(Elf64_Ehdr, e_shnum)], &many, sizeof many);

  const std::vector<std::string> paths = {
      dir.Write("first100", image.substr(0, 100)),
      dir.Write("first4096", image.substr(0, 4096)),
      dir.Write("bad_shoff", bad_shoff),
      dir.Write("huge_shnum", huge_shnum),
      dir.Write("empty", std::string()),
      dir.path(),  // a directory
      dir.path() + "/does-not-exist",
      "/dev/null",
      "",
  };
  const std::uintptr_t fn = AddressOf(&elf_test_static_fn);
  for (const std::string& path : paths) {
    INFO("path ", path);
    heapprof::detail::ArenaVector<LoadedObject> objects = {MainProgramAt(path)};
    Symbolizer symbolizer(objects);
    CHECK_FALSE(symbolizer.HasSymbols(0));
    heapprof::detail::ArenaString name = "untouched";
    std::uintptr_t start = 0;
    CHECK_FALSE(symbolizer.Lookup(fn, name, start));
    CHECK_FALSE(symbolizer.Lookup(objects[0].start, name, start));
    CHECK(name == "untouched");
  }
}

TEST_CASE("Symbolizer: a file replaced on disk (other build id) is not trusted") {
  LoadedObject main = CollectProfileObjects().at(0);
  if (main.build_id.empty()) {
    MESSAGE("test binary has no build id: skipped");
    return;
  }
  main.build_id = std::string(main.build_id.size(), '0');
  Symbolizer symbolizer({main});
  CHECK_FALSE(symbolizer.HasSymbols(0));
  heapprof::detail::ArenaString name;
  std::uintptr_t start = 0;
  CHECK_FALSE(symbolizer.Lookup(AddressOf(&elf_test_static_fn), name, start));
}

TEST_CASE("Symbolizer: random corruption of headers and symbol tables never crashes") {
  ElfTempDir dir;
  REQUIRE(!dir.path().empty());
  const std::string image = ReadFile(RealPath("/proc/self/exe"));
  REQUIRE(image.size() > sizeof(Elf64_Ehdr));
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  REQUIRE(eh.e_shoff + std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) <= image.size());

  // The bytes worth hitting: the ELF header, the section headers, the notes
  // (the build id is checked against the loaded one), and the first symbols
  // and strings of each symbol table.
  struct Region {
    std::uint64_t offset, size;
  };
  std::vector<Region> regions = {{0, sizeof(Elf64_Ehdr)},
                                 {eh.e_shoff, std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)}};
  for (std::uint64_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, image.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
    if (sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM || sh.sh_type == SHT_STRTAB ||
        sh.sh_type == SHT_NOTE) {
      regions.push_back({sh.sh_offset, std::min<std::uint64_t>(sh.sh_size, 4096)});
    }
  }

  const std::string path = dir.Write("fuzzed", image);
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  std::uint64_t seed = 20240607;
  if (const char* env = std::getenv("HEAPPROF_ELF_FUZZ_SEED"))
    seed = std::strtoull(env, nullptr, 10);
  std::mt19937_64 rng(seed);
  const std::uintptr_t probes[] = {AddressOf(&elf_test_static_fn),
                                   AddressOf(&elf_test_anonymous_fn),
                                   AddressOf(&mytest::Foo<int>::bar)};
  int with_symbols = 0;
  // HEAPPROF_ELF_FUZZ_ROUNDS raises the count for a long local run.
  int rounds = 300;
  if (const char* env = std::getenv("HEAPPROF_ELF_FUZZ_ROUNDS")) rounds = std::atoi(env);
  for (int round = 0; round < rounds; ++round) {
    const Region& region = regions[rng() % regions.size()];
    const int hits = 1 + static_cast<int>(rng() % 8);
    std::vector<std::pair<std::uint64_t, char>> saved;
    for (int h = 0; h < hits; ++h) {
      const std::uint64_t at = region.offset + rng() % region.size;
      saved.emplace_back(at, image[at]);
      // Bias towards the values that break naive readers: 0, all ones, huge.
      const char values[] = {0, static_cast<char>(0xff), static_cast<char>(0x7f),
                             static_cast<char>(rng())};
      const char value = values[rng() % 4];
      REQUIRE(::pwrite(fd, &value, 1, static_cast<off_t>(at)) == 1);
    }
    {
      heapprof::detail::ArenaVector<LoadedObject> objects = {MainProgramAt(path)};
      objects[0].build_id = CollectProfileObjects().at(0).build_id;
      Symbolizer symbolizer(objects);
      with_symbols += symbolizer.HasSymbols(0) ? 1 : 0;
      heapprof::detail::ArenaString name;
      std::uintptr_t start = 0;
      for (const std::uintptr_t pc : probes) {
        for (std::uintptr_t delta = 0; delta < 64; delta += 7)
          symbolizer.Lookup(pc + delta, name, start);
      }
    }
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      REQUIRE(::pwrite(fd, &it->second, 1, static_cast<off_t>(it->first)) == 1);
    }
  }
  ::close(fd);
  // Most single-byte hits leave the file usable; all of them failing would
  // mean the fuzzing never got past the header checks.
  CHECK(with_symbols > 0);
}

TEST_CASE("SymbolTable: a stripped file finds its .symtab in a build-id debug file") {
  if (!HaveTool("objcopy")) {
    MESSAGE("objcopy not installed: debug-file fallback skipped");
    return;
  }
  const LoadedObject main = CollectProfileObjects().at(0);
  if (main.build_id.size() < 4) {
    MESSAGE("test binary has no build id: skipped");
    return;
  }
  ElfTempDir dir;
  REQUIRE(!dir.path().empty());
  const std::string stripped = dir.path() + "/stripped";
  const std::string debug_dir = dir.path() + "/debug";
  const std::string debug_file = debug_dir + "/.build-id/" + std::string(main.build_id).substr(0, 2) + "/" +
                                 std::string(main.build_id).substr(2) + ".debug";
  REQUIRE(std::system(("mkdir -p '" + debug_dir + "/.build-id/" + std::string(main.build_id).substr(0, 2) + "'")
                          .c_str()) == 0);
  REQUIRE(std::system(("objcopy --strip-all '" + std::string(main.path) + "' '" + stripped + "'").c_str()) == 0);
  REQUIRE(std::system(
              ("objcopy --only-keep-debug '" + std::string(main.path) + "' '" + debug_file + "'").c_str()) == 0);

  const std::uint64_t vaddr = AddressOf(&elf_test_static_fn) - main.bias;
  std::size_t index = 0;

  heapprof::detail::elf::SymbolTable without_debug;
  // The stripped file alone has only .dynsym, which never names a static function.
  if (without_debug.Load(stripped, main.build_id, nullptr)) {
    CHECK((!without_debug.Find(vaddr, &index) ||
           without_debug.Name(index) != "elf_test_static_fn(int)"));
  }

  heapprof::detail::elf::SymbolTable with_debug;
  REQUIRE(with_debug.Load(stripped, main.build_id, debug_dir.c_str()));
  REQUIRE(with_debug.Find(vaddr, &index));
  CHECK(with_debug.Name(index) == "elf_test_static_fn(int)");
  CHECK(with_debug.Value(index) == vaddr);

  // A debug file for some other build is ignored.
  heapprof::detail::elf::SymbolTable wrong_id;
  const std::string other_id = std::string(main.build_id.size(), 'a');
  if (wrong_id.Load(stripped, other_id, debug_dir.c_str())) {
    CHECK((!wrong_id.Find(vaddr, &index) || wrong_id.Name(index) != "elf_test_static_fn(int)"));
  }
}

TEST_CASE("ParseMapsLine: every field of a /proc/self/maps line, and no half lines") {
  namespace elf = heapprof::detail::elf;
  elf::MapsLine m;
  REQUIRE(elf::ParseMapsLine("7f00a000-7f00c000 r-xp 0001f000 fd:01 1234567   /usr/lib/libx.so.1", m));
  CHECK(m.start == 0x7f00a000u);
  CHECK(m.end == 0x7f00c000u);
  CHECK((m.readable() && !m.writable() && m.executable() && m.is_private()));
  CHECK(m.offset == 0x1f000u);
  CHECK(major(m.device) == 0xfdu);
  CHECK(minor(m.device) == 1u);
  CHECK(m.inode == 1234567u);
  CHECK(m.path == "/usr/lib/libx.so.1");
  CHECK(!m.deleted);

  // A name with spaces is the rest of the line; " (deleted)" is taken off.
  REQUIRE(elf::ParseMapsLine("1000-2000 rw-s 00000000 00:05 42 /tmp/my lib.so (deleted)", m));
  CHECK(m.path == "/tmp/my lib.so");
  CHECK(m.deleted);
  CHECK((m.writable() && !m.is_private()));
  // ...but a file called exactly " (deleted)" keeps its name.
  REQUIRE(elf::ParseMapsLine("1000-2000 r--p 00000000 08:01 7 /x (deleted) (deleted)", m));
  CHECK(m.path == "/x (deleted)");

  // Anonymous, named and special mappings.
  REQUIRE(elf::ParseMapsLine("55d0c000-55d2d000 rw-p 00000000 00:00 0 ", m));
  CHECK(m.path.empty());
  CHECK(m.inode == 0u);
  REQUIRE(elf::ParseMapsLine("55d0c000-55d2d000 rw-p 00000000 00:00 0                          [heap]", m));
  CHECK(m.path == "[heap]");
  REQUIRE(elf::ParseMapsLine("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]", m));
  CHECK(m.end == 0xffffffffff601000u);
  CHECK((!m.readable() && m.executable()));
  REQUIRE(elf::ParseMapsLine("a-b ---p 0 0:0 0", m));  // shortest form, no path
  CHECK(m.end == 0xbu);

  // Not lines: every field is required.
  for (const char* bad : {"", "7f00a000", "7f00a000-", "-7f00c000 r-xp 0 0:0 0", "1000-2000", "1000-2000 r-x",
                          "1000-2000 r-xp", "1000-2000 r-xp 0", "1000-2000 r-xp 0 fd", "1000-2000 r-xp 0 fd:",
                          "1000-2000 r-xp 0 fd:01", "1000-2000 r-xp 0 fd:01 x /a", "1000-2000 r-xp 0 fd:01 12x /a",
                          "2000-1000 r-xp 0 fd:01 1 /a", "1000+2000 r-xp 0 fd:01 1 /a"}) {
    CAPTURE(bad);
    CHECK(!elf::ParseMapsLine(bad, m));
  }

  // The real file: ForEachMapping sees every line this test's own reader sees, with the same fields.
  const std::vector<MapsLine> expected = ReadMaps();
  std::vector<elf::MapsLine> seen;
  std::vector<std::string> paths;
  CHECK(elf::ForEachMapping([&](const elf::MapsLine& line) {
    seen.push_back(line);
    paths.emplace_back(line.path);
  }));
  REQUIRE(!expected.empty());
  // (The two reads are moments apart; this thread allocating in between may grow the heap. Compare
  // the mappings both saw.)
  std::size_t matched = 0;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    for (const MapsLine& e : expected) {
      if (e.start != seen[i].start) continue;
      ++matched;
      CHECK(std::string(seen[i].perms, 4) == e.perms);
      CHECK(seen[i].offset == e.offset);
      std::string path = e.path;
      if (seen[i].deleted) path.resize(path.size() - std::strlen(" (deleted)"));
      CHECK(paths[i] == path);
    }
  }
  CHECK(matched + 2 >= expected.size());
}
