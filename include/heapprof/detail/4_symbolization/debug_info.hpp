// heapprof: where an object's DWARF is (its own sections, compressed or not;
// a separate debug file by build id or by .gnu_debuglink; the common file
// dwz -m moved shared DIEs and strings into, by .gnu_debugaltlink or DWARF 5's
// .debug_sup), and the process-wide cache of what has been decoded from it,
// kept across profile writes.
#pragma once

#include <elf.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "heapprof/detail/0_base/spinlock.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"
#include "heapprof/detail/4_symbolization/debug_memory.hpp"
#include "heapprof/detail/4_symbolization/dwarf_info.hpp"
#include "heapprof/detail/4_symbolization/elf_file.hpp"
#include "heapprof/detail/4_symbolization/inflate.hpp"

namespace heapprof {
namespace detail {

// .dwo files mapped at once, process-wide: each is a mapping (the kernel
// allows ~65,000 per process); past this, split units give names only.
inline constexpr int kMaxDwoFiles = 4096;
inline std::atomic<int> g_dwo_files{0};

// Tests: while set, every load that found DWARF runs out of memory at its
// end (builds with exceptions; DebugObject::EnsureLoaded).
inline std::atomic<bool> g_fail_debug_loads_for_tests{false};

// The DWARF of one loaded object.
class DebugObject {
 public:
  DebugObject() = default;
  ~DebugObject() { Unload(); }
  DebugObject(const DebugObject&) = delete;
  DebugObject& operator=(const DebugObject&) = delete;

  // `build_id`: the id of the object as loaded (lowercase hex, may be empty).
  // `file`: what to open for the object's bytes when `path` no longer names
  // them (LoadedObject::file); "" = `path`. `path` still places .gnu_debuglink.
  void Load(const char* path, const char* file, const char* build_id, const char* debug_directory);

  // Loads on first use: a write touches the DWARF only of objects its PCs are in.
  void Remember(const char* path, const char* file, const char* build_id, const char* debug_directory) {
    path_ = path;
    file_name_ = file;
    build_id_ = build_id;
    debug_directory_ = debug_directory;
  }
  // A load that runs out of memory (bad_alloc, builds with exceptions) is
  // undone and rethrown: the write that asked fails over to a profile
  // without names (snapshot.hpp), and the next write loads this object
  // again. It used to stay marked loaded, without its DWARF: every later
  // profile had names but no lines for it.
  // Likewise a load that found no DWARF because a file could not be opened
  // or mapped for now (out of descriptors, or of memory for the mapping:
  // elf_file.hpp's counters): not marked loaded, so the next write tries
  // again. Marked, one profile written while the process was out of
  // descriptors cost every later profile its file:line.
  void EnsureLoaded() {
    if (loaded_) return;
    loaded_ = true;
    if (path_ == nullptr) return;
    const unsigned not_opened = elf::tls_files_not_opened, not_mapped = elf::tls_files_not_mapped;
#if HEAPPROF_EXCEPTIONS
    try {
      Load(path_, file_name_ != nullptr ? file_name_ : "", build_id_ != nullptr ? build_id_ : "", debug_directory_);
      // (After the load: what it took must be given back.)
      if (HEAPPROF_UNLIKELY(g_fail_debug_loads_for_tests.load(std::memory_order_relaxed)) && info_ != nullptr) {
        throw std::bad_alloc();
      }
    } catch (...) {  // (a forced unwind too: rethrown)
      Unload();
      throw;
    }
#else
    Load(path_, file_name_ != nullptr ? file_name_ : "", build_id_ != nullptr ? build_id_ : "", debug_directory_);
#endif
    if (info_ == nullptr && (elf::tls_files_not_opened != not_opened || elf::tls_files_not_mapped != not_mapped)) {
      Unload();
    }
  }

  int Lookup(std::uint64_t file_address, dwarf::SourceFrame* out, int max, bool* inline_known) {
    *inline_known = false;
    return info_ != nullptr ? info_->Lookup(file_address, out, max, inline_known) : 0;
  }
  bool has_lines() const { return info_ != nullptr && info_->has_lines(); }
  bool has_info() const { return info_ != nullptr && info_->has_info(); }
  // Whether its DWARF was read (or found absent) by an earlier lookup.
  bool loaded() const { return loaded_; }
  const char* debug_file() const { return debug_file_; }
  // Gives back what EnsureLoaded read: the next lookup reads it again. With
  // the cache's lock held and no Symbolizer alive (DropDebugCacheIfUnused).
  void Release() noexcept { Unload(); }

