// heapprof: the fast paths of the global hooks (operator new/delete and the
// malloc family), which count what the allocator holds: the block's usable
// size, at the allocation and at the free.
//
// Why that unit: a free does not always know the requested size. C's free()
// never does, and neither does an unsized operator delete, which GCC emits
// for delete[] of trivially destructible types (no array cookie) and for
// std::unique_ptr<char[]>. The usable size is the one number both ends can
// compute from the pointer alone, so live_bytes returns exactly to its
// baseline for any mix of sized, unsized and C frees (jemalloc's
// stats.allocated and Go's HeapAlloc count the same way). The profile keeps
// the requested sizes of its samples: the live map remembers them.
//
// The sampler's countdown still runs on requested bytes, so the profile's
// weights are those of the bytes the program asked for.
//
// Cost: on glibc the usable size is read inline from the chunk header that
// malloc just wrote, or that free is about to read (a load and three ALU
// ops), after a one-time check that the formula agrees with glibc's own
// malloc_usable_size (DetectBlockSize). Under any other allocator (jemalloc,
// tcmalloc, a sanitizer's) it is that allocator's malloc_usable_size.
#pragma once

#include "heapprof/config.hpp"

#if HEAPPROF_ENABLED

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <malloc.h>

#include "heapprof/detail/0_base/object_base.hpp"
#include "heapprof/detail/1_hooks/fast_path.hpp"

// Defined by 1_hooks/malloc.hpp (HEAPPROF_REPLACE_MALLOC): finds the allocator
// under the malloc family. Weak: absent without that macro. The definition is
// hidden, so never another object's; the reference is not: GNU gold (2.40)
// links an undefined weak *hidden* symbol of a PIE to the load address
// instead of 0, so the null check passed and the first allocation of every
// program linked with -fuse-ld=gold called into its ELF header (SIGSEGV).
// A default-visibility undefined weak reference stays null with gold, ld.bfd
// and lld alike.
extern "C" __attribute__((__weak__)) void heapprof_detail_resolve_malloc() noexcept;
// Defined by the implementation unit: decides whether this copy of the engine
// records (engine.hpp: g_engine_off). Weak likewise, its definition hidden.
extern "C" __attribute__((__weak__)) void heapprof_detail_engine_role() noexcept;

