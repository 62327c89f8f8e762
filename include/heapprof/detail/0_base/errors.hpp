// heapprof: throwing std::bad_alloc whether or not exceptions are on.
#pragma once

#include <new>

#include "heapprof/config.hpp"
#if !HEAPPROF_EXCEPTIONS && defined(HEAPPROF_HAVE_FUNCTEXCEPT_H)
#include <bits/functexcept.h>
#endif
#if !HEAPPROF_EXCEPTIONS
#include <cstdlib>
#endif

namespace heapprof {
namespace detail {

// Throws std::bad_alloc. Code built with -fno-exceptions cannot `throw`, but
// the standard library was built with exceptions and throws for it: the
// exception then unwinds as it would from libstdc++'s own operator new (to a
// handler in code that has them, else std::terminate).
[[noreturn]] inline void ThrowBadAlloc() {
#if HEAPPROF_EXCEPTIONS
  throw std::bad_alloc();
#elif defined(HEAPPROF_HAVE_FUNCTEXCEPT_H)
  std::__throw_bad_alloc();
#else
  std::abort();
#endif
}

}  // namespace detail
}  // namespace heapprof
