// heapprof: the public API (see README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "heapprof/config.hpp"
#include "heapprof/detail/engine.hpp"
#include "heapprof/detail/writer.hpp"

namespace heapprof {

// Mean bytes between samples. 0 turns sampling off (Stats still count), 1
// records every allocation. Any thread, any time; samples keep the rate they
// were taken at, so estimates stay right across a change. Values above 2^40-1
// are clamped to it.
inline void SetSampleRate(std::size_t mean_bytes) {
  detail::EnsureInit();
  detail::ApplyRate(mean_bytes);  // also resets the caller's own countdown, exactly
}

inline std::size_t GetSampleRate() {
  detail::EnsureInit();
  return static_cast<std::size_t>(detail::RateOf(detail::g_rate_state.load(std::memory_order_acquire)));
}

// gzip'ed pprof profile of the sampled heap; default sample type inuse_space.
// False if the profile could not be built or the stream failed.
inline bool WriteHeapProfile(std::ostream& out) { return detail::WriteProfile(out, false); }

// The same data with default_sample_type "alloc_space".
inline bool WriteAllocsProfile(std::ostream& out) { return detail::WriteProfile(out, true); }

// The same, to a file: written to a temporary name in the same directory and
// renamed, so a reader never sees half a profile. False (and `path` untouched)
// if the file could not be written.
inline bool WriteHeapProfile(const std::string& path) { return detail::WriteProfileFile(path, false); }
inline bool WriteAllocsProfile(const std::string& path) { return detail::WriteProfileFile(path, true); }

struct Stats {
  std::uint64_t alloc_objects, alloc_bytes;  // cumulative, every allocation the hooks saw
  std::uint64_t free_objects, free_bytes;
  std::uint64_t live_objects, live_bytes;    // alloc - free
  std::uint64_t sampled_live_objects;        // objects the profile currently tracks
  std::uint64_t profiler_bytes;              // memory the profiler itself holds
  std::uint64_t label_sets;                  // distinct label sets interned
  std::uint64_t label_set_overflows;         // sets mapped to the overflow set (cap reached)
  std::uint64_t unwind_objects;              // loaded objects with an unwind table
  std::uint64_t unwind_rows;                 // rows in those tables
  std::uint64_t unwind_table_bytes;          // their memory (part of profiler_bytes)
};

inline Stats GetStats() {
  detail::EnsureInit();
  const detail::Totals t = detail::g_registry.Sum();
  Stats s{};
  s.alloc_objects = t.alloc_objects;
  s.alloc_bytes = t.alloc_bytes;
  s.free_objects = t.free_objects;
  s.free_bytes = t.free_bytes;
  // Counters from different threads are read one after another: while others
  // run, a free can be seen before its allocation. Never report a wrapped value.
  s.live_objects = t.alloc_objects > t.free_objects ? t.alloc_objects - t.free_objects : 0;
  s.live_bytes = t.alloc_bytes > t.free_bytes ? t.alloc_bytes - t.free_bytes : 0;
  s.sampled_live_objects = detail::g_live_map.LiveCount();
  s.profiler_bytes = detail::g_arena.MappedBytes() + sizeof(detail::g_free_filter) +
                     sizeof(detail::unwind_table::g_rule_cache);
  s.label_sets = detail::g_labels.SetCount();
  s.label_set_overflows = detail::g_labels.Overflows();
  const detail::UnwindTableStats u = detail::GetUnwindTableStats();
  s.unwind_objects = u.objects;
  s.unwind_rows = u.rows;
  s.unwind_table_bytes = u.bytes;
  return s;
}

// How sampled stacks are walked. kTable (the default) reads the .eh_frame
// unwind tables of every loaded object, compiled once into compact rows: full
// stacks without frame pointers. kFramePointer follows the frame-pointer
// chain: cheaper per frame, but stops or lies in code built without
// -fno-omit-frame-pointer (most -O2 code and distro libraries).
enum class Unwinder { kFramePointer = detail::kUnwinderFramePointer, kTable = detail::kUnwinderTable };

inline void SetUnwinder(Unwinder u) {
  detail::EnsureInit();  // HEAPPROF=unwinder=... must not override a later explicit choice
  detail::g_unwinder.store(static_cast<int>(u), std::memory_order_relaxed);
}
inline Unwinder GetUnwinder() {
  detail::EnsureInit();
  return static_cast<Unwinder>(detail::g_unwinder.load(std::memory_order_relaxed));
}

}  // namespace heapprof
