// heapprof: who keeps it alive — a conservative pointer scan from the roots to
// the sampled objects, and the retention profile built from it.
//
//  roots:   the writable PT_LOAD segments of every loaded object (.data, .bss;
//           named by their ELF symbols), the calling thread's stack (from its
//           own frame up, callee-saved registers spilled first) and its TLS
//           blocks, the main thread's static TLS blocks when another thread
//           scans, and the stack of every other thread blocked in the kernel
//           (its stack pointer from /proc/self/task/<tid>/syscall; the scan
//           covers the stack mapping from there up, which in glibc holds the
//           thread's static TLS too; the main thread's is elsewhere).
//  objects: the live sampled objects (2_sampling/live_map.hpp); at rate 1
//           every object the hooks see.
//  edges:   any aligned word whose value lies inside [start, start + size) of
//           a known object: interior pointers count (a pointer to a member, a
//           std::string's data, a base subobject), as in LeakSanitizer.
//
// A breadth-first walk gives each object its shortest path: from the globals
// and TLS first (walked to the end), then from the stacks, so that an object
// a global reaches is named after it even when a (perhaps dead) stack slot
// points at it too. Objects it does not reach are then looked for in heap
// memory heapprof does not know as objects (the brk heap and anonymous private
// mappings, minus the profiler's own arena, the roots, thread stacks (right
// above a guard page) and the known objects): one found there
// is "[unsampled heap]", and what it holds is walked on from it. The rest is
// "[unreachable]". That second pass is skipped when heapprof knows every
// object (rate 1 since the start with the malloc family replaced): then a
// word in the malloc heaps that is no object's is a stale value in freed
// memory; the other anonymous mappings (under glibc's malloc, whose heaps
// are known) are roots instead, "[anonymous mapping]".
//
// Safety: every read goes through process_vm_readv on our own pid (or pread
// of /proc/self/mem where that is refused, or under a seccomp filter): an address unmapped meanwhile
// gives an error, never a fault. Only mappings /proc/self/maps lists as
// readable are read; [vvar], [vsyscall], device and PROT_NONE mappings never.
// Everything allocated comes from the arena. Other threads keep running: an
// object freed, or a pointer moved, during the scan may be seen at its old
// place — the result is an approximation taken over the scan's duration.
#pragma once

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/0_base/arena_allocator.hpp"
#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/0_base/proc_self.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"
#include "heapprof/detail/2_sampling/live_map.hpp"
#include "heapprof/detail/4_symbolization/elf_file.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "heapprof/detail/5_encoding/snapshot.hpp"
#include "heapprof/detail/5_encoding/write_headroom.hpp"

namespace heapprof {
namespace detail {
namespace retention {

// ---------------------------------------------------------------- reading memory

// The whole of a /proc file, into the arena (symbolizer.hpp's reader); an
// empty one is a failure here: every file read below has content.
inline bool ReadProcFile(const char* path, ArenaString& out) { return elf::ReadProcFile(path, out) && !out.empty(); }

// Copies of our own memory that fail instead of faulting.
class SafeReader {
 public:
  // Under a seccomp filter, process_vm_readv may kill instead of fail
  // (UnderSeccompFilter): /proc/self/mem from the start.
  SafeReader() noexcept : use_vm_(!UnderSeccompFilter()), pid_(SelfTaskId()) {}
  ~SafeReader() {
    if (mem_fd_ >= 0) ::close(mem_fd_);
  }
  SafeReader(const SafeReader&) = delete;
  SafeReader& operator=(const SafeReader&) = delete;

  // Bytes copied from the start of [addr, addr + n) (a prefix: it stops at
  // the first address that cannot be read).
  std::size_t Read(std::uintptr_t addr, void* buf, std::size_t n) noexcept {
    if (use_vm_) {
      iovec local{buf, n};
      iovec remote{reinterpret_cast<void*>(addr), n};
      const ssize_t r = ::process_vm_readv(pid_, &local, 1, &remote, 1, 0);
      if (r >= 0) return static_cast<std::size_t>(r);
      if (errno == EFAULT || errno == ESRCH) return 0;
      use_vm_ = false;  // ENOSYS, EPERM (seccomp, ptrace policy): /proc/self/mem
    }
    return ReadMem(addr, buf, n);
  }

  // Ranges `remote[0..count)` copied one after the other into `buf` (which
  // holds their total, `n` bytes) in one call: the walk reads a million
  // small objects, and a call each spent most of the scan entering the
  // kernel. True only when every byte was copied (else the caller reads
  // them one by one, each as far as it can).
  bool ReadMany(const iovec* remote, std::size_t count, void* buf, std::size_t n) noexcept {
    if (use_vm_) {
      iovec local{buf, n};
      const ssize_t r = ::process_vm_readv(pid_, &local, 1, remote, count, 0);
      if (r >= 0) return static_cast<std::size_t>(r) == n;
      if (errno == EFAULT || errno == ESRCH || errno == EINVAL) return false;
      use_vm_ = false;
    }
    char* to = static_cast<char*>(buf);
    for (std::size_t i = 0; i < count; ++i) {
      const auto addr = reinterpret_cast<std::uintptr_t>(remote[i].iov_base);
      if (ReadMem(addr, to, remote[i].iov_len) != remote[i].iov_len) return false;
      to += remote[i].iov_len;
    }
    return true;
  }

