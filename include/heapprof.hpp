// heapprof: always-on sampled heap profiles in the pprof format for C++17.
//
// Two modes of one header (the doctest/stb pattern):
//
//   #include <heapprof.hpp>                  anywhere: the light API below
//
//   #define HEAPPROF_REPLACE_NEW_DELETE      in exactly one .cpp of the program:
//   #include <heapprof.hpp>                  the light API, the implementation
//                                            (compiled once, here) and the
//                                            global operator new/delete hooks
//
// HEAPPROF_REPLACE_MALLOC (also implies HEAPPROF_IMPLEMENTATION) replaces the
// malloc family too (malloc, free, calloc, realloc, posix_memalign, ...), so
// C allocations of every library are profiled as well.
//
// HEAPPROF_IMPLEMENTATION instead of HEAPPROF_REPLACE_NEW_DELETE compiles the
// implementation without the global hooks (heapprof::allocator then profiles
// just the containers that use it). Forgetting both is a link error that names
// HEAPPROF_IMPLEMENTATION; defining them in two units is one too.
//
//   heapprof::ScopedLabels req{{"endpoint", "/search"}};  // per-request attribution
//   heapprof::WriteHeapProfile("heap.pb.gz");            // go tool pprof -http=: ./app heap.pb.gz
//
// No #pragma once: a unit may include this header first without, then again
// with HEAPPROF_IMPLEMENTATION defined. Each part below has its own guard.

#ifndef HEAPPROF_HPP_API_INCLUDED
#define HEAPPROF_HPP_API_INCLUDED
#include "heapprof/config.hpp"
#include "heapprof/api.hpp"
#include "heapprof/labels.hpp"
#include "heapprof/allocator.hpp"
#include "heapprof/http.hpp"
#endif  // HEAPPROF_HPP_API_INCLUDED

#if (defined(HEAPPROF_REPLACE_NEW_DELETE) || defined(HEAPPROF_REPLACE_MALLOC)) && !defined(HEAPPROF_IMPLEMENTATION)
#define HEAPPROF_IMPLEMENTATION
#endif

// The implementation's internals, inline: the implementation unit compiles
// them. HEAPPROF_INTERNALS alone gives them to tests and benchmarks without
// defining the API (single_include/ has no other way to reach them).
#if (defined(HEAPPROF_IMPLEMENTATION) || defined(HEAPPROF_INTERNALS)) && !defined(HEAPPROF_HPP_INTERNALS_INCLUDED)
#define HEAPPROF_HPP_INTERNALS_INCLUDED
#include "heapprof/detail/internals.hpp"
#endif

// The out-of-line half of the API and the hooks: exactly one unit.
#if defined(HEAPPROF_IMPLEMENTATION) && !defined(HEAPPROF_HPP_IMPLEMENTATION_INCLUDED)
#define HEAPPROF_HPP_IMPLEMENTATION_INCLUDED
#include "heapprof/detail/implementation.hpp"
#if defined(HEAPPROF_REPLACE_MALLOC)
#include "heapprof/detail/1_hooks/malloc.hpp"
#endif
#if defined(HEAPPROF_REPLACE_NEW_DELETE)
#include "heapprof/detail/1_hooks/new_delete.hpp"
#endif
#if defined(HEAPPROF_PRELOAD_LIBRARY)  // after the hooks: it hands out their cold functions
#include "heapprof/detail/6_serving/preload_engine.hpp"
#endif
#endif
