// heapprof: throwing std::bad_alloc whether or not exceptions are on,
// catching everything except thread cancellation, and the public path
// writers' errno.
#pragma once

#include <cerrno>
#include <new>

#include "heapprof/config.hpp"
#if !HEAPPROF_EXCEPTIONS && defined(HEAPPROF_HAVE_FUNCTEXCEPT_H)
#include <bits/functexcept.h>
#endif
#if !HEAPPROF_EXCEPTIONS
#include <cstdlib>
#endif

// pthread_cancel unwinds the cancelled thread with a "forced unwind"
// exception (abi::__forced_unwind in glibc + libstdc++). A catch (...) that
// does not rethrow it aborts the process ("FATAL: exception not rethrown"),
// so every catch-all of the implementation rethrows it first: cancellation
// passes through every heapprof frame, releasing what their destructors hold.
// config.hpp's plain definition is replaced here, before any use (every file
// that catches includes this one). HEAPPROF_CATCH_ALL_NOEXCEPT is the plain
// catch-all, for noexcept functions (a rethrow there would only terminate):
// they run on the profiler's own threads (dumps, HTTP) or at exit, which no
// one cancels.
#define HEAPPROF_CATCH_ALL_NOEXCEPT HEAPPROF_CATCH_ALL
#if HEAPPROF_EXCEPTIONS && defined(__has_include)
#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#if defined(__GLIBCXX__)
#undef HEAPPROF_CATCH_ALL_NOEXCEPT
#define HEAPPROF_CATCH_ALL_NOEXCEPT catch (...)
#undef HEAPPROF_CATCH_ALL
#define HEAPPROF_CATCH_ALL \
  catch (::abi::__forced_unwind&) { throw; }  \
  catch (...)
#define HEAPPROF_HAVE_FORCED_UNWIND 1
#endif
#endif
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

// The public Write*(path) say why they return false in errno.
inline bool FailWithErrno(int err) noexcept {
  errno = err;
  return false;
}

}  // namespace detail
}  // namespace heapprof
