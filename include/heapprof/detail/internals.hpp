// heapprof: every internal header, in the order data flows through them.
// Compiled by the implementation unit (and by tests and benchmarks that reach
// inside, with HEAPPROF_INTERNALS). Everything here is inline; the few
// definitions that must exist once are in implementation.hpp.
//
//   0_base           the profiler's own memory, locks, hashing, HEAPPROF, stderr
//   1_hooks          what every allocation and free runs inline; operator new/delete
//   2_sampling       the engine: countdown, threads, stacks and buckets, live map, labels
//   3_unwinding      frame pointers and the .eh_frame table unwinder
//   4_symbolization  ELF symbol tables, read in process
//   5_encoding       snapshot and scaling, profile.proto, gzip, Go's text format
//   6_serving        files, automatic dumps, the leak report, the HTTP server, start-up
#pragma once

#include "heapprof/config.hpp"

#if HEAPPROF_ENABLED

#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/0_base/spinlock.hpp"
#include "heapprof/detail/0_base/hash.hpp"
#include "heapprof/detail/0_base/intern_table.hpp"
#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/0_base/arena_allocator.hpp"
#include "heapprof/detail/0_base/env_config.hpp"
#include "heapprof/detail/0_base/report.hpp"

#include "heapprof/detail/1_hooks/fast_path.hpp"
#include "heapprof/detail/1_hooks/block_hooks.hpp"

#include "heapprof/detail/2_sampling/sampler.hpp"
#include "heapprof/detail/2_sampling/thread_registry.hpp"
#include "heapprof/detail/2_sampling/labels.hpp"
#include "heapprof/detail/2_sampling/buckets.hpp"
#include "heapprof/detail/2_sampling/peak.hpp"
#include "heapprof/detail/2_sampling/live_map.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"

#include "heapprof/detail/3_unwinding/loader_lock.hpp"
#include "heapprof/detail/3_unwinding/loaded_objects.hpp"
#include "heapprof/detail/3_unwinding/frame_pointers.hpp"
#include "heapprof/detail/3_unwinding/eh_frame.hpp"
#include "heapprof/detail/3_unwinding/table.hpp"

#include "heapprof/detail/4_symbolization/elf_file.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"

#include "heapprof/detail/5_encoding/protobuf.hpp"
#include "heapprof/detail/5_encoding/profile_builder.hpp"
#include "heapprof/detail/5_encoding/gzip.hpp"
#include "heapprof/detail/5_encoding/snapshot.hpp"
#include "heapprof/detail/5_encoding/text_profile.hpp"

#include "heapprof/detail/6_serving/retention.hpp"
#include "heapprof/detail/6_serving/files.hpp"
#include "heapprof/detail/6_serving/dumps.hpp"
#include "heapprof/detail/6_serving/leak_report.hpp"
#include "heapprof/detail/6_serving/http_parser.hpp"
#include "heapprof/detail/6_serving/http_server.hpp"
#include "heapprof/detail/6_serving/startup.hpp"

#endif  // HEAPPROF_ENABLED
