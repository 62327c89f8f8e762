// heapprof: what every hooked allocation and free runs inline, and the
// per-thread state it touches. Part of the light half of the API: every unit
// that uses heapprof::allocator compiles this file, so it includes nothing
// heavy (no <atomic>: the few atomic accesses are the compiler's builtins).
//
//   OnAlloc (inline, in the hook)     countdown -= n; counters += ...; done
//     └─ OnAllocSlow (out of line)    register thread / redraw / sample
//   OnFree (inline, in the hook)      filter counter == 0 → counters += ...; done
//   HotAlloc, HotFree (global hooks,  countdown, malloc, counters; chunk word
//     1_hooks/block_hooks.hpp)        (or another allocator's usable size) <
//                                     sampled_min → counters, tail call to free;
//                                     anything else: the hook's cold function
//   OnFreeBlock (cold global hooks)   block < sampled_min → counters += ...; done
//     └─ OnFreeSlow (out of line)     live map lookup, bucket frees++
//
// The slow paths are compiled once, by the implementation unit
// (2_sampling/engine.hpp). Invariant 3 of DESIGN.md: the fast paths touch
// only the calling thread's state and one read-only filter counter: no atomic
// read-modify-write, no shared cache line written, no syscall.
#pragma once

#include "heapprof/config.hpp"

