// bench/unwind: ns per frame of the unwinders on the same 32-deep stack.
//
//   frame pointers      heapprof::detail::UnwindFramePointers
//   table               heapprof::detail::UnwindWithTable: what a sample runs (reader
//                       section, snapshot, walk); the same stack every time, so
//                       the walk meets the thread's last walk at its first frame
//                       and checks the rest against the stack (replay)
//   table, every frame stepped   the same with replay off: every frame
//                       derived from the unwind tables (a stack unlike the last)
//   table, walk only    the walk alone (no replay), on a snapshot taken beforehand
//   ..., no guesses     the same with the rule cache's return-address guesses
//                       off (table.hpp: ReturnAddressAt), side by side
//   table, stepped, cache cold   every frame stepped, and the rule-cache
//                       entry of every return address on the stack cleared
//                       after each unwind, so each distinct return address is
//                       looked up in the tables (what addresses the cache has
//                       not seen, or lost to a conflict, cost). The recursion
//                       repeats one address, so this row is reported per miss:
//                       (its time - the stepped row's) / distinct addresses
//   libgcc              _Unwind_Backtrace from libgcc_s.so.1
//   libunwind           unw_backtrace (nongnu libunwind, Debian's libunwind8)
//   glibc backtrace()   <execinfo.h>, libgcc underneath
//
// libunwind is dlopen'ed RTLD_LOCAL, not linked with -lunwind: libunwind.so
// exports _Unwind_Backtrace/_Unwind_GetIP too, and once it is in the global
// scope glibc's backtrace() silently runs libunwind instead of libgcc
// (measured: 8 ns/frame instead of ~130), and a direct _Unwind_GetIP call
// binds to libunwind's, which cannot read a libgcc context.
//
// Then (GCC only) the same on random stacks: a new stack of two functions
// without frame pointers for every unwind (ReportPoly), where a guess is
// right half the time and a walk meets its predecessor only by chance.
//
// "warm": the best of 41 batches of 5000 unwinds of the same stack, per
// frame returned (best, not median: on a shared machine the slow batches
// measure the neighbours; many short batches find a quiet moment more
// often than a few long ones); "marginal": the cost of one more frame, from
// the same measurement on a 96-deep stack (per-call overhead cancels out).
// "first": the very first unwind in a fresh process (fork per unwinder, before
// anything was unwound), so it includes whatever that unwinder sets up: our
// table builds, libunwind's caches, backtrace()'s dlopen of libgcc_s.
// Also: table build time and size for libc and libstdc++, and the time to
// build the tables of every loaded object in a fresh process (the most a
// process's first samples can pay, spread over the samples that first meet
// each object).
//
// Side by side with an older include/ tree: compile this file twice, e.g.
//   g++ -std=c++17 -O2 -g -fno-omit-frame-pointer -I<old>/include bench/unwind.cpp -o unwind_old -ldl -lpthread
//
// Build (see tests/unwind/BUILD.md): frame pointers on, so every unwinder
// walks all 32 frames:
//   g++ -std=c++17 -O2 -fno-omit-frame-pointer -Iinclude bench/unwind.cpp
//       -o bench_unwind -ldl -lpthread
// (needs libunwind.so.8 at run time: Debian's libunwind8, which libunwind-dev
// pulls in; without it that row is skipped)
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <sys/wait.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "heapprof/detail/3_unwinding/frame_pointers.hpp"
#include "heapprof/detail/3_unwinding/table.hpp"
#if defined(__GNUC__) && !defined(__clang__)
#include "random_stacks.hpp"  // GCC only: the optimize attribute
#endif

