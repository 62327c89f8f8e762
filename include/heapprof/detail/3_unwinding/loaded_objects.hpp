// heapprof: the loader's objects as both the unwinder and the symbolizer see
// them. Their build ids, read from the notes the loader mapped, and the
// objects the profiler has seen loaded, remembered past their dlclose so that
// a profile written later still names their frames (SeenObject).
//
// Here, below the unwinder, because the table unwinder's snapshots (which run
// inside samples) feed that memory; the symbolizer reads it.
#pragma once

#include <elf.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <sys/auxv.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"

namespace heapprof {
namespace detail {
namespace elf {

// A span of bytes that refuses reads outside itself.
struct ByteView {
  const unsigned char* data = nullptr;
  std::uint64_t size = 0;

  bool Contains(std::uint64_t offset, std::uint64_t length) const {
    return offset <= size && length <= size - offset;
  }

  // memcpy rather than a cast: offsets taken from a file need not be aligned.
  template <class T>
  bool Read(std::uint64_t offset, T* out) const {
    if (!Contains(offset, sizeof(T))) return false;
    std::memcpy(out, data + offset, sizeof(T));
    return true;
  }

  ByteView Sub(std::uint64_t offset, std::uint64_t length) const {
    if (!Contains(offset, length)) return ByteView{};
    return ByteView{data + offset, length};
  }

