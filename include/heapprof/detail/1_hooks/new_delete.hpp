// heapprof: replacement global operator new/delete, every replaceable form.
// Included by <heapprof.hpp> only when HEAPPROF_REPLACE_NEW_DELETE is defined,
// which a program does in exactly one translation unit (these are ordinary,
// non-inline definitions: a second copy is a link error, as it should be).
// Without a supported platform (HEAPPROF_ENABLED 0) nothing is replaced.
//
// Behaviour is the standard library's (invariant 6): the new_handler loop and
// std::bad_alloc, nullptr from the nothrow forms, alignment honoured. new,
// new[] and every delete run the hot paths of block_hooks.hpp (HotAlloc,
// HotFree): on glibc ~20 instructions around new's malloc and 13 before
// delete's free, with no saved register but `n` and a tail call to free;
// under jemalloc or tcmalloc an unsized delete asks the allocator for the
// block's size inline; anything rare tail-calls the hook's cold function
// (NewCold, DeleteCold).
// Aligned new takes the hot path on glibc only. Sized and unsized deletes
// count the same: Stats count the block's usable size, which the pointer
// alone gives.
//
// With HEAPPROF_REPLACE_MALLOC too, these call the allocator under the malloc
// hooks directly (malloc.hpp), so a new is counted once, here.
#pragma once

#include "heapprof/config.hpp"

#if HEAPPROF_ENABLED

#include <cstddef>
#include <cstdlib>
#include <new>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/1_hooks/block_hooks.hpp"
#include "heapprof/detail/1_hooks/hook_check.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"

