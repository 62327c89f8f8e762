// heapprof: a stack of the profiler's own, for samples taken where the
// caller's stack is short.
//
// A sample needs a few KiB of stack: the unwinder's buffer, the interning, and
// on rare occasions much more (the first sample in an object builds its
// unwind table; the first call of a libc function through a lazily bound PLT
// saves the whole vector register file). A thread with a tiny stack, deep in
// its own frames, would overflow. So a sample runs in place only when the
// thread has kInPlaceStackHeadroom left below the hook; otherwise it runs on a
// per-thread stack mapped on first need (kProfilerStackBytes plus a guard
// page, MAP_NORESERVE: only touched pages cost memory), and then takes from the
// caller only what swapcontext and the switching frame need (a few hundred
// bytes; the hostile-process tests measure it).
//
// The switch is getcontext/makecontext/swapcontext: two sigprocmask calls, a
// microsecond, paid only by samples on short stacks. Not under ASan/TSan, whose
// stack bookkeeping does not follow a switch: there everything runs in place.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <new>

#include "heapprof/config.hpp"

namespace heapprof {
namespace detail {

// A sample runs on the caller's stack when at least this much of it is left.
constexpr std::size_t kInPlaceStackHeadroom = 64 * 1024;
// The profiler's stack, per thread that ever needed it.
constexpr std::size_t kProfilerStackBytes = 256 * 1024;

// True when `sp` lies in the thread's own stack [lo, hi) with at least `need`
// bytes below it. Elsewhere (a coroutine's or fiber's stack, a signal's
// alternate stack; bounds unknown: hi == 0) how much is left is not known,
// and it may be little: folly's fibers have 16 KiB, SIGSTKSZ is 8 KiB.
inline bool StackHasRoom(std::uintptr_t sp, std::uintptr_t lo, std::uintptr_t hi, std::size_t need) noexcept {
  return sp >= lo + need && sp < hi;
}

// The first word of every ProfilerStack ("heapprof"): the retention scan
// tells the profiler's stacks from the program's memory by it
// (ExitedThreadDtvRoots). Not a user-space address.
constexpr std::uint64_t kProfilerStackMagic = 0x666f727070616568ull;

struct ProfilerStack {
  std::uint64_t magic = kProfilerStackMagic;
  ucontext_t caller;
  ucontext_t callee;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  std::size_t mapped = 0;  // bytes of the mapping, this header and the guard page included
  bool busy = false;       // a signal handler's sample while we are on it runs in place
};

inline thread_local ProfilerStack* tls_profiler_stack HEAPPROF_TLS_MODEL = nullptr;

#if defined(HEAPPROF_ASAN) || defined(HEAPPROF_TSAN)
constexpr bool kCanSwitchStacks = false;
#else
constexpr bool kCanSwitchStacks = true;
#endif

// makecontext passes int arguments: the ProfilerStack's address in two halves.
inline void ProfilerStackEntry(unsigned hi, unsigned lo) noexcept {
  auto* s = reinterpret_cast<ProfilerStack*>((static_cast<std::uintptr_t>(hi) << 32) | lo);
  s->fn(s->arg);
  // Returning resumes uc_link: the caller's context.
}

// The ProfilerStack header's bytes at the top of its mapping: whole pages.
inline std::size_t ProfilerStackHeaderBytes() noexcept {
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t pg = page > 0 ? static_cast<std::size_t>(page) : 4096;
  return (sizeof(ProfilerStack) + pg - 1) / pg * pg;
}

// The calling thread's profiler stack, mapped on first use; null if out of memory.
inline ProfilerStack* ThisThreadProfilerStack() noexcept {
  if (ProfilerStack* s = tls_profiler_stack) return s;
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t pg = page > 0 ? static_cast<std::size_t>(page) : 4096;
  // [guard page][stack ........][ProfilerStack header], the stack growing down
  // towards the guard.
  const std::size_t header = ProfilerStackHeaderBytes();
  const std::size_t mapped = pg + kProfilerStackBytes + header;
  void* mem = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  mprotect(mem, pg, PROT_NONE);
  auto* s = new (static_cast<char*>(mem) + pg + kProfilerStackBytes) ProfilerStack();
  s->mapped = mapped;
  tls_profiler_stack = s;
  return s;
}

// At thread exit: unmaps the thread's profiler stack, if it had one.
inline void ReleaseProfilerStack() noexcept {
  ProfilerStack* s = tls_profiler_stack;
  if (s == nullptr || s->busy) return;
  tls_profiler_stack = nullptr;
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t pg = page > 0 ? static_cast<std::size_t>(page) : 4096;
  munmap(reinterpret_cast<char*>(s) - kProfilerStackBytes - pg, s->mapped);
}

// Switches to the thread's profiler stack (set up, idle) and back. The
// ProfilerStack is re-read from the thread-local after getcontext, which in
// general returns twice (the compiler must not keep it in a register across).
HEAPPROF_NOINLINE inline bool SwitchToProfilerStack() noexcept {
  if (getcontext(&tls_profiler_stack->callee) != 0) return false;
  ProfilerStack* s = tls_profiler_stack;
  s->callee.uc_stack.ss_sp = reinterpret_cast<char*>(s) - kProfilerStackBytes;
  s->callee.uc_stack.ss_size = kProfilerStackBytes;
  s->callee.uc_link = &s->caller;
  const auto bits = reinterpret_cast<std::uintptr_t>(s);
  // void (*)() is the type makecontext wants; GCC accepts a cast to it from
  // any function type.
  makecontext(&s->callee, reinterpret_cast<void (*)()>(&ProfilerStackEntry), 2,
              static_cast<unsigned>(bits >> 32), static_cast<unsigned>(bits & 0xffffffffu));
  return swapcontext(&s->caller, &s->callee) == 0;
}

// Runs fn(arg) on this thread's profiler stack. False, with fn not run, when
// it cannot: a sanitizer build, no memory, or already on it.
inline bool RunOnProfilerStack(void (*fn)(void*), void* arg) noexcept {
  if (!kCanSwitchStacks) return false;
  ProfilerStack* s = ThisThreadProfilerStack();
  if (s == nullptr || s->busy) return false;
  s->busy = true;
  s->fn = fn;
  s->arg = arg;
  const bool ok = SwitchToProfilerStack();
  tls_profiler_stack->busy = false;
  return ok;
}

inline void NothingToDo(void*) noexcept {}

// Binds, on a roomy stack, every libc function a switch calls: in a lazily
// bound program the first call of each goes through the dynamic linker's
// resolver, which saves the vector register file on the stack (KiBs): on a
// tiny stack that alone would overflow. Called once, by the thread that
// starts the profiler.
inline void PrepareProfilerStacks() noexcept {
  if (!kCanSwitchStacks) return;
  RunOnProfilerStack(&NothingToDo, nullptr);
  ReleaseProfilerStack();
}

}  // namespace detail
}  // namespace heapprof