  // The NUL-terminated string at `offset`, or nullptr when it runs off the end.
  const char* CString(std::uint64_t offset, std::size_t* length) const {
    if (offset >= size) return nullptr;
    const void* nul = std::memchr(data + offset, '\0', size - offset);
    if (nul == nullptr) return nullptr;
    *length = static_cast<std::size_t>(static_cast<const unsigned char*>(nul) - (data + offset));
    return reinterpret_cast<const char*>(data + offset);
  }
};

// Scans a note area for NT_GNU_BUILD_ID owned by "GNU" and returns its
// descriptor (the id's bytes), or an empty view. Name and descriptor are
// padded to `align` (4 for classic notes, 8 for areas such as
// .note.gnu.property laid out with 8-byte alignment, per the gABI note format).
inline ByteView GnuBuildIdBytes(const ByteView& notes, std::uint64_t align) noexcept {
  if (align != 8) align = 4;
  const auto pad = [align](std::uint64_t n) { return (n + align - 1) & ~(align - 1); };
  std::uint64_t offset = 0;
  Elf64_Nhdr nh;
  while (notes.Read(offset, &nh)) {
    const std::uint64_t name_offset = offset + sizeof(nh);
    const std::uint64_t desc_offset = name_offset + pad(nh.n_namesz);
    const std::uint64_t next = desc_offset + pad(nh.n_descsz);
    if (!notes.Contains(desc_offset, nh.n_descsz)) break;
    if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && nh.n_descsz > 0 &&
        std::memcmp(notes.data + name_offset, "GNU", 4) == 0) {
      return ByteView{notes.data + desc_offset, nh.n_descsz};
    }
    offset = next;
  }
  return ByteView{};
}

// True when a PT_LOAD segment of the object maps `address`.
inline bool SegmentCovers(const dl_phdr_info& info, std::uintptr_t address) noexcept {
  for (std::size_t i = 0; i < info.dlpi_phnum; ++i) {
    const Elf64_Phdr& ph = info.dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const std::uintptr_t lo = info.dlpi_addr + ph.p_vaddr;
    if (address >= lo && address - lo < ph.p_memsz) return true;
  }
  return false;
}

// The build id from the object's PT_NOTE segments as mapped (its bytes; empty
// if none). A note segment is read only when a PT_LOAD maps it from file
// bytes, so every read hits memory the loader mapped.
inline ByteView MemoryBuildIdBytes(const dl_phdr_info& info) noexcept {
  for (std::size_t i = 0; i < info.dlpi_phnum; ++i) {
    const Elf64_Phdr& note = info.dlpi_phdr[i];
    if (note.p_type != PT_NOTE || note.p_filesz == 0) continue;
    bool mapped = false;
    for (std::size_t j = 0; j < info.dlpi_phnum && !mapped; ++j) {
      const Elf64_Phdr& load = info.dlpi_phdr[j];
      if (load.p_type != PT_LOAD || note.p_vaddr < load.p_vaddr) continue;
      const std::uint64_t skip = note.p_vaddr - load.p_vaddr;
      mapped = skip <= load.p_filesz && note.p_filesz <= load.p_filesz - skip;
    }
    if (!mapped) continue;
    const ByteView bytes{reinterpret_cast<const unsigned char*>(info.dlpi_addr + note.p_vaddr),
                         note.p_filesz};
    const ByteView id = GnuBuildIdBytes(bytes, note.p_align);
    if (id.size != 0) return id;
  }
  return ByteView{};
}

// ---- objects since unloaded
// A profile can hold frames of a library dlclose'd before it was written:
// objects it allocated that still live, or its share of alloc_space. Their
// names are in that library's file, which usually is still on disk, but the
// loader no longer lists it. So every object the profiler sees loaded is
// remembered here, with what a profile needs of it: its name, build id and
// executable segments. The table unwinder sees a library as soon as a sample's
// stack passes through it (a PC in no known object makes it ask the loader),
// and every profile written sees what is loaded then. A record is a few
// hundred bytes of the arena, never freed; the same library loaded again where
// it was is the one record, and past kMaxSeenObjects records no more are made.
// Written under g_loader_lock (from dl_iterate_phdr callbacks), read without a
// lock (records are published whole and never change).
constexpr std::size_t kSeenSegments = 4;    // executable PT_LOADs kept of one object
constexpr std::size_t kSeenBuildIdMax = 64;  // bytes; a longer id is not kept
constexpr std::size_t kMaxSeenObjects = 1024;

struct SeenObject {
  const SeenObject* next = nullptr;  // older records
  std::uintptr_t bias = 0;
  std::uint64_t vaddr[kSeenSegments] = {};
  std::uint64_t memsz[kSeenSegments] = {};
  std::uint64_t offset[kSeenSegments] = {};
  std::uint32_t segments = 0;
  std::uint32_t build_id_size = 0;
  unsigned char build_id[kSeenBuildIdMax] = {};
  const char* name = "";  // NUL-terminated, in the same arena block, after the record
};

inline std::atomic<const SeenObject*> g_seen_objects{nullptr};
inline std::size_t g_seen_count = 0;  // under g_loader_lock

// What identifies a record: everything it holds.
inline bool SameSeenObject(const SeenObject& a, const SeenObject& b, const char* b_name) noexcept {
  return a.bias == b.bias && a.segments == b.segments && std::memcmp(a.vaddr, b.vaddr, sizeof a.vaddr) == 0 &&
         std::memcmp(a.memsz, b.memsz, sizeof a.memsz) == 0 && std::memcmp(a.offset, b.offset, sizeof a.offset) == 0 &&
         a.build_id_size == b.build_id_size && std::memcmp(a.build_id, b.build_id, a.build_id_size) == 0 &&
         std::strcmp(a.name, b_name) == 0;
}

// In a dl_iterate_phdr callback, under g_loader_lock: remembers `info`'s
// object unless it is remembered already. Not the main program or the vDSO
// (neither is ever unloaded) nor an object without a name. Runs inside
// samples (the table unwinder's snapshots), so it keeps off the stack.
inline void NoteLoadedObject(const dl_phdr_info& info) noexcept {
  const char* name = info.dlpi_name;
  if (name == nullptr || name[0] == '\0') return;
  const std::uintptr_t vdso = ::getauxval(AT_SYSINFO_EHDR);
  if (vdso != 0 && SegmentCovers(info, vdso)) return;
  SeenObject key;  // the name apart: it is compared where it is
  key.bias = info.dlpi_addr;
  for (std::size_t i = 0; i < info.dlpi_phnum && key.segments < kSeenSegments; ++i) {
    const Elf64_Phdr& ph = info.dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0 || ph.p_memsz == 0) continue;
    key.vaddr[key.segments] = ph.p_vaddr;
    key.memsz[key.segments] = ph.p_memsz;
    key.offset[key.segments] = ph.p_offset;
    ++key.segments;
  }
  if (key.segments == 0) return;
  const ByteView id = MemoryBuildIdBytes(info);
  if (id.size <= kSeenBuildIdMax) {
    key.build_id_size = static_cast<std::uint32_t>(id.size);
    if (id.size != 0) std::memcpy(key.build_id, id.data, id.size);
  }
  // A relative name means the working directory of the dlopen: resolved now,
  // while it still is that (into an arena buffer: no malloc, no 4 KiB of stack).
  char* real = nullptr;
  if (name[0] != '/') {
    real = static_cast<char*>(g_arena.Allocate(PATH_MAX));
    if (real != nullptr && ::realpath(name, real) != nullptr) name = real;
  }
  bool known = false;
  for (const SeenObject* s = g_seen_objects.load(std::memory_order_relaxed); s != nullptr && !known; s = s->next) {
    known = SameSeenObject(*s, key, name);
  }
  const std::size_t length = std::strlen(name);
  if (!known && g_seen_count < kMaxSeenObjects) {
    const std::size_t bytes = sizeof(SeenObject) + length + 1;
    if (void* mem = g_arena.Allocate(bytes)) {
      auto* record = new (mem) SeenObject(key);
      char* copy = static_cast<char*>(mem) + sizeof(SeenObject);
      std::memcpy(copy, name, length + 1);
      record->name = copy;
      record->next = g_seen_objects.load(std::memory_order_relaxed);
      ++g_seen_count;
      g_seen_objects.store(record, std::memory_order_release);
    }
  }
  g_arena.Free(real, PATH_MAX);
}

}  // namespace elf
}  // namespace detail
}  // namespace heapprof