namespace {

namespace hd = heapprof::detail;
namespace ut = heapprof::detail::unwind_table;
using Clock = std::chrono::steady_clock;

constexpr int kDepth = 32;       // frames of our own recursion under the hook
constexpr int kDeepDepth = 96;   // the second measurement, for the marginal cost
constexpr int kBatches = 41;
constexpr int kPerBatch = 5000;

void* volatile g_sink;

// Both from libgcc_s by dlsym: a direct call would bind to libunwind.so's
// exports of the same names, and libunwind's _Unwind_GetIP cannot read a
// libgcc context.
using UnwindBacktraceFn = _Unwind_Reason_Code (*)(_Unwind_Trace_Fn, void*);
using UnwindGetIpFn = _Unwind_Ptr (*)(_Unwind_Context*);
UnwindBacktraceFn g_libgcc_backtrace = nullptr;
UnwindGetIpFn g_libgcc_get_ip = nullptr;
using UnwBacktraceFn = int (*)(void**, int);
UnwBacktraceFn g_unw_backtrace = nullptr;

struct Collect {
  void** pcs;
  int n, cap;
};
_Unwind_Reason_Code CollectFrame(_Unwind_Context* ctx, void* arg) {
  auto* c = static_cast<Collect*>(arg);
  if (c->n == c->cap) return _URC_END_OF_STACK;
  c->pcs[c->n++] = reinterpret_cast<void*>(g_libgcc_get_ip(ctx));
  return _URC_NO_REASON;
}

enum Method {
  kFp, kTable, kTableNoGuess, kTableStepped, kTableSteppedNoGuess, kTableNoGen, kTableCold,
  kLibgcc, kLibunwind, kGlibc, kMethods
};
const char* const kNames[kMethods] = {"frame pointers", "table", "table, no guesses", "table, every frame stepped",
                                      "table, stepped, no guesses", "table, walk only",
                                      "table, stepped, cache cold",
                                      "libgcc _Unwind_Backtrace", "libunwind unw_backtrace", "glibc backtrace()"};

struct Where {
  const void* frame;
  const void* hook_return;
  std::uintptr_t lo, hi;
};

int g_cold_misses = 0;  // kTableCold: distinct rule-cache entries the last walk used

// One table unwind with replay and guesses as given (the flags back on after).
int TableUnwind(const Where& w, hd::CapturedStack& stack, bool replay, bool guess) {
  if (!replay) ut::g_replay_walks.store(false, std::memory_order_relaxed);
  if (!guess) ut::g_guess_walks.store(false, std::memory_order_relaxed);
  hd::UnwindWithTable(w.frame, w.hook_return, w.lo, w.hi, stack);
  if (!guess) ut::g_guess_walks.store(true, std::memory_order_relaxed);
  if (!replay) ut::g_replay_walks.store(true, std::memory_order_relaxed);
  return stack.depth;
}

// One unwind; returns the frame count.
__attribute__((noinline)) int UnwindOnce(Method m, const Where& w) {
  static thread_local hd::CapturedStack stack;
  void* buf[256];
  switch (m) {
    case kFp:
      hd::UnwindFramePointers(w.frame, w.hook_return, w.lo, w.hi, stack);
      return stack.depth;
    case kTable:
      return TableUnwind(w, stack, true, true);
    case kTableNoGuess:
      return TableUnwind(w, stack, true, false);
    case kTableStepped:
      return TableUnwind(w, stack, false, true);
    case kTableSteppedNoGuess:
      return TableUnwind(w, stack, false, false);
    case kTableCold: {
      TableUnwind(w, stack, false, true);
      // Every slot the walk used (a frame's rule is cached under its return
      // address; the leaf's is the hook's, stepped from Measure's frame).
      int distinct = 0;
      for (int i = 0; i < stack.depth; ++i) {
        auto& key = ut::g_rule_cache.e[ut::CacheSlot(stack.pcs[i])].key;
        distinct += key.load(std::memory_order_relaxed) != 0;
        key.store(0, std::memory_order_relaxed);
      }
      g_cold_misses = distinct;
      return stack.depth;
    }
    case kTableNoGen: {
      static const ut::ObjectSet* set = ut::CurrentObjects();
      ut::UnwindFrom(set, reinterpret_cast<std::uintptr_t>(w.frame), reinterpret_cast<std::uintptr_t>(w.hook_return),
                     w.lo, w.hi, stack);
      return stack.depth;
    }
    case kLibgcc: {
      Collect c{buf, 0, 256};
      g_libgcc_backtrace(&CollectFrame, &c);
      return c.n;
    }
    case kLibunwind:
      return g_unw_backtrace != nullptr ? g_unw_backtrace(buf, 256) : 0;
    case kGlibc:
      return backtrace(buf, 256);
    default:
      return 0;
  }
}

struct Result {
  double ns_per_call = 0;
  int frames = 0;
};

Result Warm(Method m, const Where& w) {
  Result r;
  for (int i = 0; i < 1000; ++i) r.frames = UnwindOnce(m, w);
  std::vector<double> batches;
  for (int b = 0; b < kBatches; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kPerBatch; ++i) r.frames = UnwindOnce(m, w);
    batches.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kPerBatch);
  }
  r.ns_per_call = *std::min_element(batches.begin(), batches.end());
  return r;
}

