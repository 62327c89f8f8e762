// heapprof: version, compile-time switches, and every compiler and platform
// test of the library. The rest of the code reads only the HEAPPROF_* macros
// defined here.
//
// Included first by every public header. Before C++17 this file stops the
// compilation with one error line that says so. It is an #include of a file
// that cannot exist rather than an #error: a missing include is fatal in gcc
// and clang, so the compiler stops there instead of going on to report every
// use of heapprof:: in the user's file (gcc's output for -std=c++14 was 216
// lines, none of them saying why).
#pragma once

#if !defined(__cplusplus) || __cplusplus < 201703L
#include "heapprof needs C++17 or later: compile with -std=c++17 (or gnu++17, c++20, c++23)"
#else
#define HEAPPROF_CXX17 1
#endif

#if defined(HEAPPROF_CXX17)

#include <cstddef>
#include <cstdint>

#define HEAPPROF_VERSION_MAJOR 0
#define HEAPPROF_VERSION_MINOR 2
#define HEAPPROF_VERSION_PATCH 0

// ---------------------------------------------------------------- platform
// heapprof profiles on Linux with glibc, x86-64 or aarch64, built by GCC or
// Clang. Anywhere else (or with HEAPPROF_DISABLE defined) the whole API still
// compiles and does nothing: no hook, Stats all zero, Write* return false,
// HttpServer serves nothing. Portable code needs no #ifdef of its own.
#if !defined(HEAPPROF_DISABLE) && defined(__linux__) && defined(__GNUC__) && \
    (defined(__x86_64__) || defined(__aarch64__))
#define HEAPPROF_ENABLED 1
#else
#define HEAPPROF_ENABLED 0
#endif

#if defined(__x86_64__)
#define HEAPPROF_ARCH_X86_64 1
#elif defined(__aarch64__)
#define HEAPPROF_ARCH_AARCH64 1
#endif

// ---------------------------------------------------------------- compiler
#if defined(__GNUC__)
#define HEAPPROF_LIKELY(x) __builtin_expect(!!(x), 1)
#define HEAPPROF_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HEAPPROF_NOINLINE __attribute__((__noinline__))
#define HEAPPROF_ALWAYS_INLINE inline __attribute__((__always_inline__))
#else
#define HEAPPROF_LIKELY(x) (x)
#define HEAPPROF_UNLIKELY(x) (x)
#define HEAPPROF_NOINLINE
#define HEAPPROF_ALWAYS_INLINE inline
#endif

// The fast path reads one thread-local pointer. initial-exec makes that a single
// %fs-relative load instead of a __tls_get_addr call when heapprof lives in a
// shared object; glibc reserves static TLS surplus for exactly this use. Code
// for an executable (-fPIE, or not PIC at all) says local-exec: the variable
// is then at a constant offset from %fs, read in one instruction. (With
// initial-exec the linker rewrote the offset's GOT load into a constant too,
// but the compiler, not knowing, kept that offset in a callee-saved register
// across the allocator call: 3 instructions per malloc+free pair.)
#if defined(HEAPPROF_NO_INITIAL_EXEC_TLS) || !defined(__GNUC__)
#define HEAPPROF_TLS_MODEL
#elif defined(__PIE__) || !defined(__PIC__)
#define HEAPPROF_TLS_MODEL __attribute__((__tls_model__("local-exec")))
#else
#define HEAPPROF_TLS_MODEL __attribute__((__tls_model__("initial-exec")))
#endif

#if defined(__GNUC__)
#define HEAPPROF_NO_SANITIZE_ADDRESS __attribute__((__no_sanitize_address__))
#else
#define HEAPPROF_NO_SANITIZE_ADDRESS
#endif

#if defined(__SANITIZE_THREAD__)
#define HEAPPROF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HEAPPROF_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define HEAPPROF_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEAPPROF_ASAN 1
#endif
#endif