namespace heapprof {
namespace detail {

// What the standard asks of a replaceable operator new when the allocation
// fails: call the new_handler until it throws or the allocation succeeds; no
// handler means std::bad_alloc. `nothrow`: a throwing handler or the missing
// one means nullptr instead. Built without exceptions, a handler that throws
// cannot be caught here: it ends the program, as it would in any unit built
// that way.
template <class Allocate>
HEAPPROF_ALWAYS_INLINE void* RetryWithNewHandler(Allocate allocate, bool nothrow) {
  for (;;) {
    if (void* p = allocate()) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) {
      if (nothrow) return nullptr;
      ThrowBadAlloc();
    }
#if HEAPPROF_EXCEPTIONS
    if (nothrow) {
      try {
        handler();
      } catch (...) {
        return nullptr;
      }
      continue;
    }
#endif
    handler();
  }
}

// The allocator under the hooks.
#if defined(HEAPPROF_REPLACE_MALLOC) && HEAPPROF_MALLOC_HOOKS
HEAPPROF_ALWAYS_INLINE void* NewMalloc(std::size_t n) noexcept { return real::Malloc(n); }
HEAPPROF_ALWAYS_INLINE void NewFree(void* p) noexcept { real::Free(p); }
// A block of malloc's bootstrap buffer (an operator new while dlsym resolved
// malloc): neither counted nor released.
HEAPPROF_ALWAYS_INLINE bool NewIsBootstrap(void* p) noexcept { return real::IsBootstrap(p); }
HEAPPROF_ALWAYS_INLINE int NewPosixMemalign(void** p, std::size_t a, std::size_t n) noexcept {
  return real::PosixMemalign(p, a, n);
}
#else
HEAPPROF_ALWAYS_INLINE void* NewMalloc(std::size_t n) noexcept { return std::malloc(n); }
HEAPPROF_ALWAYS_INLINE void NewFree(void* p) noexcept { std::free(p); }
HEAPPROF_ALWAYS_INLINE bool NewIsBootstrap(void*) noexcept { return false; }
HEAPPROF_ALWAYS_INLINE int NewPosixMemalign(void** p, std::size_t a, std::size_t n) noexcept {
  return posix_memalign(p, a, n);
}
#endif

// After NewMalloc(n) failed: HEAPPROF=oom_dump, then the new_handler loop.
HEAPPROF_ALWAYS_INLINE void* AllocateAfterFailure(std::size_t n, bool nothrow) {
  OnAllocFailure(n);
  return RetryWithNewHandler([n] { return NewMalloc(n); }, nothrow);
}

// `padded`: the block was asked for at sampled_min, for a sample (SampledRequest).
HEAPPROF_ALWAYS_INLINE void* Allocate(std::size_t n, bool& padded, bool nothrow) {
  if (n == 0) n = 1;  // every new returns a distinct pointer
  const std::size_t asked = SampledRequest(n);
  padded = asked != n;
  if (void* p = NewMalloc(asked)) return p;
  padded = false;
  return AllocateAfterFailure(n, nothrow);
}

HEAPPROF_ALWAYS_INLINE void* AllocateOrThrow(std::size_t n, bool& padded) { return Allocate(n, padded, false); }

HEAPPROF_ALWAYS_INLINE void* AllocateNoThrow(std::size_t n, bool& padded) noexcept {
  return Allocate(n, padded, true);
}

HEAPPROF_ALWAYS_INLINE void* AlignedMalloc(std::size_t n, std::size_t align) noexcept {
  void* p = nullptr;
  return NewPosixMemalign(&p, align, n) == 0 ? p : nullptr;
}

// A sized delete's release: jemalloc's sdallocx when the class table found
// it (block_hooks.hpp: g_sized_free), else free.
HEAPPROF_ALWAYS_INLINE void NewFreeSized(void* p, std::size_t n) noexcept {
  const SizedFreeFn sized = LoadRelaxed(g_sized_free);
  if (sized == nullptr || NewIsBootstrap(p)) return NewFree(p);
  sized(p, n, 0);
}

// The cold halves of the hot hooks (block_hooks.hpp: HotAlloc, HotFree): the
// whole old hook, out of line, reached by a tail call.
HEAPPROF_NOINLINE inline void DeleteCold(void* p) noexcept {
  if (NewIsBootstrap(p)) return;
  if (!OnFreeBlock(p)) NewFree(p);
}

// A block padded for a sample that the live map had no memory to remember
// (OnAllocBlock's false). Its sized delete would not find it: Stats would
// count its request's class, not the 1 KiB it is, and sdallocx would free it
// into that class (heap corruption). It has not reached the caller yet, so
// it is freed (counted as any free) and the request is made again, unpadded;
// if that fails too, the new fails as it would out of memory.
HEAPPROF_NOINLINE inline void* ReplacePadded(void* p, std::size_t n, const void* ret, bool nothrow) {
  DeleteCold(p);
  const std::size_t m = n == 0 ? 1 : n;
  void* q = NewMalloc(m);
  if (q == nullptr && (q = AllocateAfterFailure(m, nothrow)) == nullptr) return nullptr;
  (void)OnAllocBlock(q, n, ret, n != 0);
  return q;
}

// Each cold hook first: the recording library's, when this copy forwards
// (engine.hpp: ForwardedNew), reached with a tail call.
HEAPPROF_NOINLINE inline void* NewCold(std::size_t n, const void* ret) {
  if (const ForwardedNew* f = g_forwarded_new.load(std::memory_order_acquire)) return f->cold(n, ret);
  bool padded;
  void* p = AllocateOrThrow(n, padded);
  if (HEAPPROF_UNLIKELY(!OnAllocBlock(p, n, ret, n != 0 && !padded, padded))) return ReplacePadded(p, n, ret, false);
  return p;
}

HEAPPROF_NOINLINE inline void* NewNoThrowCold(std::size_t n, const void* ret) noexcept {
  if (const ForwardedNew* f = g_forwarded_new.load(std::memory_order_acquire)) return f->nothrow_cold(n, ret);
  bool padded;
  void* p = AllocateNoThrow(n, padded);
  if (p != nullptr && HEAPPROF_UNLIKELY(!OnAllocBlock(p, n, ret, n != 0 && !padded, padded))) {
    return ReplacePadded(p, n, ret, true);
  }
  return p;
}

HEAPPROF_ALWAYS_INLINE void* HotNew(std::size_t n, const volatile std::size_t& kept) noexcept {
  return HotAlloc(n, kept, [](std::size_t m) { return NewMalloc(m); });
}
HEAPPROF_ALWAYS_INLINE void HotDelete(void* p) noexcept {
  if (p == nullptr) return;
  HotFree(p, [](void* q) { NewFree(q); }, [](void* q) { return NewIsBootstrap(q); }, &DeleteCold);
}
HEAPPROF_ALWAYS_INLINE void HotDeleteSized(void* p, std::size_t n) noexcept {
  if (p == nullptr) return;
  HotFreeSized(p, n, [](void* q) { NewFree(q); }, [](void* q, std::size_t m) { NewFreeSized(q, m); },
               [](void* q) { return NewIsBootstrap(q); }, &DeleteCold);
}

// What posix_memalign is asked for an aligned new's alignment: at least its
// minimum, sizeof(void*).
HEAPPROF_ALWAYS_INLINE std::size_t MemalignAlignment(std::align_val_t al) noexcept {
  const auto align = static_cast<std::size_t>(al);
  return align < sizeof(void*) ? sizeof(void*) : align;
}

HEAPPROF_ALWAYS_INLINE void* AllocateAligned(std::size_t n, std::align_val_t al, bool nothrow) {
  const std::size_t align = MemalignAlignment(al);
  if (n == 0) n = 1;
  if (void* p = AlignedMalloc(SampledRequest(n, align), align)) return p;
  OnAllocFailure(n);
  return RetryWithNewHandler([n, align] { return AlignedMalloc(n, align); }, nothrow);
}

HEAPPROF_ALWAYS_INLINE void* AllocateAlignedOrThrow(std::size_t n, std::align_val_t al) {
  return AllocateAligned(n, al, false);
}

HEAPPROF_ALWAYS_INLINE void* AllocateAlignedNoThrow(std::size_t n, std::align_val_t al) noexcept {
  return AllocateAligned(n, al, true);
}

// Aligned new: the hot path on glibc only (the class table knows malloc's
// sizes, not memalign's). posix_memalign(0) is a unique minimum chunk there.
HEAPPROF_NOINLINE inline void* NewAlignedCold(std::size_t n, std::align_val_t al, const void* ret) {
  if (const ForwardedNew* f = g_forwarded_new.load(std::memory_order_acquire)) return f->aligned_cold(n, al, ret);
  void* p = AllocateAlignedOrThrow(n, al);
  OnAllocBlock(p, n, ret);
  return p;
}
HEAPPROF_NOINLINE inline void* NewAlignedNoThrowCold(std::size_t n, std::align_val_t al, const void* ret) noexcept {
  if (const ForwardedNew* f = g_forwarded_new.load(std::memory_order_acquire)) {
    return f->aligned_nothrow_cold(n, al, ret);
  }
  void* p = AllocateAlignedNoThrow(n, al);
  if (p != nullptr) OnAllocBlock(p, n, ret);
  return p;
}
HEAPPROF_ALWAYS_INLINE void* HotNewAligned(std::size_t n, const volatile std::size_t& kept, std::align_val_t al) noexcept {
  return HotAlloc<false>(n, kept, [al](std::size_t m) { return AlignedMalloc(m, MemalignAlignment(al)); });
}

}  // namespace detail
}  // namespace heapprof