// The first unwind of a fresh process: fork, unwind once, report by pipe.
Result First(Method m, const Where& w) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const auto t0 = Clock::now();
    Result r;
    r.frames = UnwindOnce(m, w);
    r.ns_per_call = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    if (write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  Result r;
  if (read(fds[0], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) r = Result{};
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return r;
}

struct BuildTiming {
  const void* pc;
  double ns = 0;
  std::size_t rows = 0, bytes = 0, fdes = 0;
  bool found = false;
};

int RebuildCallback(dl_phdr_info* info, std::size_t, void* data) {
  auto& t = *static_cast<BuildTiming*>(data);
  ut::ObjectInfo oi;
  const auto pc = reinterpret_cast<std::uintptr_t>(t.pc);
  if (!ut::DescribeObject(*info, oi) || pc < oi.lo || pc >= oi.hi) return 0;
  ut::Object o;
  o.lo = oi.lo;
  o.hi = oi.hi;
  o.bias = oi.bias;
  o.hdr = oi.hdr;
  o.hdr_size = oi.hdr_size;
  const auto t0 = Clock::now();
  ut::Table* table = ut::BuildTable(*info, o);
  t.ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  if (table != nullptr) {
    t.found = true;
    t.rows = table->count;
    t.bytes = table->bytes;
    t.fdes = table->fdes;
    hd::g_arena.Free(table, table->bytes);
  }
  return 1;
}

// Every loaded object's table, built in a fresh process (fork): what the
// first samples of a process pay at most, in total.
struct AllBuild {
  double ms = 0;
  std::size_t objects = 0, tables = 0, rows = 0, bytes = 0;
};
AllBuild BuildAllInChild() {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    AllBuild r;
    const auto t0 = Clock::now();
    {
      ut::ReaderSection reading;
      const ut::ObjectSet* set = ut::CurrentObjects();
      for (std::size_t i = 0; set != nullptr && i < set->count; ++i) {
        const ut::Table* t = ut::EnsureTable(set->objects[i]);
        ++r.objects;
        if (t != &ut::kNoTable) {
          ++r.tables;
          r.rows += t->count;
          r.bytes += t->bytes;
        }
      }
    }
    r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  AllBuild r;
  if (read(fds[0], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) r = AllBuild{};
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return r;
}

void ReportBuild(const char* name, const void* pc) {
  // First build: what the first sample through this object pays (page faults
  // on .eh_frame included). Then the median of rebuilds with warm pages.
  const ut::Table* t = nullptr;
  if (!ut::TableFor(pc, t)) {
    std::printf("  %-12s no table\n", name);
    return;
  }
  std::vector<double> again;
  BuildTiming bt{pc};
  for (int i = 0; i < 9; ++i) {
    dl_iterate_phdr(&RebuildCallback, &bt);
    again.push_back(bt.ns);
  }
  std::sort(again.begin(), again.end());
  // What the object answers before its table is built: one FDE's rule at a
  // time (table.hpp: LazyRuleAt), at 4,000 row starts spread over the table.
  constexpr std::uint32_t kLookups = 4000;
  bool lazy = false;
  std::uint32_t sink = 0;
  const auto l0 = Clock::now();
  for (std::uint32_t i = 0; i < kLookups; ++i) {
    const std::uint32_t row = static_cast<std::uint32_t>((std::uint64_t{i} * 2654435761u) % t->count);
    sink += ut::LazyRuleForPc(reinterpret_cast<const void*>(t->base + t->rows[row].pc), lazy);
  }
  const double one_fde_ns = std::chrono::duration<double, std::nano>(Clock::now() - l0).count() / kLookups;
  g_sink = reinterpret_cast<void*>(static_cast<std::uintptr_t>(sink));
  char one_fde[64];
  if (lazy) {
    std::snprintf(one_fde, sizeof one_fde, "%.0f ns", one_fde_ns);
  } else {
    std::snprintf(one_fde, sizeof one_fde, "(builds at once)");
  }
  std::printf("  %-12s %6zu FDEs -> %6u rows, %7.1f KiB (%.2f B/row incl. index), first build %.2f ms, rebuild %.2f ms,"
              " one FDE's rule %s\n",
              name, t->fdes, t->count, static_cast<double>(t->bytes) / 1024.0,
              static_cast<double>(t->bytes) / t->count, static_cast<double>(t->build_ns) / 1e6,
              again[again.size() / 2] / 1e6, one_fde);
}

AllBuild g_all;
Result g_first[kMethods];
Result g_warm[kMethods];
Result g_warm_deep[kMethods];
// The same on a stack of functions without frame pointers (GCC only).
constexpr Method kNoFpMethods[] = {kTable,     kTableNoGuess, kTableStepped, kTableSteppedNoGuess,
                                   kTableNoGen, kTableCold,    kLibunwind};
Result g_nofp[kMethods];
Result g_nofp_deep[kMethods];
bool g_have_nofp = false;

// The measurement runs here, under kDepth frames of Down() and a fake hook,
// shaped like the engine: this function has a frame record (it takes its
// own frame address) and unwinds from it.
__attribute__((noinline)) void Measure(const void* hook_return, bool deep, bool nofp) {
  Where w{__builtin_frame_address(0), hook_return, 0, 0};
  hd::CurrentStackBounds(w.lo, w.hi);
  w.lo = reinterpret_cast<std::uintptr_t>(w.frame);
  if (nofp) {
    g_have_nofp = true;
    for (Method m : kNoFpMethods) (deep ? g_nofp_deep : g_nofp)[m] = Warm(m, w);
    return;
  }
  if (deep) {
    for (int m = 0; m < kMethods; ++m) g_warm_deep[m] = Warm(static_cast<Method>(m), w);
    return;
  }
  for (int m = 0; m < kMethods; ++m) g_first[m] = First(static_cast<Method>(m), w);
  for (int m = 0; m < kMethods; ++m) g_warm[m] = Warm(static_cast<Method>(m), w);
}

void Report() {
  std::printf("unwinding a %d-deep stack (+ main and libc start-up frames)\n\n", kDepth);
  std::printf("  %-26s %7s %10s %12s %13s %14s\n", "unwinder", "frames", "warm ns", "warm ns/frm",
              "marginal ns/f", "first-call us");
  for (int m = 0; m < kMethods; ++m) {
    if (m == kTableCold) continue;  // per miss, below
    const Result& a = g_warm[m];
    const Result& b = g_warm_deep[m];
    const double marginal =
        b.frames > a.frames ? (b.ns_per_call - a.ns_per_call) / static_cast<double>(b.frames - a.frames) : 0.0;
    std::printf("  %-26s %7d %10.1f %12.2f %13.2f %14.1f\n", kNames[m], a.frames, a.ns_per_call,
                a.frames > 0 ? a.ns_per_call / a.frames : 0.0, marginal, g_first[m].ns_per_call / 1000.0);
  }
  if (g_have_nofp) {
    std::printf("\nthe same on a stack of functions built without frame pointers (CFA = rsp + offset)\n");
    for (Method m : kNoFpMethods) {
      if (m == kTableCold) continue;
      const Result& a = g_nofp[m];
      const Result& b = g_nofp_deep[m];
      const double marginal =
          b.frames > a.frames ? (b.ns_per_call - a.ns_per_call) / static_cast<double>(b.frames - a.frames) : 0.0;
      std::printf("  %-26s %7d %10.1f %12.2f %13.2f\n", kNames[m], a.frames, a.ns_per_call,
                  a.frames > 0 ? a.ns_per_call / a.frames : 0.0, marginal);
    }
  }
  if (g_cold_misses > 0) {
    std::printf("\n  rule-cache miss (a return address looked up in the tables): %.1f ns each"
                " (%d distinct return addresses a walk)\n",
                (g_warm[kTableCold].ns_per_call - g_warm[kTableStepped].ns_per_call) / g_cold_misses, g_cold_misses);
  }
  // The loader-generation check alone (one dl_iterate_phdr visiting one object).
  const auto t0 = Clock::now();
  for (int i = 0; i < 200000; ++i) g_sink = const_cast<ut::ObjectSet*>(ut::CurrentObjects());
  std::printf("\n  generation check (dl_iterate_phdr, 1 object): %.1f ns per call\n",
              std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / 200000);

  std::printf("\ntable builds (arena memory: rows 8 B + block index):\n");
  ReportBuild("libc", reinterpret_cast<const void*>(&std::qsort));
  ReportBuild("libstdc++", reinterpret_cast<const void*>(&std::terminate));
  ReportBuild("this binary", reinterpret_cast<const void*>(&Report));
  const hd::UnwindTableStats s = hd::GetUnwindTableStats();
  std::printf("  stats: %zu objects, %zu rows, %.1f KiB, %.2f ms total build\n", s.objects, s.rows,
              static_cast<double>(s.bytes) / 1024.0, s.build_ms);
  std::printf("  every loaded object, fresh process (best of 3): %zu objects, %zu tables, %zu rows, %.1f KiB, %.2f ms\n",
              g_all.objects, g_all.tables, g_all.rows, static_cast<double>(g_all.bytes) / 1024.0, g_all.ms);
}

__attribute__((noinline)) void Hook(bool deep, bool nofp) {
  Measure(__builtin_return_address(0), deep, nofp);
  asm volatile("" ::: "memory");
}

#if defined(__GNUC__) && !defined(__clang__)
// Down() without frame pointers: each level's rule is CFA = rsp + offset,
// the table unwinder's other common case (GCC's default at -O2). Clang has
// no per-function switch: the section is skipped there.
__attribute__((noinline, optimize("omit-frame-pointer"))) int DownNoFp(int depth, bool deep) {
  if (depth <= 1) {
    Hook(deep, true);
    return 0;
  }
  int r = DownNoFp(depth - 1, deep);
  asm volatile("" : "+r"(r));
  return r + 1;
}
#define HEAPPROF_BENCH_HAVE_NOFP 1

// Random stacks: kDepth levels of two functions without frame pointers,
// each level calling one or the other per a bit of a random shape, one
// unwind at the bottom, a new shape each time. A return address (4 of
// them: Poly<0> or Poly<1> calling either) is followed by either of two, at
// random: a guess is right half the time, the worst case for guessing that
// is not adversarial.
// Reported per frame: (descent + unwind) - (descent alone), the best of the
// batches, over the frames the unwind returned.
constexpr int kShapes = 256;
std::uint64_t g_shapes[kShapes];
Method g_poly_method = kMethods;  // kMethods: descend only
int g_poly_frames = 0;
std::uintptr_t g_poly_hi = 0;

__attribute__((noinline)) void PolyMeasure(const void* hook_return) {
  Where w{__builtin_frame_address(0), hook_return, reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0)),
          g_poly_hi};
  if (g_poly_method != kMethods) g_poly_frames = UnwindOnce(g_poly_method, w);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void PolyHook() {
  PolyMeasure(__builtin_return_address(0));
  asm volatile("" ::: "memory");
}

// ns per descent (+ unwind, unless kMethods), best of kBatches.
double PolyRun(Method m) {
  g_poly_method = m;
  double best = 0;
  for (int b = -1; b < kBatches; ++b) {  // batch -1: warm-up
    const auto t0 = Clock::now();
    for (int i = 0; i < kPerBatch; ++i) bench_stacks::Poly<0, PolyHook>(kDepth - 2, g_shapes[i % kShapes]);
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kPerBatch;
    if (b >= 0 && (best == 0 || ns < best)) best = ns;
  }
  return best;
}

void ReportPoly() {
  bench_stacks::FillShapes(g_shapes, 0x243f6a8885a308d3ull);
  std::uintptr_t lo = 0;  // each unwind's low bound is its own frame (PolyMeasure)
  hd::CurrentStackBounds(lo, g_poly_hi);
  std::printf("\nrandom stacks (a new %d-deep stack of two functions without frame pointers each unwind; ns per"
              " frame, unwind only)\n", kDepth);
  const Method methods[] = {kTable, kTableNoGuess, kTableStepped, kTableSteppedNoGuess, kLibunwind};
  double cost[kMethods] = {};
  int frames[kMethods] = {};
  for (int round = 0; round < 3; ++round) {  // interleaved, best of three rounds
    const double base = PolyRun(kMethods);
    for (Method m : methods) {
      const double t = PolyRun(m) - base;
      frames[m] = g_poly_frames;
      if (round == 0 || t < cost[m]) cost[m] = t;
    }
  }
  for (Method m : methods)
    std::printf("  %-26s %7d %12.2f\n", kNames[m], frames[m], frames[m] > 0 ? cost[m] / frames[m] : 0.0);
}
#endif

__attribute__((noinline)) int Down(int depth, bool deep) {
  if (depth <= 1) {
    Hook(deep, false);
    return 0;
  }
  int r = Down(depth - 1, deep);
  asm volatile("" : "+r"(r));  // a real call per level, no tail call or loop
  return r + 1;
}

}  // namespace