 private:
  std::size_t ReadMem(std::uintptr_t addr, void* buf, std::size_t n) noexcept {
    if (mem_fd_ < 0) {
      if (mem_failed_) return 0;
      mem_fd_ = ::open(ProcSelfPath("mem").c_str(), O_RDONLY | O_CLOEXEC);
      if (mem_fd_ < 0) {
        mem_failed_ = true;
        return 0;
      }
    }
    std::size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(mem_fd_, static_cast<char*>(buf) + done, n - done,
                                static_cast<off_t>(addr + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      done += static_cast<std::size_t>(r);
    }
    return done;
  }

  bool use_vm_ = true;
  bool mem_failed_ = false;
  int mem_fd_ = -1;
  // The scanning thread's id (proc_self.hpp: SelfTaskId), kept: a system call
  // each time was a tenth of the walk's time. A scan runs on one thread.
  pid_t pid_;
};

// ---------------------------------------------------------------- /proc/self/maps

struct Mapping {
  std::uintptr_t lo = 0, hi = 0;
  bool readable = false, writable = false, is_private = false;
  bool anonymous = false;  // no file, no [name]
  bool brk_heap = false;   // [heap]
  bool special = false;    // [vvar], [vsyscall], [vdso], a device: never read
};

using elf::ParseHex;

inline ArenaVector<Mapping> ReadMappings() {
  ArenaVector<Mapping> out;
  elf::ForEachMapping([&](const elf::MapsLine& line) {
    Mapping m;
    m.lo = line.start;
    m.hi = line.end;
    m.readable = line.readable();
    m.writable = line.writable();
    m.is_private = line.is_private();
    const std::string_view path = line.path;
    m.anonymous = path.empty() || path.substr(0, 5) == "[anon";  // [anon:name] (PR_SET_VMA_ANON_NAME)
    m.brk_heap = path == "[heap]";
    m.special = (!path.empty() && path[0] == '[' && path != "[heap]" && path.substr(0, 6) != "[stack" &&
                 path.substr(0, 5) != "[anon") ||
                path.substr(0, 5) == "/dev/";
    out.push_back(m);
  });
  return out;
}

// The mapping holding `addr`, or nullptr.
inline const Mapping* MappingOf(const ArenaVector<Mapping>& maps, std::uintptr_t addr) noexcept {
  auto it = std::upper_bound(maps.begin(), maps.end(), addr,
                             [](std::uintptr_t a, const Mapping& m) { return a < m.lo; });
  if (it == maps.begin()) return nullptr;
  --it;
  return addr < it->hi ? &*it : nullptr;
}

// ---------------------------------------------------------------- the graph

// kMapping: an anonymous mapping that is no malloc heap, read only when
// every object is known (see Scan). kExitedThread: the DTV pointer of a
// thread descriptor glibc keeps in its stack cache after the thread ended
// (see ExitedThreadDtvRoots).
enum class RootKind : std::uint8_t { kGlobal, kStack, kTls, kMapping, kExitedThread };

struct RootRegion {
  std::uintptr_t lo = 0, hi = 0;
  RootKind kind = RootKind::kGlobal;
  long tid = 0;
  int module = -1;  // kGlobal: index into Scan::modules
};

struct Module {
  ArenaString path;
  std::uintptr_t bias = 0;
};

struct Object {
  std::uintptr_t start;
  std::uint64_t size;
  const Bucket* bucket;
};

constexpr std::uint32_t kUnreached = 0xFFFFFFFFu;
constexpr std::uint32_t kUnsampledHeap = 0xFFFFFFFEu;
constexpr std::uint32_t kNotScanned = 0xFFFFFFFDu;  // /proc/self/maps could not be read: no scan
constexpr char kNotScannedName[] = "[not scanned: /proc/self/maps cannot be read]";
constexpr char kMapsUnreadable[] = "/proc/self/maps cannot be read (is /proc mounted?)";
constexpr char kMemoryUnreadableName[] = "[not scanned: the process's memory cannot be read]";
constexpr char kMemoryUnreadable[] =
    "the process's memory cannot be read (process_vm_readv refused, or not tried under a seccomp filter; "
    "/proc/self/mem not open to a process that is not dumpable)";
constexpr std::uint32_t kNoParent = 0xFFFFFFFFu;

struct ScanResult {
  ArenaVector<Object> objects;          // sorted by start
  ArenaVector<std::uint32_t> region;    // per object: the root region of its path, kUnsampledHeap, kUnreached
  ArenaVector<std::uint32_t> parent;    // per object: the object holding it, kNoParent for a root's own
  ArenaVector<std::uintptr_t> word_at;  // per root's own object: the address of the word pointing at it
  ArenaVector<std::uint32_t> first;     // per object: the first object of its path (the root's own)
  ArenaVector<std::uint32_t> order;     // reached objects, holders before what they hold (the walk's order)
  ArenaVector<RootRegion> roots;
  ArenaVector<Module> modules;
  // /proc/self/maps could not be read (no /proc in a chroot or a minimal
  // container): what is readable, and where the stacks and heaps are, is
  // unknown, and nothing was scanned. Every object's root is kNotScanned:
  // calling them all unreachable made the leak report's every object a leak
  // (and leak_exit_code's status).
  bool maps_unreadable = false;
  // Why not scanned (with maps_unreadable): kMapsUnreadable, or
  // kMemoryUnreadable (the maps were read, but not a word of memory: every
  // object was unreachable, and a leak).
  const char* not_scanned_why = kMapsUnreadable;
  const char* not_scanned_name = kNotScannedName;
  bool every_object_known = false;  // the unsampled-heap pass was skipped (see top)
  bool unsampled_pass = false;      // it ran
  std::size_t threads_running = 0;  // other threads whose stacks could not be located (running)
  std::uint64_t bytes_scanned = 0;
  std::uint64_t scan_nanos = 0;
  std::uint64_t memory_bytes = 0;   // arena bytes the scan's own tables took
  // Where the scan of this thread's stack starts above its own frame (the
  // leak report skips exit()'s frames: leak_report.hpp), the registers
  // those frames may have saved are scanned from here instead: the
  // callee-saved registers of the frame above them.
  std::uintptr_t saved_registers[16] = {};
  std::size_t saved_register_count = 0;
};

// The main thread's pthread_self(), noted on the main thread. glibc puts a
// pthread thread's static TLS at the top of its stack mapping, which the scan
// of its stack covers, but the main thread's lies in a mapping of its own that
// ld.so allocated at start-up: a scan on another thread (the HTTP server's,
// a worker calling exit()) finds it only from here. A module's static TLS
// block sits at the same offset from the thread's descriptor in every thread,
// so the calling thread's (dlpi_tls_data) gives the main thread's.
inline std::atomic<std::uintptr_t> g_main_thread_self{0};

// pthread_self() as an address (glibc's pthread_t is an integer holding one).
inline std::uintptr_t ThreadSelf() noexcept {
  const pthread_t self = ::pthread_self();
  std::uintptr_t address = 0;
  static_assert(sizeof self == sizeof address, "pthread_t holds the thread descriptor's address");
  std::memcpy(&address, &self, sizeof address);
  return address;
}

inline void NoteMainThread() noexcept {
  if (::syscall(SYS_gettid) == ::getpid()) g_main_thread_self.store(ThreadSelf(), std::memory_order_relaxed);
}

// Static initialisation runs on the main thread (for the program, and for
// the libraries loaded with it); a library dlopen'ed from another thread
// notes it at its first scan on the main thread, if any.
inline const bool g_main_thread_noted = (NoteMainThread(), true);

// The calling thread's thread pointer (glibc: the descriptor itself on
// x86-64, the end of it on aarch64).
inline std::uintptr_t ThreadPointer() noexcept {
  std::uintptr_t tp = 0;
#if defined(__x86_64__)
  asm("mov %%fs:0, %0" : "=r"(tp));
#elif defined(__aarch64__)
  asm("mrs %0, tpidr_el0" : "=r"(tp));
#endif
  return tp;
}

// Where glibc's TCB keeps a thread's DTV pointer, from the thread pointer
// (x86-64: tcbhead_t { tcb, dtv, self, ... } at %fs:0; aarch64: tcbhead_t
// { dtv, private } at tpidr_el0). The DTV is an array of 16-byte entries:
// [-1] its length, [modid] the module's TLS block for that thread (-1 when
// not allocated yet). Used only after the calling thread's own DTV agreed
// with dl_iterate_phdr (AddMainThreadDynamicTls).
#if defined(__x86_64__)
constexpr std::uintptr_t kDtvInTcb = 8;
#else
constexpr std::uintptr_t kDtvInTcb = 0;
#endif
constexpr std::uintptr_t kDtvEntryBytes = 16;

struct ModulesState {
  ArenaVector<Module>* modules;
  ArenaVector<RootRegion>* roots;
  long tid;
  const ArenaVector<Mapping>* maps;
  long main_tid;               // 0: the main thread is this one, gone, or not known
  std::uintptr_t main_self;    // its pthread_self()
  std::uintptr_t own_self;     // this thread's
  std::uintptr_t own_tp;       // this thread's thread pointer (ThreadPointer)
  SafeReader* reader;          // for the DTVs
  bool dtv_agrees = false;     // this thread's DTV held a block dl_iterate_phdr gave (AddMainThreadDynamicTls)
  ArenaVector<std::pair<std::size_t, std::uint64_t>> dynamic_tls = {};  // (modid, size): the main thread's to find
};

// [lo, lo + size) as the main thread's TLS root.
inline void AddMainThreadTlsRoot(ModulesState& st, std::uintptr_t lo, std::uint64_t size) {
  RootRegion r;
  r.lo = lo;
  r.hi = lo + size;
  r.kind = RootKind::kTls;
  r.tid = st.main_tid;
  st.roots->push_back(r);
}

// The main thread's block of a module's TLS whose block for this thread is
// [own, own + size): only for static TLS (this thread's block in the mapping
// of its own descriptor: a dynamic block is malloc'ed, at no fixed offset),
// and only where that lands inside one readable, writable mapping, the one of
// the main thread's descriptor (never a guess read blindly).
// Returns whether this thread's block is static TLS.
inline bool AddMainThreadTls(ModulesState& st, std::uintptr_t own, std::uint64_t size) {
  if (st.main_tid == 0 || size == 0) return false;
  const Mapping* mine = MappingOf(*st.maps, own);
  if (mine == nullptr || mine != MappingOf(*st.maps, st.own_self)) return false;
  const std::uintptr_t lo = st.main_self + (own - st.own_self);  // modulo 2^64: the offset may be negative
  const Mapping* m = MappingOf(*st.maps, lo);
  if (m == nullptr || m != MappingOf(*st.maps, st.main_self) || !m->readable || !m->writable || size > m->hi - lo) {
    return true;
  }
  AddMainThreadTlsRoot(st, lo, size);
  return true;
}

inline bool ReadWord(SafeReader& reader, std::uintptr_t at, std::uintptr_t& value) noexcept {
  return reader.Read(at, &value, sizeof value) == sizeof value;
}

// Entry `modid` of the DTV of the thread whose thread pointer is `tp`
// (glibc's layout, as above), read through the reader.
inline bool ReadDtvEntry(SafeReader& reader, std::uintptr_t tp, std::size_t modid, std::uintptr_t& entry) noexcept {
  std::uintptr_t dtv = 0, length = 0;
  return ReadWord(reader, tp + kDtvInTcb, dtv) && ReadWord(reader, dtv - kDtvEntryBytes, length) && modid <= length &&
         ReadWord(reader, dtv + modid * kDtvEntryBytes, entry);
}

// Whether this thread's DTV entry `modid` is `block` (dl_iterate_phdr's
// dlpi_tls_data).
inline bool OwnDtvHolds(ModulesState& st, std::size_t modid, std::uintptr_t block) noexcept {
  std::uintptr_t entry = 0;
  return st.own_tp != 0 && modid != 0 && ReadDtvEntry(*st.reader, st.own_tp, modid, entry) && entry == block;
}

// The main thread's block of a module's dynamic TLS (a library dlopen'ed
// with thread_locals: glibc mallocs each thread's block at its first use),
// found in the main thread's DTV. The main thread's DTV lies in memory ld.so
// took at start-up, which no scan reads: its thread_locals in a plugin were
// "[unsampled heap]", or "[unreachable]" with every object known, when
// another thread wrote the profile. Only once this thread's own DTV agreed
// with dl_iterate_phdr (dtv_agrees); every read goes through the reader.
inline void AddMainThreadDynamicTls(ModulesState& st, std::size_t modid, std::uint64_t size) {
  if (!st.dtv_agrees || st.main_tid == 0 || size == 0 || modid == 0) return;
  const std::uintptr_t main_tp = st.main_self + (st.own_tp - st.own_self);  // modulo 2^64, as above
  std::uintptr_t block = 0;
  if (!ReadDtvEntry(*st.reader, main_tp, modid, block) || block == 0 || block == ~std::uintptr_t{0}) {
    return;  // (-1: the main thread never used this module's thread_locals)
  }
  const Mapping* m = MappingOf(*st.maps, block);
  if (m == nullptr || !m->readable || !m->writable || size > m->hi - block) return;
  AddMainThreadTlsRoot(st, block, size);
}

// A file name's last component.
inline std::string_view BaseNameOf(std::string_view path) noexcept {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// Whether `text` starts with one of `prefixes`.
inline bool StartsWithAny(std::string_view text, std::initializer_list<std::string_view> prefixes) noexcept {
  for (const std::string_view prefix : prefixes) {
    if (text.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

// An allocator loaded as a library (preloaded or linked): its globals and TLS
// are its own bookkeeping (caches, free lists, the last block it handed out),
// which keep no object of the program alive: not roots. tcmalloc's .bss held
// the last block a thread allocated, and that became an object's "root".
inline bool IsAllocatorFile(std::string_view path) noexcept {
  return StartsWithAny(BaseNameOf(path), {"libjemalloc.so", "libtcmalloc", "libmimalloc.so"});
}

inline int CollectRootSegments(dl_phdr_info* info, std::size_t, void* data) {
  auto& st = *static_cast<ModulesState*>(data);
  const int index = static_cast<int>(st.modules->size());
  Module m;
  const char* name = info->dlpi_name;
  if (name == nullptr || name[0] == '\0') {
    m.path = index == 0 ? elf::ReadSelfExe() : ArenaString();
  } else {
    m.path = name;
  }
  m.bias = info->dlpi_addr;
  const bool allocator = IsAllocatorFile(m.path);
  st.modules->push_back(std::move(m));
  for (std::size_t i = 0; i < info->dlpi_phnum && !allocator; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_W) != 0) {
      RootRegion r;
      r.lo = info->dlpi_addr + ph.p_vaddr;
      r.hi = r.lo + ph.p_memsz;
      r.kind = RootKind::kGlobal;
      r.module = index;
      st.roots->push_back(r);
    } else if (ph.p_type == PT_TLS && info->dlpi_tls_data == nullptr) {
      // Not used by this thread yet: dynamic TLS, perhaps the main thread's.
      st.dynamic_tls.emplace_back(info->dlpi_tls_modid, ph.p_memsz);
    } else if (ph.p_type == PT_TLS) {
      // This thread's block of the object's TLS (dlpi_tls_data is the calling
      // thread's, allocated already or nullptr).
      RootRegion r;
      r.lo = reinterpret_cast<std::uintptr_t>(info->dlpi_tls_data);
      r.hi = r.lo + ph.p_memsz;
      r.kind = RootKind::kTls;
      r.tid = st.tid;
      st.roots->push_back(r);
      if (!st.dtv_agrees) st.dtv_agrees = OwnDtvHolds(st, info->dlpi_tls_modid, r.lo);
      if (!AddMainThreadTls(st, r.lo, ph.p_memsz)) st.dynamic_tls.emplace_back(info->dlpi_tls_modid, ph.p_memsz);
    }
  }
  return 0;
}

// Other threads' stack pointers: /proc/self/task/<tid>/syscall is
// "nr args... sp pc" while the thread is blocked in the kernel, "running"
// otherwise. getdents64, not opendir (which mallocs).
struct ThreadSp {
  long tid;
  std::uintptr_t sp;
};

// A thread that ended (joined, or detached) leaves its stack in glibc's cache
// for the next pthread_create, with its descriptor (struct pthread) at the
// top, and that descriptor keeps the thread's DTV, a block the loader
// calloc'ed (allocate_dtv) and frees only when the stack is reused or dropped
// from the cache. The stack itself is no root (its dead slots hold stale
// pointers), so the DTV was "[unreachable]": one leak per exited thread at
// rate 1 (a program that creates and joins one thread failed
// leak_exit_code), which LeakSanitizer does not report. The descriptor is
// found in the top 16 KiB of each stack mapping (anonymous, right above a
// PROT_NONE guard, no live thread's stack pointer in it) by its x86-64 TCB
// header: tcb and self both point at the header itself; the word between
// them, the DTV pointer, is a root.
//
// `thread_stacks` gets the start of every such guarded mapping that is a
// thread's stack: a live thread's stack pointer is in it, or a thread
// descriptor is at its top (glibc puts one there for every thread, live,
// running or cached; pthread_attr_setstack's too). Any other mapping above
// a guard page is the program's: a suspended coroutine's or fiber's stack
// (boost.context's protected_fixedsize_stack, boost.coroutine's
// protected_stack_allocator) whose frames hold its pointers. Scan reads
// those as it reads other anonymous mappings; before, every guarded mapping
// was taken for a thread stack and not read, and an object only a
// suspended fiber held was "[unreachable]" at rate 1, a leak for
// leak_exit_code. (Elsewhere than x86-64 glibc, every guarded mapping still
// counts as a thread stack.) The profiler's own stacks (ProfilerStack's
// magic word at the top) count as threads' too: their dead frames hold the
// addresses of what samples and builds there handled, leaked objects too.
inline void ExitedThreadDtvRoots(const ArenaVector<Mapping>& maps, const ArenaVector<std::uintptr_t>& live_sps,
                                 SafeReader& reader, ArenaVector<RootRegion>& roots,
                                 ArenaVector<std::uintptr_t>& thread_stacks) {
#if defined(__x86_64__) && defined(__GLIBC__)
  constexpr std::size_t kWindow = 16384, kDescriptorWindow = 8192;
  ArenaVector<std::uintptr_t> words(kWindow / sizeof(std::uintptr_t));
#endif
  for (std::size_t mi = 1; mi < maps.size(); ++mi) {
    const Mapping& m = maps[mi];
    const Mapping& below = maps[mi - 1];
    if (!m.anonymous || below.hi != m.lo || !below.anonymous || below.readable || below.writable) continue;
#if defined(__x86_64__) && defined(__GLIBC__)
    bool live = false;
    for (const std::uintptr_t sp : live_sps) live = live || (sp >= m.lo && sp < m.hi);
    if (live || !m.readable || !m.writable || !m.is_private || m.special) {
      thread_stacks.push_back(m.lo);
      continue;
    }
    const std::size_t window = std::min<std::size_t>(kWindow, (m.hi - m.lo) & ~std::uintptr_t{7});
    const std::uintptr_t lo = m.hi - window;
    if (window < 3 * sizeof(std::uintptr_t) || reader.Read(lo, words.data(), window) != window) {
      thread_stacks.push_back(m.lo);  // unknown: as before
      continue;
    }
    const std::size_t header = ProfilerStackHeaderBytes();
    if (header <= window && words[(window - header) / sizeof(std::uintptr_t)] == kProfilerStackMagic) {
      thread_stacks.push_back(m.lo);
      continue;
    }
    for (std::size_t w = 0; w + 2 < window / sizeof(std::uintptr_t); ++w) {
      const std::uintptr_t at = lo + w * sizeof(std::uintptr_t);
      if (words[w] != at || words[w + 2] != at) continue;
      roots.push_back(RootRegion{at + sizeof(std::uintptr_t), at + 2 * sizeof(std::uintptr_t), RootKind::kExitedThread, 0, -1});
      // A descriptor sits in the top few KiB (struct pthread, 2,304 bytes in
      // glibc 2.36, below the end aligned to the static TLS's alignment),
      // its DTV outside the stack. A self-pointing pair deeper in (an empty
      // list head in a dead frame of a fiber's) does not make it a thread's.
      const std::uintptr_t dtv = words[w + 1];
      if (m.hi - at <= kDescriptorWindow && dtv != 0 && (dtv < m.lo || dtv >= m.hi)) thread_stacks.push_back(m.lo);
      break;
    }
#else
    (void)live_sps;
    (void)reader;
    (void)roots;
    thread_stacks.push_back(m.lo);
#endif
  }
}

// One thread's stack pointer from its syscall file: 1 (blocked: `sp` set),
// 0 ("running": on a CPU, or woken and waiting for one), -1 (gone, or a line
// without one).
inline int ReadThreadSp(long tid, std::uintptr_t& sp) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
  ArenaString text;
  if (!ReadProcFile(path, text)) return -1;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.compare(0, 7, "running") == 0) return 0;
  // The second-to-last field.
  const std::size_t last = text.rfind(' ');
  if (last == ArenaString::npos || last == 0) return -1;
  const std::size_t prev = text.rfind(' ', last - 1);
  if (prev == ArenaString::npos) return -1;
  std::string_view field(text.data() + prev + 1, last - prev - 1);
  if (field.substr(0, 2) == "0x") field.remove_prefix(2);
  std::size_t i = 0;
  sp = ParseHex(field, i);
  return sp != 0 ? 1 : -1;
}

// A thread "running" at the first look is looked at again, up to
// kRunningRetries times, sleeping 1, 2, 4 ... ms before each (63 ms at most,
// spent only while some thread still runs). The kernel says "running" for a
// thread that is runnable, not only one on a CPU: a poller between two
// usleep(1000)s, or any thread a busy machine has not given a CPU yet after
// its wake-up. One look missed such a thread in 6 of 20 runs of a program
// with one usleep loop, and what only it held was "[unreachable]" (a leak,
// for leak_exit_code).
constexpr int kRunningRetries = 6;

inline void OtherThreads(long self, ArenaVector<ThreadSp>& out, std::size_t& running) {
  ArenaVector<long> waiting;  // "running" at the last look
  const int fd = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buf[8192];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      struct Dirent64 {
        std::uint64_t ino;
        std::int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[1];
      };
      const auto* d = reinterpret_cast<const Dirent64*>(buf + off);
      off += d->reclen;
      if (d->name[0] < '0' || d->name[0] > '9') continue;
      const long tid = std::strtol(d->name, nullptr, 10);
      if (tid == self) continue;
      std::uintptr_t sp = 0;
      const int state = ReadThreadSp(tid, sp);
      if (state == 1) out.push_back(ThreadSp{tid, sp});
      if (state == 0) waiting.push_back(tid);
    }
  }
  ::close(fd);
  for (int retry = 0; retry < kRunningRetries && !waiting.empty(); ++retry) {
    const timespec pause{0, (1L << retry) * 1000000L};
    ::nanosleep(&pause, nullptr);
    std::size_t still = 0;
    for (const long tid : waiting) {
      std::uintptr_t sp = 0;
      const int state = ReadThreadSp(tid, sp);
      if (state == 1) out.push_back(ThreadSp{tid, sp});
      if (state == 0) waiting[still++] = tid;
    }
    waiting.resize(still);
  }
  running += waiting.size();
}

class Scanner {
 public:
  explicit Scanner(ScanResult& r) : r_(r) {}

