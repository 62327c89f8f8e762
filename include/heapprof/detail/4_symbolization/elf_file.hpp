// heapprof: bounds-checked reading of ELF64 files and note segments.
// The files come from disk at profile write time and may be truncated, replaced
// or corrupt; every read here is checked so that a bad file ends in "no symbols",
// never in a fault.
#pragma once

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena_allocator.hpp"
#include "heapprof/detail/3_unwinding/loaded_objects.hpp"  // ByteView, GnuBuildIdBytes

namespace heapprof {
namespace detail {
namespace elf {

static_assert(sizeof(void*) == 8, "heapprof reads ELF64 objects only");

// Files this thread could not map for want of memory (mmap's ENOMEM: an
// RLIMIT_AS, a small oom_reserve): their symbols and DWARF are missing from
// the profile being written, which says so (snapshot.hpp:
// EncodeGzippedSymbolized). Before, such a profile had no names and nothing
// said why (HEAPPROF=oom_dump=1,oom_reserve=4k under a limit).
inline thread_local unsigned tls_files_not_mapped = 0;
// Files this thread could not open for want of descriptors (EMFILE, ENFILE)
// or kernel memory (ENOMEM): missing from the profile being written, which
// says so, and tried again by the next write (DebugObject::EnsureLoaded).
inline thread_local unsigned tls_files_not_opened = 0;

// A whole file mapped read-only. Mapping instead of reading keeps a large
// .symtab/.strtab out of the heap; the kernel pages in only what lookups touch.
class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile() { Reset(); }
  MappedFile(MappedFile&& other) noexcept : addr_(other.addr_), size_(other.size_) {
    other.addr_ = nullptr;
    other.size_ = 0;
  }
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      Reset();
      addr_ = other.addr_;
      size_ = other.size_;
      other.addr_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  bool Open(const char* path) {
    Reset();
    int fd;
    // O_NONBLOCK: the paths come from the program's DWARF and the file
    // system (debug links, build ids, .dwo names): open() of a FIFO without
    // it waits for a writer, and the profile write (the dump thread, an exit
    // or oom dump, an HTTP build) waited forever. It changes nothing for a
    // regular file, and mmap ignores it.
    do {
      fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) ++tls_files_not_opened;
      return false;
    }
    struct stat st;
    // Only regular files: a FIFO or device (e.g. /dev/null) would block or map nothing.
    const bool usable = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                        st.st_size >= static_cast<off_t>(sizeof(Elf64_Ehdr));
    if (usable) {
      void* addr =
          ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (addr != MAP_FAILED) {
        addr_ = addr;
        size_ = static_cast<std::size_t>(st.st_size);
      } else if (errno == ENOMEM) {
        ++tls_files_not_mapped;
      }
    }
    ::close(fd);
    return addr_ != nullptr;
  }

  void Reset() {
    if (addr_ != nullptr) ::munmap(addr_, size_);
    addr_ = nullptr;
    size_ = 0;
  }

  // Unmaps every page but those holding the file's bytes [offset, offset +
  // length): a symbol table keeps only its string table, not the whole file
  // (39 MB of address space for a test binary with debug info, .strtab 236 KB;
  // a write under RLIMIT_AS or in oom_dump's reserve may not have the rest).
  // Pointers into the kept bytes stay valid; view() then covers the kept pages.
  void KeepOnly(std::size_t offset, std::size_t length) {
    if (addr_ == nullptr || offset > size_ || length > size_ - offset) return;
    long page_size = ::sysconf(_SC_PAGESIZE);
    const std::size_t page = page_size > 0 ? static_cast<std::size_t>(page_size) : 4096;
    const std::size_t mapped = RoundUp(size_, page);
    const std::size_t lo = offset & ~(page - 1);
    const std::size_t hi = RoundUp(offset + length, page);
    if (hi <= lo) return;
    char* base = static_cast<char*>(addr_);
    if (lo > 0) ::munmap(base, lo);
    if (hi < mapped) ::munmap(base + hi, mapped - hi);
    addr_ = base + lo;
    size_ = hi - lo;
  }

