// heapprof: our side of the dynamic loader's lock.
//
// glibc does not reset dl_iterate_phdr's lock in a fork child: if another
// thread was inside dl_iterate_phdr when the process forked, every later
// dl_iterate_phdr in the child waits forever (seen here: one fork in ~30 while
// a thread writes profiles). So every heapprof call into dl_iterate_phdr goes
// through IterateLoadedObjects, under g_loader_lock, and the fork handlers take
// that lock first: no heapprof thread is ever inside the loader at a fork.
#pragma once

#include <link.h>

#include "heapprof/detail/0_base/spinlock.hpp"
#include "heapprof/detail/2_sampling/thread_registry.hpp"

namespace heapprof {
namespace detail {

inline SpinLock g_loader_lock;

// The guard: a callback that allocates must not sample, which would unwind,
// which would come back here for a lock this thread already holds.
inline int IterateLoadedObjects(int (*callback)(dl_phdr_info*, std::size_t, void*), void* data) noexcept {
  ReentrancyGuard guard;
  LockGuard hold(g_loader_lock);
  return ::dl_iterate_phdr(callback, data);
}

}  // namespace detail
}  // namespace heapprof