  // The object holding `v`, or -1.
  long Find(std::uintptr_t v) const noexcept {
    if (v < lo_ || v >= hi_) return -1;
    const auto& o = r_.objects;
    std::size_t a = 0, b = o.size();
    while (b - a > 1) {  // last start <= v
      const std::size_t m = (a + b) / 2;
      if (o[m].start <= v) a = m;
      else b = m;
    }
    // A zero-size object (new char[0], malloc(0)) is held by a pointer to its
    // start, all a program keeps of it.
    if (v < o[a].start || v - o[a].start >= std::max<std::uint64_t>(o[a].size, 1)) return -1;
    // glibc keeps the next chunk's header (prev_size, size) right after a
    // chunk's usable bytes, at offset roundup16(size + 8) - 16 from the
    // user pointer: for sizes of 16k+1 .. 16k+8 that is inside the object,
    // and malloc's own free lists and top pointer (in libc's .data) point
    // there. Such a word is the allocator's, not a reference to the object.
    // Only under glibc's malloc (glibc_headers_): jemalloc, tcmalloc and
    // mimalloc keep no header there, and a program's pointer to that last
    // member (&s->c of a struct { long a, b, c; }) held it; it was missed.
    const std::uint64_t header = ((o[a].size + 8 + 15) & ~std::uint64_t{15}) - 16;
    if (glibc_headers_ && (o[a].start & 15) == 0 && header != 0 && v - o[a].start == header) return -1;
    return static_cast<long>(a);
  }