namespace heapprof {
namespace detail {

// glibc's chunk layout is read inline only on x86-64 (aarch64 may tag memory,
// which changes the formula) and never under a sanitizer (it owns malloc).
#if defined(__x86_64__) && !defined(HEAPPROF_ASAN) && !defined(HEAPPROF_TSAN)
#define HEAPPROF_DETAIL_GLIBC_CHUNKS 1
#else
#define HEAPPROF_DETAIL_GLIBC_CHUNKS 0
#endif

namespace real {
// True when the process's malloc is another object's, loaded before ours
// (set by 1_hooks/malloc.hpp; read by the retention scan, which is compiled
// before the malloc hooks).
inline bool g_shadowed = false;
}  // namespace real

// True once DetectBlockSize has proven that the blocks the hooks see are
// glibc chunks. Both ways give the same number for every live block, so
// switching while blocks are live keeps the counts exact.
inline bool g_glibc_chunks = false;

// The malloc and free under the hooks when the malloc family is replaced
// (1_hooks/malloc.hpp sets them before the first block is seen); otherwise
// the process's malloc and std::free. g_release_block releases a block whose
// free the profiler deferred (live_map.hpp).
inline void* (*g_underlying_malloc)(std::size_t) = nullptr;
inline void (*g_release_block)(void*) = &std::free;
// Its malloc_usable_size, called directly: in libheapprof_preload.so under an
// allocator preloaded ahead of it, the name would find that allocator's.
inline std::size_t (*g_underlying_usable_size)(void*) = &malloc_usable_size;

// glibc malloc.c: the word before the block is the chunk's size with three
// flag bits (bit 1: the chunk is mmapped). musable() is that size less the
// header: 16 bytes for an mmapped chunk, 8 for a heap chunk (whose next
// chunk's prev_size word is usable while this one is in use).
HEAPPROF_ALWAYS_INLINE std::size_t GlibcChunkWord(const void* p) noexcept {
  // The header is outside the block as the compiler knows it (malloc's
  // result): the empty asm hides where the pointer came from, or GCC rejects
  // the read (-Warray-bounds) and may assume it cannot happen. (On the
  // pointer itself, not on the header's address: the load keeps its -8.)
#if defined(__x86_64__)
  // The load itself in the asm: an empty asm on the pointer made GCC copy
  // it first (the copy is the asm's output; the block is returned or freed).
  std::size_t head;
  asm volatile("movq -8(%1), %0" : "=r"(head) : "r"(p));
  return head;
#else
  const std::size_t* block = static_cast<const std::size_t*>(p);
  asm("" : "+r"(block));
  return block[-1];
#endif
}
HEAPPROF_ALWAYS_INLINE std::size_t GlibcChunkUsable(const void* p) noexcept {
  const std::size_t head = GlibcChunkWord(p);
  // A branch, not arithmetic on bit 1: only blocks of 128 KiB and more are
  // mmapped, so it is predicted, and the common case is two ALU ops.
  if (HEAPPROF_LIKELY((head & 2) == 0)) return (head & ~std::size_t{7}) - 8;
  return (head & ~std::size_t{7}) - 16;
}

// The usable size of a live block from malloc (or the allocator behind it).
HEAPPROF_ALWAYS_INLINE std::size_t BlockSize(void* p) noexcept {
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  if (HEAPPROF_LIKELY(LoadRelaxed(g_glibc_chunks))) return GlibcChunkUsable(p);
#endif
  return g_underlying_usable_size(p);
}

// Allocators with size classes (jemalloc, tcmalloc) promise that a block
// malloc(n) returns has the usable size nallocx(n): their malloc_usable_size,
// a call that looks the pointer up (40 instructions on jemalloc, twice per
// pair), is then not needed where `n` is known: at malloc/new and at a sized
// delete. DetectBlockSize fills this table from nallocx, checked against
// malloc_usable_size for every n, and sets g_class_table; else it stays off.
constexpr std::size_t kClassTableMax = 1024;
inline bool g_class_table = false;
inline std::uint16_t g_class_of[kClassTableMax + 1];

// jemalloc's sdallocx(p, size, flags): a free told the block's size, which
// skips free's look-up of the pointer in its radix tree. Found with the class
// table, in the underlying malloc's own object (gperftools has none; its
// tc_free_sized was slower than its free). The class table's sized deletes
// call it (HotFreeSized): their `n` names the block's class, except in a
// block padded for a sample, which the free filter sends to the cold path
// (every padded block a new returns is in the live map: ReplacePadded).
using SizedFreeFn = void (*)(void*, std::size_t, int) noexcept;  // noexcept: a tail call from the hooks
inline SizedFreeFn g_sized_free = nullptr;

// The usable size of a block that malloc(n) (or new, calloc) just returned.
HEAPPROF_ALWAYS_INLINE std::size_t RequestedBlockSize(void* p, std::size_t n) noexcept {
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  if (HEAPPROF_LIKELY(LoadRelaxed(g_glibc_chunks))) return GlibcChunkUsable(p);
#endif
  if (__atomic_load_n(&g_class_table, __ATOMIC_ACQUIRE) && n <= kClassTableMax) return LoadRelaxed(g_class_of[n]);
  return g_underlying_usable_size(p);
}

// The malloc the hooks call: the real one when the malloc family is
// replaced, else the process's.
inline void* (*UnderlyingMalloc() noexcept)(std::size_t) {
  return g_underlying_malloc != nullptr ? g_underlying_malloc : &std::malloc;
}

// The address of the malloc the hooks call (for dladdr: which object owns it).
inline void* UnderlyingMallocAddress() noexcept {
  return g_underlying_malloc != nullptr ? reinterpret_cast<void*>(g_underlying_malloc) : FindSymbol(RTLD_DEFAULT, "malloc");
}

// sdallocx, if the object of the malloc the hooks call defines it.
inline SizedFreeFn FindSizedFree() noexcept {
  void* sized = FindSymbol(RTLD_DEFAULT, "sdallocx");
  void* malloc_fn = sized != nullptr ? UnderlyingMallocAddress() : nullptr;
  const void* const base = malloc_fn != nullptr ? ObjectBaseOf(sized) : nullptr;
  if (base == nullptr || base != ObjectBaseOf(malloc_fn)) return nullptr;
  return reinterpret_cast<SizedFreeFn>(sized);
}

// Fills g_class_of when the allocator has nallocx and its every answer up to
// kClassTableMax is the usable size of a real block of that request. Not
// under a sanitizer (its malloc_usable_size is the request, and it has no
// nallocx anyway).
using NallocxFn = std::size_t (*)(std::size_t, int);
inline NallocxFn g_nallocx = nullptr;  // looked up once (a failed dlsym allocates its message)
// Set when the check failed for good: the allocator answered a live block's
// size, and that answer is not nallocx's. Only an answer of 0 (gperftools
// before its start-up, below) is worth checking again: gperftools' debug
// allocator (libtcmalloc_debug, libtcmalloc_minimal_debug) answers the
// request and its nallocx the size class, forever.
inline bool g_class_table_refused = false;

inline void DetectClassTable(bool look_up) noexcept {
#if !defined(HEAPPROF_ASAN) && !defined(HEAPPROF_TSAN)
  if (look_up) g_nallocx = reinterpret_cast<NallocxFn>(FindSymbol(RTLD_DEFAULT, "nallocx"));
  const NallocxFn nallocx = g_nallocx;
  if (nallocx == nullptr) return;
  SuppressHooks quiet;
  // Before the table's flag (a release store); a failed dlsym allocates its message.
  if (look_up) StoreRelaxed(g_sized_free, FindSizedFree());
  void* (*alloc)(std::size_t) = UnderlyingMalloc();
  for (std::size_t n = 0; n <= kClassTableMax; ++n) {
    void* p = alloc(n);
    if (p == nullptr) return;
    const std::size_t usable = g_underlying_usable_size(p);
    g_release_block(p);
    if (usable > 0xFFFF || usable < n || (n > 0 && nallocx(n, 0) != usable)) {
      if (usable != 0) StoreRelaxed(g_class_table_refused, true);
      return;
    }
    StoreRelaxed(g_class_of[n], static_cast<std::uint16_t>(usable));
  }
  __atomic_store_n(&g_class_table, true, __ATOMIC_RELEASE);  // the table before the flag
#else
  (void)look_up;
#endif
}

// The executable code of the object that defines the malloc under the hooks,
// [lo, hi) (AllocatorCode). An allocation hook whose caller is in it runs
// inside the allocator, which may hold its own locks there: gperftools' debug
// allocator allocates its free queue with operator new while holding the
// lock its free takes. The class table's check (engine.hpp: RetryClassTable)
// calls malloc and free, so it must not run in such a hook: it waited on that
// lock forever (the first free of a program under libtcmalloc_minimal_debug
// hung whenever that allocation was sampled).
inline std::uintptr_t g_allocator_code_lo = 0;
inline std::uintptr_t g_allocator_code_hi = 0;

// Finds that code from the object's program headers, once, at start-up (no
// loader lock later, when a hook asks: InAllocatorCode).
inline void FindAllocatorCode(void* malloc_fn) noexcept {
  const void* base = nullptr;
  link_map* map = nullptr;
  if (malloc_fn == nullptr || !ObjectMapOf(malloc_fn, base, map)) return;  // (not dladdr: 0_base/object_base.hpp)
  const auto* header = static_cast<const ElfW(Ehdr)*>(base);
  if (std::memcmp(header->e_ident, ELFMAG, SELFMAG) != 0) return;
  const auto* phdr = reinterpret_cast<const ElfW(Phdr)*>(static_cast<const char*>(base) + header->e_phoff);
  const auto at = reinterpret_cast<std::uintptr_t>(malloc_fn);
  for (unsigned i = 0; i < header->e_phnum; ++i) {
    if (phdr[i].p_type != PT_LOAD || (phdr[i].p_flags & PF_X) == 0) continue;
    const std::uintptr_t lo = map->l_addr + phdr[i].p_vaddr;
    const std::uintptr_t hi = lo + phdr[i].p_memsz;
    if (at >= lo && at < hi) {
      g_allocator_code_lo = lo;
      g_allocator_code_hi = hi;
      return;
    }
  }
}

// True when `pc` (a hook's return address) is the allocator's own code.
inline bool InAllocatorCode(const void* pc) noexcept {
  const auto at = reinterpret_cast<std::uintptr_t>(pc);
  return at >= g_allocator_code_lo && at < g_allocator_code_hi;
}

// gperftools' debug allocator (libtcmalloc_debug, libtcmalloc_minimal_debug,
// up to 2.16 at least) aborts in malloc_usable_size ("Check failed:
// GetOwnership(p) != MallocExtension::kNotOwned") for a block its memalign
// placed in a large span past the span's first page: posix_memalign(&p, 8192,
// 960800), say (only a span's first and last pages are in its page map; its
// debugallocation.cc says so). A program that never asks is fine, but the
// hooks ask at every free: under heapprof such a program died. So under that
// allocator the hooks ask its MallocExtension_GetOwnership first; a block it
// disowns is counted 0 bytes, when allocated and when freed alike (the answer
// cannot change while the block lives), and is never sampled (the sample moves
// to the thread's next allocation, as for any block below sampled_min).
//
// Its start-up, too: it answers through the MallocExtension it registers
// from its own initializer (TCMallocGuard registers none in the debug build,
// so FinishAllocatorStartup below does not help), which under LD_PRELOAD runs
// after every other library's constructor. Until then malloc_usable_size
// answers 0 and GetOwnership kUnknownOwnership, and blocks allocated then were
// counted 0 bytes but their full size when freed (Stats: live_bytes off by
// their sum; 18 more allocations, padded samples replaced because their size
// read 0). Then the size is read where the allocator itself reads it
// (DebugBlockSize): the answer it gives once started.
using OwnershipFn = int (*)(const void*);
constexpr int kGperftoolsUnknownOwnership = 0;  // MallocExtension::Ownership
constexpr int kGperftoolsNotOwned = 2;
inline OwnershipFn g_debug_allocator_ownership = nullptr;
inline std::size_t (*g_debug_allocator_usable_size)(void*) = nullptr;

// gperftools' debugallocation.cc (MallocBlock): four words before the data:
// the requested size, the distance back to the real header (0 but in
// memalign's extra header before an aligned pointer), a magic word, the
// allocation's kind. Its GetAllocatedSize answers the real header's size.
struct DebugBlockHeader {
  std::size_t size;
  std::size_t offset;
  std::size_t magic;  // an int constant stored sign-extended: compared in 32 bits
  std::size_t kind;
};
constexpr std::uint32_t kDebugMagicMalloc = 0xDEADBEEF;
constexpr std::uint32_t kDebugMagicMmap = 0xABCDEFAB;

inline std::size_t DebugBlockSize(const void* p) noexcept {
  const char* at = static_cast<const char*>(p) - sizeof(DebugBlockHeader);
  DebugBlockHeader h;
  std::memcpy(&h, at, sizeof h);
  if (h.offset != 0) {
    if (h.offset > reinterpret_cast<std::uintptr_t>(at)) return 0;
    std::memcpy(&h, at - h.offset, sizeof h);
    if (h.offset != 0) return 0;
  }
  const auto magic = static_cast<std::uint32_t>(h.magic);
  return magic == kDebugMagicMalloc || magic == kDebugMagicMmap ? h.size : 0;
}

inline std::size_t DebugAllocatorUsableSize(void* p) noexcept {
  const int owner = g_debug_allocator_ownership(p);
  if (owner == kGperftoolsNotOwned) return 0;
  const std::size_t size = g_debug_allocator_usable_size(p);
  if (size != 0 || owner != kGperftoolsUnknownOwnership) return size;
  return DebugBlockSize(p);  // its extension is not registered yet
}

// Installs DebugAllocatorUsableSize when the object of `malloc_fn` is
// gperftools' debug allocator: a library named so (libtcmalloc_debug.so.4,
// libtcmalloc_minimal_debug.so.4) that defines __malloctrace_write (only
// debugallocation.cc does). The name first: a failed dlsym allocates its
// message, and a program with heapprof compiled in that also preloads
// libheapprof_preload.so and jemalloc then hung at start-up (that allocation
// reaches the program's hooks, which ask the library's engine, which was
// still starting on this very thread).
inline void UseDebugAllocatorUsableSize(void* malloc_fn) noexcept {
  const void* base = nullptr;
  link_map* map = nullptr;
  if (malloc_fn == nullptr || !ObjectMapOf(malloc_fn, base, map) || std::strstr(map->l_name, "tcmalloc") == nullptr ||
      std::strstr(map->l_name, "debug") == nullptr) {
    return;
  }
  SuppressHooks quiet;
  void* trace = FindSymbol(RTLD_DEFAULT, "_Z19__malloctrace_writePKcm");
  void* ownership = trace != nullptr ? FindSymbol(RTLD_DEFAULT, "MallocExtension_GetOwnership") : nullptr;
  if (ownership == nullptr || ObjectBaseOf(trace) != base || ObjectBaseOf(ownership) != base ||
      g_underlying_usable_size == &DebugAllocatorUsableSize) {
    return;
  }
  g_debug_allocator_ownership = reinterpret_cast<OwnershipFn>(ownership);
  g_debug_allocator_usable_size = g_underlying_usable_size;
  g_underlying_usable_size = &DebugAllocatorUsableSize;
}

// gperftools (every release up to 2.16): until its start-up object (the
// static TCMallocGuard in tcmalloc.cc) is constructed, malloc_usable_size
// answers 0 for every block (it asks a default MallocExtension), while
// malloc, free and nallocx already work. tcmalloc's own initializer
// constructs it, and that runs after the constructors of every library
// initialized ahead of it: under LD_PRELOAD, all of them. Their blocks were
// counted 0 bytes when allocated and their real size when freed (Stats:
// alloc_bytes 0, free_bytes 11,200 for 100 blocks of 100 bytes), and the
// class table's check failed. So when the allocator answers 0 for a live
// block and its object defines that constructor, the start-up runs now. The
// constructor is reference counted (tcmalloc's own static runs it again as
// a no-op); its destructor, which prints MALLOCSTATS when the count returns
// to 0, runs at exit for ours. Under SuppressHooks: it allocates.
using GuardFn = void (*)(void*);
alignas(16) inline unsigned char g_tcmalloc_guard[16];  // the guard has no members
inline GuardFn g_tcmalloc_guard_end = nullptr;

inline void EndAllocatorStartup() noexcept {
  if (GuardFn end = g_tcmalloc_guard_end) end(g_tcmalloc_guard);
}

// True when the allocator behind `malloc_fn` (which answered 0 for a live
// block) was gperftools and its start-up ran.
inline bool FinishAllocatorStartup(void* malloc_fn) noexcept {
  void* begin = FindSymbol(RTLD_DEFAULT, "_ZN13TCMallocGuardC1Ev");
  const void* base = begin != nullptr ? ObjectBaseOf(malloc_fn) : nullptr;
  if (base == nullptr || ObjectBaseOf(begin) != base) {
    return false;  // another allocator's (or none): counted as before
  }
  reinterpret_cast<GuardFn>(begin)(g_tcmalloc_guard);
  if (void* end = FindSymbol(RTLD_DEFAULT, "_ZN13TCMallocGuardD1Ev")) {
    g_tcmalloc_guard_end = reinterpret_cast<GuardFn>(end);
    std::atexit(&EndAllocatorStartup);  // after tcmalloc's own (registered later): the last one prints
  }
  return true;
}

// The malloc under the hooks is not glibc's (or its blocks disagree with the
// chunk formula): where its code lies, its debug build's size look-up, its
// class table.
inline void UseOtherAllocator(void* malloc_fn) noexcept {
  FindAllocatorCode(malloc_fn);
  UseDebugAllocatorUsableSize(malloc_fn);
  DetectClassTable(true);
}

// Decides g_glibc_chunks (or g_class_table), once, at start-up (engine.hpp: EnsureInit). The inline formula is used only when that
// malloc is glibc's own (not an allocator preloaded or linked in, not
// libc_malloc_debug) and agrees with malloc_usable_size on blocks of every kind.
inline void DetectBlockSize() noexcept {
  if (&heapprof_detail_resolve_malloc != nullptr) heapprof_detail_resolve_malloc();
  {
    // gperftools' malloc_usable_size allocates with operator new on its first
    // call (MallocExtension::instance()), which would come back here through
    // the hooks and BlockSize forever: make that first call now, unseen.
    // An answer of 0 for a live block: gperftools before its start-up (above).
    SuppressHooks quiet;
    void* (*alloc)(std::size_t) = UnderlyingMalloc();
    if (void* p = alloc(1)) {
      if (g_underlying_usable_size(p) == 0) {
        if (void* used = UnderlyingMallocAddress()) (void)FinishAllocatorStartup(used);
      }
      g_release_block(p);
    }
  }
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  void* glibc = FindSymbol(RTLD_DEFAULT, "__libc_malloc");
  void* used = UnderlyingMallocAddress();
  // gperftools defines __libc_malloc too: the function must also live in libc
  // (reading a word before another allocator's block could fault).
  const char* file = glibc != nullptr && glibc == used ? ObjectFileOf(used) : nullptr;
  if (file == nullptr || std::strstr(file, "/libc.so") == nullptr) {
    UseOtherAllocator(used);  // another allocator
    return;
  }
  void* (*alloc)(std::size_t) = UnderlyingMalloc();
  void (*release)(void*) = g_release_block;
  // Small blocks (tcache's and one past it), and an mmapped one. The heap
  // block stays under what a fresh heap has free at its top: one of 70,000
  // bytes grew the heap by 72 KiB, which glibc kept (it trims only past
  // 128 KiB free), so every program started with a larger heap than without
  // heapprof (mallinfo2's arena 208,896 bytes, not 135,168). glibc raises its mmap
  // threshold for good to the size of any mmapped block freed, up to 32 MiB
  // (DEFAULT_MMAP_THRESHOLD_MAX on 64 bits; mallopt takes no more): a 1 MiB
  // block here made every program keep blocks of 128 KiB to 1 MiB in its heap
  // and trim it at 2 MiB. One of 64 MiB leaves the threshold alone and costs
  // the same (mmap, the header's page, munmap). Where the address space has
  // no room for it, that one check is skipped (EnsureInit keeps errno).
  static constexpr std::size_t kMmapped = std::size_t{64} << 20;
  static constexpr std::size_t kSizes[] = {1, 24, 1000, 4000, kMmapped};
  bool agree = true;
  for (std::size_t n : kSizes) {
    void* p = alloc(n);
    if (p == nullptr) {
      if (n != kMmapped) agree = false;
      break;
    }
    agree = agree && GlibcChunkUsable(p) == g_underlying_usable_size(p) && g_underlying_usable_size(p) >= n;
    release(p);
  }
  if (agree) {
    StoreRelaxed(g_glibc_chunks, true);
  } else {
    UseOtherAllocator(used);
  }
#else
  UseOtherAllocator(UnderlyingMallocAddress());
#endif
}

// ------------------------------------------------ the free that reads nothing
// An unsampled free must not touch the profiler's shared memory (issue 15):
// the free filter (fast_path.hpp) is 128 KiB read at a random line per free.
// The global hooks read the block's usable size anyway (for Stats), so that is
// the tag: every block they sample is at least SampledMinBlock bytes, and a
// free of a smaller block is known unsampled from the size alone. A small
// allocation the countdown is about to sample asks the allocator for
// SampledMinBlock bytes instead (SampledRequest, before the allocation: the
// countdown knows `n`), so the object's address, alignment, realloc and
// malloc_usable_size stay the allocator's own. Frees of blocks at least that
// big read the filter as before.
//
// Cost: one sampled small object holds 1 KiB; at the default 512 KiB rate
// that is at most 0.2% more heap (1/512 of the small-object bytes), at the
// 64 KiB floor 1.6%. Below 64 KiB (rate 1 records everything) blocks are not
// padded and every free reads the filter.
constexpr std::uint64_t kSampledMinBlock = 1024;
constexpr std::uint64_t kPaddedSamplingMinRate = 64 * 1024;

// The process's value; lowered to 0 (never raised again) when the rate first
// drops below kPaddedSamplingMinRate (engine.hpp: ApplyRate). Every slot's
// copy is lowered before this, under the registry lock, and a sample checks
// this one (acquire) before it keeps a small block: whoever frees the block
// later sees its own copy lowered.
inline std::atomic<std::uint64_t> g_sampled_min{HEAPPROF_DEFAULT_SAMPLE_RATE >= kPaddedSamplingMinRate ? kSampledMinBlock
                                                                                                       : 0};

// Whether the slow path (engine.hpp: AllocSlowPath) will sample an
// allocation that runs the thread's countdown out: not with sampling off
// (the countdown is then the 64 MiB recheck), not when the countdown is 0
// because the rate changed (ApplyRate pokes every thread: the slow path
// draws a fresh countdown instead), not inside the profiler. A block padded
// for a sample that is not taken broke Stats under jemalloc and tcmalloc:
// counted at its padded size when allocated, at its request's class by a
// sized delete (HotFreeSized), which cannot tell it from an unpadded one.
HEAPPROF_NOINLINE inline bool SampleDue(const ThreadState& ts) noexcept {
  const std::uint64_t state = g_rate_state.load(std::memory_order_acquire);
  const ThreadFlags& flags = tls_thread_flags;
  return RateOf(state) != 0 && ts.rate_epoch == EpochOf(state) && flags.guard == 0;
}

// What a global hook asks the allocator for, for a request of `n` bytes: `n`,
// unless the countdown is about to run out for a sample (then the sample's
// block must be at least sampled_min). Read twice (here and in OnAllocBlock),
// on the line the fast path reads anyway. If the two disagree (a signal
// handler allocated in between, or the thread had no slot yet) the sample
// moves to the thread's next allocation (engine.hpp).
HEAPPROF_ALWAYS_INLINE std::size_t SampledRequest(std::size_t n) noexcept {
  const ThreadState* ts = tls_thread_state;
  if (HEAPPROF_LIKELY(LoadRelaxed(ts->countdown) > static_cast<std::int64_t>(n))) return n;
  const std::size_t min = LoadRelaxed(ts->sampled_min);
  return n < min && SampleDue(*ts) ? min : n;
}
// The same for an aligned allocation (aligned_alloc wants a multiple of the
// alignment, a power of two).
HEAPPROF_ALWAYS_INLINE std::size_t SampledRequest(std::size_t n, std::size_t align) noexcept {
  const std::size_t m = SampledRequest(n);
  if (m == n || align == 0 || (align & (align - 1)) != 0) return m;  // a bad alignment fails as it would
  return (m + align - 1) & ~(align - 1);
}

// The global hooks' fast paths: OnAlloc and OnFree of fast_path.hpp, counting
// the block's usable size in Stats. `n` (the requested size) drives the sampler.
// `exact`: the allocator was asked for exactly `n` bytes by malloc, calloc or
// new (not realloc, not an aligned allocation): RequestedBlockSize applies.
//
// Its slow branch makes the function it is inlined into (a hook's cold
// function, or a rare hook: posix_memalign, aligned_alloc, ...) keep a frame
// pointer, whatever the implementation unit's flags: the frame-pointer
// unwinder starts at OnAllocSlow's record and follows the saved rbp through
// that function to the hook's caller. Built with -fomit-frame-pointer (-O2's
// default) these functions reused rbp as a general register and the walk
// found garbage there. Taking the frame's address is what keeps one (GCC and
// clang alike); the cold functions run once a sample, the rare hooks pay a
// push and a pop.
// `padded`: the hook asked for sampled_min bytes for a sample (SampledRequest);
// the slow path then samples the block even when the countdown no longer
// runs out here (a signal handler's allocation in between took the sample:
// under the class table a sized delete finds a padded block only in the
// live map). False: a padded block the live map had no memory for, which
// must not reach the caller (new_delete.hpp: ReplacePadded); always true
// when not `padded`.
HEAPPROF_ALWAYS_INLINE bool OnAllocBlock(void* p, std::size_t n, const void* hook_return, bool exact = false,
                                         bool padded = false) noexcept {
  ThreadState* ts = tls_thread_state;
  const std::int64_t left = LoadRelaxed(ts->countdown) - static_cast<std::int64_t>(n);
  if (HEAPPROF_UNLIKELY((left <= 0) | padded)) {
    asm volatile("" : : "r"(__builtin_frame_address(0)));
    return OnAllocSlow(p, n, hook_return, padded ? kCountBlock | kPaddedBlock : kCountBlock);
  }
  StoreRelaxed(ts->countdown, left);
  BumpCounter(ts->alloc_objects, 1);
  BumpCounter(ts->alloc_bytes, exact ? RequestedBlockSize(p, n) : BlockSize(p));
  return true;
}

// Whether the free of `p`, whose usable size is `size`, may be a sampled
// object's (or the thread has no slot yet): then only the slow path counts it.
// A block below the thread's sampled_min is known unsampled without the filter.
HEAPPROF_ALWAYS_INLINE bool FreeMayBeSampled(const void* p, std::size_t size, const ThreadState* ts) noexcept {
  return HEAPPROF_UNLIKELY(size >= LoadRelaxed(ts->sampled_min)) && (MaybeSampled(p) | (ts == &g_empty_thread_state));
}
// Before `p` goes back to the allocator, sized or not: the same cost either
// way. True: the profiler keeps the block and releases it later (see
// OnFreeSlow); only when `can_defer`.
HEAPPROF_ALWAYS_INLINE bool OnFreeBlock(void* p, bool can_defer = true) noexcept {
  ThreadState* ts = tls_thread_state;
  const std::size_t size = BlockSize(p);
  if (FreeMayBeSampled(p, size, ts)) return OnFreeSlow(p, 0, can_defer ? kFreeCanDefer : 0u);
  BumpCounter(ts->free_objects, 1);
  BumpCounter(ts->free_bytes, size);
  return false;
}

// ------------------------------------------------ the hooks' hot paths
// The common allocation and free of the global hooks, written so that the
// hook function keeps nothing but `n` across the allocator call and has no
// other call (issue 15: the old hooks spent ~30 instructions each on saved
// registers and a frame that only their rare paths needed). Everything rare
// (a sample, the thread's first allocation, a failed allocation, a block
// size that needs the allocator's malloc_usable_size, a free that may be a
// sampled object's) is a call, in tail position, to the hook's cold function,
// which is the complete old hook: `cold(n, ret)` for an allocation (`ret`: the
// hook's return address, the sample's leaf), `cold(p)` for a free. An
// allocation hook reads: `const volatile std::size_t keep = n; if (void* p =
// HotAlloc(n, keep, alloc)) return p; return cold(keep, ret);`. Both
// HotAlloc (after the call) and the cold function read the volatile copy: `n`
// waits in the frame the hook builds anyway (one store), not in a
// callee-saved register pushed, copied and restored on every call (GCC: 3
// instructions; clang kept the register while any path used `n` after the
// call). A signal handler's allocation in between has a frame of its own.
//
// When the compiler does make that call a tail call (GCC and clang at -O1 and
// above), the cold function's frame is the hook's, as the unwinders expect;
// when it does not (-O0), the unwinders skip the extra frame (both look for
// the leaf one frame further).
//
// glibc (g_glibc_chunks): the block's size is read from its chunk header
// after the allocation; malloc(0) is a unique minimum chunk there, so
// operator new(0) needs no special case. jemalloc, tcmalloc (g_class_table):
// the size is the class of `n`, 1 <= n <= kClassTableMax. Otherwise: cold.

// The block, or nullptr when the hook must run its cold function (which then
// gets the hook's return address: read only on that branch).
// `kExact`: the allocator is asked for exactly `n` bytes (malloc, new), so the
// class table applies; false for aligned allocations (glibc's chunk word only).
template <bool kExact = true, class Alloc>
HEAPPROF_ALWAYS_INLINE void* HotAlloc(std::size_t n, const volatile std::size_t& kept, Alloc alloc) noexcept {
  ThreadState* ts = tls_thread_state;
  // Compared unsigned (a countdown is never negative): a request above
  // INT64_MAX (one that will fail) goes cold instead of raising the countdown.
  const std::uint64_t countdown = static_cast<std::uint64_t>(LoadRelaxed(ts->countdown));
  if (HEAPPROF_UNLIKELY(n >= countdown)) return nullptr;
  const std::int64_t left = static_cast<std::int64_t>(countdown - n);
  // The countdown is stored before the call: nothing of it stays live across
  // it. A signal handler's allocation in between sees it already spent. (A
  // failed allocation keeps it spent: the cold function tries again and
  // counts a success once more; only the sampling process notices.) The
  // thread state is read again after the call: cheaper than keeping it. Two
  // copies of the call, one per way of sizing the block, so that the flag
  // is not read (or kept) again after it.
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  if (HEAPPROF_LIKELY(LoadRelaxed(g_glibc_chunks))) {
    StoreRelaxed(ts->countdown, left);
    void* p = alloc(n);
    if (HEAPPROF_UNLIKELY(p == nullptr)) return nullptr;
    ts = tls_thread_state;
    BumpCounter(ts->alloc_objects, 1);
    BumpCounter(ts->alloc_bytes, GlibcChunkUsable(p));
    return p;
  }
#endif
  if (!kExact || !__atomic_load_n(&g_class_table, __ATOMIC_ACQUIRE) || n - 1 >= kClassTableMax) return nullptr;
  StoreRelaxed(ts->countdown, left);
  void* p = alloc(n);
  if (HEAPPROF_UNLIKELY(p == nullptr)) return nullptr;
  ts = tls_thread_state;
  BumpCounter(ts->alloc_objects, 1);
  BumpCounter(ts->alloc_bytes, LoadRelaxed(g_class_of[kept]));  // kept: `n` is not live across the call
  return p;
}

// A free (any form) of a block the hooks allocated, p != nullptr.
// On glibc: the chunk's size word, less 8, is below sampled_min exactly when
// the block's usable size is (an mmapped chunk is at least a page, above any
// sampled_min), and is then its usable size once the flag bits are masked.
// A thread without a slot has sampled_min 0: cold.
static_assert(kSampledMinBlock + 8 <= 4096, "HotFree: an mmapped chunk must never pass the size test");

template <class Release, class Cold>
HEAPPROF_ALWAYS_INLINE void HotFreeGlibc(void* p, Release release, Cold cold) noexcept {
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  {
    const std::size_t head8 = GlibcChunkWord(p) - 8;
    ThreadState* ts = tls_thread_state;
    if (HEAPPROF_LIKELY(head8 < LoadRelaxed(ts->sampled_min))) {
      BumpCounter(ts->free_objects, 1);
      BumpCounter(ts->free_bytes, head8 & ~std::size_t{7});
      return release(p);
    }
  }
#else
  (void)release;  // (only the chunk-word path releases here)
#endif
  return cold(p);
}
// Any other allocator (jemalloc, tcmalloc, a sanitizer's): its
// malloc_usable_size gives the size, as in OnFreeBlock, but inline in the
// hook, with the free itself a tail call. The call costs what it costs (~40
// instructions on jemalloc, ~36 on tcmalloc; their sallocx and
// tc_malloc_size are the same lookup); the cold function added ~25 more
// around it (issue 15). `bootstrap(p)`: the block is the hooks' own start-up
// memory, which the allocator must not be asked about (the cold function
// drops such a free).
template <class Release, class Boot, class Cold>
HEAPPROF_ALWAYS_INLINE void HotFreeAsked(void* p, Release release, Boot bootstrap, Cold cold) noexcept {
  if (HEAPPROF_LIKELY(!bootstrap(p))) {
    const std::size_t size = g_underlying_usable_size(p);
    ThreadState* ts = tls_thread_state;
    if (!FreeMayBeSampled(p, size, ts)) {
      BumpCounter(ts->free_objects, 1);
      BumpCounter(ts->free_bytes, size);
      return release(p);
    }
  }
  return cold(p);
}
template <class Release, class Boot, class Cold>
HEAPPROF_ALWAYS_INLINE void HotFree(void* p, Release release, Boot bootstrap, Cold cold) noexcept {
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  if (HEAPPROF_LIKELY(LoadRelaxed(g_glibc_chunks))) return HotFreeGlibc(p, release, cold);
#endif
  return HotFreeAsked(p, release, bootstrap, cold);
}

// A sized delete of a plain new's block, p != nullptr: with the class table,
// `n` gives the size and the free filter finds a sampled (padded) block,
// whose cold path reads its real size; `release_sized(p, n)` releases the
// others. Without the table, or for n outside it (new(0) asked for 1), the
// allocator is asked (HotFreeAsked).
template <class Release, class ReleaseSized, class Boot, class Cold>
HEAPPROF_ALWAYS_INLINE void HotFreeSized(void* p, std::size_t n, Release release, ReleaseSized release_sized,
                                         Boot bootstrap, Cold cold) noexcept {
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  if (HEAPPROF_LIKELY(LoadRelaxed(g_glibc_chunks))) return HotFreeGlibc(p, release, cold);
#endif
  if (__atomic_load_n(&g_class_table, __ATOMIC_ACQUIRE) && n - 1 < kClassTableMax) {
    ThreadState* ts = tls_thread_state;
    if (HEAPPROF_LIKELY(!(MaybeSampled(p) | (ts == &g_empty_thread_state)))) {
      BumpCounter(ts->free_objects, 1);
      BumpCounter(ts->free_bytes, LoadRelaxed(g_class_of[n]));
      return release_sized(p, n);
    }
    return cold(p);
  }
  return HotFreeAsked(p, release, bootstrap, cold);
}

// An allocation of the global hooks failed (malloc's null, operator new
// before its new_handler loop): HEAPPROF=oom_dump=1 sets this (dumps.hpp) to
// write one profile. Called on the failure path only; keeps errno. True when
// the hook gave memory back (oom_dump's reserve): the allocation is tried
// once more, as without heapprof that memory would have been there for it.
// (operator new's new_handler loop always tries again; the malloc family
// returned null with the reserve's room unused: a C program's first failure
// came as much earlier as the reserve.)
inline std::atomic<bool (*)(std::size_t)> g_alloc_failure_hook{nullptr};

HEAPPROF_NOINLINE inline bool OnAllocFailure(std::size_t n) noexcept {
  if (bool (*hook)(std::size_t) = g_alloc_failure_hook.load(std::memory_order_acquire)) {
    const int saved = errno;
    const bool released = hook(n);
    errno = saved;
    return released;
  }
  return false;
}

}  // namespace detail
}  // namespace heapprof

#endif  // HEAPPROF_ENABLED