 private:
  struct Inflated {
    unsigned char* data;
    std::size_t size;
  };

  // The DWARF sections of a file; a .gnu_debugaltlink or .debug_sup to *link.
  // `dwo`: a split-DWARF .dwo file, whose sections are named ".debug_info.dwo" ...
  // A .dwp package's .debug_cu_index goes to *cu_index.
  bool ReadSections(const elf::SectionTable& sections, const elf::ByteView& view, dwarf::Sections* out,
                    elf::ByteView* altlink, elf::ByteView* sup, bool dwo = false,
                    elf::ByteView* cu_index = nullptr);
  // DwoOpener: the .dwo a skeleton unit names, looked for as written
  // (relative to its comp_dir), then beside the object's file, then in the
  // .dwp package beside it.
  static bool OpenDwo(void* self, const char* dwo_name, const char* comp_dir, std::uint64_t dwo_id,
                      dwarf::Sections* out);
  bool KeepDwoFile(const char* candidate, dwarf::Sections* found, elf::ByteView* cu_index,
                   bool (*wanted)(const dwarf::Sections&, const elf::ByteView&, std::uint64_t), std::uint64_t dwo_id);
  bool TryDwo(const char* candidate, std::uint64_t dwo_id, dwarf::Sections* out);
  bool TryDwp(std::uint64_t dwo_id, dwarf::Sections* out);
  bool OpenDwp(const char* candidate);
  // `name`: the file's name; `file` its bytes, and the build id it must have.
  bool UseFile(elf::MappedFile& file, const char* build_id, const char* name, const char* debug_directory);
  // The file file_'s `altlink` or `sup` names, with its DWARF in sup_info_.
  void UseSupplementary(const char* name, const elf::ByteView& altlink, const elf::ByteView& sup,
                        const char* debug_directory);
  bool TrySupplementary(const char* candidate, bool standard, const ArenaString& hex, const elf::ByteView& id);
  // Back to the state before EnsureLoaded: nothing read, everything given back.
  void Unload() noexcept {
    DebugDelete(info_);
    info_ = nullptr;
    for (elf::MappedFile* f : dwo_files_) DebugDelete(f);  // (after info_, which reads them)
    g_dwo_files.fetch_sub(static_cast<int>(dwo_files_.size()), std::memory_order_relaxed);
    dwo_files_.Clear();
    dwp_sections_ = dwarf::Sections{};
    dwp_cu_index_ = elf::ByteView{};
    dwp_tried_ = false;
    DebugDelete(sup_info_);  // (after info_, which points at it)
    sup_info_ = nullptr;
    sup_sections_ = dwarf::Sections{};
    sup_file_ = elf::MappedFile{};
    FreeInflated(0);
    sections_ = dwarf::Sections{};
    file_ = elf::MappedFile{};
    debug_file_ = nullptr;
    loaded_ = false;
  }

