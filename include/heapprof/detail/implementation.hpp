// heapprof: the out-of-line half of the API, defined once. <heapprof.hpp>
// includes this file only where HEAPPROF_IMPLEMENTATION (or
// HEAPPROF_REPLACE_NEW_DELETE) is defined: the one translation unit that
// compiles the profiler. Everything it defines is declared in the light half
// (heapprof/api.hpp, labels.hpp, http.hpp, detail/1_hooks/fast_path.hpp)
// inside HEAPPROF_LINKED_BEGIN/END, whose namespace name makes a missing or
// duplicated implementation unit a link error that says so (config.hpp).
#pragma once

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/api.hpp"
#include "heapprof/http.hpp"
#include "heapprof/labels.hpp"
#include "heapprof/detail/internals.hpp"
#include "heapprof/detail/1_hooks/hook_check.hpp"  // before 1_hooks/{malloc,new_delete}.hpp, which need it (and the single header emits it once)

#if HEAPPROF_ENABLED

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <ostream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace heapprof {
namespace detail {

// ---------------------------------------------------------------- one engine
// What libheapprof_preload.so offers a program that compiled heapprof in too
// (6_serving/preload_engine.hpp). Plain function pointers, versioned: the two
// copies may come from different heapprof releases.
// Stats as every version-1 library's get_stats returns it, by value: its
// fields up to samples_skipped_nested. Its size is part of that slot's ABI
// and never changes (Stats grows at its end; a Stats returned there by a
// library newer than the program wrote past the program's return slot, an
// older one left the new fields unset): newer fields come through
// get_stats_into.
struct EngineStatsV1 {
  std::uint64_t fields[17];
};
static_assert(sizeof(EngineStatsV1) == offsetof(Stats, unwind_one_fde_lookups), "the version-1 slot's layout");
struct EngineApi {
  std::uint32_t version;  // kEngineApiVersion
  std::uint32_t size;     // sizeof(EngineApi) of the library
  void (*set_sample_rate)(std::size_t) noexcept;
  std::size_t (*get_sample_rate)() noexcept;
  EngineStatsV1 (*get_stats)() noexcept;
  bool (*write_stream)(std::ostream& out, bool allocs);
  bool (*write_path)(const char* path, bool allocs);
  void (*set_unwinder)(Unwinder) noexcept;
  Unwinder (*get_unwinder)() noexcept;
  // From here on: only when `size` covers them (older libraries lack them).
  bool (*write_peak_stream)(std::ostream& out);
  bool (*write_peak_path)(const char* path);
  void (*reset_peak)() noexcept;
  bool (*write_retention_stream)(std::ostream& out);
  bool (*write_retention_path)(const char* path);
  // The program's heapprof::HttpServer, run by the engine that records (a
  // server of the forwarding copy would serve that copy's empty profiles).
  // Never throws: a failed start is a handle with its failure: 0 serving, -1
  // an invalid address, else the errno, with its context.
  void* (*start_http_server)(const char* listen, std::size_t size) noexcept;
  void (*stop_http_server)(void* server) noexcept;
  std::uint16_t (*http_server_port)(const void* server) noexcept;
  const char* (*http_server_error)(const void* server) noexcept;  // "" when serving
  int (*http_server_failure)(const void* server, const char** context) noexcept;
  // The program's operator new and labels (engine.hpp: ForwardedNew;
  // 2_sampling/labels.hpp: ProgramLabels). `program_labels` stays the
  // program's: the library keeps the pointer.
  const ForwardedNew* forwarded_new;
  void (*attach_program_labels)(const ProgramLabels* program_labels) noexcept;
  // The library's Stats, its first `size` bytes at most (the caller's
  // sizeof(Stats)); fields it lacks stay as they were.
  void (*get_stats_into)(Stats* out, std::size_t size) noexcept;
};
// A library's table has the members up to and including `member` when its
// size covers them.
#define HEAPPROF_ENGINE_HAS(e, member) \
  ((e)->size >= offsetof(::heapprof::detail::EngineApi, member) + sizeof((e)->member))
// The part of EngineApi every version-1 library has.
constexpr std::uint32_t kEngineApiMinSize = offsetof(EngineApi, write_peak_stream);
constexpr std::uint32_t kEngineApiVersion = 1;
using EngineApiGetter = const EngineApi* (*)() noexcept;

// The engine this program's API forwards to (set at start-up), or nullptr.
inline const EngineApi* g_external_engine = nullptr;

inline const EngineApi* ExternalEngine() noexcept {
  EnsureInit();
  return g_external_engine;
}

}  // namespace detail

HEAPPROF_LINKED_BEGIN

// ---------------------------------------------------------------- sample rate, Stats

// Every entry point that takes a profiler lock holds a ReentrancyGuard: a
// signal handler that allocates on this thread meanwhile is then not sampled,
// and so never waits on a lock its own thread holds.

void SetSampleRate(std::size_t mean_bytes) noexcept {
  if (const detail::EngineApi* e = detail::ExternalEngine()) return e->set_sample_rate(mean_bytes);
  detail::ReentrancyGuard guard;
  detail::ApplyRate(mean_bytes);  // also resets the caller's own countdown, exactly
}

std::size_t GetSampleRate() noexcept {
  if (const detail::EngineApi* e = detail::ExternalEngine()) return e->get_sample_rate();
  return detail::RateOf(detail::g_rate_state.load(std::memory_order_acquire));
}

Stats GetStats() noexcept {
  if (const detail::EngineApi* e = detail::ExternalEngine()) {
    Stats s{};
    if (HEAPPROF_ENGINE_HAS(e, get_stats_into) && e->get_stats_into != nullptr) {
      e->get_stats_into(&s, sizeof s);
    } else {
      const detail::EngineStatsV1 v1 = e->get_stats();
      std::memcpy(&s, &v1, sizeof v1);
    }
    return s;
  }
  detail::ReentrancyGuard guard;
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
  s.profiler_bytes = detail::g_arena.MappedBytes() + sizeof(detail::g_free_filter) + sizeof(detail::g_free_bits) +
                     sizeof(detail::unwind_table::g_rule_cache);
  s.label_sets = detail::g_labels.SetCount();
  s.label_set_overflows = detail::g_labels.Overflows();
  const detail::UnwindTableStats u = detail::GetUnwindTableStats();
  s.unwind_objects = u.objects;
  s.unwind_rows = u.rows;
  s.unwind_table_bytes = u.bytes;
  s.unwind_one_fde_lookups = u.lazy_lookups;
  s.stacks = detail::g_buckets.StackCount();
  s.stack_overflows = detail::g_buckets.StackOverflows();
  s.samples_dropped = detail::g_buckets.SamplesDropped();
  s.samples_skipped_nested = detail::g_registry.NestedSamples();
  return s;
}

// ---------------------------------------------------------------- writers

bool WriteHeapProfile(std::ostream& out) {
  if (const detail::EngineApi* e = detail::ExternalEngine()) return e->write_stream(out, false);
  detail::ReentrancyGuard guard;
  return detail::WriteProfile(out, false);
}
bool WriteAllocsProfile(std::ostream& out) {
  if (const detail::EngineApi* e = detail::ExternalEngine()) return e->write_stream(out, true);
  detail::ReentrancyGuard guard;
  return detail::WriteProfile(out, true);
}

bool WriteHeapProfile(const char* path) {
  if (const detail::EngineApi* e = detail::ExternalEngine()) return path != nullptr && e->write_path(path, false);
  detail::ReentrancyGuard guard;
  return detail::WriteToPath(path, [](const char* p) { return detail::WriteProfileFile(p, false); });
}
bool WriteAllocsProfile(const char* path) {
  if (const detail::EngineApi* e = detail::ExternalEngine()) return path != nullptr && e->write_path(path, true);
  detail::ReentrancyGuard guard;
  return detail::WriteToPath(path, [](const char* p) { return detail::WriteProfileFile(p, true); });
}
bool WriteHeapProfile(const std::string& path) { return WriteHeapProfile(path.c_str()); }
bool WriteAllocsProfile(const std::string& path) { return WriteAllocsProfile(path.c_str()); }

// ---------------------------------------------------------------- the peak profile

bool WritePeakHeapProfile(std::ostream& out) {
  if (const detail::EngineApi* e = detail::ExternalEngine()) {
    return HEAPPROF_ENGINE_HAS(e, write_peak_stream) && e->write_peak_stream(out);
  }
  detail::ReentrancyGuard guard;
  return detail::WriteProfile(out, false, true);
}
bool WritePeakHeapProfile(const char* path) {
  if (const detail::EngineApi* e = detail::ExternalEngine()) {
    return path != nullptr && HEAPPROF_ENGINE_HAS(e, write_peak_path) && e->write_peak_path(path);
  }
  detail::ReentrancyGuard guard;
  return detail::WriteToPath(path, [](const char* p) { return detail::WritePeakProfileFile(p); });
}
bool WritePeakHeapProfile(const std::string& path) { return WritePeakHeapProfile(path.c_str()); }

void ResetPeak() noexcept {
  if (const detail::EngineApi* e = detail::ExternalEngine()) {
    if (HEAPPROF_ENGINE_HAS(e, reset_peak)) e->reset_peak();
    return;
  }
  detail::ReentrancyGuard guard;
  detail::g_peak.Reset();
}

// ---------------------------------------------------------------- the retention profile

bool WriteRetentionProfile(std::ostream& out) {
  if (const detail::EngineApi* e = detail::ExternalEngine()) {
    return HEAPPROF_ENGINE_HAS(e, write_retention_stream) && e->write_retention_stream(out);
  }
  detail::ReentrancyGuard guard;
  detail::ClearDeadStack();  // the scan reads this thread's stack, ours included
  return detail::WriteRetentionProfile(out);
}
bool WriteRetentionProfile(const char* path) {
  if (const detail::EngineApi* e = detail::ExternalEngine()) {
    return path != nullptr && HEAPPROF_ENGINE_HAS(e, write_retention_path) && e->write_retention_path(path);
  }
  detail::ReentrancyGuard guard;
  detail::ClearDeadStack();  // the scan reads this thread's stack, ours included
  return detail::WriteToPath(path, [](const char* p) { return detail::WriteRetentionProfileFile(p); });
}
bool WriteRetentionProfile(const std::string& path) { return WriteRetentionProfile(path.c_str()); }

// ---------------------------------------------------------------- unwinder

void SetUnwinder(Unwinder u) noexcept {
  // EnsureInit first: HEAPPROF=unwinder=... must not override a later explicit choice
  if (const detail::EngineApi* e = detail::ExternalEngine()) return e->set_unwinder(u);
  detail::g_unwinder.store(u == Unwinder::kTable ? detail::kUnwinderTable : detail::kUnwinderFramePointer,
                           std::memory_order_relaxed);
}

Unwinder GetUnwinder() noexcept {
  if (const detail::EngineApi* e = detail::ExternalEngine()) return e->get_unwinder();
  return detail::g_unwinder.load(std::memory_order_relaxed) == detail::kUnwinderTable ? Unwinder::kTable
                                                                                        : Unwinder::kFramePointer;
}

HEAPPROF_LINKED_END

namespace detail {
HEAPPROF_LINKED_BEGIN

// ---------------------------------------------------------------- slow paths

// noinline: the unwinders start from this function's frame record (its saved
// rbp is the hook's, its return address points into the hook).
// Both keep errno: a successful malloc or a free must not change it (free
// keeps it by POSIX 2024), and the slow paths make system calls.
HEAPPROF_NOINLINE bool OnAllocSlow(void* p, std::size_t n, const void* hook_return, unsigned how) noexcept {
  // A heapprof::allocator's upstream calling operator new: the upstream's own
  // block, which the allocator counts itself. Checked here, before errno is
  // saved (every such allocator call), and only here: AllocSlowPath's one caller.
  if (HEAPPROF_UNLIKELY(tls_thread_flags.suppress) && (how & kCountBlock) != 0) {
    // Inside its AllocatorScope the upstream's other blocks are counted:
    // all are, until SettleAllocatorScope uncounts the allocator's own.
    if (tls_thread_flags.allocator_scope) {
      const int saved_errno = errno;
      CountScopeBlock(tls_thread_flags, p, n);
      errno = saved_errno;
    }
    return true;
  }
  const int saved_errno = errno;
  const bool kept = AllocSlowPath(p, n, hook_return, how, __builtin_frame_address(0));
  errno = saved_errno;
  // No tail call: the unwinder reads this function's frame record, which a
  // tail call would pop before the sample is taken (clang -O2 does that).
  asm volatile("" ::: "memory");
  return kept;
}

HEAPPROF_NOINLINE inline bool FreeSlowKeepingErrno(void* p, std::size_t n, unsigned how, ReleaseFn release) noexcept {
  const int saved_errno = errno;
  const bool kept = FreeSlowPath(p, n, how, release);
  errno = saved_errno;
  return kept;
}

HEAPPROF_NOINLINE bool OnFreeSlow(void* p, std::size_t n, unsigned how, ReleaseFn release) noexcept {
  // The same for its operator delete of a block no sampled object holds
  // (FreeSlowPath): here, not in the function that saves registers for the rest.
  if (HEAPPROF_UNLIKELY(tls_thread_flags.suppress) && (how & kFreeSized) == 0 && !MaybeSampled(p) &&
      !CountedInScope(tls_thread_flags, p)) {
    return false;
  }
  return FreeSlowKeepingErrno(p, n, how, release);
}

void SettleAllocatorScope(const void* p, std::size_t bytes, std::uint8_t since) noexcept {
  SettleScopeBlocks(p, bytes, since);
}

// ---------------------------------------------------------------- labels

// A scope usually opens with the labels it had before (a handler's endpoint
// and tenant, from a small set): the thread's memos (tls_label_memos) keep
// its last few sets, found by the enclosing set and the addresses of the
// first label's strings, and checked against the labels' bytes (IsMergeOf).
// A two-label scope then costs a few compares instead of sorting, hashing and
// a lookup under the registry's lock (bench/labels.cpp).
const LabelSetData* InternLabels(const LabelSetData* base, const Label* labels, std::size_t count) noexcept {
  if (count == 0) return base;  // (interned already)
  LabelMemos::Memo& m = tls_label_memos.memo[LabelMemos::Slot(base, labels[0].first.data(), labels[0].second.data())];
  if (m.base == base && m.key == labels[0].first.data() && m.value == labels[0].second.data()) {
    // Read once: a signal handler's scope may write the memo meanwhile.
    const LabelSetData* const set = __atomic_load_n(&m.set, __ATOMIC_RELAXED);
    if (IsMergeOf(set, base, labels, count)) return set;
  }
  EnsureInit();  // HEAPPROF=max_label_sets applies before the first set
  ReentrancyGuard guard;
  LabelBuilder b;
  b.AddAll(base);
  for (std::size_t i = 0; i < count; ++i) b.Put(labels[i].first, labels[i].second);
  const LabelSetData* set = g_labels.Intern(b);
  // Not the overflow set: each of its uses is counted (Stats::label_set_overflows).
  if (set != nullptr && !g_labels.IsOverflow(set)) m = LabelMemos::Memo{base, labels[0].first.data(), labels[0].second.data(), set};
  return set;
}

const LabelSetData* MergeLabels(const LabelSetData* base, const LabelSetData* over) noexcept {
  if (base == nullptr || over == nullptr) return base == nullptr ? over : base;
  EnsureInit();
  ReentrancyGuard guard;
  LabelBuilder b;
  b.AddAll(base);
  b.AddAll(over);
  return g_labels.Intern(b);
}

std::size_t LabelCount(const LabelSetData* set) noexcept { return set == nullptr ? 0 : set->count; }

Label LabelAt(const LabelSetData* set, std::size_t i) noexcept {
  if (set == nullptr || i >= set->count) return {};
  return {set->entries()[i].key, set->entries()[i].value};
}

void ReportScopeMisuse(bool abort_after) noexcept {
  static std::atomic<bool> reported{false};
  if (!reported.exchange(true, std::memory_order_relaxed)) {
    ReportRaw(
        "heapprof: ScopedLabels destroyed out of order (scopes must nest on one thread; a scope held across a "
        "co_await or a fiber switch needs heapprof::SetCurrentLabels where its task suspends and resumes)\n");
  }
  if (abort_after) std::abort();
}

// ---------------------------------------------------------------- HttpServer

HEAPPROF_LINKED_END

// The state of a server that could not even be allocated.
inline char g_http_out_of_memory_tag;
inline HttpServerState* HttpOutOfMemory() noexcept {
  return reinterpret_cast<HttpServerState*>(&g_http_out_of_memory_tag);
}

HEAPPROF_LINKED_BEGIN

inline int EngineHttpServerFailure(const void* server, const char** context) noexcept;

// Whether the engine this copy forwards to (ExternalEngine) runs servers for
// it; an older library cannot, and says so.
inline bool RemoteServing(const EngineApi* e) noexcept {
  if (HEAPPROF_ENGINE_HAS(e, http_server_failure)) return true;
  ReportRaw("heapprof: HttpServer: libheapprof_preload.so records this process but is older than this program's "
            "heapprof and cannot serve for it; this server's profiles are empty (use the library's own, "
            "HEAPPROF=http=ADDRESS)\n");
  return false;
}

HttpServerState* StartHttpServer(std::string_view listen, bool throw_errors) {
  ReentrancyGuard guard;  // the server's own memory is never sampled
  EnsureInit();
  // A program whose copy forwards has its server run by the engine that
  // records (it serves what that engine records); else one of this copy's.
  const EngineApi* engine = g_external_engine != nullptr && RemoteServing(g_external_engine) ? g_external_engine
                                                                                               : nullptr;
  void* remote = engine != nullptr ? engine->start_http_server(listen.data(), listen.size()) : nullptr;
  HttpServerState* state = nullptr;  // on the arena, like everything the server holds
  HEAPPROF_TRY {
    state = engine != nullptr ? MakeArena<HttpServerState>(engine, remote).release()
                              : MakeArena<HttpServerState>(listen).release();
  }
  HEAPPROF_CATCH_ALL { state = nullptr; }
  if (state == nullptr) {
    if (engine != nullptr) engine->stop_http_server(remote);
#if HEAPPROF_EXCEPTIONS
    if (throw_errors) throw std::bad_alloc();
#endif
    return HttpOutOfMemory();
  }
  const char* context = "";
  const int failure = EngineHttpServerFailure(state, &context);
  if (failure == 0 || !throw_errors) return state;
#if HEAPPROF_EXCEPTIONS
  // The exception's text is the caller's (host) memory.
  const std::string message = HttpServerError(state);
  const std::string where = context;
  StopHttpServer(state);
  if (failure < 0) throw std::invalid_argument(message);
  throw std::system_error(failure, std::generic_category(), where);
#else
  ReportLine(ArenaString(HttpServerError(state)) + "; not serving");
  return state;
#endif
}

void StopHttpServer(HttpServerState* state) noexcept {
  ReentrancyGuard guard;
  if (state == nullptr || state == HttpOutOfMemory()) return;
  if (state->engine != nullptr) state->engine->stop_http_server(state->remote);
  ArenaDeleter<HttpServerState>()(state);
}

std::uint16_t HttpServerPort(const HttpServerState* state) noexcept {
  if (state == nullptr || state == HttpOutOfMemory()) return 0;
  if (state->engine != nullptr) return state->engine->http_server_port(state->remote);
  return state->server->ok() ? state->server->port() : 0;
}

const char* HttpServerError(const HttpServerState* state) noexcept {
  if (state == nullptr || state == HttpOutOfMemory()) return "out of memory";
  if (state->engine != nullptr) return state->engine->http_server_error(state->remote);
  return state->server->ErrorMessage();
}

// The other side of EngineApi's server members (libheapprof_preload.so's).
inline void* EngineStartHttpServer(const char* listen, std::size_t size) noexcept {
  return StartHttpServer(std::string_view(listen, size), false);
}
inline void EngineStopHttpServer(void* server) noexcept { StopHttpServer(static_cast<HttpServerState*>(server)); }
inline std::uint16_t EngineHttpServerPort(const void* server) noexcept {
  return HttpServerPort(static_cast<const HttpServerState*>(server));
}
inline const char* EngineHttpServerError(const void* server) noexcept {
  return HttpServerError(static_cast<const HttpServerState*>(server));
}
inline int EngineHttpServerFailure(const void* server, const char** context) noexcept {
  const auto* state = static_cast<const HttpServerState*>(server);
  *context = "";
  if (state == nullptr || state == HttpOutOfMemory()) return ENOMEM;
  if (state->engine != nullptr) return state->engine->http_server_failure(state->remote, context);
  if (state->server->ok()) return 0;
  const http::StartError& e = state->server->error();
  *context = e.context.c_str();
  return e.kind == http::StartError::kInvalidAddress ? -1 : (e.err != 0 ? e.err : EIO);
}

HEAPPROF_LINKED_END

// HEAPPROF's dump thread and HTTP server start with the program (when it asks
// for them), from this unit's static initialisation; by the engine that
// records only (the other one's start-up would serve an empty profile, or
// fail to bind the same port).
[[maybe_unused]] static const bool g_started_from_env =
    secure_getenv("HEAPPROF") != nullptr && (EnsureInit(), !g_engine_off) && StartFromEnv();

}  // namespace detail
}  // namespace heapprof

