// heapprof: the frame-pointer unwinder and thread stack bounds.
//
// Invariant 4: the unwinder never faults. Every frame record is read only after
// checking it lies inside [stack_lo, stack_hi) of the calling thread, above the
// previous record and 8-byte aligned; a record that fails any check ends the
// stack. Code built without frame pointers yields short or partial stacks here,
// never a crash; the table unwinder (unwind_table.hpp) is for that code.
#pragma once

#include <cstdint>
#include <pthread.h>

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
