// heapprof: the loaded objects of this process (executable and shared objects)
// and in-process symbolization from their ELF symbol tables.
//
// Runs only when a profile is written, never inside an allocation hook. Its
// tables are standard containers on the profiler's arena (arena_allocator.hpp).
#pragma once

#include <cxxabi.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena_allocator.hpp"
#include "heapprof/detail/0_base/env_config.hpp"
#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/0_base/proc_self.hpp"
#include "heapprof/detail/0_base/self_exe.hpp"
#include "heapprof/detail/3_unwinding/loader_lock.hpp"
#include "heapprof/detail/4_symbolization/debug_info.hpp"
#include "heapprof/detail/4_symbolization/elf_file.hpp"
#include "heapprof/detail/4_symbolization/function_names.hpp"

namespace heapprof {
namespace detail {

// One executable segment of a loaded ELF object, as a pprof Mapping wants it.
struct LoadedObject {
  std::uintptr_t start = 0;       // first byte of the executable PT_LOAD segment in memory
  std::uintptr_t limit = 0;       // one past its last byte
  std::uint64_t file_offset = 0;  // file offset that `start` maps
  std::uintptr_t bias = 0;        // dlpi_addr: memory address = file vaddr + bias
  // Absolute file name: the loader's, or the kernel's (/proc/self/maps, without
  // " (deleted)") when the loader's does not name the file that was mapped.
  ArenaString path;
  ArenaString build_id;           // GNU build id, lowercase hex; empty if the file has none
  // What to open to read the object when `path` no longer names the file that
  // was mapped (deleted or replaced on disk since: a deploy): its
  // /proc/self/map_files entry, which reaches the mapped inode. Empty: `path`.
  ArenaString file;
};

// What a profile's frames can be in: every loaded object with an executable
// segment, the main program first, then those unloaded since the profiler saw
// them loaded (elf::NoteLoadedObject) where nothing loaded now overlaps them.
ArenaVector<LoadedObject> CollectProfileObjects();

namespace elf {

// Where distributions install separate debug files, named by build id
// (gdb's default debug-file-directory). Used only for an object whose own file
// has no .symtab, e.g. a stripped libc with its -dbg package installed.
constexpr const char kDebugFileDirectory[] = "/usr/lib/debug";

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};

// The kernel's name for our executable: the real path, even when argv[0] was
// relative or a symlink. Only a fallback for the main program's name: it is
// ld.so's for a program started through ld.so, and ends in " (deleted)" once
// the file is gone (FileOfMapping finds the mapped file instead). Without
// /proc: the name the program was started by (self_exe.hpp).
inline ArenaString ReadSelfExe() {
  ArenaString buf(256, '\0');
  for (;;) {
    const ssize_t n = ::readlink(ProcSelfExe(), &buf[0], buf.size());
    if (n < 0) {
      const char* start = ExecPathFromStart();
      return start != nullptr ? ArenaString(start) : ArenaString();
    }
    if (static_cast<std::size_t>(n) < buf.size()) {
      buf.resize(static_cast<std::size_t>(n));
      return buf;
    }
    // readlink truncates silently; a full buffer may be a cut path.
    if (buf.size() >= (1u << 16)) return ArenaString();
    buf.resize(buf.size() * 2);
  }
}

// A relative name (dlopen("./x.so")) means the working directory of the
// dlopen, which may not be today's: only a fallback when /proc/self/maps
// cannot be read (FileOfMapping).
inline ArenaString ResolvedPath(const char* name) {
  if (name[0] == '/') return ArenaString(name);
  char real[PATH_MAX];  // realpath(name, nullptr) would malloc
  return ::realpath(name, real) != nullptr ? ArenaString(real) : ArenaString(name);
}

// The kernel maps whole pages: the mapping starts at the page holding the
// segment's first byte and maps the file from the page holding p_offset (the
// two are congruent modulo the page size for any loadable segment), while the
// segment itself ends at p_memsz.
inline LoadedObject SegmentMapping(const Elf64_Phdr& ph, std::uintptr_t bias,
                                   std::uintptr_t page_mask) {
  LoadedObject object;
  const std::uintptr_t at = bias + ph.p_vaddr;
  const std::uintptr_t into_page = at & page_mask;
  object.start = at - into_page;
  object.limit = at + ph.p_memsz;
  object.file_offset = ph.p_offset >= into_page ? ph.p_offset - into_page : 0;
  object.bias = bias;
  return object;
}

inline bool Overlaps(const LoadedObject& o, std::uintptr_t start, std::uintptr_t limit) noexcept {
  return o.start < limit && start < o.limit;
}

// Appends the remembered objects that are no longer loaded: those no object in
// `objects` overlaps (what is loaded now wins; of two unloaded objects at the
// same addresses, the one remembered last). Their files are read by name, and
// the symbolizer's build-id check refuses a file rebuilt since.
inline void AppendUnloadedObjects(ArenaVector<LoadedObject>& objects, std::uintptr_t page_mask) {
  for (const SeenObject* s = g_seen_objects.load(std::memory_order_acquire); s != nullptr; s = s->next) {
    bool overlaps = false;
    for (std::uint32_t i = 0; i < s->segments && !overlaps; ++i) {
      const std::uintptr_t start = s->bias + s->vaddr[i];
      const std::uintptr_t limit = start + s->memsz[i];
      for (const LoadedObject& o : objects) {
        if (Overlaps(o, start & ~page_mask, limit)) {
          overlaps = true;
          break;
        }
      }
    }
    if (overlaps) continue;
    const ArenaString path(s->name);
    const ArenaString build_id = HexLower(s->build_id, s->build_id_size);
    for (std::uint32_t i = 0; i < s->segments; ++i) {
      Elf64_Phdr ph{};
      ph.p_vaddr = s->vaddr[i];
      ph.p_memsz = s->memsz[i];
      ph.p_offset = s->offset[i];
      LoadedObject object = SegmentMapping(ph, s->bias, page_mask);
      object.path = path;
      object.build_id = build_id;
      objects.push_back(std::move(object));
    }
  }
}

struct CollectState {
  ArenaVector<LoadedObject>* out = nullptr;
  std::uintptr_t vdso = 0;
  std::uintptr_t page_mask = 0;
  bool first = true;
  bool out_of_memory = false;
};

// Called by dl_iterate_phdr with the loader's lock held: an exception must not
// unwind through libc (the lock would stay taken), so it is carried out instead.
inline int CollectObject(dl_phdr_info* info, std::size_t, void* data) {
  CollectState& state = *static_cast<CollectState*>(data);
  const bool first = state.first;
  state.first = false;
  HEAPPROF_TRY {
    // The vDSO has no file for the symbolizer or pprof to read.
    if (state.vdso != 0 && SegmentCovers(*info, state.vdso)) return 0;
    const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
    ArenaString path;
    if (name[0] == '\0') {
      // glibc names the main program "" and lists it first; any other nameless
      // object has no file we could point at.
      if (!first) return 0;
      path = ReadSelfExe();
    } else {
      path = ResolvedPath(name);
    }
    NoteLoadedObject(*info);
    ArenaString build_id;
    bool have_build_id = false;
    for (std::size_t i = 0; i < info->dlpi_phnum; ++i) {
      const Elf64_Phdr& ph = info->dlpi_phdr[i];
      if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0 || ph.p_memsz == 0) continue;
      if (!have_build_id) {
        const ByteView id = MemoryBuildIdBytes(*info);
        build_id = HexLower(id.data, static_cast<std::size_t>(id.size));
        have_build_id = true;
      }
      LoadedObject object = SegmentMapping(ph, info->dlpi_addr, state.page_mask);
      object.path = path;
      object.build_id = build_id;
      state.out->push_back(std::move(object));
    }
  }
  HEAPPROF_CATCH_ALL {
    state.out_of_memory = true;  // ArenaString or ArenaVector: bad_alloc
    return 1;
  }
  return 0;
}

// One file-backed executable mapping of /proc/self/maps.
struct FileMapping {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  dev_t device = 0;
  ino_t inode = 0;
  ArenaString path;  // the kernel's name for the mapped file, without " (deleted)"
};

// Reads the whole of a /proc file (its size is unknown until read).
inline bool ReadProcFile(const char* path, ArenaString& out) {
  int fd;
  do {
    fd = ::open(path, O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return false;
  out.clear();
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return n == 0;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
}

// A hexadecimal number at s[i...] (digits only, no "0x"); i ends after it.
inline std::uintptr_t ParseHex(std::string_view s, std::size_t& i) noexcept {
  std::uintptr_t v = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else break;
    v = v * 16 + static_cast<std::uintptr_t>(d);
  }
  return v;
}

// One line of /proc/<pid>/maps:
//   "start-end perms offset major:minor inode" then, after spaces, the path.
// The path is the rest of the line, spaces included: "" (anonymous), a
// "[name]" ([heap], [stack], [vdso], [anon:name]) or a file's name, here
// without the kernel's " (deleted)" for a file since removed (`deleted`).
struct MapsLine {
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  char perms[4] = {'-', '-', '-', '-'};  // "rwxp", "r--s"
  std::uint64_t offset = 0;
  dev_t device = 0;
  ino_t inode = 0;
  std::string_view path;
  bool deleted = false;
  bool readable() const noexcept { return perms[0] == 'r'; }
  bool writable() const noexcept { return perms[1] == 'w'; }
  bool executable() const noexcept { return perms[2] == 'x'; }
  bool is_private() const noexcept { return perms[3] == 'p'; }
};

// Parses one line (without its newline). False for a line that is not one.
inline bool ParseMapsLine(std::string_view line, MapsLine& m) noexcept {
  m = MapsLine{};
  std::size_t i = 0;
  const auto field_end = [&](std::size_t at) { return at < line.size() && line[at] == ' '; };
  m.start = ParseHex(line, i);
  if (i == 0 || i >= line.size() || line[i] != '-') return false;
  const std::size_t hi_at = ++i;
  m.end = ParseHex(line, i);
  if (i == hi_at || !field_end(i) || m.end < m.start || i + 5 > line.size()) return false;
  std::memcpy(m.perms, line.data() + i + 1, 4);
  i += 5;
  if (!field_end(i)) return false;
  const std::size_t offset_at = ++i;
  m.offset = ParseHex(line, i);
  if (i == offset_at || !field_end(i)) return false;
  const std::size_t major_at = ++i;
  const std::uintptr_t major = ParseHex(line, i);
  if (i == major_at || i >= line.size() || line[i] != ':') return false;
  const std::size_t minor_at = ++i;
  const std::uintptr_t minor = ParseHex(line, i);
  if (i == minor_at || !field_end(i)) return false;
  m.device = makedev(static_cast<unsigned int>(major), static_cast<unsigned int>(minor));
  const std::size_t inode_at = ++i;
  ino_t inode = 0;
  for (; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i) inode = inode * 10 + static_cast<ino_t>(line[i] - '0');
  if (i == inode_at || (i < line.size() && line[i] != ' ')) return false;
  m.inode = inode;
  while (i < line.size() && line[i] == ' ') ++i;
  m.path = line.substr(i);
  static constexpr std::string_view kDeleted = " (deleted)";
  if (m.path.size() > kDeleted.size() && m.path[0] == '/' &&
      m.path.substr(m.path.size() - kDeleted.size()) == kDeleted) {
    m.path.remove_suffix(kDeleted.size());
    m.deleted = true;
  }
  return true;
}

// Calls f(const MapsLine&) for each line of /proc/self/maps, in address
// order. False when the file cannot be read or holds no mapping.
template <class F>
bool ForEachMapping(F&& f) {
  ArenaString text;
  if (!ReadProcFile(ProcSelfPath("maps").c_str(), text)) return false;
  std::string_view all(text);
  bool any = false;
  while (!all.empty()) {
    const std::size_t eol = all.find('\n');
    MapsLine m;
    if (ParseMapsLine(all.substr(0, eol), m)) {
      any = true;
      f(static_cast<const MapsLine&>(m));
    }
    all = eol == std::string_view::npos ? std::string_view() : all.substr(eol + 1);
  }
  return any;
}

// The executable file mappings, in address order. What the kernel says was
// mapped, unlike the loader's names: those are relative to the working
// directory of the dlopen, ld.so's own for a program it started, or name a
// file since replaced.
inline ArenaVector<FileMapping> ReadFileMappings() {
  ArenaVector<FileMapping> mappings;
  ForEachMapping([&](const MapsLine& line) {
    if (!line.executable() || line.inode == 0 || line.path.empty() || line.path[0] != '/') return;
    FileMapping m;
    m.start = line.start;
    m.end = line.end;
    m.device = line.device;
    m.inode = line.inode;
    m.path.assign(line.path.data(), line.path.size());
    mappings.push_back(std::move(m));
  });
  return mappings;
}

inline bool IsFileOf(const char* path, const FileMapping& m) {
  struct stat st;
  return ::stat(path, &st) == 0 && st.st_ino == m.inode && st.st_dev == m.device;
}

// Points `object` at the file that was mapped. The loader's name is kept when
// it still names that file (dev and inode as /proc/self/maps has them), else
// the kernel's name is shown; when that does not either (deleted or replaced),
// the bytes are read through /proc/self/map_files, or /proc/self/exe for the
// main program on kernels that refuse map_files. Neither reaching it, the name
// is read as before and the build-id checks refuse another build.
inline void FileOfMapping(LoadedObject& object, const ArenaVector<FileMapping>& mappings) {
  const auto above = std::upper_bound(mappings.begin(), mappings.end(), object.start,
                                      [](std::uintptr_t a, const FileMapping& m) { return a < m.start; });
  if (above == mappings.begin()) return;
  const FileMapping& m = *(above - 1);
  if (object.start >= m.end) return;
  if (!object.path.empty() && IsFileOf(object.path.c_str(), m)) return;
  object.path = m.path;
  if (IsFileOf(object.path.c_str(), m)) return;
  char file[64];
  std::snprintf(file, sizeof file, "/proc/self/map_files/%lx-%lx", static_cast<unsigned long>(m.start),
                static_cast<unsigned long>(m.end));
  if (IsFileOf(file, m)) {
    object.file = file;
  } else if (IsFileOf(ProcSelfExe(), m)) {
    object.file = ProcSelfExe();
  }
}

// Names of symbols that are not mangled C++ come back unchanged, except that a
// version suffix ("memcpy@@GLIBC_2.14" in an unstripped .symtab) is dropped.
inline ArenaString Demangle(const char* raw, std::size_t length) {
  const void* at = std::memchr(raw, '@', length);
  if (at != nullptr && at != raw)
    length = static_cast<std::size_t>(static_cast<const char*>(at) - raw);
  ArenaString name(raw, length);
  if (length > 2 && raw[0] == '_' && raw[1] == 'Z') {
    int status = -1;
    std::unique_ptr<char, FreeDeleter> out(
        abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status));
    if (status == 0 && out) name.assign(out.get());
  }
  return name;
}

// One function symbol, in file virtual addresses.
struct Symbol {
  std::uint64_t value;
  std::uint64_t end;          // value + st_size; for a size-0 symbol, the end of its section
  std::uint32_t name;         // string table offset, checked to be NUL-terminated in bounds
  std::uint32_t cached : 31;  // 1 + index into the demangled-name cache; 0 = not yet
  std::uint32_t zero_size : 1;
};

// The function symbols of one ELF file, sorted for lookup by file address.
class SymbolTable {
 public:
  // `build_id` is the id of the object as loaded in memory: a file on disk with
  // a different id, or none, is another build, and its symbols would lie.
  // `file_view`: what to open when `path` no longer names the object's file
  // (LoadedObject::file); empty = `path`, which still places .gnu_debuglink.
  // `probe`: only whether a full load would find any symbol, from the same
  // files in the same order, stopping at the first; the table stays empty
  // and keeps no mapping (Symbolizer: objects no PC of the profile is in).
  bool Load(std::string_view path_view, std::string_view build_id_view,
            const char* debug_directory = kDebugFileDirectory, std::string_view file_view = {},
            bool probe = false) {
    const ArenaString path(path_view), build_id(build_id_view);  // NUL-terminated
    const ArenaString file(file_view.empty() ? path_view : file_view);
    MappedFile own;
    SectionTable own_sections;
    const bool own_usable = own.Open(file.c_str()) && own_sections.Init(own.view()) &&
                            debug_files::BuildIdMatches(own_sections, build_id.c_str());
    // .symtab also names static functions; .dynsym only what the object exports.
    if (own_usable && ReadTable(own, own_sections, SHT_SYMTAB, probe)) return true;
    if (debug_directory != nullptr && build_id.size() > 2) {
      const ArenaString debug_path = ArenaString(debug_directory) + "/.build-id/" +
                                     build_id.substr(0, 2) + "/" + build_id.substr(2) + ".debug";
      MappedFile debug;
      SectionTable debug_sections;
      if (debug.Open(debug_path.c_str()) && debug_sections.Init(debug.view()) &&
          FileBuildId(debug_sections) == build_id && ReadTable(debug, debug_sections, SHT_SYMTAB, probe)) {
        return true;
      }
    }
    // A stripped file whose debug file is named by .gnu_debuglink: that file's
    // .symtab names what DWARF does not describe (_start, static libstdc++).
    if (own_usable && debug_directory != nullptr) {
      char found[1024];
      MappedFile debug;
      SectionTable debug_sections;
      if (debug_files::OpenDebugLink(path.c_str(), own.view(), debug_directory, debug, found, sizeof found) &&
          debug_sections.Init(debug.view()) && debug_files::BuildIdMatches(debug_sections, build_id.c_str()) &&
          ReadTable(debug, debug_sections, SHT_SYMTAB, probe)) {
        return true;
      }
    }
    return own_usable && ReadTable(own, own_sections, SHT_DYNSYM, probe);
  }