#if !defined(HEAPPROF_PRELOAD_LIBRARY)
namespace heapprof {
namespace detail {
// Whether the object holding `code` stays loaded for good: the main program,
// or a library pinned here (RTLD_NODELETE: a dlclose can no longer unload
// it), so that the recording library may keep pointers to its functions.
inline bool PinObjectOf(const void* code) noexcept {
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(code, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 || map == nullptr) return false;
  if (map->l_name == nullptr || map->l_name[0] == '\0') return true;  // the main program
  return dlopen(map->l_name, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE) != nullptr;  // never closed: the point
}
inline const LabelSetData* ThisCopysLabels() noexcept { return tls_current_labels; }
}  // namespace detail
}  // namespace heapprof

// Start-up of a program that compiled heapprof in: if libheapprof_preload.so
// is loaded too and its malloc is the process's, that library records (it
// sees every C allocation, and this program's operator new reaches its
// malloc), and this copy turns itself off and forwards its API, its operator
// new and its labels there (README: the preload library).
extern "C" __attribute__((__visibility__("hidden"))) void heapprof_detail_engine_role() noexcept {
  using heapprof::detail::EngineApiGetter;
  auto getter = reinterpret_cast<EngineApiGetter>(heapprof::detail::FindSymbol(RTLD_DEFAULT, "heapprof_preload_engine_v1"));
  if (getter == nullptr) return;
  const heapprof::detail::EngineApi* e = getter();
  if (e == nullptr || e->version != heapprof::detail::kEngineApiVersion ||
      e->size < heapprof::detail::kEngineApiMinSize) {
    return;
  }
  heapprof::detail::g_external_engine = e;
  heapprof::detail::g_engine_off = true;
  // A library as old as this: the program's operator new goes to its cold
  // hooks, and its samples carry the program's labels (read through this
  // copy's functions: only while they cannot be unloaded).
  if (HEAPPROF_ENGINE_HAS(e, attach_program_labels) && e->forwarded_new != nullptr &&
      e->attach_program_labels != nullptr) {
    static const heapprof::detail::ProgramLabels labels = {&heapprof::detail::ThisCopysLabels,
                                                           &heapprof::detail::LabelCount, &heapprof::detail::LabelAt};
    if (heapprof::detail::PinObjectOf(reinterpret_cast<const void*>(&heapprof::detail::ThisCopysLabels))) {
      e->attach_program_labels(&labels);
    }
    heapprof::detail::g_forwarded_new.store(e->forwarded_new, std::memory_order_release);
  }
  heapprof::detail::ReportRaw(
      "heapprof: libheapprof_preload.so is loaded and records this process; the copy compiled into the program "
      "forwards to it\n");
}
#endif

