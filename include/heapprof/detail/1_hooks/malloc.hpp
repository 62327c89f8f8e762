// heapprof: the replacement malloc family. Included by <heapprof.hpp> only
// when HEAPPROF_REPLACE_MALLOC is defined, in the one implementation unit (or
// in libheapprof_preload.so). Every library of the process then allocates
// through these: libc's own strdup, getline, opendir; zlib; OpenSSL.
//
//   malloc free calloc realloc reallocarray posix_memalign aligned_alloc
//   memalign valloc pvalloc malloc_usable_size free_sized free_aligned_sized
//
// Each one calls the same function of the allocator under us and then the
// inline fast path (block_hooks.hpp), so errno, calloc's overflow check,
// malloc(0), realloc(p, 0) and the alignment rules are exactly that
// allocator's. The allocator under us is the next definition after ours in
// the lookup order, FindSymbol(RTLD_NEXT): glibc's, or jemalloc's, tcmalloc's,
// mimalloc's when one is preloaded after heapprof (or linked into the
// program, which heapprof's executable precedes). dlsym itself allocates, so
// while the resolving thread is inside it our malloc serves a small static
// bootstrap buffer whose blocks are never released.
//
// In the profile a realloc is the free of the old block and the allocation of
// the new one; an operator new of ours calls the real malloc directly, so it
// counts once (new_delete.hpp).
//
// Under AddressSanitizer or ThreadSanitizer, which own malloc, nothing here is
// defined: HEAPPROF_REPLACE_MALLOC is a no-op (a note at compile time with
// GCC; HEAPPROF_MALLOC_HOOKS is 0), and operator new/delete are still profiled.
#pragma once

#include "heapprof/config.hpp"

#if HEAPPROF_ENABLED && !HEAPPROF_MALLOC_HOOKS
#if defined(__GNUC__) && !defined(__clang__)
#pragma message("heapprof: HEAPPROF_REPLACE_MALLOC is ignored under AddressSanitizer/ThreadSanitizer (they own malloc); operator new/delete are still profiled")
#endif
#endif

#if HEAPPROF_MALLOC_HOOKS

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/0_base/object_base.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/1_hooks/block_hooks.hpp"
#include "heapprof/detail/1_hooks/fast_path.hpp"
#include "heapprof/detail/1_hooks/hook_check.hpp"

