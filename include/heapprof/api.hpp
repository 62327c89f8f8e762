// heapprof: sample rate, Stats, profile writers, unwinder choice.
//
// Declarations only: the definitions are compiled once, by the translation
// unit that defines HEAPPROF_IMPLEMENTATION (see <heapprof.hpp>).
#pragma once

#include "heapprof/config.hpp"

#if defined(HEAPPROF_CXX17)

#include <cstddef>
#include <cstdint>
#include <iosfwd>

namespace heapprof {

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
  std::uint64_t stacks;                      // distinct stacks interned (at most HEAPPROF max_stacks)
  std::uint64_t stack_overflows;             // samples attributed to the overflow stack (cap reached)
  std::uint64_t samples_dropped;             // samples not recorded: tables full or out of memory
  std::uint64_t samples_skipped_nested;      // allocations due a sample while their thread was inside
                                             // the profiler (its own work, or a signal handler's)
  std::uint64_t unwind_one_fde_lookups;      // unwind rules found one FDE at a time, before an
                                             // object's table was built
};

// How sampled stacks are walked. kTable (the default) reads the .eh_frame
// unwind tables of every loaded object, compiled once into compact rows: full
// stacks without frame pointers. kFramePointer follows the frame-pointer
// chain: cheaper per frame, but stops or lies in code built without
// -fno-omit-frame-pointer (most -O2 code and distro libraries).
enum class Unwinder { kFramePointer = 0, kTable = 1 };

HEAPPROF_LINKED_BEGIN

// Mean bytes between samples. 0 turns sampling off (Stats still count), 1
// records every allocation. Any thread, any time; samples keep the rate they
// were taken at, so estimates stay right across a change. Values above 2^40-1
// are clamped to it.
void SetSampleRate(std::size_t mean_bytes) noexcept;
std::size_t GetSampleRate() noexcept;

// Counters of every allocation and free the hooks saw, folded from per-thread
// counters on read.
Stats GetStats() noexcept;

// gzip'ed pprof profile of the sampled heap; default sample type inuse_space.
// False if the profile could not be built or the stream failed. The writers
// throw nothing, but are not noexcept: a pthread_cancel of the writing thread
// unwinds through them, as through any function that writes a file.
bool WriteHeapProfile(std::ostream& out);
// The same data with default_sample_type "alloc_space".
bool WriteAllocsProfile(std::ostream& out);

// The same, to a file: written to a temporary name in the same directory and
// renamed, so a reader never sees half a profile. False (and `path` untouched)
// if the file could not be written; errno then says why (ENOENT: no such
// directory, EACCES, ENOSPC, EISDIR: `path` is a directory, ENOMEM: out of
// memory building the profile, EINVAL: a null path or one that is not a
// regular file, ENOSYS: heapprof disabled). The same holds for the peak and
// retention writers below.
bool WriteHeapProfile(const char* path);
bool WriteAllocsProfile(const char* path);
bool WriteHeapProfile(const std::string& path);
bool WriteAllocsProfile(const std::string& path);

void SetUnwinder(Unwinder u) noexcept;
Unwinder GetUnwinder() noexcept;

// The peak heap profile (always on): the heap profile as it was when the
// estimated in-use heap was highest, in the window since the process started
// or since ResetPeak(). A snapshot is taken each time the estimate first
// exceeds the last one by 10% (tcmalloc's rule). Comments (`go tool pprof
// -comments`) say when and how large; time_nanos is when it was reached.
bool WritePeakHeapProfile(std::ostream& out);
bool WritePeakHeapProfile(const char* path);
bool WritePeakHeapProfile(const std::string& path);
// A new window, starting at the heap as it is now.
void ResetPeak() noexcept;

// The retention profile ("who keeps it alive"): each sampled live object, valued
// as in the heap profile, on a stack that is its shortest chain of references
// from a root: its allocation stack, then the allocation site of each object
// holding it, then one frame naming the root — "[global] <symbol>",
// "[stack] thread <tid>", "[tls] thread <tid>", "[anonymous mapping] <lo>-<hi>"
// (every object known: memory the program mapped itself), "[unsampled heap]" (held only
// through memory heapprof did not sample) or "[unreachable]" (a leak). Found
// by a conservative scan of the process's memory (README "Who keeps it
// alive"): interior pointers count; the other threads keep running.
bool WriteRetentionProfile(std::ostream& out);
bool WriteRetentionProfile(const char* path);
bool WriteRetentionProfile(const std::string& path);

HEAPPROF_LINKED_END

}  // namespace heapprof

#endif  // HEAPPROF_CXX17