int main() {
  void* libgcc = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (libgcc == nullptr) libgcc = dlopen("libgcc_s.so.1", RTLD_NOW);
  if (libgcc != nullptr) {
    g_libgcc_backtrace = reinterpret_cast<UnwindBacktraceFn>(dlsym(libgcc, "_Unwind_Backtrace"));
    g_libgcc_get_ip = reinterpret_cast<UnwindGetIpFn>(dlsym(libgcc, "_Unwind_GetIP"));
  }
  if (g_libgcc_backtrace == nullptr || g_libgcc_get_ip == nullptr) {
    std::fprintf(stderr, "libgcc_s.so.1 not found\n");
    return 1;
  }
  if (void* unw = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL))
    g_unw_backtrace = reinterpret_cast<UnwBacktraceFn>(dlsym(unw, "unw_backtrace"));
  if (g_unw_backtrace == nullptr) std::fprintf(stderr, "libunwind.so.8 not found: its row stays 0\n");
  // Before anything is unwound here: a fork inherits the tables built so far.
  // Best of 3 fresh processes.
  for (int i = 0; i < 3; ++i) {
    const AllBuild b = BuildAllInChild();
    if (b.ms > 0 && (g_all.ms == 0 || b.ms < g_all.ms)) g_all = b;
  }
  Down(kDepth - 1, false);  // Down x31 + Hook = 32 frames below main
  Down(kDeepDepth - 1, true);
#if defined(HEAPPROF_BENCH_HAVE_NOFP)
  DownNoFp(kDepth - 1, false);
  DownNoFp(kDeepDepth - 1, true);
#endif
  Report();
#if defined(HEAPPROF_BENCH_HAVE_NOFP)
  ReportPoly();
#endif
  return 0;
}
