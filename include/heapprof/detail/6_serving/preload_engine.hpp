// heapprof: what libheapprof_preload.so adds to the implementation: its side
// of "one engine per process". Included by <heapprof.hpp> only with
// HEAPPROF_PRELOAD_LIBRARY (preload/heapprof_preload.cpp).
//
//  - Its malloc is the process's (it is first in LD_PRELOAD, the program does
//    not define malloc): it records, and offers its API to a copy of heapprof
//    compiled into the program (heapprof_preload_engine_v1), which then turns
//    itself off and forwards there (implementation.hpp).
//  - Otherwise (the program replaces malloc itself, or an allocator precedes
//    the library in LD_PRELOAD) it turns itself off and says so once.
#pragma once

#include "heapprof/config.hpp"

#if HEAPPROF_MALLOC_HOOKS && defined(HEAPPROF_PRELOAD_LIBRARY)

#include <dlfcn.h>
#include <link.h>
#include <cstring>
#include <ostream>

#include "heapprof/api.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/1_hooks/malloc.hpp"
#include "heapprof/detail/1_hooks/new_delete.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"

namespace heapprof {
namespace detail {

inline bool PreloadWriteStream(std::ostream& out, bool allocs) {
  return allocs ? WriteAllocsProfile(out) : WriteHeapProfile(out);
}
inline bool PreloadWritePath(const char* path, bool allocs) {
  return allocs ? WriteAllocsProfile(path) : WriteHeapProfile(path);
}

inline bool PreloadWritePeakStream(std::ostream& out) { return WritePeakHeapProfile(out); }
inline bool PreloadWritePeakPath(const char* path) { return WritePeakHeapProfile(path); }

// Qualified: detail::WriteRetentionProfile (retention.hpp) would hide the API's overloads.
inline bool PreloadWriteRetentionStream(std::ostream& out) { return ::heapprof::WriteRetentionProfile(out); }
inline bool PreloadWriteRetentionPath(const char* path) { return ::heapprof::WriteRetentionProfile(path); }

// What the program's operator new forwards to: this library's cold hooks
// (new_delete.hpp), whose samples take the program's caller as the leaf.
inline const ForwardedNew g_preload_forwarded_new = {&NewCold, &NewNoThrowCold, &NewAlignedCold,
                                                     &NewAlignedNoThrowCold};
// The first copy's (the program's own, usually: its first allocation asks);
// a second copy with its own labels (a library that compiled heapprof in
// too) is not read.
inline void AttachProgramLabels(const ProgramLabels* program) noexcept {
  const ProgramLabels* none = nullptr;
  g_program_labels.compare_exchange_strong(none, program, std::memory_order_acq_rel);
}

// Stats for the version-1 slot (EngineStatsV1), and whole for get_stats_into.
inline EngineStatsV1 PreloadGetStatsV1() noexcept {
  const Stats s = ::heapprof::GetStats();
  EngineStatsV1 v1;
  std::memcpy(&v1, &s, sizeof v1);
  return v1;
}
inline void PreloadGetStatsInto(Stats* out, std::size_t size) noexcept {
  const Stats s = ::heapprof::GetStats();
  std::memcpy(out, &s, size < sizeof s ? size : sizeof s);
}

inline const EngineApi g_preload_engine_api = {
    kEngineApiVersion,      sizeof(EngineApi), &SetSampleRate,       &GetSampleRate, &PreloadGetStatsV1,
    &PreloadWriteStream,    &PreloadWritePath, &SetUnwinder,         &GetUnwinder,
    &PreloadWritePeakStream, &PreloadWritePeakPath, &ResetPeak,
    &PreloadWriteRetentionStream, &PreloadWriteRetentionPath,
    &EngineStartHttpServer, &EngineStopHttpServer, &EngineHttpServerPort, &EngineHttpServerError,
    &EngineHttpServerFailure, &g_preload_forwarded_new, &AttachProgramLabels, &PreloadGetStatsInto,
};

}  // namespace detail
}  // namespace heapprof

extern "C" __attribute__((__visibility__("hidden"))) void heapprof_detail_engine_role() noexcept {
  if (!heapprof::detail::real::g_shadowed) return;
  heapprof::detail::g_engine_off = true;
  Dl_info info{};
  link_map* map = nullptr;
  void* active = heapprof::detail::FindSymbol(RTLD_DEFAULT, "malloc");
  const bool found =
      active != nullptr && dladdr1(active, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0;
  const char* who = found && info.dli_fname != nullptr && info.dli_fname[0] != '\0' ? info.dli_fname : "the program";
  // The executable itself (the first link map), as rustc with its jemalloc
  // linked in: listing this library first, which the line used to advise,
  // cannot help there; nothing preloaded comes before the program.
  const bool program = found && map != nullptr && map->l_prev == nullptr;
  heapprof::detail::ReportRaw("heapprof: libheapprof_preload.so: malloc is defined by ");
  heapprof::detail::ReportRaw(who);
  heapprof::detail::ReportRaw(
      program ? ", the program itself, so this library records nothing (a program with heapprof compiled in "
                "records itself; one with another allocator linked in cannot be profiled by preloading)\n"
              : ", loaded before it, so this library records nothing (a program with heapprof compiled in "
                "records itself; otherwise list libheapprof_preload.so first in LD_PRELOAD)\n");
}

// The one symbol a program's own copy of heapprof looks for (RTLD_DEFAULT).
// Asked from inside this library's own start-up (EnsureInit returns at once
// there: see its re-entry), the answer is the one start-up gives: off exactly
// when malloc is another object's (real::g_shadowed, known once the real
// functions are resolved, which Resolve does first). A program that replaced
// malloc itself, run with LD_PRELOAD=libheapprof_preload.so:libtcmalloc_minimal.so.4,
// hung there: tcmalloc's start-up called the program's operator new, whose
// copy asked here, and the wait waited for itself.
extern "C" __attribute__((__visibility__("default"))) const heapprof::detail::EngineApi* heapprof_preload_engine_v1() noexcept {
  heapprof::detail::EnsureInit();
  if (!heapprof::detail::real::Resolve()) return nullptr;
  return heapprof::detail::g_engine_off || heapprof::detail::real::g_shadowed ? nullptr
                                                                               : &heapprof::detail::g_preload_engine_api;
}

#endif  // HEAPPROF_MALLOC_HOOKS && HEAPPROF_PRELOAD_LIBRARY
