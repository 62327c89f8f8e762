// heapprof: which loaded object holds an address, without dladdr's symbol
// search (start-up's hook and allocator checks ask it a dozen times).
#pragma once

#include <dlfcn.h>
#include <link.h>

namespace heapprof {
namespace detail {

// The start of the loaded object that holds `addr` (dladdr's dli_fbase), or
// nullptr. glibc 2.35's _dl_find_object answers from the loader's sorted
// table; dladdr also searches the object's symbols for the nearest one:
// ~80,000 instructions for an address in libc, and start-up asked 12 times
// (0.9M instructions, a third of a small program's whole run). dladdr stays
// the fallback (older glibc, an object the table does not hold yet).
inline const void* ObjectBaseOf(const void* addr) noexcept {
#if defined(__GLIBC__) && defined(__GLIBC_PREREQ)
#if __GLIBC_PREREQ(2, 35)
  dl_find_object found;
  if (_dl_find_object(const_cast<void*>(addr), &found) == 0) return found.dlfo_map_start;
#endif
#endif
  Dl_info info{};
  return dladdr(addr, &info) != 0 ? info.dli_fbase : nullptr;
}

}  // namespace detail
}  // namespace heapprof
