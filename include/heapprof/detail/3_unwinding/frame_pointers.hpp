// heapprof: the frame-pointer unwinder and thread stack bounds.
//
// Invariant 4: the unwinder never faults. Every frame record is read only after
// checking it lies inside [stack_lo, stack_hi) of the calling thread, above the
// previous record and 8-byte aligned; a record that fails any check ends the
// stack. Code built without frame pointers yields short or partial stacks here,
// never a crash; the table unwinder (unwind_table.hpp) is for that code.
#pragma once

#include <fcntl.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <ucontext.h>
#include <sys/auxv.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/proc_self.hpp"

namespace heapprof {
namespace detail {

// The main thread's stack as glibc's pthread_getattr_np gives it, without
// its /proc/self/maps read (40-90 us, 126,000 instructions: a third of what
// heapprof added to a small program's start-up with sampling off). False
// where the answer could differ: hi is the page above __libc_stack_end; the
// stack mapping ends where the kernel put AT_EXECFN's string, 8 bytes below
// its end (checked: page-aligned, above hi, the 8 bytes between zero; not so
// under valgrind, which builds the stack its own way); lo is the soft RLIMIT_STACK
// below that end. glibc also caps the size at the mapping below, which it
// reads from the maps file: taken only for a limit of at most 128 MiB, the
// least gap the kernel leaves between the stack's top and its mmap area
// whatever the limit was at exec (the gap follows that limit, not one a
// setrlimit raised later: with ASLR off, as under gdb, a limit raised to 1 GiB
// gave a lo 1 GiB down, across ld.so's mappings, where glibc's stops at
// them), else pthread_getattr_np. And only when the caller's frame lies in
// [lo, hi): the child of a fork from another thread has the pid as its tid,
// and the forking thread's stack (not this one) as its own.
extern "C" void* __libc_stack_end __attribute__((__weak__));
inline bool MainStackBounds(std::uintptr_t& lo, std::uintptr_t& hi) noexcept {
#if defined(__GLIBC__) && defined(__linux__)
  if (&__libc_stack_end == nullptr || __libc_stack_end == nullptr) return false;
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto* execfn = reinterpret_cast<const char*>(::getauxval(AT_EXECFN));
  rlimit rl{};
  if (page <= 0 || execfn == nullptr || ::getrlimit(RLIMIT_STACK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
      rl.rlim_cur > (rlim_t{128} << 20)) {
    return false;
  }
  const auto mask = static_cast<std::uintptr_t>(page) - 1;
  const std::uintptr_t top = (reinterpret_cast<std::uintptr_t>(__libc_stack_end) & ~mask) + mask + 1;
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(execfn) + std::strlen(execfn) + 1 + sizeof(void*);
  if ((end & mask) != 0 || end < top || end - top >= rl.rlim_cur) return false;
  // The kernel's 8 zero bytes above the string (in the string's page: end is
  // page-aligned, the string's NUL is the byte below them).
  std::uint64_t marker;
  std::memcpy(&marker, reinterpret_cast<const void*>(end - sizeof marker), sizeof marker);
  if (marker != 0) return false;
  const std::uintptr_t size = (rl.rlim_cur - (end - top)) & ~mask;
  if (size == 0 || size > top) return false;
  const auto sp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (sp < top - size || sp >= top) return false;
  lo = top - size;
  hi = top;
  return true;
#else
  (void)lo;
  (void)hi;
  return false;
#endif
}

// Binds, on the roomy stack of the thread that starts the profiler, the
// allocator functions glibc's pthread_getattr_np calls through libc's PLT
// (calloc, realloc, free: its cpuset copy, through
// pthread_attr_setaffinity_np). In a lazily bound libc the first call of
// each runs the dynamic linker's resolver, which saves the vector registers
// on the stack (KiBs): registering a thread that first allocates deep in a
// 16 KiB stack overflowed it. (The main thread's registration, which bound
// them, no longer calls pthread_getattr_np: MainStackBounds.)
// Also this object's own PLT slots of the calls CurrentStackBounds makes
// (pthread_getattr_np itself is called through g_getattr_np when it is
// known: no slot).
//
// glibc's pthread_getattr_np itself, looked up once (EnsureInit): in a
// non-PIE executable &pthread_getattr_np is the executable's PLT stub, and
// a thread whose first allocation was inside glibc's hung (the realloc there
// registered it, and registration calls pthread_getattr_np, whose lock that
// thread held: engine.hpp, DeferRegistration). Null until EnsureInit, or if
// the lookup failed.
using GetattrFn = int (*)(pthread_t, pthread_attr_t*);
inline std::atomic<GetattrFn> g_getattr_np{nullptr};
inline void BindStackBoundsCalls() noexcept {
#if defined(__GLIBC__) && defined(__linux__)
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  (void)pthread_attr_setaffinity_np(&attr, sizeof set, &set);
  void* addr = nullptr;
  std::size_t size = 0;
  (void)pthread_attr_getstack(&attr, &addr, &size);
  pthread_attr_destroy(&attr);
  (void)pthread_self();
#endif
}

// [lo, hi) of the calling thread's stack; {0, 0} if unknown. Called once per
// thread from the registration slow path (pthread_getattr_np may allocate for
// the main thread; the reentrancy guard makes that invisible to the profiler).
inline void CurrentStackBounds(std::uintptr_t& lo, std::uintptr_t& hi) noexcept {
  lo = hi = 0;
#if defined(__linux__)
  if (::syscall(SYS_gettid) == ::getpid() && MainStackBounds(lo, hi)) return;
#endif
  pthread_attr_t attr;
  GetattrFn getattr = g_getattr_np.load(std::memory_order_relaxed);
  if (getattr == nullptr) getattr = &pthread_getattr_np;
  if (getattr(pthread_self(), &attr) != 0) return;
  void* addr = nullptr;
  std::size_t size = 0;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0 && addr != nullptr) {
    lo = reinterpret_cast<std::uintptr_t>(addr);
    hi = lo + size;
  }
  pthread_attr_destroy(&attr);
}

// Bounds for a walk from `frame` when it is not on the thread's own stack:
// a signal handler on its sigaltstack, or a stack the program switched to
// (makecontext/swapcontext, boost.context, fibers). {0, 0} when unknown (then
// the stack is the leaf alone, as it always was before).
//
// The alternate stack's bounds are exact (sigaltstack). Anything else is an
// allocation of the program's whose extent we do not know: the walk may read
// [frame, hi) where hi is where memory stops being readable, found by asking
// the kernel to read 8 bytes of each page from the frame's up, at most
// kForeignStackProbePages pages (a coroutine's frames are rarely deeper):
// it stops at the first page it cannot read, where a plain load would fault
// (a guard page, a hole). Only samples taken on such a stack ask.
//
// The kernel reads them as rt_sigprocmask's new mask with an invalid `how`:
// it copies the mask in first (EFAULT where it cannot) and only then refuses
// the `how` (EINVAL), changing nothing. Every program makes that call, and no
// seccomp filter kills it. (This was process_vm_readv on ourselves, skipped
// under a filter, which may kill for it: a SystemCallFilter= without @ipc does. The
// filter was looked for in /proc/self/status at most once a second, so one
// installed within that second, or on another thread than the one that
// looked, killed the process at the next such sample.)
constexpr std::size_t kForeignStackProbePages = 64;

// Whether the process runs under a seccomp filter ("Seccomp:\t2" in
// /proc/thread-self/status). For the retention scan's reader, which uses
// process_vm_readv where there is none (thousands of calls: a filter may
// kill for it). Once seen, never read again (a filter stays); until then the
// file is read at each question (a filter may have come since, on this
// thread or through another one's TSYNC; a scan asks twice). Unreadable:
// taken as a filter.
inline std::atomic<int> g_seccomp_filter{-1};  // -1 unknown, 0 none seen, 1 filter

__attribute__((__noinline__)) inline int ReadSeccompMode() noexcept {
  const int fd = ::open(ProcSelfPath("status").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 1;
  // Read in pieces, keeping the key's length of overlap, so the buffer stays
  // small.
  static constexpr char kKey[] = "\nSeccomp:\t";
  constexpr std::size_t kKeyLen = sizeof kKey - 1;
  char buf[512 + kKeyLen + 1];
  std::size_t kept = 0;
  int mode = 1;
  for (;;) {
    const ssize_t n = ::read(fd, buf + kept, sizeof buf - 1 - kept);
    if (n <= 0) break;
    const std::size_t have = kept + static_cast<std::size_t>(n);
    buf[have] = '\0';
    if (const char* at = std::strstr(buf, kKey)) {
      if (at + kKeyLen < buf + have) {
        mode = at[kKeyLen] == '2' ? 1 : 0;
        break;
      }
    }
    kept = have < kKeyLen ? have : kKeyLen;
    std::memmove(buf, buf + have - kept, kept);
  }
  ::close(fd);
  return mode;
}

inline bool UnderSeccompFilter() noexcept {
  if (g_seccomp_filter.load(std::memory_order_relaxed) == 1) return true;
  const int state = ReadSeccompMode();
  g_seccomp_filter.store(state, std::memory_order_relaxed);
  return state == 1;
}

// Whether the kernel can read the 8 bytes at `at` (ForeignStackBounds).
inline bool KernelCanRead(const void* at) noexcept {
  constexpr long kInvalidHow = 0x7fff;
  constexpr long kKernelSigsetBytes = 8;  // _NSIG / 8 on x86-64 and aarch64
  return ::syscall(SYS_rt_sigprocmask, kInvalidHow, at, nullptr, kKernelSigsetBytes) == -1 && errno == EINVAL;
}

// Readable pages from `first` on (page-aligned), at most `pages` of them
// (<= kForeignStackProbePages): asks the kernel, never faults. 0 when none,
// or when the probe does not tell (page 0 reads as readable: a filter that
// fails the call with EINVAL, or page 0 mapped). Keeps errno.
inline std::size_t ReadablePages(std::uintptr_t first, std::size_t pages) noexcept {
  constexpr std::uintptr_t kPage = 4096;
  if (pages > kForeignStackProbePages) pages = kForeignStackProbePages;
  const int saved_errno = errno;
  std::size_t got = 0;
  if (!KernelCanRead(reinterpret_cast<const void*>(std::uintptr_t{8}))) {
    while (got < pages && KernelCanRead(reinterpret_cast<const void*>(first + got * kPage))) ++got;
  }
  errno = saved_errno;
  return got;
}

// How far above a sample a stack of unknown extent is followed: a walk that
// reaches the probe's limit (`capped` below) and needs a frame above it asks
// for the pages up to that frame (ExtendForeignStack) and walks again, up to
// this many bytes above the sample; past it the stack is cut and marked
// truncated (engine.hpp: CaptureStack).
constexpr std::uintptr_t kForeignStackMaxBytes = std::uintptr_t{8} << 20;

enum class Extended { kNo, kYes, kCut };

// Raises `hi`, the top of ForeignStackBounds' stack from `lo` (page-aligned:
// the probe's limit), so that the record or CFA at `target` lies below it.
// kYes: done, every page up to there is readable (one probe, at most
// kForeignStackProbePages pages). kNo: a page between is not, or `target` is
// farther above `hi` than one probe reaches (no frame is that large): the
// address is on no stack contiguous with this one, the chain left it.
// kCut: `target` is within reach but kForeignStackMaxBytes above `lo`.
inline Extended ExtendForeignStack(std::uintptr_t lo, std::uintptr_t& hi, std::uintptr_t target) noexcept {
  constexpr std::uintptr_t kPage = 4096;
  if (target < hi) return Extended::kNo;
  const std::uintptr_t want = (target + 16 + kPage - 1) & ~(kPage - 1);  // a record's two words
  if ((want - hi) / kPage > kForeignStackProbePages) return Extended::kNo;
  if (want - lo > kForeignStackMaxBytes) return Extended::kCut;
  if ((hi & (kPage - 1)) != 0) return Extended::kNo;
  const std::size_t got = ReadablePages(hi, kForeignStackProbePages);
  if (hi + got * kPage < want) return Extended::kNo;
  hi += got * kPage;
  if (hi - lo > kForeignStackMaxBytes) hi = lo + kForeignStackMaxBytes;  // (lo: 8-aligned, the walk's bound)
  return Extended::kYes;
}

// `capped` (when not null): set when [lo, hi) ends at the probe's limit
// rather than where readable memory ends (the stack may go on above).
inline void ForeignStackBounds(std::uintptr_t frame, std::uintptr_t& lo, std::uintptr_t& hi,
                               bool* capped = nullptr) noexcept {
  lo = hi = 0;
  if (capped != nullptr) *capped = false;
  stack_t alt;
  if (sigaltstack(nullptr, &alt) == 0 && (alt.ss_flags & SS_DISABLE) == 0 && alt.ss_sp != nullptr) {
    const auto base = reinterpret_cast<std::uintptr_t>(alt.ss_sp);
    if (frame >= base && frame - base < alt.ss_size) {
      lo = frame;
      hi = base + alt.ss_size;
      return;
    }
  }
  constexpr std::uintptr_t kPage = 4096;
  const std::uintptr_t first = frame & ~(kPage - 1);
  const std::size_t got = ReadablePages(first, kForeignStackProbePages);
  if (got == 0) return;
  const std::uintptr_t end = first + static_cast<std::uintptr_t>(got) * kPage;
  if (end <= frame) return;
  lo = frame;
  hi = end;
  if (capped != nullptr) *capped = got == kForeignStackProbePages;
}

// One captured stack: return addresses, leaf first.
struct CapturedStack {
  std::uintptr_t pcs[HEAPPROF_MAX_FRAMES];
  int depth = 0;
  bool truncated = false;
  // Set by the table unwinder: where the thread's walk record keeps what the
  // profiler interned for this stack (null: no record). `*interned` is
  // non-null only when this stack is the record's previous one, frame for
  // frame (then it is what was interned for that one).
  const void** interned = nullptr;
};

// The kernel's signal frame on x86-64 Linux, as the frame-pointer walk meets
// it: a handler built with frame pointers pushed the interrupted code's rbp
// (the kernel leaves rbp alone) and returned into the signal trampoline
// (glibc's __restore_rt, the sa_restorer the kernel pushed), and the
// rt_sigframe's ucontext_t starts right above that return address, at
// record + 16. Its uc_mcontext.gregs hold the interrupted registers.
// Offsets: the kernel's ucontext layout (checked against glibc's below).
constexpr std::uintptr_t kUcFlags = 0, kUcLink = 8;
constexpr std::uintptr_t kUcGregs = 40;                 // offsetof(ucontext_t, uc_mcontext.gregs)
constexpr std::uintptr_t kUcRbp = kUcGregs + 10 * 8;    // REG_RBP
constexpr std::uintptr_t kUcRsp = kUcGregs + 15 * 8;    // REG_RSP
constexpr std::uintptr_t kUcRip = kUcGregs + 16 * 8;    // REG_RIP
constexpr std::uintptr_t kUcCsGsFs = kUcGregs + 18 * 8; // REG_CSGSFS: cs in the low 16 bits
constexpr std::uintptr_t kUcChecked = kUcCsGsFs + 8;    // bytes read from the ucontext
#if defined(HEAPPROF_ARCH_X86_64)
static_assert(offsetof(ucontext_t, uc_mcontext) == kUcGregs, "the kernel's ucontext layout");
static_assert(offsetof(ucontext_t, uc_link) == kUcLink, "the kernel's ucontext layout");
#endif

// Whether the record at `rec` (saved fp `next`) is a handler's, returning
// into the trampoline with the kernel's frame above it (its return address
// is not checked: a handler installed by other means than glibc's sigaction
// has another trampoline):
// that frame's uc_flags are the kernel's (UC_FP_XSTATE | UC_SIGCONTEXT_SS |
// UC_STRICT_RESTORE_SS at most), uc_link is null, the saved rbp is the one the
// handler pushed and cs is the 64-bit user code segment (0x33). The first
// test (one load) fails for almost every other record.
HEAPPROF_NO_SANITIZE_ADDRESS HEAPPROF_ALWAYS_INLINE bool LooksLikeSignalFrame(const std::uintptr_t* rec,
                                                                            std::uintptr_t next,
                                                                            std::uintptr_t stack_hi) noexcept {
#if defined(HEAPPROF_ARCH_X86_64)
  const auto uc = reinterpret_cast<std::uintptr_t>(rec) + 16;
  if (stack_hi - uc < kUcChecked) return false;  // (rec is below stack_hi - 16: no wrap)
  // Plain loads in this function, not in a lambda: a lambda is a function of
  // its own, without the no_sanitize_address above, and ASan reported these
  // reads of other frames' words as stack-buffer-overflows.
  const auto* ctx = reinterpret_cast<const std::uintptr_t*>(uc);
  if (HEAPPROF_LIKELY(ctx[kUcRbp / 8] != next)) return false;
  return ctx[kUcFlags / 8] < 8 && ctx[kUcLink / 8] == 0 && (ctx[kUcCsGsFs / 8] & 0xffff) == 0x33;
#else
  (void)rec, (void)next, (void)stack_hi;
  return false;
#endif
}

// On the thread's own stack the interrupted code's frame record (at or above
// its sp) lies above the kernel's signal frame, its ucontext and siginfo and
// the red zone it skipped: far more than this above the handler's record.
constexpr std::uintptr_t kMinSignalFrameGap = 512;

template <bool kThroughHook>
HEAPPROF_NO_SANITIZE_ADDRESS HEAPPROF_ALWAYS_INLINE bool FramePointerChain(
    std::uintptr_t fp, std::uintptr_t next, std::uintptr_t stack_lo, std::uintptr_t stack_hi, CapturedStack& out,
    std::uintptr_t own_lo, std::uintptr_t own_hi, std::uintptr_t* beyond) noexcept;

// Out of the handler's record at `fp` (returning to the trampoline) into
// the interrupted code, from the kernel's frame above it, and on.
template <bool kThroughHook>
HEAPPROF_NO_SANITIZE_ADDRESS __attribute__((__noinline__)) bool FramePointersAfterSignal(
    std::uintptr_t fp, std::uintptr_t stack_hi, CapturedStack& out, std::uintptr_t own_lo, std::uintptr_t own_hi,
    std::uintptr_t* beyond) noexcept {
#if defined(HEAPPROF_ARCH_X86_64)
  const std::uintptr_t uc = fp + 16;
  if (stack_hi - uc < kUcChecked) return kThroughHook;  // (fp + 16 <= stack_hi: the walk checked)
  const auto* ctx = reinterpret_cast<const std::uintptr_t*>(uc);  // (not a lambda: see LooksLikeSignalFrame)
  const std::uintptr_t pc = ctx[kUcRip / 8], sp = ctx[kUcRsp / 8];
  if (pc == 0 || pc == ~std::uintptr_t{0} || (sp & 7) != 0) return kThroughHook;
  if (sp < uc + kUcChecked || sp >= stack_hi) {
    // Another stack: the thread's own, below the handler's sigaltstack.
    // Once: from there on, callers lie above; that stack's top is known.
    if (own_hi == 0 || sp < own_lo || sp >= own_hi) return kThroughHook;
    stack_hi = own_hi;
    own_hi = 0;
    beyond = nullptr;
  }
  if (out.depth == HEAPPROF_MAX_FRAMES) {
    out.truncated = true;
    return kThroughHook;
  }
  out.pcs[out.depth++] = pc + 1;
  // Its callers, from its rbp: records at or above its sp.
  return FramePointerChain<kThroughHook>(sp - 8, ctx[kUcRbp / 8], sp, stack_hi, out, own_lo, own_hi, beyond);
#else
  (void)fp, (void)stack_hi, (void)out, (void)own_lo, (void)own_hi, (void)beyond;
  return kThroughHook;
#endif
}

// The chain from the record at `fp` (checked: aligned, at or above
// `stack_lo`, two words below `stack_hi`), whose saved fp is `next`,
// appended to `out`; returns kThroughHook (see UnwindFramePointers).
//
// A step to a record 8 to 504 bytes above the last one (almost every step)
// needs two more checks: aligned, and two words below the top; the bottom
// holds by induction. Anything else (a frame of 512 bytes or more, the end
// of the chain, a record on another stack) takes the rare branch, which is
// where a signal frame shows: the handler's record, whose saved fp, the
// interrupted code's, lies above the kernel's frame (or on the thread's own
// stack, below its sigaltstack). That leaves through a tail call: the walk
// needs no registers saved (with the step inline, or called, it saved and
// restored up to six: 2-3 ns a walk, bench_unwind).
template <bool kThroughHook>
HEAPPROF_NO_SANITIZE_ADDRESS HEAPPROF_ALWAYS_INLINE bool FramePointerChain(
    std::uintptr_t fp, std::uintptr_t next, std::uintptr_t stack_lo, std::uintptr_t stack_hi, CapturedStack& out,
    std::uintptr_t own_lo, std::uintptr_t own_hi, std::uintptr_t* beyond) noexcept {
  (void)stack_lo;  // next > fp >= stack_lo
  const std::uintptr_t top = stack_hi - 2 * sizeof(void*);  // the highest record
  for (;;) {
    if (HEAPPROF_UNLIKELY(next - fp - 8 >= kMinSignalFrameGap - 8)) {
      if (LooksLikeSignalFrame(reinterpret_cast<const std::uintptr_t*>(fp), next, stack_hi)) {
        return FramePointersAfterSignal<kThroughHook>(fp, stack_hi, out, own_lo, own_hi, beyond);
      }
      if (next <= fp) return kThroughHook;
    }
    if ((next & 7) != 0 || next > top) {
      if (beyond != nullptr && (next & 7) == 0 && next >= stack_hi) *beyond = next;
      return kThroughHook;
    }
    fp = next;
    const auto* rec = reinterpret_cast<const std::uintptr_t*>(fp);
    const std::uintptr_t ret = rec[1];
    next = rec[0];
    if (ret == 0) return kThroughHook;
    if (out.depth == HEAPPROF_MAX_FRAMES) {
      out.truncated = true;
      return kThroughHook;
    }
    out.pcs[out.depth++] = ret;
  }
}

// Walks the frame-pointer chain starting at `frame`, the frame record of the
// profiler's slow-path function. `hook_return` is the return address of the
// hook (operator new, allocator::allocate): it becomes the leaf. The first
// record's return address points into the hook itself and is skipped; if the
// hook kept a frame pointer, the next record's return address equals
// `hook_return` and is skipped as well, so the stack is the same whichever way
// the user's compiler built the hook.
// Not instrumented by ASan: in code without frame pointers rbp can point into
// a live frame's redzone; the bounds checks keep the read itself safe.
//
// Returns whether the chain was seen to pass through the hook: a record
// returning to `hook_return` among the first two. False means the hook's
// code reused rbp (the implementation unit built without frame pointers, a
// hook that did not reach its cold function with a tail call): the frames
// after the leaf may then be wrong, and the caller walks with the tables
// instead (engine.hpp: CaptureStack).
//
// A signal frame (x86-64) is stepped through into the code the signal
// interrupted, as the table unwinder does: the trampoline's address, then the
// interrupted PC + 1 (the instruction at it had not run; a frame's pc - 1 is
// the one looked up), then that code's chain from its rbp. When the handler
// ran on another stack (its sigaltstack) the interrupted code is walked within
// [its sp, own_hi) if its sp lies in [own_lo, own_hi), the thread's stack.
//
// `beyond`: set (when not null) to the next record's address when the walk
// stopped only because that record lies at or above `stack_hi` (a stack whose
// top is not known, ForeignStackBounds), else 0.
// Out of line: the chain's loop then needs no register saved (see
// FramePointerChain); inlined into a caller's loop it kept six.
HEAPPROF_NO_SANITIZE_ADDRESS __attribute__((__noinline__))
inline bool UnwindFramePointers(const void* frame, const void* hook_return, std::uintptr_t stack_lo,
                                std::uintptr_t stack_hi, CapturedStack& out, std::uintptr_t own_lo = 0,
                                std::uintptr_t own_hi = 0, std::uintptr_t* beyond = nullptr) noexcept {
  out.depth = 0;
  out.truncated = false;
  if (beyond != nullptr) *beyond = 0;
  const auto leaf = reinterpret_cast<std::uintptr_t>(hook_return);
  if (leaf == 0) return true;
  out.pcs[out.depth++] = leaf;

  auto fp = reinterpret_cast<std::uintptr_t>(frame);
  auto valid = [&](std::uintptr_t f) {
    return (f & 7) == 0 && f >= stack_lo && f < stack_hi && stack_hi - f >= 2 * sizeof(void*);
  };
  if (!valid(fp)) return true;
  // Record layout on x86-64 and aarch64 alike: [fp] = caller's fp, [fp+8] = return address.
  std::uintptr_t next = reinterpret_cast<const std::uintptr_t*>(fp)[0];  // skips our own return
  // The hook's own record, when the hook kept a frame pointer: its return
  // address is the leaf. It may be the second record: a hook's cold function
  // (block_hooks.hpp) that the hook called without a tail call (-O0) has a
  // record of its own first, returning into the hook.
  bool through_hook = false;
  if (valid(next) && next > fp) {
    const auto* r1 = reinterpret_cast<const std::uintptr_t*>(next);
    if (r1[1] == leaf) {
      fp = next;
      next = r1[0];
      through_hook = true;
    } else if (valid(r1[0]) && r1[0] > next) {
      const auto* r2 = reinterpret_cast<const std::uintptr_t*>(r1[0]);
      if (r2[1] == leaf) {
        fp = r1[0];
        next = r2[0];
        through_hook = true;
      }
    }
  }
  if (HEAPPROF_LIKELY(through_hook)) return FramePointerChain<true>(fp, next, stack_lo, stack_hi, out, own_lo, own_hi, beyond);
  return FramePointerChain<false>(fp, next, stack_lo, stack_hi, out, own_lo, own_hi, beyond);
}

}  // namespace detail
}  // namespace heapprof