#if defined(HEAPPROF_CXX17)

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace heapprof {
namespace detail {

struct LabelSetData;  // an interned label set (2_sampling/labels.hpp)
// Releases a block of `n` bytes the way its owner would (a heapprof::allocator's upstream).
using ReleaseFn = void (*)(void* p, std::size_t n) noexcept;

#if HEAPPROF_ENABLED

// Relaxed atomic load and store of a plain field: plain moves on x86-64 and
// aarch64, yet a reader on another thread (GetStats) is no data race. The
// owner of a counter is its only writer, so load + store is an exact
// increment without a locked instruction.
template <class T>
HEAPPROF_ALWAYS_INLINE T LoadRelaxed(const T& x) noexcept {
  return __atomic_load_n(&x, __ATOMIC_RELAXED);
}
template <class T>
HEAPPROF_ALWAYS_INLINE void StoreRelaxed(T& x, T v) noexcept {
  __atomic_store_n(&x, v, __ATOMIC_RELAXED);
}
// Adds `by` to a counter only its owning thread writes. One instruction on
// x86-64 (a plain `add` to memory, no lock prefix): a signal handler that
// allocates on the same thread runs between instructions, never between a
// load and a store of ours, so its own increments are never overwritten
// (they were, with load + store: 7,936 allocations lost in one run). Other
// threads (GetStats) read it whole: an aligned 8-byte access. Elsewhere a
// relaxed fetch_add (on aarch64 an LL/SC loop, which a signal restarts).
HEAPPROF_ALWAYS_INLINE void BumpCounter(std::uint64_t& c, std::uint64_t by) noexcept {
#if defined(__x86_64__)
  asm volatile("addq %1, %0" : "+m"(c) : "er"(by));
#else
  __atomic_fetch_add(&c, by, __ATOMIC_RELAXED);
#endif
}

// One thread's state. The fast path reads the thread-local pointer and the
// six words at its start; the rest is the slow path's and the registry's
// (2_sampling/thread_registry.hpp). Slots live in the profiler's arena, one
// cache line each, and are recycled when their thread exits.
struct alignas(64) ThreadState {
  // --- written by the owning thread on every allocation and free ---
  std::int64_t countdown = 0;  // bytes until the next sample
  std::uint64_t alloc_objects = 0;
  std::uint64_t alloc_bytes = 0;
  std::uint64_t free_objects = 0;
  std::uint64_t free_bytes = 0;
  // --- read by the owner on every global hook's free; written under the registry lock ---
  // No sampled block of the global hooks is smaller than this (block_hooks.hpp:
  // SampledMinBlock), so a smaller block's free is not a sampled object's. 0 in
  // the empty state: a thread without a slot sends every free to the slow path.
  std::uint64_t sampled_min = 0;
  // --- owner only, slow path ---
  std::uint64_t rng = 0;
  std::uint64_t rate_epoch = 0;  // epoch of the rate the countdown was drawn at
  std::uintptr_t stack_lo = 0;   // [stack_lo, stack_hi): this thread's stack
  std::uintptr_t stack_hi = 0;
  // --- registry, under its lock ---
  ThreadState* next_slot = nullptr;  // every slot ever made
  ThreadState* next_free = nullptr;  // slots whose thread has exited
  bool in_use = false;
};

// A thread that never reached the slow path points here (mimalloc's "empty
// heap" trick: no null check on the fast path). Never written: its countdown
// of 0 sends every allocation to the slow path, which registers a real slot.
inline ThreadState g_empty_thread_state HEAPPROF_VISIBLE;

inline thread_local ThreadState* tls_thread_state HEAPPROF_TLS_MODEL HEAPPROF_VISIBLE = &g_empty_thread_state;

// Read only on slow paths.
struct ThreadFlags {
  std::uint32_t guard = 0;  // > 0 while the profiler itself runs on this thread
  bool suppress = false;    // heapprof::allocator is calling its upstream
  bool exiting = false;     // our key destructor ran: do not register again
  // In a heapprof::allocator's upstream call (AllocatorScope, below): the
  // global hooks count the upstream's blocks, all but the allocator's own.
  bool allocator_scope = false;
  std::uint8_t scope_blocks = 0;    // blocks counted in allocates' scopes so far, modulo 256 (AllocatorScope)
  ThreadState* suppressed = nullptr;  // while `suppress`: the thread's own state (SuppressHooks)
  const void* own_block = nullptr;    // in a deallocate's scope: the block it returns to the upstream
};
inline thread_local ThreadFlags tls_thread_flags HEAPPROF_TLS_MODEL HEAPPROF_VISIBLE;

// Set for good on the profiler's own threads (the dump thread, the HTTP
// server's): the malloc hooks serve what libc and libstdc++ allocate there
// (__cxa_demangle's names) from the profiler's arena (malloc.hpp: OwnAlloc),
// so that no glibc arena is made for them. Read only on cold paths.
inline thread_local bool tls_profiler_thread HEAPPROF_TLS_MODEL = false;

// ---- sample rate: one atomic word, (epoch << kRateBits) | rate ----
// The epoch tells a thread its countdown was drawn at an older rate (the
// slow path draws a fresh one: 2_sampling/engine.hpp). Read by the hooks'
// cold paths too (block_hooks.hpp: SampledRequest).
constexpr int kRateBits = 40;
constexpr std::uint64_t kMaxRate = (std::uint64_t{1} << kRateBits) - 1;  // 1 TiB
inline std::atomic<std::uint64_t> g_rate_state{HEAPPROF_DEFAULT_SAMPLE_RATE};

inline std::uint64_t RateOf(std::uint64_t state) noexcept { return state & kMaxRate; }
inline std::uint64_t EpochOf(std::uint64_t state) noexcept { return state >> kRateBits; }

// The calling thread's current label set (nullptr = empty), and the set a
// heapprof::allocator carries while it records an allocation.
inline thread_local const LabelSetData* tls_current_labels HEAPPROF_TLS_MODEL HEAPPROF_VISIBLE = nullptr;
inline thread_local const LabelSetData* tls_allocator_labels HEAPPROF_TLS_MODEL HEAPPROF_VISIBLE = nullptr;

// ---------------------------------------------------------------- free filter
// 2^16 counters indexed by a hash of the pointer; a counter is the number of
// live sampled objects hashing there, and one bit per counter says "not 0".
// An unsampled free reads its bit, sees 0 and is done: the bits are 8 KiB,
// which stay in L1 where the 128 KiB of counters did not (a free read one at
// a random line). Counters and bits change only under the live map's shard
// lock (2_sampling/live_map.hpp); a word of 64 bits belongs to one shard.
constexpr int kFreeFilterBits = 16;

// Fibonacci hashing: the top bits of p * 2^64/phi spread neighbouring,
// 16-byte-aligned pointers over the whole table.
HEAPPROF_ALWAYS_INLINE std::uint64_t PointerHash(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) * 0x9E3779B97F4A7C15ull;
}
HEAPPROF_ALWAYS_INLINE std::size_t FreeFilterIndex(const void* p) noexcept {
  // (No cast: on LP64 it is a useless one, which -Wuseless-cast reports in
  // every unit that includes <heapprof.hpp>; the value fits in any size_t.)
  const std::size_t i = PointerHash(p) >> (64 - kFreeFilterBits);
  return i;
}

inline std::uint16_t g_free_filter[std::size_t{1} << kFreeFilterBits] HEAPPROF_VISIBLE;
inline std::uint64_t g_free_bits[(std::size_t{1} << kFreeFilterBits) / 64] HEAPPROF_VISIBLE;

// False only when `p` is certainly not a live sampled object: the one load an
// unsampled free pays.
HEAPPROF_ALWAYS_INLINE bool MaybeSampled(const void* p) noexcept {
  const std::size_t i = FreeFilterIndex(p);
  return ((LoadRelaxed(g_free_bits[i >> 6]) >> (i & 63)) & 1) != 0;
}

// ---------------------------------------------------------------- slow paths
// Compiled once, in the implementation unit.
HEAPPROF_LINKED_BEGIN
// An allocation that ran the countdown out (or the thread's first). `how`:
// kCountBlock (a global hook: Stats count the block's usable size, see
// 1_hooks/block_hooks.hpp) or 0 (heapprof::allocator: Stats count `n`), with
// kPaddedBlock when the hook padded the block for a sample. False: a padded
// block the live map could not remember (out of memory), which the hook must
// not return (new_delete.hpp: ReplacePadded); true otherwise.
bool OnAllocSlow(void* p, std::size_t n, const void* hook_return, unsigned how) noexcept;
// A free of a maybe-sampled object (or the thread's first). `flags`:
// kFreeSized (Stats count `n`; otherwise the block's usable size), kFreeCanDefer
// (the caller releases the block itself and skips that when told to). True: the profiler keeps
// the block and releases it itself later (a signal handler freed a sampled
// object while its thread was inside the profiler, holding the lock the free
// needs: 2_sampling/live_map.hpp), with `release(p, n)` when given (a
// heapprof::allocator's upstream), else with the global hooks' real free.
bool OnFreeSlow(void* p, std::size_t n, unsigned flags, ReleaseFn release = nullptr) noexcept;
// After a heapprof::allocator's upstream returned `p` for `bytes`
// (AllocatorScope): the global hooks counted the blocks the upstream
// allocated; one at `p` requested for `bytes` is the allocator's own, which
// it counts itself, so it is uncounted here.
// `since`: the count of scope blocks when its scope began (AllocatorScope::base).
void SettleAllocatorScope(const void* p, std::size_t bytes, std::uint8_t since) noexcept;
HEAPPROF_LINKED_END

#endif  // HEAPPROF_ENABLED

// The hook families compiled into this program and in effect, set at the
// static initialisation of the unit that defines them (hook_check.hpp). Read
// when a profile is written before any allocation was seen (snapshot.hpp:
// WarnIfNoAllocationSeen says what is hooked rather than "not installed").
constexpr unsigned kNewDeleteHooks = 1, kMallocHooks = 2;
inline std::atomic<unsigned> g_hook_families{0};

constexpr unsigned kFreeSized = 1;
constexpr unsigned kFreeCanDefer = 2;
constexpr unsigned kCountBlock = 1;
constexpr unsigned kPaddedBlock = 2;

// ---------------------------------------------------------------- fast paths

// After a successful allocation of `n` bytes at `p`. `hook_return` is the
// return address of the hook function: the leaf frame of the sample.
HEAPPROF_ALWAYS_INLINE void OnAlloc(void* p, std::size_t n, const void* hook_return) noexcept {
#if HEAPPROF_ENABLED
  ThreadState* ts = tls_thread_state;
  const std::int64_t left = LoadRelaxed(ts->countdown) - static_cast<std::int64_t>(n);
  if (HEAPPROF_UNLIKELY(left <= 0)) {
    OnAllocSlow(p, n, hook_return, 0);
    return;
  }
  StoreRelaxed(ts->countdown, left);
  BumpCounter(ts->alloc_objects, 1);
  BumpCounter(ts->alloc_bytes, n);
#else
  (void)p, (void)n, (void)hook_return;
#endif
}

// Before `p` (of `n` bytes) goes back to the allocator. Must run before the
// memory is released: afterwards malloc may hand the address to another thread.
// `release`, when not null, releases `p` as the caller would: the caller
// skips its release when this returns true (the profiler then owns the block
// and releases it with `release(p, n)`; see OnFreeSlow). Always false on the
// fast path.
HEAPPROF_ALWAYS_INLINE bool OnFree(void* p, std::size_t n, ReleaseFn release) noexcept {
#if HEAPPROF_ENABLED
  ThreadState* ts = tls_thread_state;
  if (HEAPPROF_UNLIKELY(MaybeSampled(p) | (ts == &g_empty_thread_state))) {
    return OnFreeSlow(p, n, kFreeSized | (release != nullptr ? kFreeCanDefer : 0u), release);
  }
  BumpCounter(ts->free_objects, 1);
  BumpCounter(ts->free_bytes, n);
  return false;
#else
  (void)p, (void)n, (void)release;
  return false;
#endif
}

// The profiler's own calls that may reach the hooks (start-up's dlsym, an
// allocator's first malloc_usable_size) run inside this scope, and
// heapprof::allocator's upstream calls inside AllocatorScope (below), which
// builds on it. The fast paths stay unchanged: the thread is pointed at the
// empty state, which sends them to the slow path, which sees `suppress`. What
// a signal handler does in that window is not the upstream's: the slow paths
// count its heapprof::allocator blocks, and its frees of sampled objects, on
// the thread's own state, kept in `suppressed` (2_sampling/engine.hpp).
#if HEAPPROF_ENABLED
class SuppressHooks {
 public:
  // `suppressed` is set by the outermost scope only (a nested one's state is
  // the empty one) and never restored: it is read only while `suppress` is.
  // The profiler's own scopes (start-up's dlsym, an allocator's first
  // malloc_usable_size) count nothing, inside an AllocatorScope too.
  SuppressHooks() noexcept
      : saved_state_(tls_thread_state),
        saved_suppress_(tls_thread_flags.suppress),
        saved_allocator_scope_(tls_thread_flags.allocator_scope) {
    if (!saved_suppress_) tls_thread_flags.suppressed = saved_state_;
    tls_thread_flags.suppress = true;
    tls_thread_flags.allocator_scope = false;
    tls_thread_state = &g_empty_thread_state;
    asm volatile("" ::: "memory");  // (see AllocatorScope)
  }
  ~SuppressHooks() {
    asm volatile("" ::: "memory");
    tls_thread_state = saved_state_;
    tls_thread_flags.suppress = saved_suppress_;
    tls_thread_flags.allocator_scope = saved_allocator_scope_;
  }
  SuppressHooks(const SuppressHooks&) = delete;
  SuppressHooks& operator=(const SuppressHooks&) = delete;

 private:
  ThreadState* saved_state_;
  bool saved_suppress_;
  bool saved_allocator_scope_;
};

// heapprof::allocator's upstream call: hooks suppressed as above, except that
// the global hooks count every block the upstream allocates or frees but the
// allocator's own: the block allocate returns, requested for its bytes
// (uncounted afterwards, SettleAllocatorScope), and the block at the address
// deallocate passes down (`own_block`). A pmr resource's chunk, allocated in
// one allocate and freed by the resource's destructor or release() anywhere,
// and the exception an upstream throws, freed after its catch, are then
// counted at both ends. Suppressed whole, they were counted at the free only:
// a monotonic_buffer_resource per request drove Stats' live_bytes to 0 within
// a thousand requests. (A signal handler's operator new or delete in that
// window is counted the same way, and not sampled.)
class AllocatorScope {
 public:
  explicit AllocatorScope(const void* own_block) noexcept
      : quiet_(), saved_own_block_(tls_thread_flags.own_block), base_(tls_thread_flags.scope_blocks) {
    tls_thread_flags.allocator_scope = true;  // (quiet_ saved it, and restores it)
    tls_thread_flags.own_block = own_block;
    // Compiler barriers around the upstream call: clang takes a replaceable
    // operator new or delete (libstdc++ calls __builtin_operator_new) for one
    // that touches no memory of the program's, so it dropped these stores as
    // dead (the dtor overwrites them) and reused scope_blocks read before the
    // call: the settle never ran and every block was counted twice.
    asm volatile("" ::: "memory");
  }
  ~AllocatorScope() {
    asm volatile("" ::: "memory");
    tls_thread_flags.own_block = saved_own_block_;
  }
  // The blocks counted in this scope (and in those nested in it, a signal
  // handler's) are those after `base`: SettleAllocatorScope's range.
  std::uint8_t base() const noexcept { return base_; }
  AllocatorScope(const AllocatorScope&) = delete;
  AllocatorScope& operator=(const AllocatorScope&) = delete;

 private:
  SuppressHooks quiet_;
  const void* saved_own_block_;
  std::uint8_t base_;
};
#else
// Without a profiler: nothing to suppress.
class SuppressHooks {
 public:
  SuppressHooks() noexcept {}
  SuppressHooks(const SuppressHooks&) = delete;
  SuppressHooks& operator=(const SuppressHooks&) = delete;
};
class AllocatorScope {
 public:
  explicit AllocatorScope(const void*) noexcept {}
  std::uint8_t base() const noexcept { return 0; }
  AllocatorScope(const AllocatorScope&) = delete;
  AllocatorScope& operator=(const AllocatorScope&) = delete;
};
#endif

}  // namespace detail
}  // namespace heapprof

#endif  // HEAPPROF_CXX17