  void Bounds() noexcept {
    lo_ = r_.objects.empty() ? 1 : r_.objects.front().start;
    hi_ = 0;
    for (const Object& o : r_.objects) {
      hi_ = std::max<std::uintptr_t>(hi_, o.start + std::max<std::uint64_t>(o.size, 1));  // see Find
    }
  }

  // Every pointer-aligned word of [lo, hi): f(word value, word address).
  template <class F>
  void Words(std::uintptr_t lo, std::uintptr_t hi, F&& f) {
    lo = (lo + sizeof(std::uintptr_t) - 1) & ~(sizeof(std::uintptr_t) - 1);
    while (lo + sizeof(std::uintptr_t) <= hi) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uintptr_t>(hi - lo, kChunk)) &
                               ~(sizeof(std::uintptr_t) - 1);
      const std::size_t got = reader_.Read(lo, buf_.data(), want) & ~(sizeof(std::uintptr_t) - 1);
      r_.bytes_scanned += got;
      const std::size_t words = got / sizeof(std::uintptr_t);
      for (std::size_t i = 0; i < words; ++i) f(buf_[i], lo + i * sizeof(std::uintptr_t));
      if (got < want) {
        lo = ((lo + got) & ~std::uintptr_t{4095}) + 4096;  // an unreadable page: past it
      } else {
        lo += got;
      }
    }
  }

  // Words, over only the pages of [lo, hi) ever touched: present, or swapped
  // out (which must still be read), as /proc/self/pagemap tells (bits 63 and
  // 62; they stay readable without privileges, which only hide the frame
  // numbers). A page never touched holds zeros, and reading it maps the zero
  // page in, page tables and all: an untouched MAP_NORESERVE reservation of
  // 8 GiB took seconds and 16 MiB of page tables, one of a terabyte minutes.
  // Without pagemap (not mounted, refused): every page, as Words.
  template <class F>
  void TouchedWords(std::uintptr_t lo, std::uintptr_t hi, F&& f) {
    if (pagemap_fd_ == -2) {
      pagemap_fd_ = ::open(ProcSelfPath("pagemap").c_str(), O_RDONLY | O_CLOEXEC);
      page_ = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
      if (pagemap_fd_ >= 0 && (page_ == 0 || (page_ & (page_ - 1)) != 0)) {
        ::close(pagemap_fd_);
        pagemap_fd_ = -1;
      }
      if (pagemap_fd_ >= 0) entries_.resize(kPagemapEntries);
    }
    if (pagemap_fd_ < 0) return Words(lo, hi, f);
    constexpr std::uint64_t kTouched = std::uint64_t{3} << 62;  // present | swapped
    std::uintptr_t run = 0;  // the start of the current run of touched pages, or 0
    std::uintptr_t at = lo & ~(page_ - 1);
    while (at < hi) {
      const std::size_t want =
          static_cast<std::size_t>(std::min<std::uintptr_t>((hi - at + page_ - 1) / page_, kPagemapEntries));
      ssize_t got;
      do {
        got = ::pread(pagemap_fd_, entries_.data(), want * sizeof(std::uint64_t),
                      static_cast<off_t>(at / page_ * sizeof(std::uint64_t)));
      } while (got < 0 && errno == EINTR);
      if (got < static_cast<ssize_t>(sizeof(std::uint64_t))) {
        // Unreadable now: the rest as Words does it (it never faults).
        Words(std::max(run != 0 ? run : at, lo), hi, f);
        return;
      }
      const std::size_t n = static_cast<std::size_t>(got) / sizeof(std::uint64_t);
      for (std::size_t i = 0; i < n; ++i, at += page_) {
        const bool touched = (entries_[i] & kTouched) != 0;
        if (touched && run == 0) {
          run = at;
        } else if (!touched && run != 0) {
          Words(std::max(run, lo), at, f);
          run = 0;
        }
      }
    }
    if (run != 0) Words(std::max(run, lo), hi, f);
  }

  // Objects [lo[i], hi[i]) read in one call, then f(word value, word
  // address) over each one's words in turn (`each(i)` first); false (nothing
  // done) when the call could not copy them all. Each range is pointer-
  // aligned, at most kChunk bytes in all.
  template <class Each, class F>
  bool ManyWords(const iovec* remote, std::size_t count, std::size_t total, Each&& each, F&& f) {
    if (!reader_.ReadMany(remote, count, buf_.data(), total)) return false;
    r_.bytes_scanned += total;
    const std::uintptr_t* word = buf_.data();
    for (std::size_t i = 0; i < count; ++i) {
      each(i);
      const auto at = reinterpret_cast<std::uintptr_t>(remote[i].iov_base);
      const std::size_t words = remote[i].iov_len / sizeof(std::uintptr_t);
      for (std::size_t w = 0; w < words; ++w) f(word[w], at + w * sizeof(std::uintptr_t));
      word += words;
    }
    return true;
  }
  static constexpr std::size_t kChunkBytes() noexcept { return kChunk; }

  void Prepare() { buf_.resize(kChunk / sizeof(std::uintptr_t)); }
  void SetGlibcHeaders(bool on) noexcept { glibc_headers_ = on; }

  ~Scanner() {
    if (pagemap_fd_ >= 0) ::close(pagemap_fd_);
  }
  Scanner(const Scanner&) = delete;
  Scanner& operator=(const Scanner&) = delete;

 private:
  static constexpr std::size_t kChunk = 1 << 16;
  static constexpr std::size_t kPagemapEntries = 1 << 13;  // 64 KiB: 32 MiB of 4 KiB pages a read
  ScanResult& r_;
  SafeReader reader_;
  ArenaVector<std::uintptr_t> buf_;
  std::uintptr_t lo_ = 1, hi_ = 0;
  bool glibc_headers_ = true;
  int pagemap_fd_ = -2;  // -2: not opened yet, -1: none
  std::uintptr_t page_ = 0;
  ArenaVector<std::uint64_t> entries_;
};

// True when heapprof sees every allocation: the malloc family replaced in
// this build (or the preload library) and every sample taken at rate 1.
inline bool EveryObjectKnown() noexcept {
#if HEAPPROF_MALLOC_HOOKS && (defined(HEAPPROF_REPLACE_MALLOC) || defined(HEAPPROF_PRELOAD_LIBRARY))
  if (real::g_shadowed) return false;
  if (RateOf(g_rate_state.load(std::memory_order_acquire)) != 1) return false;
  for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) {
    if (b->rate != 1) return false;
  }
  return true;
#else
  return false;
#endif
}

// Whether the objects' memory may be glibc malloc's chunks (Scanner::Find's
// header word): false only where the malloc under the objects is positively
// an allocator library's (jemalloc, tcmalloc, mimalloc; preloaded or linked):
// the one under the hooks when they replace malloc, else the process's.
inline bool MallocMayBeGlibcs() noexcept {
  void* const fn = UnderlyingMallocAddress();
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return true;
  return !IsAllocatorFile(info.dli_fname);
}

// glibc's non-main arenas keep their chunks in heaps of (at most) 64 MiB,
// each on a 64 MiB boundary (HEAP_MAX_SIZE on 64-bit), starting with a
// heap_info { ar_ptr, prev, size, mprotect_size }: size is what the heap
// uses, mprotect_size what is read-write, both at most 64 MiB and page
// multiples, size <= mprotect_size; ar_ptr is its arena, which lies in
// the first heap of that arena (right after its heap_info) or in libc's
// .data (the main arena never has heaps like these).
constexpr std::uintptr_t kArenaHeapBytes = std::uintptr_t{1} << 26;

inline bool LooksLikeArenaHeap(SafeReader& reader, std::uintptr_t at) noexcept {
  std::uintptr_t info[4];
  if (reader.Read(at, info, sizeof info) != sizeof info) return false;
  const std::uintptr_t size = info[2], rw = info[3];
  return info[0] != 0 && size != 0 && size <= rw && rw <= kArenaHeapBytes && (size & 4095) == 0 && (rw & 4095) == 0;
}