  bool empty() const { return symbols_.empty(); }
  std::size_t size() const { return symbols_.size(); }
  // Address space the table keeps of its file: the string table's pages.
  std::size_t mapped_bytes() const { return file_.mapped_bytes(); }
  std::uint64_t Value(std::size_t index) const { return symbols_[index].value; }

  // The symbol whose range holds file address `addr`. A size-0 symbol (hand
  // written assembly without .size) is trusted only when it is the nearest symbol
  // below `addr`, no sized function overlaps its start, and `addr` is still in its
  // section: a wrong name is worse than none.
  bool Find(std::uint64_t addr, std::size_t* index) const {
    const auto above =
        std::upper_bound(symbols_.begin(), symbols_.end(), addr,
                         [](std::uint64_t a, const Symbol& s) { return a < s.value; });
    const std::size_t count = static_cast<std::size_t>(above - symbols_.begin());
    if (count == 0) return false;
    // max_end_ lets the walk stop as soon as nothing earlier can reach addr.
    for (std::size_t i = count; i > 0 && max_end_[i - 1] > addr; --i) {
      const Symbol& s = symbols_[i - 1];
      if (!s.zero_size && addr < s.end) {
        *index = i - 1;
        return true;
      }
    }
    const Symbol& nearest = symbols_[count - 1];
    if (!nearest.zero_size || addr >= nearest.end) return false;
    if (count >= 2 && max_end_[count - 2] > nearest.value) return false;
    *index = count - 1;
    return true;
  }