// The hook's return address is the leaf frame of the sample.
#define HEAPPROF_DETAIL_RETURN_ADDRESS __builtin_return_address(0)

// Each replacement must stay a function of its own: GCC's identical code
// folding would otherwise turn operator new[] into a call to the identical
// operator new, and (with TSan's instrumentation) that call puts operator
// new[] itself in the stack as the leaf. noipa forbids exactly that; clang
// does not fold functions in the compiler, but it does inline a hook this
// small into a caller in the same unit (its return address would then be the
// caller's): noinline.
#if defined(__clang__)
#define HEAPPROF_DETAIL_HOOK __attribute__((__noinline__))
#else
#define HEAPPROF_DETAIL_HOOK __attribute__((__noipa__))
#endif

HEAPPROF_DETAIL_HOOK void* operator new(std::size_t n) {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  if (void* p = heapprof::detail::HotNew(n, keep)) return p;
  return heapprof::detail::NewCold(keep, HEAPPROF_DETAIL_RETURN_ADDRESS);
}
HEAPPROF_DETAIL_HOOK void* operator new[](std::size_t n) {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  if (void* p = heapprof::detail::HotNew(n, keep)) return p;
  return heapprof::detail::NewCold(keep, HEAPPROF_DETAIL_RETURN_ADDRESS);
}
HEAPPROF_DETAIL_HOOK void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  if (void* p = heapprof::detail::HotNew(n, keep)) return p;
  return heapprof::detail::NewNoThrowCold(keep, HEAPPROF_DETAIL_RETURN_ADDRESS);
}
HEAPPROF_DETAIL_HOOK void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  if (void* p = heapprof::detail::HotNew(n, keep)) return p;
  return heapprof::detail::NewNoThrowCold(keep, HEAPPROF_DETAIL_RETURN_ADDRESS);
}
HEAPPROF_DETAIL_HOOK void* operator new(std::size_t n, std::align_val_t al) {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  const volatile std::align_val_t keep_al = al;
  if (void* p = heapprof::detail::HotNewAligned(n, keep, al)) return p;
  return heapprof::detail::NewAlignedCold(keep, keep_al, HEAPPROF_DETAIL_RETURN_ADDRESS);
}
HEAPPROF_DETAIL_HOOK void* operator new[](std::size_t n, std::align_val_t al) {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  const volatile std::align_val_t keep_al = al;
  if (void* p = heapprof::detail::HotNewAligned(n, keep, al)) return p;
  return heapprof::detail::NewAlignedCold(keep, keep_al, HEAPPROF_DETAIL_RETURN_ADDRESS);
}
HEAPPROF_DETAIL_HOOK void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  const volatile std::align_val_t keep_al = al;
  if (void* p = heapprof::detail::HotNewAligned(n, keep, al)) return p;
  return heapprof::detail::NewAlignedNoThrowCold(keep, keep_al, HEAPPROF_DETAIL_RETURN_ADDRESS);
}
HEAPPROF_DETAIL_HOOK void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  const volatile std::size_t keep = n;  // in the frame, not a saved register (HotAlloc)
  const volatile std::align_val_t keep_al = al;
  if (void* p = heapprof::detail::HotNewAligned(n, keep, al)) return p;
  return heapprof::detail::NewAlignedNoThrowCold(keep, keep_al, HEAPPROF_DETAIL_RETURN_ADDRESS);
}