  elf::MappedFile file_;
  dwarf::Sections sections_{};
  elf::MappedFile sup_file_;  // dwz -m's common file (.gnu_debugaltlink) or a DWARF 5 supplementary file
  dwarf::Sections sup_sections_{};
  dwarf::DwarfInfo* sup_info_ = nullptr;
  // Compressed sections inflated: of the file, its supplementary file and
  // its .dwo files (-gz -gsplit-dwarf compresses those too).
  DebugArray<Inflated> inflated_;
  // Gives back the inflated sections from the `keep`-th on.
  void FreeInflated(std::size_t keep) noexcept {
    while (inflated_.size() > keep) {
      DebugFree(inflated_.back().data, inflated_.back().size);
      inflated_.Pop();
    }
  }
  dwarf::DwarfInfo* info_ = nullptr;
  DebugArray<elf::MappedFile*> dwo_files_;  // the .dwo files info_'s split units are read from, and the .dwp
  dwarf::Sections dwp_sections_{};          // the .dwp package's, when there is one
  elf::ByteView dwp_cu_index_;
  bool dwp_tried_ = false;
  bool loaded_ = false;
  const char* path_ = nullptr;             // in the cache's key pool
  const char* file_name_ = nullptr;
  const char* build_id_ = nullptr;
  const char* debug_directory_ = nullptr;
  const char* debug_file_ = nullptr;  // the file the DWARF came from
  char debug_file_buf_[1024] = {};
};

namespace debug_files {

inline std::uint32_t Crc32(const unsigned char* data, std::size_t n) {
  std::uint32_t crc = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xffffffffu;
}

inline bool Exists(const char* path) { return ::access(path, R_OK) == 0; }

// Section name of header `sh` through the section-name string table.
inline const char* SectionName(const elf::ByteView& file, const elf::SectionTable& sections,
                               const Elf64_Shdr& sh) {
  Elf64_Ehdr eh;
  if (!file.Read(0, &eh)) return nullptr;
  std::uint64_t index = eh.e_shstrndx;
  Elf64_Shdr first;
  if (index == SHN_XINDEX && sections.Get(0, &first)) index = first.sh_link;
  Elf64_Shdr names;
  if (!sections.Get(index, &names)) return nullptr;
  const elf::ByteView strtab = sections.Contents(names);
  std::size_t length = 0;
  return strtab.CString(sh.sh_name, &length);
}

inline bool HasDwarf(const elf::MappedFile& file) {
  elf::SectionTable sections;
  if (!sections.Init(file.view())) return false;
  Elf64_Shdr sh;
  for (std::uint64_t i = 1; i < sections.count(); ++i) {
    if (!sections.Get(i, &sh) || sh.sh_type == SHT_NOBITS) continue;
    const char* name = SectionName(file.view(), sections, sh);
    if (name != nullptr && (std::strcmp(name, ".debug_info") == 0 || std::strcmp(name, ".zdebug_info") == 0 ||
                            std::strcmp(name, ".debug_line") == 0 || std::strcmp(name, ".zdebug_line") == 0)) {
      return true;
    }
  }
  return false;
}

// Whether a file's build id matches the loaded object's. A file without one
// is refused too when the object has one: it is some other build (a decoy
// of the same name, an old copy), and its names and lines would lie.
inline bool BuildIdMatches(const elf::SectionTable& sections, const char* build_id) {
  if (build_id == nullptr || build_id[0] == '\0') return true;
  return elf::FileBuildId(sections) == build_id;
}

// The separate debug file that the object's own file `own` names by
// .gnu_debuglink: a file name and the CRC-32 of that file, looked for beside
// `path` (the object's name, not the file it was read through), in its
// .debug/, and under the debug directory. The first candidate whose CRC
// matches is mapped into `out` and its name written to `found`.
inline bool OpenDebugLink(const char* path, const elf::ByteView& own, const char* debug_directory,
                          elf::MappedFile& out, char* found, std::size_t found_size) {
  elf::SectionTable sections;
  if (!sections.Init(own)) return false;
  Elf64_Shdr sh;
  for (std::uint64_t i = 1; i < sections.count(); ++i) {
    if (!sections.Get(i, &sh)) continue;
    const char* name = SectionName(own, sections, sh);
    if (name == nullptr || std::strcmp(name, ".gnu_debuglink") != 0) continue;
    const elf::ByteView link = sections.Contents(sh);
    std::size_t length = 0;
    const char* file = link.CString(0, &length);
    std::uint32_t crc = 0;
    if (file == nullptr || length == 0 || std::strchr(file, '/') != nullptr ||
        !link.Read((length + 4) & ~std::uint64_t{3}, &crc)) {
      return false;
    }
    const char* slash = std::strrchr(path, '/');
    const int dir_length = slash != nullptr ? static_cast<int>(slash - path) : 0;
    for (int where = 0; where < 3; ++where) {
      if (where == 0) std::snprintf(found, found_size, "%.*s/%s", dir_length, path, file);
      if (where == 1) std::snprintf(found, found_size, "%.*s/.debug/%s", dir_length, path, file);
      if (where == 2) {
        if (debug_directory == nullptr) break;
        std::snprintf(found, found_size, "%s%.*s/%s", debug_directory, dir_length, path, file);
      }
      if (std::strcmp(found, path) == 0) continue;
      if (!out.Open(found)) continue;
      const elf::ByteView bytes = out.view();
      if (Crc32(bytes.data, static_cast<std::size_t>(bytes.size)) == crc) return true;
    }
    out.Reset();
    return false;
  }
  return false;
}

// gdb's place for a separate debug file: <dir>/.build-id/xx/yyyy.debug for
// the id xxyyyy (lowercase hex, at least 2 digits).
inline void BuildIdPath(char* out, std::size_t size, const char* debug_directory, const char* hex) {
  std::snprintf(out, size, "%s/.build-id/%.2s/%s.debug", debug_directory, hex, hex + 2);
}

// A .debug_sup section (DWARF 5, 7.3.6; dwz -m -5): version (2 bytes),
// is_supplementary (1 byte: 0 in a file that uses the supplementary file, 1
// in that file), the supplementary file's name, then a ULEB128 length and
// that many checksum bytes, the same in both files. False when damaged.
struct DebugSup {
  std::uint16_t version = 0;
  std::uint8_t is_supplementary = 0;
  const char* name = nullptr;
  elf::ByteView checksum;
};
inline bool ReadDebugSup(const elf::ByteView& sup, DebugSup* out) {
  dwarf::Cursor c(sup, 0);
  out->version = c.U16();
  out->is_supplementary = c.U8();
  out->name = c.CString();
  const std::uint64_t length = c.Uleb();
  if (!c.ok() || !sup.Contains(c.pos(), length)) return false;
  out->checksum = sup.Sub(c.pos(), length);
  return true;
}

}  // namespace debug_files

inline bool DebugObject::ReadSections(const elf::SectionTable& sections, const elf::ByteView& view,
                                      dwarf::Sections* out_sections, elf::ByteView* altlink, elf::ByteView* sup,
                                      bool dwo, elf::ByteView* cu_index) {
  Elf64_Shdr sh;
  for (std::uint64_t i = 1; i < sections.count(); ++i) {
    if (!sections.Get(i, &sh) || sh.sh_type == SHT_NOBITS) continue;
    const char* name = debug_files::SectionName(view, sections, sh);
    if (name == nullptr) continue;
    char plain[32];  // a .dwo's ".debug_info.dwo" read as ".debug_info"
    if (dwo && cu_index != nullptr && std::strcmp(name, ".debug_cu_index") == 0) {
      *cu_index = sections.Contents(sh);
      continue;
    }
    if (dwo) {
      const std::size_t length = std::strlen(name);
      if (length < 4 || length - 4 >= sizeof plain || std::strcmp(name + length - 4, ".dwo") != 0) continue;
      std::memcpy(plain, name, length - 4);
      plain[length - 4] = '\0';
      name = plain;
    }
    if (std::strcmp(name, ".gnu_debugaltlink") == 0) {
      *altlink = sections.Contents(sh);
      continue;
    }
    if (std::strcmp(name, ".debug_sup") == 0) {
      *sup = sections.Contents(sh);
      continue;
    }
    bool gnu_compressed = false;
    if (std::strncmp(name, ".zdebug_", 8) == 0) {
      gnu_compressed = true;
      name += 2;  // ".zdebug_x" → "debug_x"
    } else if (std::strncmp(name, ".debug_", 7) == 0) {
      name += 1;
    } else {
      continue;
    }
    elf::ByteView* target = nullptr;
    if (std::strcmp(name, "debug_info") == 0) target = &out_sections->info;
    else if (std::strcmp(name, "debug_abbrev") == 0) target = &out_sections->abbrev;
    else if (std::strcmp(name, "debug_line") == 0) target = &out_sections->line;
    else if (std::strcmp(name, "debug_str") == 0) target = &out_sections->str;
    else if (std::strcmp(name, "debug_line_str") == 0) target = &out_sections->line_str;
    else if (std::strcmp(name, "debug_str_offsets") == 0) target = &out_sections->str_offsets;
    else if (std::strcmp(name, "debug_addr") == 0) target = &out_sections->addr;
    else if (std::strcmp(name, "debug_ranges") == 0) target = &out_sections->ranges;
    else if (std::strcmp(name, "debug_rnglists") == 0) target = &out_sections->rnglists;
    if (target == nullptr) continue;
    elf::ByteView bytes = sections.Contents(sh);
    if (bytes.size == 0) continue;
    const unsigned char* packed = nullptr;
    std::uint64_t packed_size = 0, size = 0;
    if ((sh.sh_flags & SHF_COMPRESSED) != 0) {
      Elf64_Chdr ch;
      if (!bytes.Read(0, &ch) || ch.ch_type != ELFCOMPRESS_ZLIB) continue;  // zstd: not read
      packed = bytes.data + sizeof ch;
      packed_size = bytes.size - sizeof ch;
      size = ch.ch_size;
    } else if (gnu_compressed) {
      // "ZLIB", then the size as 8 big-endian bytes (the pre-gABI -gz=zlib-gnu).
      if (bytes.size < 12 || std::memcmp(bytes.data, "ZLIB", 4) != 0) continue;
      for (int k = 0; k < 8; ++k) size = (size << 8) | bytes.data[4 + k];
      packed = bytes.data + 12;
      packed_size = bytes.size - 12;
    } else {
      *target = bytes;
      continue;
    }
    if (size == 0 || size > HEAPPROF_DEBUG_INFO_MAX_BYTES || !inflated_.Reserve(inflated_.size() + 1)) continue;
    auto* out = static_cast<unsigned char*>(DebugAllocate(size));
    if (out == nullptr) continue;
    if (!inflate::ZlibInflate(packed, packed_size, out, size)) {
      DebugFree(out, size);
      continue;
    }
    (void)inflated_.Push(Inflated{out, size});  // (room reserved above)
    *target = elf::ByteView{out, size};
  }
  // Without units there is nothing to find a line program through.
  return out_sections->info.size != 0 && out_sections->abbrev.size != 0;
}

// Maps `candidate`, a .dwo or .dwp (sections named ".debug_info.dwo" ...),
// and keeps it mapped, with what was inflated of it, when `wanted` accepts
// its sections (and a .dwp's unit index); else gives both back.
inline bool DebugObject::KeepDwoFile(const char* candidate, dwarf::Sections* found, elf::ByteView* cu_index,
                                     bool (*wanted)(const dwarf::Sections&, const elf::ByteView&, std::uint64_t),
                                     std::uint64_t dwo_id) {
  if (g_dwo_files.load(std::memory_order_relaxed) >= kMaxDwoFiles) return false;
  elf::MappedFile* f = DebugNew<elf::MappedFile>();
  if (f == nullptr) return false;
  elf::SectionTable sections;
  const std::size_t inflated_before = inflated_.size();
  elf::ByteView no_altlink, no_sup;
  if (f->Open(candidate) && sections.Init(f->view(), /*relocatable=*/true) &&
      ReadSections(sections, f->view(), found, &no_altlink, &no_sup, /*dwo=*/true, cu_index) &&
      wanted(*found, *cu_index, dwo_id) && dwo_files_.Push(f)) {
    g_dwo_files.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  FreeInflated(inflated_before);
  DebugDelete(f);
  return false;
}

// A .dwo whose split unit has the skeleton's id.
inline bool DebugObject::TryDwo(const char* candidate, std::uint64_t dwo_id, dwarf::Sections* out) {
  dwarf::Sections found{};
  elf::ByteView no_index;
  auto has_unit = [](const dwarf::Sections& s, const elf::ByteView&, std::uint64_t id) {
    dwarf::UnitHeader unit;
    return dwarf::FindSplitUnit(s, id, &unit);
  };
  if (!KeepDwoFile(candidate, &found, &no_index, has_unit, dwo_id)) return false;
  *out = found;
  return true;
}

// A .dwp package, kept mapped (as a .dwo is) when it has a unit index.
inline bool DebugObject::OpenDwp(const char* candidate) {
  dwarf::Sections found{};
  elf::ByteView cu_index;
  auto has_index = [](const dwarf::Sections&, const elf::ByteView& index, std::uint64_t) { return index.size != 0; };
  if (!KeepDwoFile(candidate, &found, &cu_index, has_index, 0)) return false;
  dwp_sections_ = found;
  dwp_cu_index_ = cu_index;
  return true;
}

// The .dwp package is "<object>.dwp", as gdb and llvm-symbolizer look for it
// (beside the object, or beside the separate debug file its DWARF came from);
// opened once, on the first unit whose .dwo is not found.
inline bool DebugObject::TryDwp(std::uint64_t dwo_id, dwarf::Sections* out) {
  if (!dwp_tried_) {
    dwp_tried_ = true;
    char candidate[1024];
    for (const char* base : {path_, debug_file_}) {
      if (base == nullptr || (base == debug_file_ && path_ != nullptr && std::strcmp(base, path_) == 0)) continue;
      const int n = std::snprintf(candidate, sizeof candidate, "%s.dwp", base);
      if (n > 0 && static_cast<std::size_t>(n) < sizeof candidate && OpenDwp(candidate)) break;
    }
  }
  if (dwp_cu_index_.size == 0) return false;
  dwarf::Sections unit{};
  dwarf::UnitHeader header;
  if (!dwarf::DwpUnitSections(dwp_sections_, dwp_cu_index_, dwo_id, &unit) ||
      !dwarf::FindSplitUnit(unit, dwo_id, &header)) {
    return false;
  }
  *out = unit;
  return true;
}

// Where GCC and clang put the .dwo (DW_AT_dwo_name, relative to DW_AT_comp_dir
// unless absolute), then beside the object's file (under the name as written,
// then its last component): a build tree moved, or a program and its .dwo
// files copied together. The first whose split unit has the skeleton's id.
inline bool DebugObject::OpenDwo(void* self, const char* dwo_name, const char* comp_dir, std::uint64_t dwo_id,
                                 dwarf::Sections* out) {
  DebugObject& o = *static_cast<DebugObject*>(self);
  char candidate[1024];
  auto fits = [&](int n) { return n > 0 && static_cast<std::size_t>(n) < sizeof candidate; };
  if (dwo_name[0] == '/') {
    if (o.TryDwo(dwo_name, dwo_id, out)) return true;
  } else if (comp_dir != nullptr && comp_dir[0] != '\0' &&
             fits(std::snprintf(candidate, sizeof candidate, "%s/%s", comp_dir, dwo_name)) &&
             o.TryDwo(candidate, dwo_id, out)) {
    return true;
  }
  const char* object = o.path_;
  if (object == nullptr) return o.TryDwp(dwo_id, out);
  const char* slash = std::strrchr(object, '/');
  const int dir_length = slash != nullptr ? static_cast<int>(slash - object) : -1;
  const char* base = std::strrchr(dwo_name, '/');
  base = base != nullptr ? base + 1 : dwo_name;
  for (const char* name : {dwo_name[0] == '/' ? nullptr : dwo_name, base == dwo_name ? nullptr : base}) {
    if (name == nullptr) continue;
    const int n = dir_length < 0 ? std::snprintf(candidate, sizeof candidate, "%s", name)
                                 : std::snprintf(candidate, sizeof candidate, "%.*s/%s", dir_length, object, name);
    if (fits(n) && o.TryDwo(candidate, dwo_id, out)) return true;
  }
  return o.TryDwp(dwo_id, out);
}

inline bool DebugObject::UseFile(elf::MappedFile& file, const char* build_id, const char* name,
                                 const char* debug_directory) {
  elf::SectionTable sections;
  if (!sections.Init(file.view())) return false;
  if (!debug_files::BuildIdMatches(sections, build_id)) return false;  // replaced on disk since it was loaded
  if (!debug_files::HasDwarf(file)) return false;
  file_ = static_cast<elf::MappedFile&&>(file);
  elf::ByteView altlink, sup;
  if (!ReadSections(sections, file_.view(), &sections_, &altlink, &sup)) {
    sections_ = dwarf::Sections{};
    return false;
  }
  UseSupplementary(name, altlink, sup, debug_directory);
  info_ = DebugNew<dwarf::DwarfInfo>(sections_);
  if (info_ == nullptr) {
    DebugDelete(sup_info_);
    sup_info_ = nullptr;
    sup_file_.Reset();
    return false;
  }
  info_->SetSupplementary(sup_info_);
  info_->SetDwoOpener(&DebugObject::OpenDwo, this);
  return true;
}

// .gnu_debugaltlink (what dwz -m writes): the common file's name, NUL, then
// its build id (the bytes of its NT_GNU_BUILD_ID note). .debug_sup: see
// debug_files::ReadDebugSup; the checksum stands for the id. `candidate` is
// the common file when its sections read, it has strings and its id (or
// checksum) is `id`: a file of another build would have DIE offsets naming
// the wrong functions. Then it is kept, with its DWARF in sup_info_.
inline bool DebugObject::TrySupplementary(const char* candidate, bool standard, const ArenaString& hex,
                                          const elf::ByteView& id) {
  elf::MappedFile f;
  elf::SectionTable sections;
  if (!f.Open(candidate) || !sections.Init(f.view(), /*relocatable=*/true)) return false;
  const std::size_t inflated_before = inflated_.size();
  dwarf::Sections found{};
  elf::ByteView its_altlink, its_sup;
  bool matches = ReadSections(sections, f.view(), &found, &its_altlink, &its_sup) && found.str.size != 0;
  if (matches && !standard) {
    matches = elf::FileBuildId(sections) == hex;
  } else if (matches) {
    debug_files::DebugSup theirs;
    matches = debug_files::ReadDebugSup(its_sup, &theirs) && theirs.is_supplementary == 1 &&
              theirs.checksum.size == id.size &&
              std::memcmp(theirs.checksum.data, id.data, static_cast<std::size_t>(id.size)) == 0;
  }
  dwarf::DwarfInfo* info = matches ? DebugNew<dwarf::DwarfInfo>(found) : nullptr;
  if (info == nullptr) {
    FreeInflated(inflated_before);
    return false;
  }
  sup_file_ = static_cast<elf::MappedFile&&>(f);  // (the mapping, and views into it, stay)
  sup_sections_ = found;
  sup_info_ = info;
  sections_.sup_str = found.str;
  return true;
}

// Where the common file is looked for: the name as written (absolute, or
// relative to the directory of `name`, the file holding the link, then of the
// file it is a symbolic link to), then by the id under the debug directory
// (.build-id/xx/yyyy.debug, as gdb looks), then the absolute name under the
// debug directory. Not found: the names it holds stay unknown.
inline void DebugObject::UseSupplementary(const char* name, const elf::ByteView& altlink,
                                          const elf::ByteView& sup, const char* debug_directory) {
  const char* link = nullptr;
  std::size_t link_length = 0;
  elf::ByteView id;
  const bool standard = altlink.size == 0;
  if (!standard) {
    link = altlink.CString(0, &link_length);
    if (link != nullptr) id = altlink.Sub(link_length + 1, altlink.size - link_length - 1);
  } else if (sup.size != 0) {
    debug_files::DebugSup ours;
    if (!debug_files::ReadDebugSup(sup, &ours) || ours.version < 2 || ours.version > 5 || ours.is_supplementary != 0) {
      return;
    }
    link = ours.name;
    id = ours.checksum;
    if (link != nullptr) link_length = std::strlen(link);
  }
  if (link == nullptr || link_length == 0 || id.size == 0 || id.size > 64) return;
  const ArenaString hex = elf::HexLower(id.data, id.size);  // (<= 64; no cast: a useless one on LP64, -Wuseless-cast)
  char candidate[1024];
  // The link relative to the directory of `holder`.
  auto beside = [&](const char* holder) {
    const char* slash = std::strrchr(holder, '/');
    if (slash == nullptr) {
      std::snprintf(candidate, sizeof candidate, "%s", link);
    } else {
      std::snprintf(candidate, sizeof candidate, "%.*s/%s", static_cast<int>(slash - holder), holder, link);
    }
    return TrySupplementary(candidate, standard, hex, id);
  };
  if (link[0] == '/') {
    if (TrySupplementary(link, standard, hex, id)) return;
  } else {
    if (beside(name)) return;
    char real[PATH_MAX];
    if (::realpath(name, real) != nullptr && std::strcmp(real, name) != 0 && beside(real)) return;
  }
  if (debug_directory == nullptr) return;
  if (!standard && id.size >= 2) {
    debug_files::BuildIdPath(candidate, sizeof candidate, debug_directory, hex.c_str());
    if (TrySupplementary(candidate, standard, hex, id)) return;
  }
  if (link[0] == '/') {
    std::snprintf(candidate, sizeof candidate, "%s%s", debug_directory, link);
    (void)TrySupplementary(candidate, standard, hex, id);
  }
}

inline void DebugObject::Load(const char* path, const char* file, const char* build_id,
                              const char* debug_directory) {
  auto remember = [&](const char* name) {
    std::snprintf(debug_file_buf_, sizeof debug_file_buf_, "%s", name);
    debug_file_ = debug_file_buf_;
  };
  const char* own_file = file != nullptr && file[0] != '\0' ? file : path;
  elf::MappedFile own;
  if (own.Open(own_file)) {
    // The own file, if it still has its DWARF.
    if (UseFile(own, build_id, path, debug_directory)) {
      remember(path);
      return;
    }
  }
  if (debug_directory == nullptr) return;
  char candidate[1024];
  // 1. By build id (gdb's /usr/lib/debug/.build-id/xx/yyyy.debug).
  const std::size_t id_length = build_id != nullptr ? std::strlen(build_id) : 0;
  if (id_length > 2) {
    debug_files::BuildIdPath(candidate, sizeof candidate, debug_directory, build_id);
    elf::MappedFile debug;
    if (debug.Open(candidate) && UseFile(debug, build_id, candidate, debug_directory)) {
      remember(candidate);
      return;
    }
  }
  // 2. By .gnu_debuglink.
  if (!own.Open(own_file)) return;
  elf::MappedFile debug;
  if (debug_files::OpenDebugLink(path, own.view(), debug_directory, debug, candidate, sizeof candidate) &&
      UseFile(debug, build_id, candidate, debug_directory)) {
    remember(candidate);
  }
}

// ------------------------------------------------------------------ the cache

// Objects are keyed by path and build id; decoded data stays for the life of
// the process (or until the budget is spent: then new lookups get names only).
struct DebugCacheEntry {
  const char* path;
  const char* file;
  const char* build_id;
  const char* debug_directory;
  DebugObject* object;
};

struct DebugCache {
  static constexpr int kMaxObjects = 1024;
  DebugCacheEntry entries[kMaxObjects];
  int count = 0;
  DebugStringPool keys;
};

inline SpinLock g_debug_cache_lock;
inline DebugCache* g_debug_cache = nullptr;

// A child forked while another thread held the lock would wait forever: it
// starts over with a fresh cache instead (the old one is left, not freed, as
// it may be half updated). Run by the engine's fork child handler.
inline void DebugCacheForkChild() noexcept {
  if (!g_debug_cache_lock.try_lock()) g_debug_cache = nullptr;
  g_debug_cache_lock.unlock();
}

// Holds the cache lock with thread cancellation held off: a cancelled thread
// must not leave the lock taken (with -fno-exceptions nothing would release it).
// The fork hook is set before the lock is taken (program order, release):
// a child that inherits the lock held also inherits the hook.
class DebugCacheLock {
 public:
  DebugCacheLock() noexcept {
    g_fork_child_symbolizer.store(&DebugCacheForkChild, std::memory_order_release);
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_state_);
    g_debug_cache_lock.lock();
  }
  ~DebugCacheLock() {
    g_debug_cache_lock.unlock();
    int ignored = 0;
    pthread_setcancelstate(old_state_, &ignored);
  }
  DebugCacheLock(const DebugCacheLock&) = delete;
  DebugCacheLock& operator=(const DebugCacheLock&) = delete;

 private:
  int old_state_ = 0;
};

// The Symbolizers alive now (symbolizer.hpp). A lookup's names, files and
// lines point into the cache's DWARF while its Symbolizer lives.
inline std::atomic<int> g_live_symbolizers{0};

// After a write ran out of memory: every object's DWARF (decoded tables,
// inflated sections, mapped debug files) goes back, unless a Symbolizer is
// alive, whose lookups may point into it; each object reads its DWARF again
// at its next lookup. A write whose encoding with names ran out of memory
// then has the room it used for the encoding without names (snapshot.hpp:
// EncodeGzippedSymbolized). Before, what earlier writes had cached stayed:
// an oom dump under a tight address space, after a warm-up write had cached
// a large program's DWARF, failed without names too (nothing written). A
// Symbolizer made meanwhile counts itself before its first lookup, which
// waits for this lock and then reads the DWARF again. True when dropped.
inline bool DropDebugCacheIfUnused() noexcept {
  DebugCacheLock hold;
  if (g_debug_cache == nullptr || g_live_symbolizers.load(std::memory_order_seq_cst) != 0) return false;
  for (int i = 0; i < g_debug_cache->count; ++i) g_debug_cache->entries[i].object->Release();
  return true;
}

// The object for (path, file, build_id); its DWARF is read by EnsureLoaded,
// on first use. Null only when memory is short. Call with the DebugCacheLock held.
inline DebugObject* FindDebugObject(const char* path, const char* file, const char* build_id,
                                    const char* debug_directory) {
  if (g_debug_cache == nullptr) {
    g_debug_cache = DebugNew<DebugCache>();
    if (g_debug_cache == nullptr) return nullptr;
  }
  DebugCache& cache = *g_debug_cache;
  for (int i = 0; i < cache.count; ++i) {
    const DebugCacheEntry& e = cache.entries[i];
    const bool same_directory = (e.debug_directory == nullptr && debug_directory == nullptr) ||
                                (e.debug_directory != nullptr && debug_directory != nullptr &&
                                 std::strcmp(e.debug_directory, debug_directory) == 0);
    if (std::strcmp(e.path, path) == 0 && std::strcmp(e.file, file) == 0 && std::strcmp(e.build_id, build_id) == 0 &&
        same_directory) {
      return e.object;
    }
  }
  if (cache.count == DebugCache::kMaxObjects) return nullptr;
  const char* key_path = cache.keys.Add(path);
  const char* key_file = cache.keys.Add(file);
  const char* key_id = cache.keys.Add(build_id);
  const char* key_dir = debug_directory != nullptr ? cache.keys.Add(debug_directory) : nullptr;
  DebugObject* object = DebugNew<DebugObject>();
  if (key_path == nullptr || key_file == nullptr || key_id == nullptr || object == nullptr ||
      (debug_directory != nullptr && key_dir == nullptr)) {
    DebugDelete(object);
    return nullptr;
  }
  object->Remember(key_path, key_file, key_id, key_dir);
  cache.entries[cache.count++] = DebugCacheEntry{key_path, key_file, key_id, key_dir, object};
  return object;
}

}  // namespace detail
}  // namespace heapprof