  // The symbol's own bytes (mangled), without a version suffix.
  std::string_view RawName(std::size_t index) const {
    std::size_t length = 0;
    const char* raw = strtab_.CString(symbols_[index].name, &length);
    if (raw == nullptr) return std::string_view();
    const void* at = std::memchr(raw, '@', length);
    if (at != nullptr && at != raw) length = static_cast<std::size_t>(static_cast<const char*>(at) - raw);
    return std::string_view(raw, length);
  }

  const ArenaString& Name(std::size_t index) {
    Symbol& s = symbols_[index];
    if (s.cached == 0) {
      std::size_t length = 0;
      const char* raw = strtab_.CString(s.name, &length);
      names_.push_back(raw != nullptr ? Demangle(raw, length) : ArenaString());
      s.cached = static_cast<std::uint32_t>(names_.size()) & 0x7fffffffu;
    }
    return names_[s.cached - 1];
  }

 private:
  struct SectionRange {
    std::uint64_t addr = 0;
    std::uint64_t end = 0;
    bool executable = false;
  };
  struct Candidate {
    Symbol symbol;
    std::uint32_t rank;
  };

  // Among aliases of one address, the name a reader expects: glibc exports
  // `malloc` beside `__libc_malloc`, and public names are often weak aliases of
  // global internal ones, so fewer leading underscores wins before binding.
  static std::uint32_t Rank(const char* name, unsigned char binding) {
    std::uint32_t underscores = 0;
    while (underscores < 3 && name[underscores] == '_') ++underscores;
    const std::uint32_t bind = binding == STB_GLOBAL ? 0 : binding == STB_WEAK ? 1 : 2;
    return underscores * 4 + bind;
  }