// How far above its stack pointer a stack in heap memory is scanned when
// heapprof does not know the block holding it (see Scan's stack_top). A
// compromise: such a thread's frames further up are missed, and heap blocks
// above its stack within this distance still count as its stack.
constexpr std::uintptr_t kUnknownHeapStackBytes = std::uintptr_t{1} << 20;

// The scan itself. `stack_top_sp`: the lowest address of the caller's frame
// to scan on this thread (taken after its callee-saved registers were
// spilled). Throws bad_alloc (arena exhausted).
inline void Scan(ScanResult& r, std::uintptr_t own_sp) {
  const std::uint64_t t0 = MonotonicNanos();
  const std::size_t arena0 = g_arena.MappedBytes();
  const long self = ::syscall(SYS_gettid);

  // Objects first, so that whatever they point at is already where it will
  // be read from.
  {
    ArenaVector<Object>& objects = r.objects;
    for (int attempt = 0; attempt < 4; ++attempt) {
      objects.clear();
      objects.reserve(g_live_map.LiveCount() + 1024 + objects.capacity() / 4);
      bool overflow = false;
      g_live_map.ForEach([&](std::uintptr_t key, Bucket* b) {
        // Zero-size objects too: the heap profile counts them (see Find).
        if (b == nullptr || b == &g_dropped_sample_bucket) return;  // (a dropped sample: in no profile)
        if (objects.size() == objects.capacity()) {
          overflow = true;
          return;
        }
        objects.push_back(Object{key, b->size, b});  // within capacity: no allocation
      });
      if (!overflow) break;
    }
    std::sort(objects.begin(), objects.end(), [](const Object& a, const Object& b) { return a.start < b.start; });
  }
  const std::size_t n = r.objects.size();
  r.region.assign(n, kUnreached);
  r.parent.assign(n, kNoParent);
  r.word_at.assign(n, 0);
  r.first.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) r.first[i] = static_cast<std::uint32_t>(i);

  const ArenaVector<Mapping> maps = ReadMappings();
  if (maps.empty()) {
    r.maps_unreadable = true;
    r.region.assign(n, kNotScanned);
    r.scan_nanos = MonotonicNanos() - t0;
    return;
  }
  {
    // No way to read memory (a process that is not dumpable, as after a
    // setuid, and not root, whose process_vm_readv a filter refuses or may
    // kill for, as Docker's does without CAP_SYS_PTRACE: /proc/self/mem is
    // root's file then): as without the maps. A word of this frame, which
    // is readable.
    SafeReader probe;
    std::uintptr_t word = 0;
    if (probe.Read(reinterpret_cast<std::uintptr_t>(&maps), &word, sizeof word) != sizeof word) {
      r.maps_unreadable = true;
      r.not_scanned_why = kMemoryUnreadable;
      r.not_scanned_name = kMemoryUnreadableName;
      r.region.assign(n, kNotScanned);
      r.scan_nanos = MonotonicNanos() - t0;
      return;
    }
  }

  // Roots: globals, this thread's TLS and the main thread's, then this
  // thread's stack, then the others'.
  const long pid = ::getpid();
  if (self == pid) NoteMainThread();
  SafeReader tls_reader;
  ModulesState ms{&r.modules, &r.roots, self, &maps, 0, g_main_thread_self.load(std::memory_order_relaxed),
                  ThreadSelf(), ThreadPointer(), &tls_reader};
  if (self != pid && ms.main_self != 0) {
    // Still there, not a zombie: after the main thread's pthread_exit its
    // TLS is stale (its destructors ran), and not a root.
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/task/%ld/stat", pid);
    ArenaString text;
    const std::size_t paren = ReadProcFile(path, text) ? text.rfind(')') : ArenaString::npos;
    if (paren != ArenaString::npos && paren + 2 < text.size() && text[paren + 2] != 'Z') ms.main_tid = pid;
  }
  dl_iterate_phdr(&CollectRootSegments, &ms);
  for (const auto& module : ms.dynamic_tls) AddMainThreadDynamicTls(ms, module.first, module.second);

  Scanner scanner(r);
  scanner.Prepare();
  scanner.Bounds();
  scanner.SetGlibcHeaders(MallocMayBeGlibcs());

  // The top of the stack holding `sp`: the end of its mapping (a thread
  // stack, [stack], a fiber's own mmap), except in a malloc heap (the brk
  // heap, a glibc arena's heap: anonymous, on a 64 MiB boundary, not above a
  // guard page), where a stack is one block (pthread_attr_setstack on a
  // malloc'ed block, a fiber's) and the rest of the mapping other blocks,
  // which would all count as that thread's stack: there the end of the known
  // object holding sp, or at most kUnknownHeapStackBytes above sp.
  auto stack_top = [&](const Mapping& m, std::uintptr_t sp) -> std::uintptr_t {
    const std::size_t mi = static_cast<std::size_t>(&m - maps.data());
    const bool guarded = mi > 0 && maps[mi - 1].hi == m.lo && maps[mi - 1].anonymous && !maps[mi - 1].readable &&
                         !maps[mi - 1].writable;
    const bool heap = m.brk_heap || (m.anonymous && !guarded && (m.lo & ((std::uintptr_t{1} << 26) - 1)) == 0);
    if (!heap) return m.hi;
    const long k = scanner.Find(sp);
    if (k >= 0) {
      const Object& o = r.objects[static_cast<std::size_t>(k)];
      return std::min<std::uintptr_t>(m.hi, o.start + o.size);
    }
    return sp + std::min<std::uintptr_t>(m.hi - sp, kUnknownHeapStackBytes);
  };
  if (const Mapping* m = MappingOf(maps, own_sp)) {
    r.roots.push_back(RootRegion{own_sp, stack_top(*m, own_sp), RootKind::kStack, self, -1});
  }
  // Called on a coroutine's stack: the thread's own stack still holds the
  // frames suspended at the switch (main()'s locals: an event loop, its
  // services), below them where its sp was is not known: the whole
  // mapping, dead frames too (at worst an object counts as held that is not).
  if (const ThreadState* ts = tls_thread_state;
      ts != nullptr && ts->stack_hi > ts->stack_lo && (own_sp < ts->stack_lo || own_sp >= ts->stack_hi)) {
    if (const Mapping* m = MappingOf(maps, ts->stack_hi - 1)) {
      r.roots.push_back(RootRegion{std::max(m->lo, ts->stack_lo), ts->stack_hi, RootKind::kStack, self, -1});
    }
  }
  if (r.saved_register_count != 0) {
    const auto lo = reinterpret_cast<std::uintptr_t>(r.saved_registers);
    r.roots.push_back(RootRegion{lo, lo + r.saved_register_count * sizeof(std::uintptr_t), RootKind::kStack, self, -1});
  }
  ArenaVector<ThreadSp> threads;
  OtherThreads(self, threads, r.threads_running);
  for (const ThreadSp& t : threads) {
    const Mapping* m = MappingOf(maps, t.sp);
    if (m == nullptr || !m->readable || !m->writable) continue;
    const std::uintptr_t lo = t.sp - m->lo > 128 ? t.sp - 128 : m->lo;  // the x86-64 red zone
    r.roots.push_back(RootRegion{lo, stack_top(*m, t.sp), RootKind::kStack, t.tid, -1});
  }
  ArenaVector<std::uintptr_t> thread_stacks;  // sorted: maps are
  {
    ArenaVector<std::uintptr_t> live_sps;
    live_sps.push_back(own_sp);
    for (const ThreadSp& t : threads) live_sps.push_back(t.sp);
    ExitedThreadDtvRoots(maps, live_sps, tls_reader, r.roots, thread_stacks);
  }
  ArenaVector<std::uint32_t> queue;
  queue.reserve(n);

  // Only what the maps say is readable is read.
  auto for_readable = [&](std::uintptr_t lo, std::uintptr_t hi, auto&& fn) {
    auto it = std::upper_bound(maps.begin(), maps.end(), lo,
                               [](std::uintptr_t a, const Mapping& m) { return a < m.lo; });
    if (it != maps.begin()) --it;
    for (; it != maps.end() && it->lo < hi; ++it) {
      if (!it->readable || it->special) continue;
      const std::uintptr_t a = std::max(lo, it->lo), b = std::min(hi, it->hi);
      if (a < b) fn(a, b);
    }
  };

  // Small objects are read many to a call (Scanner::ManyWords): those
  // wholly inside one readable mapping, pointer-aligned, up to kBatch of
  // them and 64 KiB in all; the rest (and a batch the call could not read
  // whole) one by one, over their readable parts.
  constexpr std::size_t kBatch = 256;
  iovec batch[kBatch];
  std::uint32_t batch_holder[kBatch];
  // The object `v` points into, if there is one not reached yet: reached
  // from `region` now, and queued for the walk. Its index, or -1.
  const auto mark = [&](std::uintptr_t v, std::uint32_t region) -> long {
    const long k = scanner.Find(v);
    if (k < 0 || r.region[static_cast<std::size_t>(k)] != kUnreached) return -1;
    r.region[static_cast<std::size_t>(k)] = region;
    queue.push_back(static_cast<std::uint32_t>(k));
    return k;
  };
  // A word of root `ri` at `at`: what it points into is held by that root.
  const auto from_root = [&](std::uint32_t ri) {
    return [&, ri](std::uintptr_t v, std::uintptr_t at) {
      const long k = mark(v, ri);
      if (k >= 0) r.word_at[static_cast<std::size_t>(k)] = at;
    };
  };
  auto walk = [&](std::size_t head) {
    std::uint32_t holder = 0, region = 0;
    const auto hold = [&](std::uintptr_t v, std::uintptr_t) {
      const long k = mark(v, region);
      if (k < 0) return;
      r.parent[static_cast<std::size_t>(k)] = holder;
      r.first[static_cast<std::size_t>(k)] = r.first[holder];
    };
    const auto one = [&](std::uint32_t i) {
      holder = i;
      region = r.region[i];
      const Object o = r.objects[i];
      for_readable(o.start, o.start + o.size, [&](std::uintptr_t a, std::uintptr_t b) { scanner.Words(a, b, hold); });
    };
    const auto batchable = [&](const Object& o) {
      if ((o.start & (sizeof(std::uintptr_t) - 1)) != 0 || o.size < sizeof(std::uintptr_t) ||
          o.size > Scanner::kChunkBytes() / 4) {
        return false;
      }
      const Mapping* m = MappingOf(maps, o.start);
      return m != nullptr && m->readable && !m->special && o.start + o.size <= m->hi;
    };
    while (head < queue.size()) {
      std::size_t count = 0, total = 0;
      for (std::size_t q = head; q < queue.size() && count < kBatch; ++q) {
        const Object& o = r.objects[queue[q]];
        if (!batchable(o)) break;
        const std::size_t bytes = static_cast<std::size_t>(o.size) & ~(sizeof(std::uintptr_t) - 1);
        if (total + bytes > Scanner::kChunkBytes()) break;
        batch[count] = iovec{reinterpret_cast<void*>(o.start), bytes};
        batch_holder[count++] = queue[q];
        total += bytes;
      }
      if (count < 2) {
        one(queue[head++]);
        continue;
      }
      const auto each = [&](std::size_t i) {
        holder = batch_holder[i];
        region = r.region[holder];
      };
      if (!scanner.ManyWords(batch, count, total, each, hold)) {
        for (std::size_t i = 0; i < count; ++i) one(batch_holder[i]);
      }
      head += count;
    }
    return head;
  };
  // Globals and TLS first, walked to the end, then the stacks: an object a
  // global reaches is named after the global even when a stack word points
  // at it too (a stack's references come and go; and dead stack slots hold
  // stale copies that would otherwise shorten every path).
  std::size_t head = 0;
  // A TLS block that is itself an object (a dynamic TLS block: glibc mallocs
  // it, through the hooks when they replace malloc) is held by its thread, as
  // its contents are, before any word elsewhere is looked at. Only the main
  // thread's DTV points at its blocks, and no scan reads that: the block was
  // "[unreachable]", a leak at rate 1 that set leak_exit_code.
  for (std::uint32_t ri = 0; ri < r.roots.size(); ++ri) {
    if (r.roots[ri].kind != RootKind::kTls) continue;
    from_root(ri)(r.roots[ri].lo, r.roots[ri].lo);
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (std::uint32_t ri = 0; ri < r.roots.size(); ++ri) {
      const RootRegion root = r.roots[ri];
      if ((root.kind == RootKind::kStack) != (pass == 1)) continue;
      const auto reach = from_root(ri);
      for_readable(root.lo, root.hi, [&](std::uintptr_t a, std::uintptr_t b) {
        // A module's writable segment: only its touched pages. A .data page
        // never written is the file's (no heap address), a .bss page never
        // touched is zeros; a program's 1 GiB static array was read whole.
        if (root.kind == RootKind::kGlobal) scanner.TouchedWords(a, b, reach);
        else scanner.Words(a, b, reach);
      });
    }
    head = walk(head);
  }

  r.every_object_known = EveryObjectKnown();
  bool any_unreached = queue.size() < n;
