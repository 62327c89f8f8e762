// heapprof: the sampling engine: the slow paths behind the inline fast paths
// of 1_hooks/fast_path.hpp, start-up, fork handling.
//
//   OnAllocSlow (out of line)        register thread / redraw / sample
//     └─ RecordSample                unwind → bucket → live map
//   OnFreeSlow (out of line)         live map lookup, bucket frees++
//
// OnAllocSlow and OnFreeSlow themselves are defined by the implementation
// unit (detail/implementation.hpp) around AllocSlowPath and FreeSlowPath.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <malloc.h>
#include <new>
#include <pthread.h>
#include <unistd.h>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/2_sampling/buckets.hpp"
#include "heapprof/detail/0_base/env_config.hpp"
#include "heapprof/detail/0_base/profiler_stack.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/0_base/self_exe.hpp"
#include "heapprof/detail/2_sampling/labels.hpp"
#include "heapprof/detail/2_sampling/live_map.hpp"
#include "heapprof/detail/2_sampling/peak.hpp"
#include "heapprof/detail/3_unwinding/loader_lock.hpp"
#include "heapprof/detail/2_sampling/sampler.hpp"
#include "heapprof/detail/1_hooks/fast_path.hpp"
#include "heapprof/detail/1_hooks/block_hooks.hpp"
#include "heapprof/detail/2_sampling/thread_registry.hpp"
#include "heapprof/detail/3_unwinding/frame_pointers.hpp"
#include "heapprof/detail/3_unwinding/table.hpp"