  bool ReadTable(MappedFile& file, const SectionTable& sections, std::uint32_t type, bool probe) {
    Elf64_Shdr table{};
    std::uint64_t table_index = 0;
    for (std::uint64_t i = 1; i < sections.count(); ++i) {
      if (sections.Get(i, &table) && table.sh_type == type) {
        table_index = i;
        break;
      }
    }
    if (table_index == 0 || table.sh_entsize != sizeof(Elf64_Sym)) return false;
    const ByteView syms = sections.Contents(table);
    Elf64_Shdr strings;
    if (syms.size < sizeof(Elf64_Sym) || !sections.Get(table.sh_link, &strings) ||
        strings.sh_type != SHT_STRTAB) {
      return false;
    }
    const ByteView strtab = sections.Contents(strings);
    if (strtab.size == 0) return false;

    ArenaVector<SectionRange> ranges(sections.count());
    for (std::uint64_t i = 1; i < sections.count(); ++i) {
      Elf64_Shdr sh;
      if (!sections.Get(i, &sh) || (sh.sh_flags & SHF_EXECINSTR) == 0) continue;
      if (sh.sh_addr + sh.sh_size < sh.sh_addr) continue;
      ranges[i] = SectionRange{sh.sh_addr, sh.sh_addr + sh.sh_size, true};
    }

    ArenaVector<Candidate> found;
    const std::uint64_t count = syms.size / sizeof(Elf64_Sym);
    for (std::uint64_t i = 1; i < count; ++i) {
      Elf64_Sym sym;
      if (!syms.Read(i * sizeof(Elf64_Sym), &sym)) break;
      const unsigned char kind = ELF64_ST_TYPE(sym.st_info);
      if (kind != STT_FUNC && kind != STT_GNU_IFUNC) continue;
      // Undefined imports, SHN_ABS and SHN_XINDEX-indexed symbols carry no
      // section to check the address against; skipping them is the safe side.
      if (sym.st_shndx == SHN_UNDEF || sym.st_shndx >= SHN_LORESERVE ||
          sym.st_shndx >= ranges.size()) {
        continue;
      }
      const SectionRange& section = ranges[sym.st_shndx];
      if (!section.executable || sym.st_value < section.addr || sym.st_value >= section.end) {
        continue;
      }
      std::size_t length = 0;
      const char* name = strtab.CString(sym.st_name, &length);
      if (name == nullptr || length == 0) continue;
      Candidate c;
      c.symbol.value = sym.st_value;
      c.symbol.name = sym.st_name;
      c.symbol.cached = 0;
      if (sym.st_size == 0) {
        c.symbol.zero_size = 1;
        c.symbol.end = section.end;
      } else {
        // A size running past its section is corrupt; clamp rather than let one
        // symbol swallow its neighbours.
        c.symbol.zero_size = 0;
        c.symbol.end =
            sym.st_size > section.end - sym.st_value ? section.end : sym.st_value + sym.st_size;
      }
      if (probe) return true;  // the table would not be empty
      c.rank = Rank(name, ELF64_ST_BIND(sym.st_info));
      found.push_back(c);
    }
    if (found.empty()) return false;

    // Within one address: sized before size-0, then widest first so that the
    // backwards walk in Find meets the innermost range first; best name first.
    std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
      if (a.symbol.value != b.symbol.value) return a.symbol.value < b.symbol.value;
      if (a.symbol.zero_size != b.symbol.zero_size) return a.symbol.zero_size < b.symbol.zero_size;
      if (a.symbol.end != b.symbol.end) return a.symbol.end > b.symbol.end;
      if (a.rank != b.rank) return a.rank < b.rank;
      return a.symbol.name < b.symbol.name;
    });