#undef HEAPPROF_DETAIL_RETURN_ADDRESS

// Stats count the block's usable size at both ends, so every mix of sized
// and unsized deletes balances; a sized delete only finds it faster.
HEAPPROF_DETAIL_HOOK void operator delete(void* p) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete[](void* p) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete(void* p, std::size_t n) noexcept {
  heapprof::detail::HotDeleteSized(p, n);
}
HEAPPROF_DETAIL_HOOK void operator delete[](void* p, std::size_t n) noexcept {
  heapprof::detail::HotDeleteSized(p, n);
}
HEAPPROF_DETAIL_HOOK void operator delete(void* p, const std::nothrow_t&) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete[](void* p, const std::nothrow_t&) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete(void* p, std::align_val_t) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete[](void* p, std::align_val_t) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  heapprof::detail::HotDelete(p);
}
HEAPPROF_DETAIL_HOOK void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  heapprof::detail::HotDelete(p);
}

#undef HEAPPROF_DETAIL_HOOK

// Hooks in a dlopen'ed plugin never run: said once, at its load (hook_check.hpp).
[[maybe_unused]] static const bool g_heapprof_new_delete_hooks_checked =
    (heapprof::detail::ReportHooksNotInEffect("_Znwm", "operator new/delete", heapprof::detail::kNewDeleteHooks), true);

#endif  // HEAPPROF_ENABLED
