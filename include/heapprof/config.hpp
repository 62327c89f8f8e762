// heapprof: compile-time switches and platform detection.
// Every platform #ifdef of the library lives here or in the few files that must
// touch the OS (arena, elf, unwind_fp, new_delete).
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(__linux__)
#error "heapprof supports Linux (glibc or musl) only for now"
#endif
#if !defined(__GNUC__)
#error "heapprof needs GCC or Clang (builtins for frame addresses and branch hints)"
#endif

#if defined(__x86_64__)
#define HEAPPROF_ARCH_X86_64 1
#elif defined(__aarch64__)
#define HEAPPROF_ARCH_AARCH64 1
#endif

// Deepest stack recorded, leaf first. A deeper stack is cut and ends with a
// marker frame so the cut shows in every viewer.
#ifndef HEAPPROF_MAX_FRAMES
#define HEAPPROF_MAX_FRAMES 128
#endif
static_assert(HEAPPROF_MAX_FRAMES >= 4 && HEAPPROF_MAX_FRAMES <= 1024,
              "HEAPPROF_MAX_FRAMES out of range");

// Default mean distance between samples in bytes: Go's and jemalloc's 512 KiB.
#ifndef HEAPPROF_DEFAULT_SAMPLE_RATE
#define HEAPPROF_DEFAULT_SAMPLE_RATE 524288
#endif

#define HEAPPROF_LIKELY(x) __builtin_expect(!!(x), 1)
#define HEAPPROF_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HEAPPROF_NOINLINE __attribute__((noinline))
#define HEAPPROF_ALWAYS_INLINE inline __attribute__((always_inline))

// The fast path reads one thread-local pointer. initial-exec makes that a single
// %fs-relative load instead of a __tls_get_addr call when heapprof lives in a
// shared object; glibc reserves static TLS surplus for exactly this use.
#if defined(HEAPPROF_NO_INITIAL_EXEC_TLS)
#define HEAPPROF_TLS_MODEL
#else
#define HEAPPROF_TLS_MODEL __attribute__((tls_model("initial-exec")))
#endif

#define HEAPPROF_NO_SANITIZE_ADDRESS __attribute__((no_sanitize_address))

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