    ArenaVector<Symbol> symbols;
    symbols.reserve(found.size());
    for (std::size_t i = 0; i < found.size(); ++i) {
      const Symbol& s = found[i].symbol;
      if (!symbols.empty() && symbols.back().value == s.value) {
        const Symbol& prev = symbols.back();
        // Aliases with one range keep the best-ranked name; a size-0 label at a
        // sized function's address adds nothing.
        if (s.zero_size || (!prev.zero_size && prev.end == s.end)) continue;
      }
      symbols.push_back(s);
    }
    ArenaVector<std::uint64_t> max_end(symbols.size());
    std::uint64_t reach = 0;
    for (std::size_t i = 0; i < symbols.size(); ++i) {
      if (!symbols[i].zero_size) reach = std::max(reach, symbols[i].end);
      max_end[i] = reach;
    }

    symbols_ = std::move(symbols);
    max_end_ = std::move(max_end);
    names_.clear();
    strtab_ = strtab;
    file.KeepOnly(strings.sh_offset, strings.sh_size);  // the names; the rest of the file goes
    file_ = std::move(file);  // the string table lives in this mapping
    return true;
  }

  MappedFile file_;
  ByteView strtab_;
  ArenaVector<Symbol> symbols_;         // sorted by value
  ArenaVector<std::uint64_t> max_end_;  // max end of the sized symbols in symbols_[0..i]
  ArenaDeque<ArenaString> names_;       // demangled names, filled on first lookup (stable)
};

}  // namespace elf

