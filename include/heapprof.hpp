// heapprof: always-on sampled heap profiles in the pprof format for C++17.
//
//   #define HEAPPROF_REPLACE_NEW_DELETE   // in exactly one .cpp of the program
//   #include <heapprof.hpp>
//   ...
//   std::ofstream f("heap.pb.gz", std::ios::binary);
//   heapprof::WriteHeapProfile(f);       // go tool pprof -http=: ./app heap.pb.gz
//   heapprof::ScopedLabels req{{"endpoint", "/search"}};  // per-request attribution
//
// Without HEAPPROF_REPLACE_NEW_DELETE this header adds no hook and no cost;
// heapprof::allocator still profiles the containers that use it.
#pragma once

#include "heapprof/config.hpp"
#include "heapprof/api.hpp"
#include "heapprof/labels.hpp"
#include "heapprof/allocator.hpp"
#include "heapprof/http.hpp"
#include "heapprof/detail/dumps.hpp"

#if defined(HEAPPROF_REPLACE_NEW_DELETE)
#include "heapprof/detail/new_delete.hpp"
#endif