namespace heapprof {
namespace detail {
namespace real {

// ---------------------------------------------------------------- bootstrap
// Blocks handed out while dlsym runs on the resolving thread. Each has a
// 16-byte header: its size, then a word of all ones where a glibc chunk has
// its size (so the hot free, block_hooks.hpp: HotFree, takes a bootstrap
// block for a big one and leaves it to FreeCold). None is ever reused or
// released.
constexpr std::size_t kBootstrapBytes = std::size_t{64} << 10;
alignas(4096) inline unsigned char g_bootstrap[kBootstrapBytes];
inline std::size_t g_bootstrap_used = 0;  // under the resolving thread only

HEAPPROF_ALWAYS_INLINE bool IsBootstrap(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(g_bootstrap) < kBootstrapBytes;
}

inline void* BootstrapAlloc(std::size_t n, std::size_t align) noexcept {
  if (align < 16) align = 16;
  if (n > kBootstrapBytes || align > 4096) {
    errno = ENOMEM;
    return nullptr;
  }
  std::size_t at = (g_bootstrap_used + 16 + align - 1) & ~(align - 1);
  if (at + n > kBootstrapBytes) {
    errno = ENOMEM;
    return nullptr;
  }
  g_bootstrap_used = at + n;
  reinterpret_cast<std::size_t*>(g_bootstrap + at)[-2] = n;  // zeroed memory otherwise: calloc is free
  reinterpret_cast<std::size_t*>(g_bootstrap + at)[-1] = ~std::size_t{0};
  return g_bootstrap + at;
}

inline std::size_t BootstrapSize(const void* p) noexcept { return static_cast<const std::size_t*>(p)[-2]; }

// ---------------------------------------------------------------- the profiler's own threads
// glibc gives a thread its own arena at its first malloc (up to 8 per core):
// a 64 MiB reservation (HEAP_MAX_SIZE), one more "Arena" in malloc_stats()
// and malloc_info(), and one of the arenas the program's threads are spread
// over. The profiler's threads malloc only inside libc and libstdc++
// (__cxa_demangle, per name a profile write demangles), so the dump thread
// and the HTTP server's builder each made one, for the rest of the process.
// On those threads (tls_profiler_thread), with glibc's allocator under us,
// the malloc family serves its blocks from the profiler's arena instead.
// Each has the bootstrap blocks' 16-byte header (its size, then a word of all
// ones where a glibc chunk has its size, which no glibc chunk has): the hot
// free and realloc take it for a big block and leave it to the cold
// functions, which know it by that word.
HEAPPROF_ALWAYS_INLINE bool OwnBlocks() noexcept {
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  return tls_profiler_thread && LoadRelaxed(g_glibc_chunks);
#else
  return false;
#endif
}
// Any thread may free one (another copy of the hooks in the process reads the
// same word): only under glibc's allocator, whose blocks all have a header.
inline bool IsOwnBlock(const void* p) noexcept {
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  return LoadRelaxed(g_glibc_chunks) && GlibcChunkWord(p) == ~std::size_t{0} && !IsBootstrap(p);
#else
  (void)p;
  return false;
#endif
}
inline void* OwnAlloc(std::size_t n, bool zeroed) noexcept {
  if (n > (std::size_t{1} << 40)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* b = static_cast<std::size_t*>(zeroed ? g_arena.Allocate(n + 16) : g_arena.AllocateUninitialized(n + 16));
  if (b == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  b[0] = n;
  b[1] = ~std::size_t{0};
  return b + 2;
}
inline std::size_t OwnSize(const void* p) noexcept { return BootstrapSize(p); }  // (the same header)
inline void OwnFree(void* p) noexcept {
  const std::size_t n = OwnSize(p);
  g_arena.Free(static_cast<std::size_t*>(p) - 2, n + 16);
}

// ---------------------------------------------------------------- the allocator under us
struct Functions {
  void* (*malloc)(std::size_t) noexcept;
  void (*free)(void*) noexcept;
  void* (*calloc)(std::size_t, std::size_t) noexcept;
  void* (*realloc)(void*, std::size_t) noexcept;
  void* (*memalign)(std::size_t, std::size_t) noexcept;
  int (*posix_memalign)(void**, std::size_t, std::size_t) noexcept;
  void* (*aligned_alloc)(std::size_t, std::size_t) noexcept;
  void* (*valloc)(std::size_t) noexcept;
  void* (*pvalloc)(std::size_t) noexcept;
  std::size_t (*usable_size)(void*) noexcept;
};

bool Resolve() noexcept;

// Until Resolve has run, every entry points at one of these: they resolve,
// then call the real function (or, on the resolving thread, the bootstrap).
inline void* FirstMalloc(std::size_t n) noexcept;
inline void FirstFree(void* p) noexcept;
inline void* FirstCalloc(std::size_t c, std::size_t s) noexcept;
inline void* FirstRealloc(void* p, std::size_t n) noexcept;
inline void* FirstMemalign(std::size_t a, std::size_t n) noexcept;
inline int FirstPosixMemalign(void** out, std::size_t a, std::size_t n) noexcept;
inline void* FirstAlignedAlloc(std::size_t a, std::size_t n) noexcept;
inline void* FirstValloc(std::size_t n) noexcept;
inline void* FirstPvalloc(std::size_t n) noexcept;
inline std::size_t FirstUsableSize(void* p) noexcept;

inline Functions g_fn = {&FirstMalloc,        &FirstFree,         &FirstCalloc, &FirstRealloc,
                         &FirstMemalign,      &FirstPosixMemalign, &FirstAlignedAlloc,
                         &FirstValloc,        &FirstPvalloc,      &FirstUsableSize};

// 0 not resolved, 1 resolving, 2 resolved.
inline std::atomic<int> g_state{0};
inline thread_local bool tls_resolving HEAPPROF_TLS_MODEL = false;
// g_shadowed (the process's malloc is another object's): block_hooks.hpp.

inline int BootstrapPosixMemalign(void** out, std::size_t a, std::size_t n) noexcept {
  void* p = BootstrapAlloc(n, a);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

// Fallbacks for functions an allocator does not export.
inline void* MemalignViaPosix(std::size_t a, std::size_t n) noexcept {
  void* p = nullptr;
  const int e = g_fn.posix_memalign(&p, a, n);
  if (e != 0) {
    errno = e;
    return nullptr;
  }
  return p;
}
inline void* VallocViaMemalign(std::size_t n) noexcept { return g_fn.memalign(static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), n); }
inline void* PvallocViaMemalign(std::size_t n) noexcept {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  if (n > SIZE_MAX - page) {
    errno = ENOMEM;
    return nullptr;
  }
  return g_fn.memalign(page, n == 0 ? page : (n + page - 1) & ~(page - 1));
}
inline int PosixMemalignViaMemalign(void** out, std::size_t a, std::size_t n) noexcept {
  if (a == 0 || a % sizeof(void*) != 0 || (a & (a - 1)) != 0) return EINVAL;
  const int saved = errno;
  void* p = g_fn.memalign(a, n);
  if (p == nullptr) {
    errno = saved;
    return ENOMEM;
  }
  *out = p;
  return 0;
}
inline void* AlignedAllocViaMemalign(std::size_t a, std::size_t n) noexcept { return g_fn.memalign(a, n); }
inline std::size_t NoUsableSize(void*) noexcept { return 0; }

// `name` from the object that defines the real malloc (`base`), else
// `fallback`: an allocator without pvalloc (jemalloc) must not get glibc's,
// which is what dlsym would find next, and which would mix two heaps.
template <class F>
inline F Lookup(void* handle, const char* name, const void* base, F fallback) noexcept {
  void* f = FindSymbol(handle, name);
  if (f == nullptr) return fallback;
  if (base != nullptr && ObjectBaseOf(f) != base) return fallback;
  return reinterpret_cast<F>(f);
}

inline void OurObjectMarker() noexcept {}

// ---------------------------------------------------------------- shadowed
// When the process's malloc is another object's (g_shadowed: an allocator
// listed before libheapprof_preload.so in LD_PRELOAD), this engine is off and
// our hooks run only where that object lacks the function: jemalloc has no
// reallocarray, pvalloc, free_sized or free_aligned_sized; tcmalloc none but
// pvalloc. The program then calls ours with that allocator's blocks, which
// the allocator under us (glibc's, the next after us) must never see: such a
// hook forwards to the process's own realloc, memalign or free, records
// nothing, and the program runs as without us (glibc's reallocarray calls
// the process's realloc too; pvalloc is built from memalign, as above).
enum : unsigned {
  kShadowResolved = 1,  // Resolve has decided; alone: no hook forwards
  kShadowReallocarray = 2,
  kShadowPvalloc = 4,
  kShadowFreeSized = 8,
  kShadowFreeAlignedSized = 16,
};
inline unsigned g_shadow_hooks = 0;  // written once, before g_state's release store
struct ProcessFunctions {
  void* (*realloc)(void*, std::size_t) noexcept;
  void* (*memalign)(std::size_t, std::size_t) noexcept;
  void (*free)(void*) noexcept;
};
inline ProcessFunctions g_process_fn{};

// `name`'s definition in the process (RTLD_DEFAULT) when it is another
// object's than `ours`, else nullptr. A non-PIE program that takes the
// function's address has its PLT stub there (which calls the process's
// definition, whoever's: at worst ours, which is no worse than not
// forwarding).
inline void* ProcessFunction(const char* name, const void* ours) noexcept {
  void* f = FindSymbol(RTLD_DEFAULT, name);
  const void* const base = f != nullptr ? ObjectBaseOf(f) : nullptr;
  if (base == nullptr || base == ours) return nullptr;
  return f;
}
// Whether the process's `name` is ours (the shadowing object lacks it).
inline bool ProcessHasOurs(const char* name, const void* ours) noexcept {
  void* f = FindSymbol(RTLD_DEFAULT, name);
  return f != nullptr && ours != nullptr && ObjectBaseOf(f) == ours;
}

inline unsigned ResolveShadowHooks(const void* ours) noexcept {
  unsigned hooks = kShadowResolved;
  g_process_fn.realloc = reinterpret_cast<void* (*)(void*, std::size_t) noexcept>(ProcessFunction("realloc", ours));
  g_process_fn.memalign =
      reinterpret_cast<void* (*)(std::size_t, std::size_t) noexcept>(ProcessFunction("memalign", ours));
  g_process_fn.free = reinterpret_cast<void (*)(void*) noexcept>(ProcessFunction("free", ours));
  if (g_process_fn.realloc != nullptr && ProcessHasOurs("reallocarray", ours)) hooks |= kShadowReallocarray;
  if (g_process_fn.memalign != nullptr && ProcessHasOurs("pvalloc", ours)) hooks |= kShadowPvalloc;
  if (g_process_fn.free != nullptr && ProcessHasOurs("free_sized", ours)) hooks |= kShadowFreeSized;
  if (g_process_fn.free != nullptr && ProcessHasOurs("free_aligned_sized", ours)) hooks |= kShadowFreeAlignedSized;
  return hooks;
}

// Finds the allocator under us. Thread-safe: one thread resolves, others wait.
// False: this thread is inside the resolution (dlsym allocating); the caller
// serves the bootstrap buffer.
inline bool Resolve() noexcept {
  if (g_state.load(std::memory_order_acquire) == 2) return true;
  if (tls_resolving) return false;
  int expected = 0;
  if (!g_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    while (g_state.load(std::memory_order_acquire) != 2) sched_yield();
    return true;
  }
  tls_resolving = true;
  SuppressHooks quiet;  // dlsym's allocations (bootstrap blocks) are not counted
  // Is the process's malloc ours? If an object before us defines it (a
  // program that replaces malloc itself, an allocator preloaded ahead of
  // libheapprof_preload.so), our malloc family runs only when that one calls
  // it as its own next malloc: start-up then turns this engine off
  // (preload_engine.hpp). The allocator under us is still the next one: the
  // first one's would call back into us.
  void* const handle = RTLD_NEXT;
  Dl_info process_malloc{};
  void* active = FindSymbol(RTLD_DEFAULT, "malloc");
  // Only a definition counts: a non-PIE program that takes malloc's address
  // (Debian's python3) has its PLT stub as malloc's canonical address, which
  // dlsym returns, under an undefined symbol (SHN_UNDEF).
  void* sym_entry = nullptr;
  const bool found = active != nullptr && dladdr1(active, &process_malloc, &sym_entry, RTLD_DL_SYMENT) != 0;
  const auto* sym = static_cast<const ElfW(Sym)*>(sym_entry);
  unsigned shadow_hooks = kShadowResolved;
  const void* const ours = ObjectBaseOf(reinterpret_cast<const void*>(&OurObjectMarker));
  if (found && sym != nullptr && sym->st_shndx != SHN_UNDEF && ours != nullptr && process_malloc.dli_fbase != ours) {
    g_shadowed = true;
    shadow_hooks = ResolveShadowHooks(ours);
  }
  Functions f{};
  f.malloc = Lookup(handle, "malloc", nullptr, static_cast<void* (*)(std::size_t) noexcept>(nullptr));
  const void* base = f.malloc != nullptr ? ObjectBaseOf(reinterpret_cast<const void*>(f.malloc)) : nullptr;
  f.free = Lookup(handle, "free", base, static_cast<void (*)(void*) noexcept>(nullptr));
  f.calloc = Lookup(handle, "calloc", base, static_cast<void* (*)(std::size_t, std::size_t) noexcept>(nullptr));
  f.realloc = Lookup(handle, "realloc", base, static_cast<void* (*)(void*, std::size_t) noexcept>(nullptr));
  f.memalign = Lookup(handle, "memalign", base, static_cast<void* (*)(std::size_t, std::size_t) noexcept>(nullptr));
  f.posix_memalign =
      Lookup(handle, "posix_memalign", base, static_cast<int (*)(void**, std::size_t, std::size_t) noexcept>(nullptr));
  if (f.malloc == nullptr || f.free == nullptr || f.calloc == nullptr || f.realloc == nullptr) {
    // No dynamic symbol to follow (a static program?): glibc's own entry points.
    base = nullptr;
    f.malloc = Lookup(RTLD_DEFAULT, "__libc_malloc", nullptr, f.malloc);
    f.free = Lookup(RTLD_DEFAULT, "__libc_free", nullptr, f.free);
    f.calloc = Lookup(RTLD_DEFAULT, "__libc_calloc", nullptr, f.calloc);
    f.realloc = Lookup(RTLD_DEFAULT, "__libc_realloc", nullptr, f.realloc);
    f.memalign = Lookup(RTLD_DEFAULT, "__libc_memalign", nullptr, f.memalign);
  }
  if (f.malloc == nullptr || f.free == nullptr || f.calloc == nullptr || f.realloc == nullptr) {
    // A statically linked program (-static) has no other malloc: its only
    // one is ours. HEAPPROF_REPLACE_NEW_DELETE works there.
    ReportRaw("heapprof: HEAPPROF_REPLACE_MALLOC: cannot find the real malloc (dlsym): a statically linked "
              "program has none to forward to (link it dynamically, or use HEAPPROF_REPLACE_NEW_DELETE "
              "alone); aborting\n");
    std::abort();
  }
  if (f.memalign == nullptr && f.posix_memalign == nullptr) {
    ReportRaw("heapprof: HEAPPROF_REPLACE_MALLOC: the real allocator has neither memalign nor posix_memalign; aborting\n");
    std::abort();
  }
  // Published one by one; the fallbacks call g_fn, so theirs go first.
  g_fn.posix_memalign = f.posix_memalign != nullptr ? f.posix_memalign : &PosixMemalignViaMemalign;
  g_fn.memalign = f.memalign != nullptr ? f.memalign : &MemalignViaPosix;
  g_fn.aligned_alloc = Lookup(handle, "aligned_alloc", base, &AlignedAllocViaMemalign);
  g_fn.valloc = Lookup(handle, "valloc", base, &VallocViaMemalign);
  g_fn.pvalloc = Lookup(handle, "pvalloc", base, &PvallocViaMemalign);
  g_fn.usable_size = Lookup(handle, "malloc_usable_size", base, &NoUsableSize);
  g_fn.realloc = f.realloc;
  g_fn.calloc = f.calloc;
  g_fn.free = f.free;
  g_fn.malloc = f.malloc;
  g_underlying_malloc = f.malloc;
  g_underlying_usable_size = g_fn.usable_size;
  g_release_block = f.free;
  __atomic_store_n(&g_shadow_hooks, shadow_hooks, __ATOMIC_RELEASE);
  tls_resolving = false;
  g_state.store(2, std::memory_order_release);
  return true;
}

inline void* FirstMalloc(std::size_t n) noexcept { return Resolve() ? g_fn.malloc(n) : BootstrapAlloc(n, 16); }
inline void FirstFree(void* p) noexcept {
  if (Resolve() && !IsBootstrap(p)) g_fn.free(p);
}
inline void* FirstCalloc(std::size_t c, std::size_t s) noexcept {
  if (Resolve()) return g_fn.calloc(c, s);
  std::size_t n;
  if (__builtin_mul_overflow(c, s, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  return BootstrapAlloc(n, 16);  // never-used static memory: already zero
}
inline void* FirstRealloc(void* p, std::size_t n) noexcept {
  if (Resolve()) return g_fn.realloc(p, n);
  void* q = BootstrapAlloc(n, 16);
  if (q != nullptr && p != nullptr) {
    const std::size_t old = BootstrapSize(p);
    std::memcpy(q, p, old < n ? old : n);
  }
  return q;
}
inline void* FirstMemalign(std::size_t a, std::size_t n) noexcept {
  return Resolve() ? g_fn.memalign(a, n) : BootstrapAlloc(n, a);
}
inline int FirstPosixMemalign(void** out, std::size_t a, std::size_t n) noexcept {
  if (Resolve()) return g_fn.posix_memalign(out, a, n);
  return BootstrapPosixMemalign(out, a, n);
}
inline void* FirstAlignedAlloc(std::size_t a, std::size_t n) noexcept {
  return Resolve() ? g_fn.aligned_alloc(a, n) : BootstrapAlloc(n, a);
}
inline void* FirstValloc(std::size_t n) noexcept { return Resolve() ? g_fn.valloc(n) : BootstrapAlloc(n, 4096); }
inline void* FirstPvalloc(std::size_t n) noexcept { return Resolve() ? g_fn.pvalloc(n) : BootstrapAlloc(n, 4096); }
inline std::size_t FirstUsableSize(void* p) noexcept { return Resolve() ? g_fn.usable_size(p) : 0; }

// Whether hook `bit` forwards to the process's allocator (see "shadowed"),
// resolving first. One load once resolved: is it kShadowResolved alone.
HEAPPROF_NOINLINE inline bool ForwardsToProcessCold(unsigned bit) noexcept {
  Resolve();  // on the resolving thread itself: still 0, so the hook goes on (to the bootstrap)
  return (__atomic_load_n(&g_shadow_hooks, __ATOMIC_ACQUIRE) & bit) != 0;
}
HEAPPROF_ALWAYS_INLINE bool ForwardsToProcess(unsigned bit) noexcept {
  if (HEAPPROF_LIKELY(__atomic_load_n(&g_shadow_hooks, __ATOMIC_ACQUIRE) == kShadowResolved)) return false;
  return ForwardsToProcessCold(bit);
}
inline void* ProcessPvalloc(std::size_t n) noexcept {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  if (n > SIZE_MAX - page) {
    errno = ENOMEM;
    return nullptr;
  }
  return g_process_fn.memalign(page, n == 0 ? page : (n + page - 1) & ~(page - 1));
}

// What operator new/delete call when both families are replaced: the real
// allocator directly, so a new counts once.
HEAPPROF_ALWAYS_INLINE void* Malloc(std::size_t n) noexcept { return g_fn.malloc(n); }
HEAPPROF_ALWAYS_INLINE void Free(void* p) noexcept {
  if (HEAPPROF_LIKELY(!IsBootstrap(p))) g_fn.free(p);
}
HEAPPROF_ALWAYS_INLINE int PosixMemalign(void** out, std::size_t a, std::size_t n) noexcept {
  return g_fn.posix_memalign(out, a, n);
}

// The cold halves of malloc, calloc and free (block_hooks.hpp: HotAlloc, HotFree).
HEAPPROF_NOINLINE inline void* MallocCold(std::size_t n, const void* ret) noexcept {
  if (HEAPPROF_UNLIKELY(OwnBlocks())) return OwnAlloc(n, false);
  const std::size_t asked = SampledRequest(n);
  void* p = g_fn.malloc(asked);
  if (HEAPPROF_LIKELY(p != nullptr)) {
    OnAllocBlock(p, n, ret, n != 0 && asked == n, asked != n);
  } else if (n != 0 && OnAllocFailure(n)) {  // HEAPPROF=oom_dump; true: its reserve is free
    return MallocCold(n, ret);
  }
  return p;
}
// calloc's: overflow, a sample, a failure, an allocator without a size table.
HEAPPROF_NOINLINE inline void* CallocCold(std::size_t count, std::size_t size, const void* ret) noexcept {
  std::size_t total;
  const bool overflow = __builtin_mul_overflow(count, size, &total);
  if (HEAPPROF_UNLIKELY(OwnBlocks())) {
    if (!overflow) return OwnAlloc(total, true);
    errno = ENOMEM;
    return nullptr;
  }
  const std::size_t want = overflow ? total : SampledRequest(total);
  void* p = want == total ? g_fn.calloc(count, size)  // overflow: nullptr, ENOMEM
                          : g_fn.calloc(1, want);
  if (HEAPPROF_LIKELY(p != nullptr)) {
    OnAllocBlock(p, total, ret, want == total && total != 0, !overflow && want != total);
  } else if (!overflow && total != 0 && OnAllocFailure(total)) {  // (calloc's overflow is no request for memory)
    return CallocCold(count, size, ret);
  }
  return p;
}
HEAPPROF_NOINLINE inline void FreeCold(void* p) noexcept {
  if (IsBootstrap(p)) return;
  if (HEAPPROF_UNLIKELY(IsOwnBlock(p))) return OwnFree(p);
  if (!OnFreeBlock(p)) g_fn.free(p);
}

// The shared bodies of the hooks (always inlined into each, so the hook's
// return address is the caller's call site).
HEAPPROF_ALWAYS_INLINE void FreeBody(void* p) noexcept {
  if (p == nullptr) return;
  HotFree(p, [](void* q) { g_fn.free(q); }, [](void* q) { return IsBootstrap(q); }, &FreeCold);
}

// realloc's cold half: every case the hot path below leaves (an allocator
// with neither glibc's chunks nor a size table, a maybe-sampled or bootstrap
// block, a glibc block of 1 KiB or more, a sample due, realloc(p, 0), a
// thread without a slot).
HEAPPROF_NOINLINE inline void* ReallocCold(void* p, std::size_t n, const void* ret) noexcept {
  if (HEAPPROF_UNLIKELY(OwnBlocks() || (p != nullptr && IsOwnBlock(p)))) {
    // glibc's realloc(p, 0) frees and returns null.
    if (p != nullptr && n == 0) {
      FreeCold(p);  // (an own block too: FreeCold knows it)
      return nullptr;
    }
    void* q = OwnBlocks() ? OwnAlloc(n, false) : MallocCold(n, ret);
    if (q == nullptr || p == nullptr) return q;
    const std::size_t old = IsOwnBlock(p) ? OwnSize(p) : BlockSize(p);
    std::memcpy(q, p, old < n ? old : n);
    FreeCold(p);
    return q;
  }
  if (p == nullptr) {
    void* q = g_fn.malloc(SampledRequest(n));
    if (q != nullptr) {
      OnAllocBlock(q, n, ret);
    } else if (n != 0 && OnAllocFailure(n)) {
      return ReallocCold(p, n, ret);
    }
    return q;
  }
  if (HEAPPROF_UNLIKELY(IsBootstrap(p))) {  // a bootstrap block moves to the real heap
    void* q = g_fn.malloc(SampledRequest(n));
    if (q != nullptr) {
      const std::size_t old = BootstrapSize(p);
      std::memcpy(q, p, old < n ? old : n);
      OnAllocBlock(q, n, ret);
    }
    return q;
  }
  // The old block leaves the profile before the allocator may reuse it; a
  // realloc cannot be deferred (the caller expects the move now).
  OnFreeBlock(p, false);
  // realloc(p, 0) frees (glibc) whatever the countdown says.
  void* q = g_fn.realloc(p, n == 0 ? 0 : SampledRequest(n));
  if (q != nullptr) {
    OnAllocBlock(q, n, ret);
  } else if (n != 0) {
    // Failed: the old block is still the caller's, unchanged. It comes back
    // as a new allocation (its original request size is not known: the
    // usable size stands in for it).
    const int saved = errno;
    OnAllocBlock(p, BlockSize(p), ret);
    errno = saved;
    if (OnAllocFailure(n)) return ReallocCold(p, n, ret);  // (its free is counted again there)
  }
  // else realloc(p, 0) freed p (glibc): counted above.
  return q;
}

// The hot path's realloc failed: `p` is still the caller's, unchanged, and
// its free was counted before the call. It is counted back (as ReallocCold
// does: a free and an allocation of the same block), then the failure hook.
HEAPPROF_NOINLINE inline void* ReallocFailed(void* p, std::size_t n) noexcept {
  ThreadState* ts = tls_thread_state;
  const std::size_t old = BlockSize(p);
  BumpCounter(ts->alloc_objects, 1);
  BumpCounter(ts->alloc_bytes, old);
  if (!OnAllocFailure(n)) return nullptr;  // keeps errno
  // oom_dump released its reserve: once more
  // (an unsampled block, as ReallocCold counts it: the old one's free
  // again, the new one's allocation).
  BumpCounter(ts->free_objects, 1);
  BumpCounter(ts->free_bytes, old);
  void* q = g_fn.realloc(p, n);
  ts = tls_thread_state;
  BumpCounter(ts->alloc_objects, 1);
  BumpCounter(ts->alloc_bytes, q != nullptr ? BlockSize(q) : old);  // failed: p is still the caller's
  return q;
}

// The hot path's realloc once it is decided: the old block's free (of `old`
// bytes) counted before the call, the new block's (`size_of(q)`) after it; a
// failure goes to ReallocFailed. `ts`: the calling thread's state; read
// again after the call (cheaper than keeping it).
template <class SizeOf>
HEAPPROF_ALWAYS_INLINE void* ReallocCounted(void* p, std::size_t n, ThreadState* ts, std::size_t old,
                                            SizeOf size_of) noexcept {
  BumpCounter(ts->free_objects, 1);
  BumpCounter(ts->free_bytes, old);
  void* q = g_fn.realloc(p, n);
  if (HEAPPROF_UNLIKELY(q == nullptr)) return ReallocFailed(p, n);
  const std::size_t now = size_of(q);
  ts = tls_thread_state;
  BumpCounter(ts->alloc_objects, 1);
  BumpCounter(ts->alloc_bytes, now);
  return q;
}

// realloc's hot path: p != nullptr, n != 0, the old block unsampled and no
// sample due (the countdown above n, so the request is n itself). On glibc
// (g_glibc_chunks) the old block is unsampled when its chunk word is below
// sampled_min (as in HotFreeGlibc: a bootstrap block's word of all ones and
// an mmapped chunk fail that test), and both sizes are chunk words. Under a
// size-class allocator (g_class_table: jemalloc, tcmalloc) the free filter
// says the old block is unsampled (and it is not a bootstrap block, which
// that allocator does not know), and both sizes are malloc_usable_size
// (realloc may keep a block in place at its old size: tcmalloc does). The old
// block's free is counted before the call; only p and n stay live across it
// (for a failure). True when it handled the call (`out`: the result).
HEAPPROF_ALWAYS_INLINE bool HotRealloc(void* p, std::size_t n, void*& out) noexcept {
  if (HEAPPROF_UNLIKELY(p == nullptr || n == 0)) return false;
  // The countdown is compared unsigned (it is never negative): a request
  // above INT64_MAX is not a negative one.
#if HEAPPROF_DETAIL_GLIBC_CHUNKS
  if (HEAPPROF_LIKELY(LoadRelaxed(g_glibc_chunks))) {
    const std::size_t head8 = GlibcChunkWord(p) - 8;
    ThreadState* ts = tls_thread_state;
    const std::uint64_t countdown = static_cast<std::uint64_t>(LoadRelaxed(ts->countdown));
    if (HEAPPROF_UNLIKELY(head8 >= LoadRelaxed(ts->sampled_min) || n >= countdown)) return false;
    StoreRelaxed(ts->countdown, static_cast<std::int64_t>(countdown - n));
    out = ReallocCounted(p, n, ts, head8 & ~std::size_t{7}, [](void* q) { return GlibcChunkUsable(q); });
    return true;
  }
#endif
  if (!__atomic_load_n(&g_class_table, __ATOMIC_ACQUIRE)) return false;
  ThreadState* ts = tls_thread_state;
  const std::uint64_t countdown = static_cast<std::uint64_t>(LoadRelaxed(ts->countdown));
  // (A thread without a slot has the empty state's countdown of 0.)
  if (HEAPPROF_UNLIKELY(n >= countdown || MaybeSampled(p) || IsBootstrap(p))) return false;
  StoreRelaxed(ts->countdown, static_cast<std::int64_t>(countdown - n));
  const std::size_t old = g_underlying_usable_size(p);
  out = ReallocCounted(p, n, tls_thread_state, old, [](void* q) { return g_underlying_usable_size(q); });
  return true;
}

// The body of the aligned forms but posix_memalign: the block `alloc()` gives
// is counted (`ret`: the hook's return address, the sample's leaf); after a
// failure that released oom_dump's reserve (OnAllocFailure is true once at
// most), `alloc()` is tried once more.
template <class Alloc>
HEAPPROF_ALWAYS_INLINE void* AllocOrRetry(std::size_t n, const void* ret, Alloc alloc) noexcept {
  void* p;
  do {
    p = alloc();
    if (HEAPPROF_LIKELY(p != nullptr)) {
      OnAllocBlock(p, n, ret);
      return p;
    }
  } while (n != 0 && OnAllocFailure(n));
  return p;
}

}  // namespace real
}  // namespace detail
}  // namespace heapprof

// Every hook is a function of its own (no identical code folding: GCC could
// make valloc a call to pvalloc, and the leaf frame would be wrong; and no
// inlining into a caller in the same unit, which clang does to hooks this small).
#if defined(__clang__)
#define HEAPPROF_DETAIL_MALLOC_HOOK extern "C" __attribute__((__visibility__("default"), __used__, __noinline__))
#else
#define HEAPPROF_DETAIL_MALLOC_HOOK extern "C" __attribute__((__visibility__("default"), __used__, __noipa__))
#endif
#define HEAPPROF_DETAIL_RET __builtin_return_address(0)

// glibc declares these without free_sized/free_aligned_sized before 2.40.
extern "C" void free_sized(void* p, std::size_t n) noexcept;
extern "C" void free_aligned_sized(void* p, std::size_t alignment, std::size_t n) noexcept;

HEAPPROF_DETAIL_MALLOC_HOOK void* malloc(std::size_t n) noexcept {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  if (void* p = heapprof::detail::HotAlloc(n, keep, [](std::size_t m) { return heapprof::detail::real::g_fn.malloc(m); })) {
    return p;
  }
  return heapprof::detail::real::MallocCold(keep, HEAPPROF_DETAIL_RET);
}

HEAPPROF_DETAIL_MALLOC_HOOK void free(void* p) noexcept { heapprof::detail::real::FreeBody(p); }

// C23: the caller's size is not trusted; the count is the block's size, as for free.
// (Under an allocator preloaded before us that lacks them: its free.)
HEAPPROF_DETAIL_MALLOC_HOOK void free_sized(void* p, std::size_t) noexcept {
  if (HEAPPROF_UNLIKELY(heapprof::detail::real::ForwardsToProcess(heapprof::detail::real::kShadowFreeSized))) {
    return heapprof::detail::real::g_process_fn.free(p);
  }
  heapprof::detail::real::FreeBody(p);
}
HEAPPROF_DETAIL_MALLOC_HOOK void free_aligned_sized(void* p, std::size_t, std::size_t) noexcept {
  if (HEAPPROF_UNLIKELY(heapprof::detail::real::ForwardsToProcess(heapprof::detail::real::kShadowFreeAlignedSized))) {
    return heapprof::detail::real::g_process_fn.free(p);
  }
  heapprof::detail::real::FreeBody(p);
}

// The hot path asks for calloc(1, count * size): the same zeroed bytes, and
// only the product stays live across the call (the cold function gets it as
// calloc(1, n) after a failure; an overflow goes there as it came).
HEAPPROF_DETAIL_MALLOC_HOOK void* calloc(std::size_t count, std::size_t size) noexcept {
  std::size_t n;
  if (HEAPPROF_UNLIKELY(__builtin_mul_overflow(count, size, &n))) {
    return heapprof::detail::real::CallocCold(count, size, HEAPPROF_DETAIL_RET);
  }
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  if (void* p =
          heapprof::detail::HotAlloc(n, keep, [](std::size_t m) { return heapprof::detail::real::g_fn.calloc(1, m); })) {
    return p;
  }
  return heapprof::detail::real::CallocCold(1, keep, HEAPPROF_DETAIL_RET);
}

// realloc(nullptr, n) is malloc's hot path; realloc(p, n) has its own.
HEAPPROF_DETAIL_MALLOC_HOOK void* realloc(void* p, std::size_t n) noexcept {
  if (p == nullptr) {
    const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
    if (void* q = heapprof::detail::HotAlloc(n, keep, [](std::size_t m) { return heapprof::detail::real::g_fn.malloc(m); })) {
      return q;
    }
    return heapprof::detail::real::MallocCold(keep, HEAPPROF_DETAIL_RET);
  }
  void* q;
  if (heapprof::detail::real::HotRealloc(p, n, q)) return q;
  return heapprof::detail::real::ReallocCold(p, n, HEAPPROF_DETAIL_RET);
}

// glibc's reallocarray: ENOMEM when count * size overflows, else realloc.
HEAPPROF_DETAIL_MALLOC_HOOK void* reallocarray(void* p, std::size_t count, std::size_t size) noexcept {
  std::size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  // (Under an allocator preloaded before us, which lacks reallocarray: its realloc.)
  if (HEAPPROF_UNLIKELY(heapprof::detail::real::ForwardsToProcess(heapprof::detail::real::kShadowReallocarray))) {
    return heapprof::detail::real::g_process_fn.realloc(p, n);
  }
  void* q;
  if (heapprof::detail::real::HotRealloc(p, n, q)) return q;
  return heapprof::detail::real::ReallocCold(p, n, HEAPPROF_DETAIL_RET);
}

// The aligned forms: once more after a failure that released oom_dump's
// reserve (OnAllocFailure is true once at most; AllocOrRetry).
HEAPPROF_DETAIL_MALLOC_HOOK int posix_memalign(void** out, std::size_t alignment, std::size_t n) noexcept {
  int e;
  do {
    e = heapprof::detail::real::g_fn.posix_memalign(out, alignment, heapprof::detail::SampledRequest(n));
    if (e == 0) {
      heapprof::detail::OnAllocBlock(*out, n, HEAPPROF_DETAIL_RET);
      return 0;
    }
  } while (e == ENOMEM && heapprof::detail::OnAllocFailure(n));
  return e;
}

HEAPPROF_DETAIL_MALLOC_HOOK void* aligned_alloc(std::size_t alignment, std::size_t n) noexcept {
  return heapprof::detail::real::AllocOrRetry(n, HEAPPROF_DETAIL_RET, [&] {
    return heapprof::detail::real::g_fn.aligned_alloc(alignment, heapprof::detail::SampledRequest(n, alignment));
  });
}

HEAPPROF_DETAIL_MALLOC_HOOK void* memalign(std::size_t alignment, std::size_t n) noexcept {
  return heapprof::detail::real::AllocOrRetry(n, HEAPPROF_DETAIL_RET, [&] {
    return heapprof::detail::real::g_fn.memalign(alignment, heapprof::detail::SampledRequest(n));
  });
}

HEAPPROF_DETAIL_MALLOC_HOOK void* valloc(std::size_t n) noexcept {
  return heapprof::detail::real::AllocOrRetry(
      n, HEAPPROF_DETAIL_RET, [&] { return heapprof::detail::real::g_fn.valloc(heapprof::detail::SampledRequest(n)); });
}

HEAPPROF_DETAIL_MALLOC_HOOK void* pvalloc(std::size_t n) noexcept {
  // (Under an allocator preloaded before us, which lacks pvalloc: its memalign.)
  if (HEAPPROF_UNLIKELY(heapprof::detail::real::ForwardsToProcess(heapprof::detail::real::kShadowPvalloc))) {
    return heapprof::detail::real::ProcessPvalloc(n);
  }
  return heapprof::detail::real::AllocOrRetry(n, HEAPPROF_DETAIL_RET,
                                              [&] { return heapprof::detail::real::g_fn.pvalloc(n); });
}

HEAPPROF_DETAIL_MALLOC_HOOK std::size_t malloc_usable_size(void* p) noexcept {
  if (p == nullptr) return 0;
  if (HEAPPROF_UNLIKELY(heapprof::detail::real::IsBootstrap(p))) return heapprof::detail::real::BootstrapSize(p);
  if (HEAPPROF_UNLIKELY(heapprof::detail::real::IsOwnBlock(p))) return heapprof::detail::real::OwnSize(p);
  return heapprof::detail::real::g_fn.usable_size(p);
}

// Start-up (engine.hpp: EnsureInit) resolves the allocator before it decides
// how BlockSize reads: hidden, so only this object's engine finds it.
extern "C" __attribute__((__visibility__("hidden"))) void heapprof_detail_resolve_malloc() noexcept {
  heapprof::detail::real::Resolve();
}

#undef HEAPPROF_DETAIL_RET
#undef HEAPPROF_DETAIL_MALLOC_HOOK

// Hooks in a dlopen'ed plugin never run: said once, at its load (hook_check.hpp).
[[maybe_unused]] static const bool g_heapprof_malloc_hooks_checked =
    (heapprof::detail::ReportHooksNotInEffect("malloc", "malloc", heapprof::detail::kMallocHooks), true);

#endif  // HEAPPROF_MALLOC_HOOKS