inline ArenaVector<LoadedObject> CollectProfileObjects() {
  ArenaVector<LoadedObject> objects;
  elf::CollectState state;
  state.out = &objects;
  state.vdso = ::getauxval(AT_SYSINFO_EHDR);
  std::uintptr_t page = ::getauxval(AT_PAGESZ);
  if (page == 0 || (page & (page - 1)) != 0) page = 4096;
  state.page_mask = page - 1;
  IterateLoadedObjects(&elf::CollectObject, &state);
  if (state.out_of_memory) ThrowBadAlloc();
  const ArenaVector<elf::FileMapping> mappings = elf::ReadFileMappings();
  for (LoadedObject& object : objects) elf::FileOfMapping(object, mappings);
  elf::AppendUnloadedObjects(objects, state.page_mask);
  return objects;
}

// One frame of a symbolized address: what a pprof Line and its Function say.
// The views stay valid until the next Symbolize call on the same Symbolizer.
struct SymbolizedFrame {
  std::string_view name;           // short form, as pprof displays it: "ns::Class::Method"
  std::string_view system_name;    // linkage (mangled) name, or the plain name
  std::string_view full_name;      // demangled with parameters: "ns::Class::Method(int)"
  std::string_view function_file;  // file declaring the function; may be empty
  std::string_view file;           // file of `line`; may be empty
  std::uint32_t line = 0;          // 0 = unknown
  std::uint32_t start_line = 0;    // the function's declaration line; 0 = unknown
};

// tls_symbolize_cached_debug_only: debug_memory.hpp.

// What Symbolize knew about an address.
struct SymbolizedQuality {
  bool function = false;      // the outermost frame has a name
  bool line = false;          // the innermost frame has a file and line
  bool inline_known = false;  // .debug_info described it: the chain is complete
};

// Reads .symtab (falling back to .dynsym) of each object's file once per
// Symbolizer, when a lookup first falls in the object (the constructor only
// probes whether there are symbols), and through the process-wide debug
// cache, its DWARF.
class Symbolizer {
 public:
  explicit Symbolizer(const ArenaVector<LoadedObject>& objects,
                      const char* debug_directory = elf::kDebugFileDirectory);
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // Demangled name and start address of the function containing `pc`, from
  // the symbol table. False when no symbol covers it (name and start untouched).
  bool Lookup(std::uintptr_t pc, ArenaString& name, std::uintptr_t& start);
  // True when the object at `object_index` (into the constructor's vector)
  // had a symbol table we could read.
  bool HasSymbols(std::size_t object_index) const;
  // True when DWARF was found for the object (its own, or a debug file);
  // reads it if no lookup has yet.
  bool HasDebugInfo(std::size_t object_index) const;

  // The frames of `address` (an address inside the call, not a return
  // address), innermost first: several when the compiler inlined calls there.
  // Returns how many (at most `max`), 0 when nothing is known.
  int Symbolize(std::uintptr_t address, SymbolizedFrame* out, int max, SymbolizedQuality* quality);

 private:
  // Counts this Symbolizer in g_live_symbolizers (debug_info.hpp) for its
  // whole life, from before its first lookup; first member: a constructor
  // that throws still uncounts it.
  struct Live {
    Live() noexcept { g_live_symbolizers.fetch_add(1, std::memory_order_seq_cst); }
    ~Live() { g_live_symbolizers.fetch_sub(1, std::memory_order_seq_cst); }
    Live(const Live&) = delete;
    Live& operator=(const Live&) = delete;
  };
  Live live_;
  struct Range {
    std::uintptr_t start;
    std::uintptr_t limit;
    std::uintptr_t bias;
    std::size_t table;
    DebugObject* debug;  // null: no DWARF
  };
  const Range* RangeOf(std::uintptr_t pc) const;
  // The table, read in full on first use.
  elf::SymbolTable& Table(std::size_t table);

  // Where a table is read from; only probed until a PC falls in its object.
  struct TableSource {
    ArenaString path, build_id, file;
    bool loaded = false;
  };

  // ArenaPtr keeps each table (and the mapping its names point into) in place.
  ArenaVector<ArenaPtr<elf::SymbolTable>> tables_;
  ArenaVector<TableSource> sources_;  // per table
  ArenaString debug_directory_;
  bool has_debug_directory_ = false;
  ArenaVector<Range> ranges_;  // objects with symbols or DWARF, sorted by start
  ArenaVector<bool> has_symbols_;
  ArenaVector<DebugObject*> debug_;  // per object; its DWARF is read on first use
  char short_buf_[1024];
};