#if defined(HEAPPROF_ASAN) || defined(HEAPPROF_TSAN)
  // The sanitizers' shadow and allocator regions are anonymous mappings of
  // terabytes: heap memory is not told apart from them, so not scanned.
  any_unreached = false;
#endif
  // What is not heap memory: the arena, the roots, the known objects.
  // `all_arena_known`: false when not every arena mapping is known, and all
  // anonymous mappings are left out instead (the brk heap kept: the arena
  // never uses brk).
  auto not_heap = [&](bool& all_arena_known) {
    ArenaVector<std::pair<std::uintptr_t, std::uintptr_t>> skip;
    skip.reserve(n + r.roots.size() + 64);
    for (const Object& o : r.objects) skip.emplace_back(o.start, o.start + o.size);
    for (const RootRegion& root : r.roots) skip.emplace_back(root.lo, root.hi);
    ArenaVector<std::uintptr_t> raw(2 * Arena::kMaxCopiedRanges);
    auto* ranges = reinterpret_cast<std::uintptr_t(*)[2]>(raw.data());
    const long count = g_arena.CopyRanges(ranges, Arena::kMaxCopiedRanges);
    all_arena_known = count >= 0;
    if (count >= 0) {
      for (long i = 0; i < count && i < static_cast<long>(Arena::kMaxCopiedRanges); ++i) {
        skip.emplace_back(ranges[i][0], ranges[i][1]);
      }
    } else {
      for (const Mapping& m : maps) {
        if (m.anonymous) skip.emplace_back(m.lo, m.hi);
      }
    }
    std::sort(skip.begin(), skip.end());
    return skip;
  };
  // Anonymous or brk memory, private and writable: where the heap is.
  auto heap_like = [&](std::size_t mi) {
    const Mapping& m = maps[mi];
    if (!m.readable || !m.writable || !m.is_private || m.special || !(m.anonymous || m.brk_heap)) return false;
    // A thread stack, live or cached by glibc after its thread exited:
    // right above its PROT_NONE guard. Not heap memory: its dead slots
    // hold stale copies of pointers. (A malloc arena's heap also follows
    // the reserved tail of the one before it at times, but starts on a
    // 64 MiB boundary.)
    // (Only a thread's: a fiber's stack above its guard is the program's
    // memory. See ExitedThreadDtvRoots.)
    return !(m.anonymous && mi > 0 && maps[mi - 1].hi == m.lo && maps[mi - 1].anonymous && !maps[mi - 1].readable &&
             !maps[mi - 1].writable && (m.lo & ((std::uintptr_t{1} << 26) - 1)) != 0 &&
             std::binary_search(thread_stacks.begin(), thread_stacks.end(), m.lo));
  };
  // Every word of [lo, hi) outside `skip`, over its touched pages.
  auto gaps = [&](std::uintptr_t lo, std::uintptr_t hi,
                  const ArenaVector<std::pair<std::uintptr_t, std::uintptr_t>>& skip, auto&& fn) {
    std::uintptr_t cursor = lo;
    auto it = std::upper_bound(skip.begin(), skip.end(), std::make_pair(lo, ~std::uintptr_t{0}));
    if (it != skip.begin()) --it;
    auto scan_gap = [&](std::uintptr_t a, std::uintptr_t b) {
      if (a < b) scanner.TouchedWords(a, b, fn);
    };
    for (; it != skip.end() && it->first < hi; ++it) {
      if (it->second <= cursor) continue;
      scan_gap(cursor, std::min(it->first, hi));
      cursor = std::max(cursor, it->second);
    }
    scan_gap(cursor, hi);
  };
  if (any_unreached && !r.every_object_known) {
    r.unsampled_pass = true;
    bool all_arena_known = false;
    const auto skip = not_heap(all_arena_known);
    for (std::size_t mi = 0; mi < maps.size(); ++mi) {
      if (!heap_like(mi)) continue;
      gaps(maps[mi].lo, maps[mi].hi, skip, [&](std::uintptr_t v, std::uintptr_t) { mark(v, kUnsampledHeap); });
    }
    head = walk(head);
  } else if (any_unreached && MallocMayBeGlibcs()) {
    // Every object known, under glibc's malloc: its memory is the brk heap,
    // its arenas' heaps (anonymous, each on a 64 MiB boundary) and one
    // mapping per chunk it mmaps, which is a known object (unmapped when
    // freed). Freed chunks in the heaps hold stale pointers, so those are not
    // read; any other anonymous mapping is memory the program (or a library,
    // or a runtime's own heap) mapped itself, and a pointer kept there holds
    // its object as a global's does. An object held only from a pool
    // allocator's mmap'ed region was "[unreachable]": a leak, for
    // leak_exit_code. (Under jemalloc, tcmalloc or mimalloc, their heaps are
    // anonymous mappings too, with freed blocks of their own: not read.)
    bool all_arena_known = false;
    const auto skip = not_heap(all_arena_known);
    const std::size_t first_mapping_root = r.roots.size();
    for (std::size_t mi = 0; mi < maps.size() && all_arena_known; ++mi) {
      const Mapping& m = maps[mi];
      if (!heap_like(mi) || m.brk_heap) continue;
      // Less every 64 MiB block that starts with an arena heap's header (the
      // kernel merges a mapping placed right below a heap with it).
      std::uintptr_t lo = m.lo;
      for (std::uintptr_t a = (m.lo + kArenaHeapBytes - 1) & ~(kArenaHeapBytes - 1); a < m.hi && a >= m.lo;
           a += kArenaHeapBytes) {
        if (!LooksLikeArenaHeap(tls_reader, a)) continue;
        if (lo < a) r.roots.push_back(RootRegion{lo, a, RootKind::kMapping, 0, -1});
        lo = std::min(m.hi, a + kArenaHeapBytes);
      }
      if (lo < m.hi) r.roots.push_back(RootRegion{lo, m.hi, RootKind::kMapping, 0, -1});
    }
    for (std::size_t ri = first_mapping_root; ri < r.roots.size(); ++ri) {
      const RootRegion root = r.roots[ri];
      gaps(root.lo, root.hi, skip, from_root(static_cast<std::uint32_t>(ri)));
    }
    head = walk(head);
  }
  (void)head;
  r.order = std::move(queue);
  r.scan_nanos = MonotonicNanos() - t0;
  const std::size_t arena1 = g_arena.MappedBytes();
  r.memory_bytes = arena1 > arena0 ? arena1 - arena0 : 0;
}