#else  // !HEAPPROF_ENABLED: the documented no-op API of unsupported platforms.

#include <string>

namespace heapprof {
HEAPPROF_LINKED_BEGIN
void SetSampleRate(std::size_t) noexcept {}
std::size_t GetSampleRate() noexcept { return 0; }
Stats GetStats() noexcept { return Stats{}; }
bool WriteHeapProfile(std::ostream&) { return false; }
bool WriteAllocsProfile(std::ostream&) { return false; }
bool WriteHeapProfile(const char*) { return detail::FailWithErrno(ENOSYS); }
bool WriteAllocsProfile(const char*) { return detail::FailWithErrno(ENOSYS); }
bool WriteHeapProfile(const std::string&) { return detail::FailWithErrno(ENOSYS); }
bool WriteAllocsProfile(const std::string&) { return detail::FailWithErrno(ENOSYS); }
bool WritePeakHeapProfile(std::ostream&) { return false; }
bool WritePeakHeapProfile(const char*) { return detail::FailWithErrno(ENOSYS); }
bool WritePeakHeapProfile(const std::string&) { return detail::FailWithErrno(ENOSYS); }
void ResetPeak() noexcept {}
bool WriteRetentionProfile(std::ostream&) { return false; }
bool WriteRetentionProfile(const char*) { return detail::FailWithErrno(ENOSYS); }
bool WriteRetentionProfile(const std::string&) { return detail::FailWithErrno(ENOSYS); }
void SetUnwinder(Unwinder) noexcept {}
Unwinder GetUnwinder() noexcept { return Unwinder::kTable; }
HEAPPROF_LINKED_END

namespace detail {
struct HttpServerState {};
HEAPPROF_LINKED_BEGIN
bool OnAllocSlow(void*, std::size_t, const void*, unsigned) noexcept { return true; }
bool OnFreeSlow(void*, std::size_t, unsigned, ReleaseFn) noexcept { return false; }
const LabelSetData* InternLabels(const LabelSetData*, const Label*, std::size_t) noexcept { return nullptr; }
const LabelSetData* MergeLabels(const LabelSetData*, const LabelSetData*) noexcept { return nullptr; }
std::size_t LabelCount(const LabelSetData*) noexcept { return 0; }
Label LabelAt(const LabelSetData*, std::size_t) noexcept { return {}; }
void ReportScopeMisuse(bool) noexcept {}
HttpServerState* StartHttpServer(std::string_view, bool) {
  static HttpServerState none;
  return &none;
}
void StopHttpServer(HttpServerState*) noexcept {}
std::uint16_t HttpServerPort(const HttpServerState*) noexcept { return 0; }
const char* HttpServerError(const HttpServerState*) noexcept {
  return "heapprof is not supported on this platform (Linux on x86-64 or aarch64 only)";
}
HEAPPROF_LINKED_END
}  // namespace detail
}  // namespace heapprof

#endif  // HEAPPROF_ENABLED