  ByteView view() const { return ByteView{static_cast<const unsigned char*>(addr_), size_}; }
  std::size_t mapped_bytes() const { return size_; }

 private:
  static std::size_t RoundUp(std::size_t n, std::size_t page) { return (n + page - 1) & ~(page - 1); }

  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

#if defined(HEAPPROF_ARCH_X86_64)
constexpr Elf64_Half kNativeMachine = EM_X86_64;
#elif defined(HEAPPROF_ARCH_AARCH64)
constexpr Elf64_Half kNativeMachine = EM_AARCH64;
#else
constexpr Elf64_Half kNativeMachine = EM_NONE;  // unchecked
#endif

// `relocatable`: ET_REL is accepted too (the DWARF-only file dwz -m writes
// for what several binaries share is one).
inline bool IsNativeElfHeader(const Elf64_Ehdr& eh, bool relocatable = false) {
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return false;
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_VERSION] != EV_CURRENT) return false;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  if (eh.e_ident[EI_DATA] != ELFDATA2MSB) return false;
#else
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB) return false;
#endif
  if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN && !(relocatable && eh.e_type == ET_REL)) return false;
  // A file for another machine at the same path cannot describe our code.
  return kNativeMachine == EM_NONE || eh.e_machine == kNativeMachine;
}

// The section header table of a validated file. Every header handed out lies
// entirely inside the file; the data a header points at is checked by its user.
class SectionTable {
 public:
  bool Init(const ByteView& file, bool relocatable = false) {
    count_ = 0;
    Elf64_Ehdr eh;
    if (!file.Read(0, &eh) || !IsNativeElfHeader(eh, relocatable)) return false;
    if (eh.e_shoff == 0 || eh.e_shentsize != sizeof(Elf64_Shdr)) return false;
    file_ = file;
    offset_ = eh.e_shoff;
    std::uint64_t count = eh.e_shnum;
    if (count == 0) {
      // More than SHN_LORESERVE sections: the real count sits in section 0's sh_size.
      Elf64_Shdr first;
      if (!file.Read(offset_, &first)) return false;
      count = first.sh_size;
    }
    if (count == 0 || count > file.size / sizeof(Elf64_Shdr) ||
        !file.Contains(offset_, count * sizeof(Elf64_Shdr))) {
      return false;
    }
    count_ = count;
    return true;
  }

  std::uint64_t count() const { return count_; }

  bool Get(std::uint64_t index, Elf64_Shdr* out) const {
    if (index >= count_) return false;
    return file_.Read(offset_ + index * sizeof(Elf64_Shdr), out);
  }

  // The bytes of a section that has file contents, or an empty view.
  ByteView Contents(const Elf64_Shdr& sh) const {
    if (sh.sh_type == SHT_NOBITS) return ByteView{};
    return file_.Sub(sh.sh_offset, sh.sh_size);
  }

 private:
  ByteView file_;
  std::uint64_t offset_ = 0;
  std::uint64_t count_ = 0;
};

inline ArenaString HexLower(const unsigned char* bytes, std::size_t length) {
  static const char kDigits[] = "0123456789abcdef";
  ArenaString out(length * 2, '0');
  for (std::size_t i = 0; i < length; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

// The same id in lowercase hex, as pprof's Mapping.build_id has it; "" if none.
inline ArenaString FindGnuBuildId(const ByteView& notes, std::uint64_t align) {
  const ByteView id = GnuBuildIdBytes(notes, align);
  return HexLower(id.data, static_cast<std::size_t>(id.size));
}

// The build id recorded in a file's SHT_NOTE sections. Sections, not PT_NOTE:
// a separate debug file keeps the note section but its program headers' file
// offsets no longer point at it.
inline ArenaString FileBuildId(const SectionTable& sections) {
  Elf64_Shdr sh;
  for (std::uint64_t i = 1; i < sections.count(); ++i) {
    if (!sections.Get(i, &sh) || sh.sh_type != SHT_NOTE) continue;
    ArenaString id = FindGnuBuildId(sections.Contents(sh), sh.sh_addralign);
    if (!id.empty()) return id;
  }
  return ArenaString();
}

}  // namespace elf
}  // namespace detail
}  // namespace heapprof