// ---------------------------------------------------------------- naming roots

// Data symbols of one file, sorted, loaded when a global root first needs one.
// Names are demangled when a root first uses them, not at load: a module has
// thousands of data symbols, a profile a few roots, and __cxa_demangle
// allocates with malloc (through the hooks where they replace it).
struct DataSymbols {
  struct Sym {
    std::uint64_t value, end;
    ArenaString name;  // as the symbol table spells it until `demangled`
    bool demangled;
  };
  bool loaded = false;
  ArenaVector<Sym> syms;

  void Load(const ArenaString& path) {
    loaded = true;
    if (path.empty()) return;
    elf::MappedFile file;
    if (!file.Open(path.c_str())) return;
    const elf::ByteView view = file.view();
    elf::SectionTable sections;
    if (!sections.Init(view)) return;
    for (int pass = 0; pass < 2 && syms.empty(); ++pass) {
      const std::uint32_t want = pass == 0 ? SHT_SYMTAB : SHT_DYNSYM;
      for (std::uint64_t i = 1; i < sections.count(); ++i) {
        Elf64_Shdr sh;
        if (!sections.Get(i, &sh) || sh.sh_type != want) continue;
        Elf64_Shdr strsh;
        if (!sections.Get(sh.sh_link, &strsh)) continue;
        const elf::ByteView table = sections.Contents(sh), strings = sections.Contents(strsh);
        for (std::uint64_t off = 0; off + sizeof(Elf64_Sym) <= table.size; off += sizeof(Elf64_Sym)) {
          Elf64_Sym s;
          if (!table.Read(off, &s)) break;
          const unsigned type = ELF64_ST_TYPE(s.st_info);
          if ((type != STT_OBJECT && type != STT_COMMON) || s.st_shndx == SHN_UNDEF || s.st_size == 0) continue;
          std::size_t len = 0;
          const char* name = strings.CString(s.st_name, &len);
          if (name == nullptr || len == 0) continue;
          syms.push_back(Sym{s.st_value, s.st_value + s.st_size, ArenaString(name, len), false});
        }
      }
    }
    std::sort(syms.begin(), syms.end(), [](const Sym& a, const Sym& b) { return a.value < b.value; });
  }

  const ArenaString* Find(std::uint64_t vaddr) {
    auto it = std::upper_bound(syms.begin(), syms.end(), vaddr,
                               [](std::uint64_t a, const Sym& s) { return a < s.value; });
    // The nearest symbol starting at or below vaddr may be one nested inside
    // the symbol holding it (a member given a name of its own): a few steps
    // back from there, as nesting is rare and shallow.
    const auto from = it;
    while (it != syms.begin()) {
      --it;
      if (vaddr < it->end) {
        if (!it->demangled) {
          it->name = elf::Demangle(it->name.data(), it->name.size());
          it->demangled = true;
        }
        return &it->name;
      }
      if (from - it >= 8) break;
    }
    return nullptr;
  }
};

// A synthetic frame's name as pprof will show it. pprof "simplifies" a name
// that is not mangled by cutting every parenthesised group (taking them for
// parameter lists), so "(anonymous namespace)" is spelt without them.
inline ArenaString MarkerSafe(std::string_view name) {
  ArenaString out;
  constexpr std::string_view kAnon = "(anonymous namespace)";
  for (std::size_t i = 0; i < name.size();) {
    if (name.compare(i, kAnon.size(), kAnon) == 0) {
      out += "{anonymous}";
      i += kAnon.size();
    } else {
      out += name[i++];
    }
  }
  return out;
}

class RootNamer {
 public:
  // `objects`: the profile's (CollectProfileObjects), whose absolute paths
  // and /proc/self/map_files entries name the files that were mapped.
  RootNamer(const ScanResult& r, const ArenaVector<LoadedObject>& objects)
      : r_(r), objects_(objects), symbols_(r.modules.size()) {}

  // "[global] g_cache", "[stack] thread 1234", "[tls] thread 1234",
  // "[unsampled heap]", "[unreachable]" for the path's root of object `i`.
  ArenaString NameOf(std::size_t i) {
    const std::size_t k = r_.first[i];
    const std::uint32_t region = r_.region[k];
    if (region == kUnreached) return "[unreachable]";
    if (region == kUnsampledHeap) return "[unsampled heap]";
    if (region == kNotScanned) return r_.not_scanned_name;
    const RootRegion& root = r_.roots[region];
    if (root.kind == RootKind::kStack) return "[stack] thread " + ArenaDecimal(static_cast<unsigned long long>(root.tid));
    if (root.kind == RootKind::kTls) return "[tls] thread " + ArenaDecimal(static_cast<unsigned long long>(root.tid));
    if (root.kind == RootKind::kExitedThread) return "[exited thread] glibc's cached descriptor";
    if (root.kind == RootKind::kMapping) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "[anonymous mapping] %#llx-%#llx", static_cast<unsigned long long>(root.lo),
                    static_cast<unsigned long long>(root.hi));
      return buf;
    }
    const Module& m = r_.modules[static_cast<std::size_t>(root.module)];
    DataSymbols& syms = symbols_[static_cast<std::size_t>(root.module)];
    if (!syms.loaded) syms.Load(FileOf(m));
    const std::uintptr_t at = r_.word_at[k];
    if (const ArenaString* name = syms.Find(at - m.bias)) return "[global] " + MarkerSafe(*name);
    char buf[64];
    std::snprintf(buf, sizeof buf, "+%#llx", static_cast<unsigned long long>(at - m.bias));
    return "[global] " + ArenaString(BaseNameOf(m.path)) + buf;
  }

 private:
  // What to open for a module's symbols: dl_iterate_phdr's name is the
  // string given to dlopen, which a relative path ("./plugin.so") no longer
  // names after a chdir (a daemon's chdir("/")), nor a path whose file a
  // deploy has replaced or deleted since: the loaded object's (same load
  // bias) file as the symbolizer reads it. Roots were "lib.so+0x4020", or
  // named after the new file's symbols.
  const ArenaString& FileOf(const Module& m) const {
    for (const LoadedObject& o : objects_) {
      if (o.bias != m.bias || o.path.empty()) continue;
      return !o.file.empty() ? o.file : o.path;
    }
    return m.path;
  }

  const ScanResult& r_;
  const ArenaVector<LoadedObject>& objects_;
  ArenaVector<DataSymbols> symbols_;
};

// ---------------------------------------------------------------- holders' frames

// Frames of the allocator machinery rather than of the program (the standard
// library, heapprof, the allocation functions): a holder is shown by the first
// frame of its allocation stack that is none of these. The C functions by
// their whole name: a prefix would take the program's malloc_pool::Grow or
// reallocate_buffer for machinery.
inline bool IsMachineryName(std::string_view name) {
  if (StartsWithAny(name, {"std::", "__gnu_cxx::", "__cxx", "heapprof::", "operator new", "operator delete", "__libc_"})) {
    return true;
  }
  for (const char* function : {"malloc", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc",
                               "memalign", "valloc", "pvalloc"}) {
    if (name == function) return true;
  }
  return false;
}

// The language runtime and allocators' own files: a holder allocated inside
// them (glibc's tsearch node, hsearch table, a stdio buffer; a libstdc++
// locale facet) is named by the program's function that called them, not by
// glibc's internal alias (__GI___tsearch).
inline bool IsRuntimeFile(std::string_view path) {
  return IsAllocatorFile(path) ||
         StartsWithAny(BaseNameOf(path), {"libc.so", "libc-2.", "libm.so", "libpthread.so", "libdl.so", "librt.so",
                                          "ld-linux", "ld64.so", "libstdc++.so", "libc++.so", "libc++abi.so",
                                          "libgcc_s.so", "libheapprof_preload.so"});
}

class HolderSites {
 public:
  HolderSites(Symbolizer& s, const ArenaVector<LoadedObject>& objects) : symbolizer_(s) {
    for (const LoadedObject& o : objects) {
      if (IsRuntimeFile(o.path)) runtime_.push_back(std::make_pair(o.start, o.limit));
    }
  }

  // The frame standing for a holder: "[held by] Fn at file.cpp:42", Fn being
  // the first function of its allocation stack that is the program's (not
  // std::, heapprof or an allocation function, not code of libc or the other
  // runtime libraries), at the line that allocated. When every named frame is
  // such code, the first of them not machinery by its name.
  const ArenaString& SiteOf(const StackRecord* stack) {
    auto it = cache_.find(stack);
    if (it != cache_.end()) return it->second;
    ArenaString site, fallback;
    for (std::uint32_t i = 0; stack != nullptr && i < stack->depth && site.empty(); ++i) {
      const std::uintptr_t pc = stack->pcs()[i];
      SymbolizedFrame frames[32];
      SymbolizedQuality q;
      const int k = pc != 0 ? symbolizer_.Symbolize(pc - 1, frames, 32, &q) : 0;
      const bool runtime = InRuntime(pc - 1);
      for (int f = 0; f < k && site.empty(); ++f) {  // innermost (inlined) first
        if (frames[f].name.empty() || IsMachineryName(frames[f].name)) continue;
        if (runtime && !fallback.empty()) continue;
        ArenaString& to = runtime ? fallback : site;
        to = "[held by] ";
        to += MarkerSafe(frames[f].name);
        if (!frames[f].file.empty() && frames[f].line != 0) {
          to += " at ";
          to += BaseNameOf(frames[f].file);
          to += ':';
          to += ArenaDecimal(frames[f].line);
        }
      }
    }
    if (site.empty()) site = !fallback.empty() ? std::move(fallback) : ArenaString("[held by] an object of unknown origin");
    return cache_.emplace(stack, std::move(site)).first->second;
  }