// The malloc family can be replaced (HEAPPROF_REPLACE_MALLOC) except under
// AddressSanitizer and ThreadSanitizer, whose runtimes own malloc: there the
// macro is a no-op and only operator new/delete are profiled.
#if HEAPPROF_ENABLED && !defined(HEAPPROF_ASAN) && !defined(HEAPPROF_TSAN)
#define HEAPPROF_MALLOC_HOOKS 1
#else
#define HEAPPROF_MALLOC_HOOKS 0
#endif

// Exceptions may be off (-fno-exceptions, as Google-style code bases build).
// The implementation then never throws or catches: HEAPPROF_TRY/CATCH_ALL
// compile to an if/else whose else is dead, and what would throw
// std::bad_alloc still does, through the standard library (see
// ThrowBadAlloc in detail/0_base/errors.hpp).
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define HEAPPROF_EXCEPTIONS 1
#define HEAPPROF_TRY try
#define HEAPPROF_CATCH_ALL catch (...)
#else
#define HEAPPROF_EXCEPTIONS 0
#define HEAPPROF_TRY if (true)
#define HEAPPROF_CATCH_ALL else
#endif
// Where the standard library declares its out-of-line throw helpers: the way
// to throw from code compiled without exceptions (the library itself was
// built with them).
#if defined(__has_include)
#if __has_include(<bits/functexcept.h>)
#define HEAPPROF_HAVE_FUNCTEXCEPT_H 1
#endif
#endif

// ---------------------------------------------------------------- knobs
// Deepest stack recorded, leaf first. A deeper stack is cut and ends with a
// marker frame so the cut shows in every viewer.
#ifndef HEAPPROF_MAX_FRAMES
#define HEAPPROF_MAX_FRAMES 128
#endif
static_assert(HEAPPROF_MAX_FRAMES >= 4 && HEAPPROF_MAX_FRAMES <= 1024, "HEAPPROF_MAX_FRAMES out of range");

// Default mean distance between samples in bytes: Go's and jemalloc's 512 KiB.
#ifndef HEAPPROF_DEFAULT_SAMPLE_RATE
#define HEAPPROF_DEFAULT_SAMPLE_RATE 524288
#endif

// ---------------------------------------------------------------- linking
// The API is in two halves. The light half (declarations, the inline
// allocation fast path) is what every #include <heapprof.hpp> compiles. The
// rest is compiled once, by the one translation unit that defines
// HEAPPROF_IMPLEMENTATION (or HEAPPROF_REPLACE_NEW_DELETE, which implies it)
// before including <heapprof.hpp>. Every function of that half is declared in
// this inline namespace, so a program without that unit fails to link with a
// message that says what to do:
//   undefined reference to `heapprof::define_HEAPPROF_IMPLEMENTATION_in_one_cpp_file::GetStats()'
// and a program with two such units gets "multiple definition of" the same
// names. Callers never spell it: heapprof::GetStats() finds it.
//
// Both halves are one per process, whatever -fvisibility the units were built
// with: a shared library built with -fvisibility=hidden (CMake's
// CXX_VISIBILITY_PRESET hidden) that includes <heapprof.hpp> must reach the
// program's implementation, and share the fast path's thread-local state
// (HEAPPROF_VISIBLE in 1_hooks/fast_path.hpp). Hidden, the library had its own
// copies: its ScopedLabels never reached the profile, its heapprof::allocator
// allocations were counted twice (the global hook did not see that thread's
// suppress flag), and an implementation unit built hidden failed to link
// ("hidden symbol ... is referenced by DSO").
#if defined(__GNUC__)
#define HEAPPROF_VISIBLE __attribute__((__visibility__("default")))
#else
#define HEAPPROF_VISIBLE
#endif
#define HEAPPROF_LINKED_BEGIN inline namespace define_HEAPPROF_IMPLEMENTATION_in_one_cpp_file HEAPPROF_VISIBLE {
#define HEAPPROF_LINKED_END }

#endif  // HEAPPROF_CXX17