// A table is only probed here (is there any symbol?); it is read and sorted
// when a PC first falls in its object. A profile's PCs are in a few objects of
// the many loaded: libstdc++, libm, libgcc_s were read and sorted on every
// write for nothing (a fifth of a warm write of 10,000 stacks).
inline Symbolizer::Symbolizer(const ArenaVector<LoadedObject>& objects, const char* debug_directory)
    : has_debug_directory_(debug_directory != nullptr) {
  if (debug_directory != nullptr) debug_directory_ = debug_directory;
  // Several executable segments of one object share its file and its table.
  ArenaMap<ArenaString, std::size_t> table_of_file;
  ArenaVector<DebugObject*> debug_of_table;
  has_symbols_.reserve(objects.size());
  debug_.reserve(objects.size());
  for (const LoadedObject& object : objects) {
    ArenaString key = object.path;
    key.push_back('\0');
    key += object.file;
    key.push_back('\0');
    key += object.build_id;
    auto it = table_of_file.find(key);
    if (it == table_of_file.end()) {
      auto table = MakeArena<elf::SymbolTable>();
      DebugObject* debug = nullptr;
      bool any = false;
      if (!object.path.empty()) {
        any = table->Load(object.path, object.build_id, debug_directory, object.file, /*probe=*/true);
        DebugCacheLock hold;
        debug = FindDebugObject(object.path.c_str(), object.file.c_str(), object.build_id.c_str(), debug_directory);
      }
      tables_.push_back(std::move(table));
      TableSource source;
      source.loaded = !any;  // nothing to read
      if (any) {
        source.path = object.path;
        source.build_id = object.build_id;
        source.file = object.file;
      }
      sources_.push_back(std::move(source));
      debug_of_table.push_back(debug);
      it = table_of_file.emplace(std::move(key), tables_.size() - 1).first;
    }
    const bool usable = !sources_[it->second].loaded;
    DebugObject* debug = debug_of_table[it->second];
    has_symbols_.push_back(usable);
    debug_.push_back(debug);
    if ((usable || debug != nullptr) && object.start < object.limit) {
      ranges_.push_back(Range{object.start, object.limit, object.bias, it->second, debug});
    }
  }
  std::sort(ranges_.begin(), ranges_.end(),
            [](const Range& a, const Range& b) { return a.start < b.start; });
}

inline Symbolizer::~Symbolizer() = default;

// Tests: the next this many symbol tables read on first use (Table, during
// an encoding) fail as an open() refused for lack of descriptors would.
inline std::atomic<int> g_fail_table_loads_for_tests{0};

inline elf::SymbolTable& Symbolizer::Table(std::size_t table) {
  TableSource& source = sources_[table];
  if (!source.loaded) {
    source.loaded = true;  // (a file missed here counts in elf::tls_files_not_mapped/_opened: EncodeGzippedNamed)
    if (HEAPPROF_UNLIKELY(g_fail_table_loads_for_tests.load(std::memory_order_relaxed) > 0) &&
        g_fail_table_loads_for_tests.fetch_sub(1, std::memory_order_relaxed) > 0) {
      ++elf::tls_files_not_opened;  // as an open() refused with EMFILE
      return *tables_[table];
    }
    tables_[table]->Load(source.path, source.build_id, has_debug_directory_ ? debug_directory_.c_str() : nullptr,
                         source.file);
  }
  return *tables_[table];
}

inline const Symbolizer::Range* Symbolizer::RangeOf(std::uintptr_t pc) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), pc,
                             [](std::uintptr_t a, const Range& r) { return a < r.start; });
  if (it == ranges_.begin()) return nullptr;
  --it;
  return pc < it->limit ? &*it : nullptr;
}

inline bool Symbolizer::Lookup(std::uintptr_t pc, ArenaString& name, std::uintptr_t& start) {
  const Range* r = RangeOf(pc);
  if (r == nullptr) return false;
  elf::SymbolTable& table = Table(r->table);
  std::size_t index = 0;
  if (table.empty() || !table.Find(pc - r->bias, &index)) return false;
  name = table.Name(index);
  start = table.Value(index) + r->bias;
  return true;
}