 private:
  bool InRuntime(std::uintptr_t pc) const noexcept {
    for (const auto& range : runtime_) {
      if (pc >= range.first && pc < range.second) return true;
    }
    return false;
  }

  Symbolizer& symbolizer_;
  ArenaVector<std::pair<std::uintptr_t, std::uintptr_t>> runtime_;  // [start, limit) of runtime files' code
  ArenaMap<const StackRecord*, ArenaString> cache_;
};

// Holders' frames as a trie: node 0 is the empty chain; a node is a site
// (its frame's name) before the rest of the chain. A run of holders
// allocated at one site (a tree's nodes, a list's links) is one frame.
class HolderChains {
 public:
  HolderChains() { nodes_.push_back(Node{nullptr, 0, 0}); }

  std::uint32_t Push(const ArenaString& site, std::uint32_t rest) {
    const Node& r = nodes_[rest];
    if (r.site != nullptr && *r.site == site) return rest;
    const auto key = std::make_pair(&site, rest);
    auto it = index_.find(key);
    if (it != index_.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(nodes_.size());
    nodes_.push_back(Node{&site, rest, r.depth + 1});
    index_.emplace(key, id);
    return id;
  }

  void Append(std::uint32_t node, ArenaVector<ArenaString>& out) const {
    for (std::size_t shown = 0; node != 0; node = nodes_[node].rest) {
      if (++shown > kMaxHolders) {
        out.emplace_back("[heapprof: retention path longer than 32 holders]");
        return;
      }
      out.push_back(*nodes_[node].site);
    }
  }

 private:
  static constexpr std::size_t kMaxHolders = 32;
  struct Node {
    const ArenaString* site;  // interned by HolderSites: equal names, one address
    std::uint32_t rest;
    std::uint32_t depth;
  };
  ArenaVector<Node> nodes_;
  ArenaMap<std::pair<const ArenaString*, std::uint32_t>, std::uint32_t> index_;
};


// The retention profile's samples: one per object (merged when the whole
// stack and the bucket are the same), valued as the heap profile values it
// (one sampled object, scaled by its bucket's size and rate).
inline ProfileData RetentionProfileData(const ScanResult& r, const ArenaVector<LoadedObject>& objects,
                                        Symbolizer& symbolizer) {
  ProfileData data;
  data.period = static_cast<std::int64_t>(RateOf(g_rate_state.load(std::memory_order_acquire)));
  data.time_nanos = RealtimeNanos();
  RootNamer namer(r, objects);
  HolderSites sites(symbolizer, objects);
  struct Agg {
    const Bucket* bucket;
    ArenaVector<std::uintptr_t> pcs;
    ArenaVector<ArenaString> markers;
    double count = 0;
  };
  ArenaMap<ArenaString, Agg> merged;
  std::uint64_t unreachable = 0, unsampled = 0, reached = 0;
  // Each object's chain of holder frames, built once per distinct chain in
  // the walk's order (a holder's chain is known before what it holds): a
  // trie of (site, rest) nodes, so a million-link list costs a million
  // steps, not a million per link.
  HolderChains chains;
  ArenaVector<std::uint32_t> node_of(r.objects.size(), 0);
  for (const std::uint32_t i : r.order) {
    const std::uint32_t p = r.parent[i];
    if (p == kNoParent) continue;
    node_of[i] = chains.Push(sites.SiteOf(r.objects[p].bucket->stack), node_of[p]);
  }
  for (std::size_t i = 0; i < r.objects.size(); ++i) {
    const Object& o = r.objects[i];
    ArenaVector<std::uintptr_t> pcs(o.bucket->stack->pcs(), o.bucket->stack->pcs() + o.bucket->stack->depth);
    // Holders, nearest first (see HolderChains).
    ArenaVector<ArenaString> markers;
    if (o.bucket->stack->truncated) markers.emplace_back("[heapprof: allocation stack truncated]");
    chains.Append(node_of[i], markers);
    markers.push_back(namer.NameOf(i));
    const ArenaString& root = markers.back();
    if (root == "[unreachable]") ++unreachable;
    else if (root == "[unsampled heap]") ++unsampled;
    else ++reached;
    ArenaString key(reinterpret_cast<const char*>(pcs.data()), pcs.size() * sizeof(std::uintptr_t));
    key.append(reinterpret_cast<const char*>(&o.bucket), sizeof o.bucket);
    for (const ArenaString& m : markers) {
      key += '\0';
      key += m;
    }
    auto it = merged.find(key);
    if (it == merged.end()) {
      Agg a{o.bucket, std::move(pcs), std::move(markers), 0};
      it = merged.emplace(std::move(key), std::move(a)).first;
    }
    it->second.count += 1;
  }
  for (auto& entry : merged) {
    Agg& a = entry.second;
    AppendBucketSample(data, a.bucket, a.count, a.count);
    ProfileSample& s = data.samples.back();
    s.pcs = std::move(a.pcs);
    s.truncated = false;  // the leaf's own cut stack reads as its marker below
    s.markers = std::move(a.markers);
  }
  char line[256];
  if (r.maps_unreadable) {
    std::snprintf(line, sizeof line, "heapprof retention: %zu sampled objects, not scanned: %s", r.objects.size(),
                  r.not_scanned_why);
    data.comments.emplace_back(line);
    return data;
  }
  std::snprintf(line, sizeof line,
                "heapprof retention: %zu sampled objects: %llu reached from roots, %llu only from unsampled heap, "
                "%llu unreachable",
                r.objects.size(), static_cast<unsigned long long>(reached), static_cast<unsigned long long>(unsampled),
                static_cast<unsigned long long>(unreachable));
  data.comments.emplace_back(line);
  std::snprintf(line, sizeof line,
                "heapprof retention: scanned %.1f MiB in %.1f ms; %zu threads running (stacks not scanned)%s",
                static_cast<double>(r.bytes_scanned) / (1 << 20), static_cast<double>(r.scan_nanos) / 1e6,
                r.threads_running, r.every_object_known ? "; every object known" : "");
  data.comments.emplace_back(line);
  return data;
}

// The scan with this thread's registers on its stack: the caller's
// callee-saved registers are spilled into this frame, and the scan starts
// below it (ScanFrom's frame is deeper than ours).
__attribute__((__noinline__)) inline std::uintptr_t CurrentFrame() noexcept {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

__attribute__((__noinline__)) inline void ScanWithRegisters(ScanResult& r) {
  __builtin_unwind_init();
  volatile std::uintptr_t keep = 0;  // a frame that stays
  Scan(r, CurrentFrame());
  keep = keep + 1;
}

// fn(from): `from` is where a scan of this thread's stack starts, the
// caller's callee-saved registers spilled above it, in this frame, which
// stays while fn runs: fn may then scan from another stack (files.hpp:
// RunWithBuildStack).
template <class Fn>
__attribute__((__noinline__)) inline void WithRegistersSpilled(Fn& fn) {
  __builtin_unwind_init();
  volatile std::uintptr_t keep = 0;  // a frame that stays
  fn(CurrentFrame());
  keep = keep + 1;
}

}  // namespace retention

// One scan and its figures (bench/retention.cpp).
struct ScanResultForBench {
  std::uint64_t nanos = 0, bytes_scanned = 0, memory_bytes = 0;
  std::size_t objects = 0;
};
inline ScanResultForBench RetentionScanForBench() {
  ReentrancyGuard guard;
  EnsureInit();
  ScanResultForBench out;
  HEAPPROF_TRY {
    retention::ScanResult scan;
    retention::ScanWithRegisters(scan);
    out.nanos = scan.scan_nanos;
    out.bytes_scanned = scan.bytes_scanned;
    out.memory_bytes = scan.memory_bytes;
    out.objects = scan.objects.size();
  }
  HEAPPROF_CATCH_ALL {}
  return out;
}

// The retention profile, serialised and compressed; false on failure.
// `from`: where this thread's stack is scanned from (WithRegistersSpilled's);
// 0: from here.
inline bool BuildRetentionProfileBytes(ArenaString& gz, std::uintptr_t from = 0) {
  ReentrancyGuard guard;
  EnsureInit();
  WarnIfNoAllocationSeen();
  WriteHeadroom headroom;  // built without exceptions: the memory first, or no write
  if (!headroom.ok()) return false;
  HEAPPROF_TRY {
    retention::ScanResult scan;
    if (from != 0) {
      retention::Scan(scan, from);
    } else {
      retention::ScanWithRegisters(scan);
    }
    const ArenaVector<LoadedObject> objects = CollectProfileObjects();
    Symbolizer symbolizer(objects);
    const ProfileData data = retention::RetentionProfileData(scan, objects, symbolizer);
    gz = EncodeGzipped(data, objects, symbolizer);
    return true;
  }
  HEAPPROF_CATCH_ALL {
    gz.clear();
    return false;
  }
}

}  // namespace detail
}  // namespace heapprof
