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
#include <cstdint>
#include <cstring>
#include <pthread.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include "heapprof/config.hpp"

namespace heapprof {
namespace detail {

// [lo, hi) of the calling thread's stack; {0, 0} if unknown. Called once per
// thread from the registration slow path (pthread_getattr_np may allocate for
// the main thread; the reentrancy guard makes that invisible to the profiler).
inline void CurrentStackBounds(std::uintptr_t& lo, std::uintptr_t& hi) noexcept {
  lo = hi = 0;
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
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
// the kernel for one byte of each page from the frame's up
// (process_vm_readv on ourselves, one-byte elements: it stops at the first
// page it cannot read, where a plain load would fault: a guard page, a hole;
// 64 bytes copied, not the pages), at most kForeignStackProbePages pages (a
// coroutine's frames are rarely deeper). Only samples taken on such a stack
// ask. Not under a seccomp filter (UnderSeccompFilter): there the call may be
// one that kills the process rather than fails; the stack is then the leaf
// alone, as it is where the call is refused.
constexpr std::size_t kForeignStackProbePages = 64;

// Whether the process runs under a seccomp filter ("Seccomp:\t2" in
// /proc/self/status). systemd's SystemCallFilter=@system-service, for one,
// kills a process that calls process_vm_readv. A filter, once installed,
// stays: seen once, it is never read again; not seen, the file is read again
// at most once a second (a program may install one later). Unreadable: taken
// as a filter.
inline std::atomic<int> g_seccomp_filter{-1};  // -1 unknown, 0 none seen, 1 filter
inline std::atomic<std::int64_t> g_seccomp_read_at{0};  // CLOCK_MONOTONIC_COARSE seconds of the last read

__attribute__((noinline)) inline int ReadSeccompMode() noexcept {
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 1;
  // Read in pieces, keeping the key's length of overlap, so the buffer stays
  // small (this runs on whatever stack the sample is on under the sanitizers).
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
  int state = g_seccomp_filter.load(std::memory_order_relaxed);
  if (state == 1) return true;
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  if (state == 0 && g_seccomp_read_at.load(std::memory_order_relaxed) == now.tv_sec) return false;
  state = ReadSeccompMode();
  g_seccomp_read_at.store(now.tv_sec, std::memory_order_relaxed);
  g_seccomp_filter.store(state, std::memory_order_relaxed);
  return state == 1;
}

inline void ForeignStackBounds(std::uintptr_t frame, std::uintptr_t& lo, std::uintptr_t& hi) noexcept {
  lo = hi = 0;
  stack_t alt;
  if (sigaltstack(nullptr, &alt) == 0 && (alt.ss_flags & SS_DISABLE) == 0 && alt.ss_sp != nullptr) {
    const auto base = reinterpret_cast<std::uintptr_t>(alt.ss_sp);
    if (frame >= base && frame - base < alt.ss_size) {
      lo = frame;
      hi = base + alt.ss_size;
      return;
    }
  }
  if (UnderSeccompFilter()) return;
  constexpr std::uintptr_t kPage = 4096;
  const std::uintptr_t first = frame & ~(kPage - 1);
  char bytes[kForeignStackProbePages];  // one byte of each page, never read
  iovec local{bytes, sizeof bytes};
  iovec remote[kForeignStackProbePages];
  for (std::size_t i = 0; i < kForeignStackProbePages; ++i) {
    remote[i].iov_base = reinterpret_cast<void*>(first + i * kPage);
    remote[i].iov_len = 1;
  }
  // A partial transfer stops at an element's boundary: `got` pages readable.
  const ssize_t got = process_vm_readv(getpid(), &local, 1, remote, kForeignStackProbePages, 0);
  if (got <= 0) return;
  const std::uintptr_t end = first + static_cast<std::uintptr_t>(got) * kPage;
  if (end <= frame) return;
  lo = frame;
  hi = end;
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

// Walks the frame-pointer chain starting at `frame`, the frame record of the
// profiler's slow-path function. `hook_return` is the return address of the
// hook (operator new, allocator::allocate): it becomes the leaf. The first
// record's return address points into the hook itself and is skipped; if the
// hook kept a frame pointer, the next record's return address equals
// `hook_return` and is skipped as well, so the stack is the same whichever way
// the user's compiler built the hook.
// Not instrumented by ASan: in code without frame pointers rbp can point into
// a live frame's redzone; the bounds checks keep the read itself safe.
HEAPPROF_NO_SANITIZE_ADDRESS
inline void UnwindFramePointers(const void* frame, const void* hook_return, std::uintptr_t stack_lo,
                                std::uintptr_t stack_hi, CapturedStack& out) noexcept {
  out.depth = 0;
  out.truncated = false;
  const auto leaf = reinterpret_cast<std::uintptr_t>(hook_return);
  if (leaf == 0) return;
  out.pcs[out.depth++] = leaf;

  auto fp = reinterpret_cast<std::uintptr_t>(frame);
  auto valid = [&](std::uintptr_t f) {
    return (f & 7) == 0 && f >= stack_lo && f < stack_hi && stack_hi - f >= 2 * sizeof(void*);
  };
  if (!valid(fp)) return;
  // Record layout on x86-64 and aarch64 alike: [fp] = caller's fp, [fp+8] = return address.
  std::uintptr_t next = reinterpret_cast<const std::uintptr_t*>(fp)[0];  // skips our own return
  // The hook's own record, when the hook kept a frame pointer: its return
  // address is the leaf. It may be the second record: a hook's cold function
  // (block_hooks.hpp) that the hook called without a tail call (-O0) has a
  // record of its own first, returning into the hook.
  if (valid(next) && next > fp) {
    const auto* r1 = reinterpret_cast<const std::uintptr_t*>(next);
    if (r1[1] == leaf) {
      fp = next;
      next = r1[0];
    } else if (valid(r1[0]) && r1[0] > next) {
      const auto* r2 = reinterpret_cast<const std::uintptr_t*>(r1[0]);
      if (r2[1] == leaf) {
        fp = r1[0];
        next = r2[0];
      }
    }
  }
  while (valid(next) && next > fp) {
    fp = next;
    const std::uintptr_t ret = reinterpret_cast<const std::uintptr_t*>(fp)[1];
    next = reinterpret_cast<const std::uintptr_t*>(fp)[0];
    if (ret == 0) break;
    if (out.depth == HEAPPROF_MAX_FRAMES) {
      out.truncated = true;
      break;
    }
    out.pcs[out.depth++] = ret;
  }
}

}  // namespace detail
}  // namespace heapprof