inline int Symbolizer::Symbolize(std::uintptr_t address, SymbolizedFrame* out, int max,
                                 SymbolizedQuality* quality) {
  *quality = SymbolizedQuality{};
  if (max <= 0) return 0;
  const Range* r = RangeOf(address);
  if (r == nullptr) return 0;
  const std::uint64_t file_address = address - r->bias;
  constexpr int kMaxInline = 64;
  dwarf::SourceFrame source[kMaxInline];
  int n = 0;
  bool inline_known = false;
  if (r->debug != nullptr) {
    DebugCacheLock hold;  // decoding fills the shared cache
    if (!g_symbolize_names_only.load(std::memory_order_relaxed) &&
        (!tls_symbolize_cached_debug_only || r->debug->loaded())) {
      r->debug->EnsureLoaded();
      n = r->debug->Lookup(file_address, source, max < kMaxInline ? max : kMaxInline, &inline_known);
    }
  }
  for (int i = 0; i < n; ++i) {
    SymbolizedFrame& f = out[i];
    f = SymbolizedFrame{};
    if (source[i].function != nullptr) {
      const dwarf::FunctionInfo& fn = *source[i].function;
      f.name = fn.name;
      f.system_name = fn.system_name;
      f.full_name = fn.full_name;
      if (fn.file != nullptr) f.function_file = fn.file;
      f.start_line = fn.start_line;
    }
    if (source[i].file != nullptr) f.file = source[i].file;
    f.line = source[i].line;
  }
  // The symbol table names the outermost function when the DWARF did not, or
  // gave only an unqualified name (GCC writes no linkage name for a static
  // function: "Helper" where the symbol says "myns::Helper(int)").
  elf::SymbolTable& table = Table(r->table);
  std::size_t index = 0;
  const bool outer_plain = n > 0 && (source[n - 1].function == nullptr || !source[n - 1].function->linkage);
  if ((n == 0 || outer_plain) && !table.empty() && table.Find(file_address, &index)) {
    const ArenaString& full = table.Name(index);
    const std::size_t k = ShortFunctionName(full.c_str(), short_buf_, sizeof short_buf_);
    const std::string_view short_name = k != 0 ? std::string_view(short_buf_, k) : std::string_view(full);
    SymbolizedFrame& f = out[n == 0 ? 0 : n - 1];
    // The symbol must be the DWARF's function: its name, or a qualified form
    // of its plain DWARF name (full_name when there is no linkage name; our
    // qualified name may differ: "{lambda at f.cc:5}" for "{lambda(int)#1}").
    // ABI tags are in the symbol's name only: "app::Build[abi:cxx11]" is the
    // DWARF's "Build" (clang's -gline-tables-only and -g1 write no linkage
    // names, so every function returning a std::string met this).
    char untagged_buf[sizeof short_buf_];
    std::size_t untagged_len = 0;
    const bool fits_buf = short_name.size() <= sizeof untagged_buf;  // else compared as it is
    for (std::size_t i = 0; fits_buf && i < short_name.size();) {
      if (short_name.compare(i, 5, "[abi:") == 0) {
        const std::size_t close = short_name.find(']', i);
        if (close != std::string_view::npos) {
          i = close + 1;
          continue;
        }
      }
      untagged_buf[untagged_len++] = short_name[i++];
    }
    const std::string_view untagged = fits_buf ? std::string_view(untagged_buf, untagged_len) : short_name;
    const auto ends_with = [&untagged](std::string_view tail) {
      const std::size_t m = tail.size();
      return m == 0 || untagged == tail ||
             (untagged.size() > m + 2 && untagged.compare(untagged.size() - m, m, tail) == 0 &&
              untagged.compare(untagged.size() - m - 2, 2, "::") == 0);
    };
    // A plain DWARF name keeps its template arguments, which the short name
    // has not: GCC's generic lambda with code of its own is DWARF's
    // "operator()<Box<int>, Box<int> >", its symbol's short name
    // "app::Sorted::{lambda(auto:1 const&, auto:2 const&)#1}::operator()".
    std::string_view plain = f.full_name;
    if (outer_plain && !plain.empty() && plain.back() == '>') {
      int depth = 0;
      for (std::size_t i = plain.size(); i-- > 0;) {
        if (plain[i] == '>') ++depth;
        else if (plain[i] == '<' && --depth == 0) {
          plain = plain.substr(0, i);
          while (!plain.empty() && plain.back() == ' ') plain.remove_suffix(1);
          break;
        }
      }
      if (depth != 0) plain = f.full_name;  // unbalanced: "operator>", compared as it is
    }
    const bool fits = n == 0 || ends_with(f.name) || (outer_plain && (ends_with(f.full_name) || ends_with(plain)));
    if (fits) {
      if (n == 0) {
        f = SymbolizedFrame{};
        n = 1;
      }
      f.name = short_name;
      f.system_name = table.RawName(index);
      f.full_name = full;
    }
  }
  // A return address the kernel or the C library made up rather than a call
  // pushed: a signal handler returns to glibc's __restore_rt, a makecontext
  // coroutine to __start_context. It is the function's first byte, so the
  // instruction looked up (one byte before, where a call would be) is the
  // padding before it, in no symbol (glibc puts a nop there for unwinders):
  // the frame was an unnamed [libc.so.6]. Only there, the function starting
  // right after names it. (Here no symbol holds the address itself: the
  // lookup above would have named the frame.)
  if (n == 0 && !table.empty() && table.Find(file_address + 1, &index) && table.Value(index) == file_address + 1) {
    const ArenaString& full = table.Name(index);
    const std::size_t k = ShortFunctionName(full.c_str(), short_buf_, sizeof short_buf_);
    SymbolizedFrame& f = out[0];
    f = SymbolizedFrame{};
    f.name = k != 0 ? std::string_view(short_buf_, k) : std::string_view(full);
    f.system_name = table.RawName(index);
    f.full_name = full;
    n = 1;
  }
  if (n == 0) return 0;
  quality->function = !out[n - 1].name.empty();
  quality->line = !out[0].file.empty() && out[0].line != 0;
  quality->inline_known = inline_known;
  return n;
}

inline bool Symbolizer::HasSymbols(std::size_t object_index) const {
  return object_index < has_symbols_.size() && has_symbols_[object_index];
}

inline bool Symbolizer::HasDebugInfo(std::size_t object_index) const {
  if (object_index >= debug_.size() || debug_[object_index] == nullptr) return false;
  DebugCacheLock hold;
  debug_[object_index]->EnsureLoaded();  // reads the object's DWARF if no lookup has yet
  return debug_[object_index]->has_info();
}

}  // namespace detail
}  // namespace heapprof