namespace heapprof {
namespace detail {

// ---- sample rate: g_rate_state (1_hooks/fast_path.hpp) ----
// With sampling off a thread still looks at the rate every 64 MiB it allocates,
// so turning sampling on reaches threads whose wake-up poke was lost.
constexpr std::int64_t kRateRecheckBytes = std::int64_t{1} << 26;

// gperftools' malloc_usable_size answers 0 for new blocks while tcmalloc is
// still starting (our start-up, and the first samples, can run inside its
// first operator new), so the class table's check fails then: tried again at
// each of the first kClassTableTries samples, and with sampling off (no
// samples) each kClassTableRecheckBytes a thread allocates. Switching while
// blocks are live is exact: the table holds their sizes.
constexpr int kClassTableTries = 16;
constexpr std::int64_t kClassTableRecheckBytes = std::int64_t{1} << 20;
inline std::atomic<int> g_class_table_tries{0};
// The allocator has nallocx, its table is not on, and tries are left.
inline bool ClassTablePending() noexcept {
  return g_nallocx != nullptr && !LoadRelaxed(g_class_table) && !LoadRelaxed(g_glibc_chunks) &&
         !LoadRelaxed(g_class_table_refused) &&
         g_class_table_tries.load(std::memory_order_relaxed) < kClassTableTries;
}

// The countdown a thread starts with under `rate`.
inline std::int64_t FreshCountdown(ThreadState& ts, std::uint64_t rate) noexcept {
  if (rate != 0) return DrawSampleDistance(ts.rng, rate);
  return ClassTablePending() ? kClassTableRecheckBytes : kRateRecheckBytes;
}

// heapprof::Unwinder as int: 0 frame pointers, 1 the eh_frame table (default).
constexpr int kUnwinderFramePointer = 0;
constexpr int kUnwinderTable = 1;
inline std::atomic<int> g_unwinder{kUnwinderTable};

// ---- lazy start-up (invariant 2: nothing runs before the first use) ----
inline std::atomic<int> g_init_state{0};  // 0 not started, 1 running, 2 done
inline pthread_key_t g_thread_key;
// HEAPPROF as parsed at start-up (dumps.hpp, http.hpp read the rest of it).
inline EnvConfig g_env_config;
// Zeroes up to 64 KiB of the calling thread's stack below the caller's
// frame. There lie the dead frames of what the program ran last, their
// slots still holding its pointers; the frames a retention scan (the leak
// report, WriteRetentionProfile) then builds there are scanned as this
// thread's stack, and a slot they leave unwritten made the stale pointer a
// root: a true leak at rate 1 was "reachable <== [stack] thread N" and
// leak_exit_code missed it. Called before those frames are built. Within
// the thread's known stack only, leaving 16 KiB above its end; nothing on a
// stack the profiler does not know (a sigaltstack, a coroutine's).
__attribute__((__noinline__)) inline void ClearDeadStack() noexcept {
  constexpr std::uintptr_t kClear = std::uintptr_t{64} << 10, kMargin = std::uintptr_t{16} << 10;
  const ThreadState* ts = tls_thread_state;
  const auto sp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (sp <= ts->stack_lo + kMargin || sp >= ts->stack_hi) return;
  const std::size_t n = std::min(kClear, sp - ts->stack_lo - kMargin) & ~std::uintptr_t{15};
  void* area = __builtin_alloca(n);
  std::memset(area, 0, n);
  asm volatile("" : : "r"(area) : "memory");  // the stores are the point
}

// What runs at exit (dumps.hpp sets it). Registered with atexit() by the very
// first allocation, so it runs after the destructors of every static object
// that allocated: the latest moment a leak report can look.
inline std::atomic<void (*)()> g_exit_hook{nullptr};
// Forked children run them too, under their own pid (a child that must not,
// ends with _exit, as children that exec or abandon their parent's state do).
inline void RunExitHook() {
  if (tls_thread_flags.guard != 0) {
    // exit() from a signal handler that interrupted this thread inside the
    // profiler, which may hold a lock the exit actions need: running them
    // could wait forever on ourselves. Say so and skip them.
    if (g_exit_hook.exchange(nullptr) != nullptr) {
      ReportRaw("heapprof: exit() was called while this thread was inside the profiler (from a signal "
                "handler?): exit dumps and the leak report are skipped\n");
    }
    return;
  }
  if (void (*hook)() = g_exit_hook.exchange(nullptr)) {
    ReentrancyGuard guard;
    ClearDeadStack();  // before the leak report's frames
    hook();
  }
}

// One engine per process. A program that compiles heapprof in and also runs
// under libheapprof_preload.so has two copies of it; start-up decides which
// one records (detail/implementation.hpp: heapprof_detail_engine_role) and
// the other turns itself off: its hooks still run (they are bound) but their
// slow paths return at once, and its API forwards to the recording engine.
inline bool g_engine_off = false;

// A program's operator new while libheapprof_preload.so records the process
// (implementation.hpp: heapprof_detail_engine_role): the library's cold hooks,
// which allocate and record the block as the library's own operator new does.
// The program's cold hooks reach them with a tail call, so the sample's leaf
// is the program's code that called operator new, not the program's hook
// (before, the hook called malloc, and the library's malloc hook took the
// hook as the leaf). Published once, before the program's engine turns off.
struct ForwardedNew {
  void* (*cold)(std::size_t n, const void* ret);
  void* (*nothrow_cold)(std::size_t n, const void* ret) noexcept;
  void* (*aligned_cold)(std::size_t n, std::align_val_t al, const void* ret);
  void* (*aligned_nothrow_cold)(std::size_t n, std::align_val_t al, const void* ret) noexcept;
};
inline std::atomic<const ForwardedNew*> g_forwarded_new{nullptr};

void ApplyRate(std::uint64_t rate) noexcept;
void OnThreadExit(void* slot) noexcept;
void ForkPrepare() noexcept;
void ForkParent() noexcept;
void ForkChild() noexcept;

// Set on the thread running EnsureInit's start-up, while it runs.
inline thread_local bool tls_initialising HEAPPROF_TLS_MODEL = false;

inline void EnsureInit() noexcept {
  if (HEAPPROF_LIKELY(g_init_state.load(std::memory_order_acquire) == 2)) return;
  int expected = 0;
  if (g_init_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    tls_initialising = true;
    ReentrancyGuard guard;
    // Start-up keeps errno, whichever entry point runs it (an allocation's
    // slow path, or an API call): its steps make system calls, and
    // DetectBlockSize's large block may fail with ENOMEM.
    const int saved_errno = errno;
#if defined(__GLIBC__)
    // RTLD_NEXT: the objects after this one, past an executable's PLT stub.
    // Before DetectBlockSize: glibc's every dl* call frees the message of the
    // thread's last failed one, and DetectBlockSize's failed lookups leave
    // one (freed here, it moved a free into the program's own counts: one
    // live object short in one_engine under tcmalloc, test_preload.cpp).
    g_getattr_np.store(reinterpret_cast<GetattrFn>(FindSymbol(RTLD_NEXT, "pthread_getattr_np")),
                       std::memory_order_relaxed);
#endif
    DetectBlockSize();
    if (&heapprof_detail_engine_role != nullptr) heapprof_detail_engine_role();
    pthread_key_create(&g_thread_key, &OnThreadExit);
    pthread_atfork(&ForkPrepare, &ForkParent, &ForkChild);
    std::atexit(&RunExitHook);
    PrepareProfilerStacks();
    BindStackBoundsCalls();
    RememberStderr();  // heapprof's lines go to this stderr, not to what takes fd 2 later
    RememberExecPath();  // the program's file, should /proc/self/exe be unreadable later
    g_peak.StartWindow();
    // secure_getenv: ignored in setuid/setgid programs (AT_SECURE), as glibc
    // ignores MALLOC_*; an unprivileged user must not make a privileged
    // program write dumps wherever they like.
    if (const char* env = secure_getenv("HEAPPROF")) {
      ConfigureReportSink(env);  // log= first: the other keys' problems go where it says
      g_env_config = ParseEnvConfig(env);
      const EnvConfig& cfg = g_env_config;
      if (cfg.has_rate) ApplyRate(cfg.rate);
      if (cfg.has_max_label_sets) g_labels.SetMaxSets(cfg.max_label_sets);
      if (cfg.has_unwinder) g_unwinder.store(cfg.unwinder_table ? kUnwinderTable : kUnwinderFramePointer);
      if (cfg.has_max_stacks) g_buckets.SetMaxStacks(cfg.max_stacks);
      if (!cfg.lines) g_symbolize_names_only.store(true, std::memory_order_relaxed);
    }
    errno = saved_errno;
    g_init_state.store(2, std::memory_order_release);
    tls_initialising = false;
    return;
  }
  // Re-entry on the initialising thread itself: its own allocations run under
  // the guard, but another copy of heapprof can call back in (a program's copy
  // asking libheapprof_preload.so for its engine from an operator new that
  // the allocator's start-up, inside DetectBlockSize, called). Waiting would
  // wait for ourselves, forever; the caller gets what is decided so far.
  if (tls_initialising) return;
  // Another thread is initialising; it allocates nothing through our hooks that
  // could wait on us, so a short wait is safe.
  while (g_init_state.load(std::memory_order_acquire) != 2) sched_yield();
}

inline void ApplyRate(std::uint64_t rate) noexcept {
  if (rate > kMaxRate) rate = kMaxRate;
  // Before any thread can draw at the new rate (block_hooks.hpp: sampled_min).
  if (rate != 0 && rate < kPaddedSamplingMinRate) g_registry.LowerSampledMin();
  std::uint64_t old = g_rate_state.load(std::memory_order_relaxed);
  while (!g_rate_state.compare_exchange_weak(old, ((EpochOf(old) + 1) << kRateBits) | rate,
                                             std::memory_order_acq_rel)) {
  }
  g_registry.PokeAll();
}

inline std::uint64_t SeedFor(const void* slot) noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return Mix64(reinterpret_cast<std::uintptr_t>(slot) ^ static_cast<std::uint64_t>(ts.tv_nsec) ^
               (static_cast<std::uint64_t>(ts.tv_sec) << 32));
}

// First slow path of a thread: a slot, stack bounds, a countdown.
HEAPPROF_NOINLINE inline ThreadState* RegisterThread() noexcept {
  ReentrancyGuard guard;
  EnsureInit();
  if (g_engine_off) return nullptr;  // every allocation of this thread stays on the slow path, which returns
  ThreadState* ts = g_registry.Acquire();
  if (ts == nullptr) return nullptr;
  CurrentStackBounds(ts->stack_lo, ts->stack_hi);
  ts->rng = SeedFor(ts);
  const std::uint64_t state = g_rate_state.load(std::memory_order_acquire);
  ts->rate_epoch = EpochOf(state);
  StoreRelaxed(ts->countdown, FreshCountdown(*ts, RateOf(state)));
  pthread_setspecific(g_thread_key, ts);
  tls_thread_state = ts;
  return ts;
}

inline void OnThreadExit(void* slot) noexcept {
  ReentrancyGuard guard;  // a handler allocating now must not wait on the registry lock we take
  tls_thread_flags.exiting = true;
  tls_thread_state = &g_empty_thread_state;
  ReleaseProfilerStack();
  g_registry.Release(static_cast<ThreadState*>(slot));
}

// Lock order: loader, unwind tables, registry, labels, buckets, live map shards, peak, arena
// (innermost). The loader lock comes first: see loader_lock.hpp.
inline void ForkPrepare() noexcept {
  g_loader_lock.lock();
  unwind_table::g_lock.lock();
  g_registry.lock().lock();
  g_labels.lock().lock();
  g_buckets.lock().lock();
  g_live_map.LockAll();
  g_peak.lock().lock();
  g_window_peak.lock().lock();
  g_arena.lock().lock();
}
inline void ForkParent() noexcept {
  g_arena.lock().unlock();
  g_window_peak.lock().unlock();
  g_peak.lock().unlock();
  g_live_map.UnlockAll();
  g_buckets.lock().unlock();
  g_labels.lock().unlock();
  g_registry.lock().unlock();
  unwind_table::g_lock.unlock();
  g_loader_lock.unlock();
}
// Set by the symbolizer (a later layer) before it first takes its cache lock:
// runs in the child after the engine's locks are released. Through the
// engine's handler, registered at the first allocation, rather than a
// pthread_atfork of its own: glibc ignores the child handler of a
// registration made while another thread's fork runs its prepare handlers,
// and that fork's child would inherit a held lock.
inline std::atomic<void (*)()> g_fork_child_symbolizer{nullptr};

inline void ForkChild() noexcept {
  unwind_table::ResetReadersInChild();
  ForkParent();
  g_arena.DropHeadroomInChild();  // held by the parent's writes, whose threads the child lacks
  if (void (*hook)() = g_fork_child_symbolizer.load(std::memory_order_acquire)) hook();
}

// One walk with the chosen unwinder. A frame-pointer walk that did not pass
// through the hook's frame (the hook's code reused rbp: the implementation
// unit built without frame pointers, frame_pointers.hpp) is redone with the
// tables (x86-64), which step through the hook whatever its build.
inline void UnwindOnce(const void* frame, const void* hook_return, std::uintptr_t lo, std::uintptr_t hi,
                       std::uintptr_t own_lo, std::uintptr_t own_hi, std::uintptr_t* beyond,
                       CapturedStack& out) noexcept {
  if (g_unwinder.load(std::memory_order_relaxed) == kUnwinderTable) {
    UnwindWithTable(frame, hook_return, lo, hi, out, own_lo, own_hi, beyond);
    return;
  }
  if (HEAPPROF_LIKELY(UnwindFramePointers(frame, hook_return, lo, hi, out, own_lo, own_hi, beyond))) return;
#if defined(HEAPPROF_ARCH_X86_64)
  UnwindWithTable(frame, hook_return, lo, hi, out, own_lo, own_hi, beyond);
#endif
}

inline void CaptureStack(const void* frame, const void* hook_return, const ThreadState& ts,
                         CapturedStack& out) noexcept {
  auto lo = reinterpret_cast<std::uintptr_t>(frame);  // nothing below our own frame is a caller
  auto hi = ts.stack_hi;
  // The thread's own stack, where code a signal interrupted runs: past a
  // signal frame whose interrupted sp is outside [lo, hi) (below the sample:
  // a sigaltstack handler whose alternate stack is an array on this very
  // stack, or outside it: a sigaltstack elsewhere), both unwinders go on
  // there. (Only given for a sample on another stack, the first case's
  // stack ended at the signal frame.)
  const std::uintptr_t own_lo = ts.stack_lo, own_hi = ts.stack_hi;
  bool capped = false;
  if (HEAPPROF_UNLIKELY(lo < ts.stack_lo || lo >= hi)) {
    // Not on the thread's own stack (a sigaltstack handler, a coroutine):
    // checked against that stack's bounds, every frame was out of them and
    // the stack was the leaf alone.
    ForeignStackBounds(reinterpret_cast<std::uintptr_t>(frame), lo, hi, &capped);
  }
  if (HEAPPROF_LIKELY(!capped)) {
    UnwindOnce(frame, hook_return, lo, hi, own_lo, own_hi, nullptr, out);
    return;
  }
  // A stack whose top the probe did not reach (more than its 256 KiB above
  // the sample, all readable): a walk that stopped only because its next
  // frame lay above `hi` is walked again with the pages up to that frame,
  // while they are readable; at kForeignStackMaxBytes the stack is cut, and
  // marked so, as at HEAPPROF_MAX_FRAMES. (The frames beyond were dropped
  // silently before.)
  for (;;) {
    std::uintptr_t beyond = 0;
    UnwindOnce(frame, hook_return, lo, hi, own_lo, own_hi, &beyond, out);
    if (beyond == 0 || out.truncated) return;
    const Extended e = ExtendForeignStack(lo, hi, beyond);
    if (e == Extended::kNo) return;  // the chain left this stack: its end
    if (e == Extended::kCut) break;
  }
  out.truncated = true;
  // Not the stack the table walk recorded (that one was not cut).
  if (out.interned != nullptr) {
    *out.interned = nullptr;
    out.interned = nullptr;
  }
}

void DrainDeferredFreesNow() noexcept;
// Runs the frees a signal handler queued while this thread held a shard lock
// (DrainDeferredFreesNow). The queue's check inline: every sample and every
// slow free asks, and the queue is almost always empty (out of line, the
// call and its saved registers were ~40 instructions a sample).
HEAPPROF_ALWAYS_INLINE void DrainDeferredFrees() noexcept {
  if (HEAPPROF_LIKELY(__atomic_load_n(&tls_live_map.queued, __ATOMIC_RELAXED) == 0)) return;
  DrainDeferredFreesNow();
}

// A block that must be found at its free although no profile shows it: a
// sample the tables had no room for (RecordSampleHere), or a block padded for
// a sample that the rate, set to 0 meanwhile, no longer takes (AllocSlowPath).
// See buckets.hpp: g_dropped_sample_bucket. False: the live map is out of memory.
// `of_allocator`: a heapprof::allocator's object (LiveMap::Insert).
HEAPPROF_NOINLINE inline bool RememberUnsampledObject(void* p, bool of_allocator) noexcept {
  ReentrancyGuard guard;
  return g_live_map.Insert(p, &g_dropped_sample_bucket, of_allocator);
}

// The work of one sample: unwind, intern, remember the object. False: the
// live map had no memory for it (its free will not find it).
HEAPPROF_NOINLINE inline bool RecordSampleHere(void* p, std::size_t n, std::uint64_t rate, const void* hook_return,
                                               const ThreadState& ts, const void* frame, bool of_allocator) noexcept {
  ReentrancyGuard guard;
  CapturedStack stack;
  CaptureStack(frame, hook_return, ts, stack);
  // A stack the table unwinder found equal to this thread's last one, frame
  // for frame, is the stack record interned then (records are never freed).
  const StackRecord* known = stack.interned != nullptr ? static_cast<const StackRecord*>(*stack.interned) : nullptr;
  const StackRecord* interned = nullptr;
  bool new_stack = false;
  Bucket* b = g_buckets.RecordAlloc(stack.pcs, static_cast<std::uint32_t>(stack.depth), stack.truncated, n, rate,
                                    CurrentSampleLabels(), known, &interned, &new_stack);
  if (stack.interned != nullptr) *stack.interned = interned;
  // The frame-pointer walk reads no loaded objects: a new stack's PCs are
  // checked against them, so that a library it passes through is remembered
  // for profiles written after its dlclose (the table walk does so on its way).
  if (HEAPPROF_UNLIKELY(new_stack) && g_unwinder.load(std::memory_order_relaxed) == kUnwinderFramePointer) {
    unwind_table::NoteStackObjects(stack.pcs, static_cast<std::uint32_t>(stack.depth));
  }
  if (b == nullptr) {
    // Dropped (the tables are full): the object is still remembered, so that
    // its free is found as a sampled object's.
    return RememberUnsampledObject(p, of_allocator);
  }
  if (!g_live_map.Insert(p, b, of_allocator)) {
    // Out of memory for the live map: count it freed now rather than leak it
    // into the in-use totals forever.
    b->frees.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  CountSampledPeak(b);  // the peak profile's estimate; a snapshot past each 10%
  return true;
}

struct SampleCall {
  void* p;
  std::size_t n;
  std::uint64_t rate;
  const void* hook_return;
  const ThreadState* ts;
  const void* frame;
  bool of_allocator;
  bool remembered;
};

inline void RecordSampleThunk(void* arg) noexcept {
  auto& c = *static_cast<SampleCall*>(arg);
  c.remembered = RecordSampleHere(c.p, c.n, c.rate, c.hook_return, *c.ts, c.frame, c.of_allocator);
}

// Runs the sample in place when the thread's stack has room for it, else on
// the profiler's own stack (0_base/profiler_stack.hpp). False: the object is
// not in the live map (out of memory).
inline bool RecordSample(void* p, std::size_t n, std::uint64_t rate, const void* hook_return,
                         const ThreadState& ts, const void* frame, bool of_allocator) noexcept {
  const auto sp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  bool done = false;
  bool remembered = false;
  if (HEAPPROF_UNLIKELY(!StackHasRoom(sp, ts.stack_lo, ts.stack_hi, kInPlaceStackHeadroom))) {
    ReentrancyGuard guard;  // also while switching: a handler's allocation meanwhile is nested
    SampleCall call{p, n, rate, hook_return, &ts, frame, of_allocator, false};
    done = RunOnProfilerStack(&RecordSampleThunk, &call);
    remembered = call.remembered;
  }
  if (!done) remembered = RecordSampleHere(p, n, rate, hook_return, ts, frame, of_allocator);
  DrainDeferredFrees();
  return remembered;
}

// Set while a thread not registered yet allocates inside glibc's
// pthread_getattr_np: registration waits until the thread allocates
// elsewhere. It asks pthread_getattr_np for the thread's own stack bounds,
// and glibc holds the thread's lock across those allocations (the cpuset's
// realloc; pthread_attr_setaffinity_np's calloc of the attribute's extension
// and copy of the cpuset; the free): the thread waited on itself for ever.
// The JVM's every thread starts with that call (java -version hung at
// start-up under the preload library), and so may any program's thread.
// Those few blocks are counted as an unregistered thread's (Stats totals),
// not sampled.
inline thread_local bool tls_defer_registration HEAPPROF_TLS_MODEL = false;

// Whether an allocation whose caller is `hook_return`, on a thread not
// registered yet, must not register it: a caller in pthread_getattr_np (a
// window from its address, four times the 1004 bytes glibc 2.36 gives it),
// and while already deferred one in glibc's thread code around it (within
// 64 KiB of it: __pthread_attr_extension and pthread_attr_setaffinity_np lie
// 14 KiB below it in glibc 2.36). A caller there that allocates first on a
// fresh thread only delays its registration. (In a non-PIE executable that
// compiles heapprof in, &pthread_getattr_np is the executable's PLT stub:
// EnsureInit looks up glibc's own, g_getattr_np.) Nor an allocation the
// allocator makes itself (its caller in the allocator's code: block_hooks.hpp,
// InAllocatorCode), when the allocator is not glibc: gperftools' debug
// allocator allocates its free queue inside free, so also inside
// pthread_getattr_np's own free, and a thread whose first allocation was that
// one hung. (Under glibc's malloc that code is all of libc, whose functions
// allocate for the program: strdup, fopen.)
inline bool DeferRegistration(const void* hook_return, bool deferred) noexcept {
#if defined(__GLIBC__)
  constexpr std::uintptr_t kNear = 64 * 1024;
  const auto at = reinterpret_cast<std::uintptr_t>(hook_return);
  const auto near = [at, deferred](std::uintptr_t getattr) {
    return at - getattr < 4096 || (deferred && at + kNear - getattr < 2 * kNear);
  };
  const auto in_libc = reinterpret_cast<std::uintptr_t>(g_getattr_np.load(std::memory_order_relaxed));
  const auto getattr = in_libc != 0 ? in_libc : reinterpret_cast<std::uintptr_t>(&pthread_getattr_np);
  if (InAllocatorCode(hook_return) && !InAllocatorCode(reinterpret_cast<const void*>(getattr))) return true;
  return near(reinterpret_cast<std::uintptr_t>(&pthread_getattr_np)) || (in_libc != 0 && near(in_libc));
#else
  (void)hook_return;
  (void)deferred;
  return false;
#endif
}

// This thread's slot, registering it on first use; nullptr while it must not
// register (the profiler's own work, past our thread-exit destructor, or an
// allocation from pthread_getattr_np: `alloc_return`, the allocation hook's
// caller, decides that again; a free keeps what the last allocation decided).
inline ThreadState* CurrentThreadSlot(const ThreadFlags& flags, const void* alloc_return = nullptr) noexcept {
  ThreadState* ts = tls_thread_state;
  if (ts != &g_empty_thread_state) return ts;
  if (alloc_return != nullptr) tls_defer_registration = DeferRegistration(alloc_return, tls_defer_registration);
  if (HEAPPROF_UNLIKELY(flags.suppress)) {
    // Inside a heapprof::allocator's upstream call (SuppressHooks): the
    // thread's own state is saved there (none: not registered now, or the
    // slot would be lost when the scope restores the empty state).
    return flags.suppressed != &g_empty_thread_state ? flags.suppressed : nullptr;
  }
  return (flags.guard != 0 || flags.exiting || tls_defer_registration) ? nullptr : RegisterThread();
}

// The class table's check again (see kClassTableTries), unless the hook's
// caller `hook_return` is the allocator itself (block_hooks.hpp:
// InAllocatorCode): the check's own malloc and free could wait on a lock the
// allocator holds there. That allocation does not use up a try.
HEAPPROF_NOINLINE inline void RetryClassTable(const void* hook_return) noexcept {
  if (InAllocatorCode(hook_return)) return;
  if (g_class_table_tries.fetch_add(1, std::memory_order_acq_rel) >= kClassTableTries) return;
  ReentrancyGuard guard;
  static SpinLock lock;  // one filler at a time
  LockGuard hold(lock);
  if (!LoadRelaxed(g_glibc_chunks) && !LoadRelaxed(g_class_table)) DetectClassTable(false);
}

// The body of OnAllocSlow. `frame` is OnAllocSlow's own frame record, the
// unwinders' starting point: its saved rbp is the hook's and its return
// address points into the hook. False: a block the hook padded for a
// sample (kPaddedBlock) that is not in the live map (out of memory for it):
// the hook replaces it (new_delete.hpp: ReplacePadded).
HEAPPROF_ALWAYS_INLINE bool AllocSlowPath(void* p, std::size_t n, const void* hook_return, unsigned how,
                                          const void* frame) noexcept {
  ThreadFlags& flags = tls_thread_flags;
  // (Inside a heapprof::allocator's upstream call, a global hook's block is
  // counted by CountScopeBlock, unsampled: OnAllocSlow returned before this,
  // implementation.hpp. A heapprof::allocator's own sample there is a signal
  // handler's: counted and sampled, on the state CurrentThreadSlot finds.)
  ThreadState* ts = CurrentThreadSlot(flags, hook_return);  // first: start-up decides how BlockSize reads
  const std::size_t counted = (how & kCountBlock) != 0 ? BlockSize(p) : n;
  const bool padded = (how & kPaddedBlock) != 0;
  bool remembered = false;  // in the live map
  if (ts == nullptr) {
    if (!g_engine_off) g_registry.CountUnregisteredAlloc(counted);
    return !padded;
  }
  BumpCounter(ts->alloc_objects, 1);
  BumpCounter(ts->alloc_bytes, counted);
  const std::uint64_t state = g_rate_state.load(std::memory_order_acquire);
  const std::uint64_t rate = RateOf(state);
  std::int64_t left = LoadRelaxed(ts->countdown);
  if (ts->rate_epoch != EpochOf(state)) {
    // The rate changed: restart the sampling process at the new rate from
    // this allocation on (memorylessness makes the restart unbiased).
    ts->rate_epoch = EpochOf(state);
    left = FreshCountdown(*ts, rate);
  }
  // A block the hook padded for a sample (block_hooks.hpp: SampledRequest)
  // whose countdown no longer runs out: another thread changed the rate
  // during the allocation (the restart above), or a signal handler's
  // allocation in between took the sample (OnAllocBlock sends padded blocks
  // here). Its free must find it: under the class table a sized delete would
  // count its request's class, not the padded size. So it is sampled, or
  // with sampling now off remembered as a dropped sample's object is. (The
  // hook's flag too: a rate under 64 KiB meanwhile lowered min to 0.)
  const std::uint64_t min = LoadRelaxed(ts->sampled_min);
  if (HEAPPROF_UNLIKELY((how & kCountBlock) != 0 && (padded || (n < min && counted >= min)) &&
                        left > static_cast<std::int64_t>(n))) {
    if (rate == 0) {
      remembered = RememberUnsampledObject(p, false);  // (kCountBlock: a global hook's)
    } else {
      left = static_cast<std::int64_t>(n);  // runs out just below: sampled
    }
  }
  left -= static_cast<std::int64_t>(n);
  if (left > 0) {
    StoreRelaxed(ts->countdown, left);
    return !padded || remembered;
  }
  if (rate == 0) {
    // No samples to retry the class table: this does, each 1 MiB while it is
    // pending (under tcmalloc, hooks only at rate 0 otherwise ran every
    // allocation's cold path: 22 instead of 8.8 ns a churn pair).
    if (HEAPPROF_UNLIKELY(flags.guard == 0 && ClassTablePending())) RetryClassTable(hook_return);
    StoreRelaxed(ts->countdown, FreshCountdown(*ts, rate));
    return !padded || remembered;
  }
  if ((how & kCountBlock) != 0 && flags.guard == 0 && counted < g_sampled_min.load(std::memory_order_acquire)) {
    // A global hook's block below sampled_min: its free would not look for
    // it. The hook did not pad it (SampledRequest saw another countdown: the
    // thread's first allocation, or a signal handler's in between): the
    // sample moves to this thread's next allocation, which will be padded.
    StoreRelaxed(ts->countdown, std::int64_t{1});
    return !padded;
  }
  StoreRelaxed(ts->countdown, FreshCountdown(*ts, rate));
  if (flags.guard != 0) {
    // The profiler's own allocation, or a signal handler's that interrupted
    // this thread inside the profiler (which may hold any of its locks):
    // never sampled, counted.
    g_registry.CountNestedSample();
    return !padded;
  }
  if (HEAPPROF_UNLIKELY(ClassTablePending())) RetryClassTable(hook_return);
  const LabelSetData* allocator_labels = tls_allocator_labels;
  if (HEAPPROF_UNLIKELY((how & kCountBlock) != 0 && allocator_labels != nullptr)) {
    // A global hook while a heapprof::allocator holds its labels out for its
    // own sample (allocator.hpp): a signal handler that interrupted it. The
    // handler's object is not the container's: sampled without those labels.
    tls_allocator_labels = nullptr;
    remembered = RecordSample(p, n, rate, hook_return, *ts, frame, false);
    tls_allocator_labels = allocator_labels;
    return !padded || remembered;
  }
  remembered = RecordSample(p, n, rate, hook_return, *ts, frame, (how & kCountBlock) == 0);
  return !padded || remembered;
}

// Counts a free in the thread's counters (or the orphan totals).
HEAPPROF_ALWAYS_INLINE void CountFree(ThreadFlags& flags, std::size_t n) noexcept {
  ThreadState* ts = CurrentThreadSlot(flags);
  if (ts == nullptr) {
    if (!g_engine_off) g_registry.CountUnregisteredFree(n);
    return;
  }
  BumpCounter(ts->free_objects, 1);
  BumpCounter(ts->free_bytes, n);
}

// ---------------------------------------------------------------- a heapprof::allocator's upstream
// In an AllocatorScope (fast_path.hpp) the global hooks count the upstream's
// blocks but the allocator's own. Its own block in a deallocate is known
// beforehand (`own_block`); in an allocate it is the one the upstream returns,
// requested for exactly the allocator's bytes (a monotonic_buffer_resource
// returns the start of a larger chunk, which is the resource's), so the blocks
// counted there are remembered (the last kScopeBlocks of them) until
// SettleAllocatorScope uncounts that one.
struct ScopeBlock {
  void* p;
  std::size_t requested;  // (its counted size is BlockSize(p) again: it is still live when settled)
};
// Two: an upstream that allocates more than its block in one call is rare
// (a pmr resource: a chunk), and static TLS is short (test_own_memory.cpp).
constexpr unsigned kScopeBlocks = 2;  // divides 256: flags.scope_blocks wraps around with the ring
inline thread_local ScopeBlock tls_scope_blocks[kScopeBlocks] HEAPPROF_TLS_MODEL;

// Whether a global hook's free of `p` while `suppress` is set is counted.
HEAPPROF_ALWAYS_INLINE bool CountedInScope(const ThreadFlags& flags, const void* p) noexcept {
  return flags.allocator_scope && p != flags.own_block;
}

// Where an AllocatorScope's blocks are counted: the thread's own state (saved
// by the outermost scope), or nullptr for a thread without a slot.
inline ThreadState* ScopeCounters(const ThreadFlags& flags) noexcept {
  ThreadState* ts = tls_thread_state;
  if (ts == &g_empty_thread_state && flags.suppress) ts = flags.suppressed;
  return ts == &g_empty_thread_state ? nullptr : ts;
}

// One allocation of `size` bytes in an AllocatorScope, counted (+1) or
// uncounted (-1: the counters are summed modulo 2^64) where the scope's
// blocks are (ScopeCounters), or in the orphan totals. False: not counted
// (the engine is off).
inline bool CountScopeAlloc(const ThreadFlags& flags, std::size_t size, bool uncount) noexcept {
  ThreadState* ts = ScopeCounters(flags);
  if (ts == nullptr) {
    if (g_engine_off) return false;
    if (uncount) {
      g_registry.UncountUnregisteredAlloc(size);
    } else {
      g_registry.CountUnregisteredAlloc(size);
    }
    return true;
  }
  BumpCounter(ts->alloc_objects, uncount ? ~std::uint64_t{0} : std::uint64_t{1});
  BumpCounter(ts->alloc_bytes, uncount ? std::uint64_t{0} - size : size);
  return true;
}

// A global hook's block allocated in an AllocatorScope: counted as the slow
// path counts any (its usable size), on the thread's own state; not sampled.
inline void CountScopeBlock(ThreadFlags& flags, void* p, std::size_t requested) noexcept {
  if (flags.guard == 0 && !flags.exiting) EnsureInit();  // it decides how BlockSize reads
  if (!CountScopeAlloc(flags, BlockSize(p), false)) return;
  if (flags.own_block != nullptr) return;  // a deallocate's scope: nothing to settle
  tls_scope_blocks[flags.scope_blocks % kScopeBlocks] = ScopeBlock{p, requested};
  ++flags.scope_blocks;  // (modulo 256)
}

// The allocate's upstream returned `p` for `bytes`: a block of that request
// the hooks counted at `p` in its scope (entries after `since`) is the
// allocator's own (it counts it itself), so it is uncounted.
inline void SettleScopeBlocks(const void* p, std::size_t bytes, std::uint8_t since) noexcept {
  const ThreadFlags& flags = tls_thread_flags;
  unsigned n = static_cast<std::uint8_t>(flags.scope_blocks - since);
  if (n > kScopeBlocks) n = kScopeBlocks;  // older ones were overwritten: they stay counted
  for (unsigned i = 1; i <= n; ++i) {      // newest first: an address freed and reused there
    const ScopeBlock& b = tls_scope_blocks[static_cast<std::uint8_t>(flags.scope_blocks - i) % kScopeBlocks];
    if (b.p != p || b.requested != bytes) continue;
    CountScopeAlloc(flags, BlockSize(b.p), true);
    return;
  }
}

// The body of OnFreeSlow. True: the block was queued (see live_map.hpp) and
// the caller must not release it.
HEAPPROF_ALWAYS_INLINE bool FreeSlowPath(void* p, std::size_t n, unsigned how, ReleaseFn release) noexcept {
  ThreadFlags& flags = tls_thread_flags;
  // Inside a heapprof::allocator's deallocate, the global hook's free of the
  // block it passes down is the allocator's own, which it counted itself:
  // uncounted, unless a sampled object's (never lost). Any other block freed
  // in its upstream call is counted as anywhere (CountedInScope); in the
  // profiler's own SuppressHooks nothing is. A heapprof::allocator's own free
  // (sized) there is a signal handler's: counted as any.
  bool counted = true;
  if (HEAPPROF_UNLIKELY(flags.suppress) && (how & kFreeSized) == 0 && !CountedInScope(flags, p)) {
    if (!MaybeSampled(p)) return false;
    counted = false;  // unless the live map has it
  }
  // What Stats count: the caller's size (heapprof::allocator), or the block's
  // usable size (the global hooks), read while the block is still ours.
  // Start-up first: it decides how BlockSize reads (and warms it up).
  if (flags.guard == 0 && !flags.exiting) EnsureInit();
  if ((how & kFreeSized) == 0) n = BlockSize(p);
  // Even under the guard: a sampled object's free must never be lost.
  if (MaybeSampled(p)) {
    if (HEAPPROF_UNLIKELY(g_live_map.HeldByThisThread(p))) {
      // A signal handler freeing while its thread holds p's shard lock.
      if ((how & kFreeCanDefer) != 0) {
        if (PushDeferredFree(p, n, how, release)) return true;
        // Every slot taken: the block goes on a list through the blocks. A
        // global hook's (its size is read again at the drain), or a
        // heapprof::allocator one with room for its size and release.
        if ((how & kFreeSized) == 0 && n >= sizeof(void*)) {
          PushOverflowFree(p);
          return true;
        }
        if ((how & kFreeSized) != 0 && release != nullptr && n >= sizeof(SizedOverflowNode)) {
          PushSizedOverflowFree(p, n, release);
          return true;
        }
      }
      // Cannot wait and cannot queue (a heapprof::allocator whose upstream
      // has state, or a block too small for the list): count the free now;
      // the map entry stays until the address is sampled again, when Insert
      // retires it as freed.
    } else {
      Bucket* b;
      {
        ReentrancyGuard guard;  // a handler allocating now must not sample (and lock) here
        b = g_live_map.Remove(p, (how & kFreeSized) != 0);  // sized: a heapprof::allocator's
      }
      if (b != nullptr) {
        CountSampledFree(b);
        counted = true;
      }
    }
  }
  if (counted) CountFree(flags, n);
  DrainDeferredFrees();
  return false;
}

// A heapprof::allocator block goes back through its upstream inside
// SuppressHooks (so that the upstream's operator delete is not counted
// again). A signal handler's allocation or free in that window would be
// suppressed with it: not counted, and a sampled object's entry left in the
// map. So the window runs with signals blocked; only deferred frees get here.
inline void ReleaseWithSignalsBlocked(ReleaseFn release, void* p, std::size_t n) noexcept {
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &saved);
  release(p, n);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

// Out of every lock now, each queued free is removed from the map, counted
// and released.
HEAPPROF_NOINLINE inline void DrainDeferredFreesNow() noexcept {
  LiveMapThreadState& t = tls_live_map;
  if (t.draining || t.held_shard != nullptr) return;  // (queued: DrainDeferredFrees checked it)
  t.draining = true;
  DeferredFree f;
  for (;;) {
    while (PopDeferredFree(f)) {
      if (FreeSlowPath(f.p, f.n, f.how & ~kFreeCanDefer, nullptr)) continue;
      if (f.release != nullptr) {
        ReleaseWithSignalsBlocked(f.release, f.p, f.n);
      } else {
        g_release_block(f.p);
      }
    }
    void* list = TakeOverflowFrees(t.overflow);
    void* sized = TakeOverflowFrees(t.overflow_sized);
    if (list == nullptr && sized == nullptr) break;
    while (list != nullptr) {
      void* next;
      std::memcpy(&next, list, sizeof next);
      __atomic_fetch_sub(&t.queued, 1u, __ATOMIC_RELAXED);
      if (!FreeSlowPath(list, 0, 0, nullptr)) g_release_block(list);  // (how 0: its size is read again)
      list = next;
    }
    while (sized != nullptr) {
      SizedOverflowNode node;
      std::memcpy(&node, sized, sizeof node);
      __atomic_fetch_sub(&t.queued, 1u, __ATOMIC_RELAXED);
      if (!FreeSlowPath(sized, node.n, kFreeSized, nullptr)) ReleaseWithSignalsBlocked(node.release, sized, node.n);
      sized = node.next;
    }
  }
  t.draining = false;
}

}  // namespace detail
}  // namespace heapprof
