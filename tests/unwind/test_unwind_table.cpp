// The table unwinder against libgcc's _Unwind_Backtrace, frame for frame, on
// code built -O2 -fomit-frame-pointer (frames.cpp, dso.cpp), through libc,
// libstdc++.so, the PLT, another thread, a dlopen'ed object (then dlclosed),
// code without unwind tables; plus garbage stacks behind guard pages.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "frames.hpp"
#include "heapprof/detail/3_unwinding/table.hpp"

namespace hd = heapprof::detail;
namespace ut = heapprof::detail::unwind_table;
using unwind_test::Capture;

namespace {

template <class F>
std::unique_ptr<Capture> Run(F&& scenario) {
  auto c = std::make_unique<Capture>();
  unwind_test::CurrentCapture() = c.get();
  scenario();
  unwind_test::CurrentCapture() = nullptr;
  return c;
}

std::string Describe(std::uintptr_t pc) {
  Dl_info info;
  std::ostringstream os;
  os << "0x" << std::hex << pc;
  if (pc != 0 && dladdr(reinterpret_cast<void*>(pc - 1), &info) != 0) {
    os << " " << (info.dli_sname != nullptr ? info.dli_sname : "?") << " in "
       << (info.dli_fname != nullptr ? info.dli_fname : "?");
  }
  return os.str();
}

std::string Dump(const std::uintptr_t* a, int na, const std::uintptr_t* b, int nb) {
  std::ostringstream os;
  for (int i = 0; i < (na > nb ? na : nb); ++i) {
    os << (i < na && i < nb && a[i] == b[i] ? "   " : "!! ") << i << ": "
       << (i < na ? Describe(a[i]) : std::string("-")) << "  |  " << (i < nb ? Describe(b[i]) : std::string("-"))
       << "\n";
  }
  return os.str();
}

// Ours equals libgcc's, frame for frame (up to our cap).
bool MatchesLibgcc(const Capture& c) {
  if (!c.taken || c.table.depth == 0) return false;
  int want = c.ref_n;
  if (c.table.truncated) {
    if (c.ref_n <= c.table.depth) return false;
    want = c.table.depth;
  }
  if (c.table.depth != want) return false;
  return std::memcmp(c.table.pcs, c.ref, sizeof(std::uintptr_t) * static_cast<std::size_t>(want)) == 0;
}

bool SameStack(const hd::CapturedStack& a, const hd::CapturedStack& b) {
  return a.depth == b.depth && a.truncated == b.truncated &&
         std::memcmp(a.pcs, b.pcs, sizeof(std::uintptr_t) * static_cast<std::size_t>(a.depth)) == 0;
}

void CheckMatchesLibgcc(const Capture& c, int min_depth) {
  REQUIRE(c.taken);
  INFO("table unwinder | _Unwind_Backtrace\n" << Dump(c.table.pcs, c.table.depth, c.ref, c.ref_n));
  CHECK(c.table.depth >= min_depth);
  CHECK(MatchesLibgcc(c));
  CHECK(SameStack(c.table, c.stepped));  // the replaying walk equals stepping every frame
  MESSAGE("depth " << c.table.depth << " (frame pointers alone: " << c.fp.depth << ")");
}

bool HasFrameIn(const hd::CapturedStack& st, const char* object_substring) {
  for (int i = 0; i < st.depth; ++i) {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(st.pcs[i] - 1), &info) != 0 && info.dli_fname != nullptr &&
        std::strstr(info.dli_fname, object_substring) != nullptr)
      return true;
  }
  return false;
}

std::string DsoPath() {
  if (const char* env = std::getenv("HEAPPROF_UNWIND_DSO")) return env;
#ifdef HEAPPROF_UNWIND_DSO_PATH
  return HEAPPROF_UNWIND_DSO_PATH;
#else
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "libheapprof_unwind_dso.so";
  std::string exe(buf, static_cast<std::size_t>(n));
  return exe.substr(0, exe.rfind('/') + 1) + "libheapprof_unwind_dso.so";
#endif
}

}  // namespace

TEST_CASE("user functions: big frame, pushes, alloca, realigned stack, recursion") {
  auto c = Run([] { unwind_test::UserChain(6); });
  CheckMatchesLibgcc(*c, 6 + 6);
  // The shapes we meant to cover did occur on this stack.
  bool fp_rel = false, fp_deref = false, big = false;
  for (int i = 0; i < c->table.depth; ++i) {
    const hd::eh::Rule r{ut::RuleForPc(reinterpret_cast<const void*>(c->table.pcs[i] - 1))};
    fp_rel |= r.cfa_kind() == hd::eh::kCfaFpRel;
    fp_deref |= r.cfa_kind() == hd::eh::kCfaFpDeref;
    big |= r.cfa_kind() == hd::eh::kCfaSpRel && r.cfa_offset() > 5000;
  }
  CHECK(fp_rel);
#if !defined(__clang__)
  CHECK(fp_deref);  // GCC's DRAP prologue; Clang realigns through rbp/rbx instead
#else
  (void)fp_deref;
#endif
#if !defined(HEAPPROF_ASAN)
  CHECK(big);  // ASan may move the buffer to its fake stack: a small frame then
#else
  (void)big;
#endif
  // Without frame pointers the frame-pointer walk loses most of this.
#if !defined(HEAPPROF_ASAN)
  CHECK(c->fp.depth < c->table.depth);
#endif
}

TEST_CASE("a hook that calls its cold function without a tail call: the extra frame is skipped") {
  auto c = Run([] { unwind_test::ViaColdFunction(1); });
  // Leaf = the hook's return address (in ViaColdFunction), then its callers:
  // neither the cold function nor the hook appears.
  CheckMatchesLibgcc(*c, 2);
  CHECK(c->fp.depth >= 1);
  CHECK(c->fp.pcs[0] == c->table.pcs[0]);
}

TEST_CASE("libc: qsort calls a comparator that allocates (a PLT call into libc)") {
  auto c = Run([] { unwind_test::QsortWithAllocatingComparator(); });
  CheckMatchesLibgcc(*c, 4);
  CHECK(HasFrameIn(c->table, "libc.so"));
}

TEST_CASE("std::sort with an allocating comparator") {
  auto c = Run([] { unwind_test::StdSortWithAllocatingComparator(); });
  CheckMatchesLibgcc(*c, 4);
}

TEST_CASE("std::function callback") {
  auto c = Run([] { unwind_test::StdFunctionCallback(); });
  CheckMatchesLibgcc(*c, 4);
}

TEST_CASE("libstdc++.so: ostream formatting calls our streambuf") {
  auto c = Run([] { unwind_test::OstreamCustomStreambuf(); });
  CheckMatchesLibgcc(*c, 4);
  CHECK(HasFrameIn(c->table, "libstdc++.so"));
}

TEST_CASE("libc: std::call_once's callable under pthread_once") {
  auto c = Run([] { unwind_test::CallOnceCallback(); });
  CheckMatchesLibgcc(*c, 4);
  CHECK(HasFrameIn(c->table, "libc.so"));
}

TEST_CASE("another thread's stack, down to clone") {
  auto c = Run([] { unwind_test::InThread(); });
  CheckMatchesLibgcc(*c, 6);
}

TEST_CASE("a signal handler: through the kernel's signal frame into the interrupted code, down to _start") {
  // glibc's __restore_rt has a CIE marked 'S'; the walk used to end there,
  // so a handler's allocation never showed what the signal interrupted.
  auto c = Run([] { unwind_test::InSignalHandler(); });
  CheckMatchesLibgcc(*c, 10);
  CHECK(HasFrameIn(c->table, "libc.so"));  // raise, and __restore_rt
  // Past the signal frame: the return address into InSignalHandler, the
  // caller of the function that raised the signal.
  const auto entry = reinterpret_cast<std::uintptr_t>(&unwind_test::InSignalHandler);
  bool interrupted = false;
  for (int i = 0; i < c->table.depth; ++i) interrupted |= c->table.pcs[i] > entry && c->table.pcs[i] - entry < 256;
  CHECK(interrupted);
}

TEST_CASE("deep recursion is cut at HEAPPROF_MAX_FRAMES") {
  auto c = Run([] { unwind_test::Recurse(HEAPPROF_MAX_FRAMES + 50); });
  REQUIRE(c->taken);
  CHECK(c->table.depth == HEAPPROF_MAX_FRAMES);
  CHECK(c->table.truncated);
  CHECK(MatchesLibgcc(*c));
  auto shallow = Run([] { unwind_test::Recurse(10); });
  CHECK_FALSE(shallow->table.truncated);
  CHECK(MatchesLibgcc(*shallow));
}

TEST_CASE("code without unwind tables: frame-pointer steps through it") {
  auto c = Run([] { unwind_test::ThroughNoCfi(4); });
  REQUIRE(c->taken);
  INFO("table unwinder | _Unwind_Backtrace\n" << Dump(c->table.pcs, c->table.depth, c->ref, c->ref_n));
  // libgcc stops at the first frame without an FDE; up to there we agree.
  REQUIRE(c->ref_n >= 3);
  REQUIRE(c->table.depth > c->ref_n);
  CHECK(std::memcmp(c->table.pcs, c->ref, sizeof(std::uintptr_t) * static_cast<std::size_t>(c->ref_n)) == 0);
  // Past the table-less frames we are back in ThroughNoCfi, and from there on
  // the stack is what libgcc saw from ThroughNoCfi itself.
  int at = -1;
  for (int i = 0; i < c->table.depth; ++i)
    if (c->table.pcs[i] == unwind_test_nocfi_return) at = i;
  REQUIRE(at > 0);
  REQUIRE(c->outer_n > 0);
  const int rest = c->table.depth - at - 1;
  CHECK(rest == c->outer_n);
  CHECK(std::memcmp(c->table.pcs + at + 1, c->outer,
                    sizeof(std::uintptr_t) * static_cast<std::size_t>(rest < c->outer_n ? rest : c->outer_n)) == 0);
}

TEST_CASE("PLT rows: the lazy-binding expression steps like the instructions") {
  const ut::Table* t = nullptr;
  REQUIRE(ut::TableFor(reinterpret_cast<const void*>(&unwind_test::FakeNew), t));
  std::uintptr_t plt = 0;
  for (std::uint32_t i = 0; i < t->count; ++i) {
    if (hd::eh::Rule{t->rows[i].rule}.cfa_kind() == hd::eh::kCfaPlt) {
      plt = t->base + t->rows[i].pc;
      break;
    }
  }
  REQUIRE(plt != 0);
  CHECK(plt % 16 == 0);  // the expression's rows start at the first 16-byte entry
  // A fake stack: [sp] = what `push $index` pushed, [sp + 8] = return address
  // after it, or [sp] = return address before it.
  const long page = sysconf(_SC_PAGESIZE);
  void* mem = mmap(nullptr, static_cast<std::size_t>(page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  auto* words = static_cast<std::uintptr_t*>(mem);
  const auto ra0 = reinterpret_cast<std::uintptr_t>(&unwind_test::UserChain) + 1;
  const auto ra1 = reinterpret_cast<std::uintptr_t>(&unwind_test::Recurse) + 1;
  words[8] = ra0;
  words[9] = ra1;
  const auto sp = reinterpret_cast<std::uintptr_t>(&words[8]);
  const ut::ObjectSet* set = ut::CurrentObjects();
  REQUIRE(set != nullptr);
  const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(mem);
  const std::uintptr_t hi = lo + static_cast<std::uintptr_t>(page);
  {
    // Inside `jmp *GOT` (offset < 6, lookup pc = 5): nothing pushed yet.
    ut::Cursor cur{set, lo, hi};
    ut::Regs r{plt + 6, sp, 0};
    REQUIRE(ut::Step(cur, r));
    CHECK(r.pc == ra0);
    CHECK(r.sp == sp + 8);
  }
  {
    // Past `push` (lookup pc = 11): one word deeper.
    ut::Cursor cur{set, lo, hi};
    ut::Regs r{plt + 12, sp, 0};
    REQUIRE(ut::Step(cur, r));
    CHECK(r.pc == ra1);
    CHECK(r.sp == sp + 16);
  }
  munmap(mem, static_cast<std::size_t>(page));
}

TEST_CASE("dlopen: samples inside a loaded object, then dlclose, then more samples") {
  const std::string path = DsoPath();
  INFO("shared object: " << path);
  const ut::ObjectSet* before = ut::CurrentObjects();
  REQUIRE(before != nullptr);
  CHECK(before == ut::CurrentObjects());  // nothing changed: the same snapshot
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(h != nullptr, dlerror());
  auto entry = reinterpret_cast<int (*)(int, unwind_test::AllocFn)>(dlsym(h, "unwind_test_dso_entry"));
  REQUIRE(reinterpret_cast<void*>(entry) != nullptr);
  auto c = Run([entry] { entry(5, &unwind_test::FakeNew); });
  CheckMatchesLibgcc(*c, 5 + 4);
  CHECK(HasFrameIn(c->table, "libheapprof_unwind_dso"));
  const ut::ObjectSet* loaded = ut::CurrentObjects();
  CHECK(loaded->count == before->count + 1);
  REQUIRE(dlclose(h) == 0);
  const ut::ObjectSet* after = ut::CurrentObjects();
  CHECK(after->count == before->count);
  auto c2 = Run([] { unwind_test::UserChain(2); });
  CheckMatchesLibgcc(*c2, 8);
  // Round trips: each dlopen's samples right, table memory bounded.
  const hd::UnwindTableStats s0 = hd::GetUnwindTableStats();
  for (int i = 0; i < 20; ++i) {
    void* h2 = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE(h2 != nullptr);
    auto e2 = reinterpret_cast<int (*)(int, unwind_test::AllocFn)>(dlsym(h2, "unwind_test_dso_entry"));
    auto c3 = Run([e2] { e2(2, &unwind_test::FakeNew); });
    CHECK(MatchesLibgcc(*c3));
    REQUIRE(dlclose(h2) == 0);
  }
  const hd::UnwindTableStats s1 = hd::GetUnwindTableStats();
  MESSAGE("20 dlopen/dlclose rounds: tables " << s0.objects << " -> " << s1.objects << ", bytes " << s0.bytes
                                               << " -> " << s1.bytes);
  CHECK(s1.objects <= s0.objects + 20);
}

TEST_CASE("threads sampling while another thread dlopens and dlcloses") {
  const std::string path = DsoPath();
  std::atomic<bool> stop{false};
  std::atomic<int> samples{0}, mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        auto c = Run([t] {
          if (t == 0) unwind_test::QsortWithAllocatingComparator();
          if (t == 1) unwind_test::UserChain(3);
          if (t == 2) unwind_test::OstreamCustomStreambuf();
        });
        samples.fetch_add(1);
        if (!MatchesLibgcc(*c)) mismatches.fetch_add(1);
      }
    });
  }
  // At least 40 rounds, and on until every thread has sampled a few times
  // (they may start late on a busy machine); bounded in case they never do.
  int rounds = 0;
  for (; rounds < 40 || (samples.load() < 30 && rounds < 20000); ++rounds) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE(h != nullptr);
    auto e = reinterpret_cast<int (*)(int, unwind_test::AllocFn)>(dlsym(h, "unwind_test_dso_entry"));
    auto c = Run([e] { e(3, &unwind_test::FakeNew); });
    if (!MatchesLibgcc(*c)) mismatches.fetch_add(1);
    REQUIRE(dlclose(h) == 0);
  }
  stop.store(true);
  for (auto& th : threads) th.join();
  MESSAGE(samples.load() << " samples on 3 threads during " << rounds << " dlopen/dlclose rounds");
  CHECK(samples.load() >= 30);
  CHECK(mismatches.load() == 0);
}

namespace {

// One page of words between two inaccessible pages: a stack to fill with
// garbage, where any read outside [lo, hi) faults.
struct GuardedPage {
  long page = sysconf(_SC_PAGESIZE);
  std::size_t len = static_cast<std::size_t>(page) * 3;
  char* base = nullptr;
  std::uintptr_t* words = nullptr;
  std::size_t n = static_cast<std::size_t>(page) / sizeof(std::uintptr_t);
  GuardedPage() {
    void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return;
    base = static_cast<char*>(mem);
    if (mprotect(base, static_cast<std::size_t>(page), PROT_NONE) != 0 ||
        mprotect(base + 2 * page, static_cast<std::size_t>(page), PROT_NONE) != 0)
      return;
    words = reinterpret_cast<std::uintptr_t*>(base + page);
  }
  ~GuardedPage() {
    if (base != nullptr) munmap(base, len);
  }
  GuardedPage(const GuardedPage&) = delete;
  GuardedPage& operator=(const GuardedPage&) = delete;
  std::uintptr_t lo() const { return reinterpret_cast<std::uintptr_t>(words); }
  std::uintptr_t hi() const { return lo() + static_cast<std::uintptr_t>(page); }
};

}  // namespace

TEST_CASE("garbage stacks never fault: every read stays inside [lo, hi)") {
  // One page of random words between two inaccessible pages. Stack-like
  // values (addresses inside the page) and code-like values (PCs of real
  // functions) are mixed in, so the walk goes some way before it stops.
  GuardedPage g;
  REQUIRE(g.words != nullptr);
  std::uintptr_t* const words = g.words;
  const std::size_t n = g.n;
  const long page = g.page;
  const std::uintptr_t lo = g.lo(), hi = g.hi();
  // Return addresses from real stacks.
  std::vector<std::uintptr_t> pcs;
  for (auto* f : {+[] { unwind_test::UserChain(3); }, +[] { unwind_test::QsortWithAllocatingComparator(); },
                  +[] { unwind_test::OstreamCustomStreambuf(); }}) {
    auto c = Run(f);
    pcs.insert(pcs.end(), c->table.pcs, c->table.pcs + c->table.depth);
  }
  REQUIRE(pcs.size() > 10);
  std::mt19937_64 rng(7);
  int deepest = 0;
  for (int iter = 0; iter < 50000; ++iter) {
    for (std::size_t i = 0; i < n; ++i) {
      switch (rng() % 4) {
        case 0:
          words[i] = lo + (rng() % static_cast<std::uintptr_t>(page + 64)) - 32;  // near or in the page
          break;
        case 1:
          words[i] = pcs[rng() % pcs.size()];
          break;
        case 2:
          words[i] = lo + 8 * (i + 1 + rng() % 8);  // a plausible frame chain
          break;
        default:
          words[i] = rng();
      }
    }
    const std::uintptr_t frame = lo + (rng() % static_cast<std::uintptr_t>(page)) - (iter % 3 == 0 ? 0 : rng() % 8);
    const std::uintptr_t leaf = pcs[rng() % pcs.size()];
    hd::CapturedStack out;
    hd::UnwindWithTable(reinterpret_cast<const void*>(frame), reinterpret_cast<const void*>(leaf), lo, hi, out);
    REQUIRE(out.depth <= HEAPPROF_MAX_FRAMES);
    if (out.depth > deepest) deepest = out.depth;
  }
  MESSAGE("deepest garbage walk: " << deepest << " frames");
}

TEST_CASE("stats: objects, rows and memory of the built tables") {
  Run([] { unwind_test::QsortWithAllocatingComparator(); });
  Run([] { unwind_test::OstreamCustomStreambuf(); });
  // The walks may have asked one FDE at a time only: build the three tables.
  for (const void* pc : {reinterpret_cast<const void*>(&std::qsort), reinterpret_cast<const void*>(&std::__throw_bad_alloc),
                         reinterpret_cast<const void*>(&unwind_test::FakeNew)}) {
    const ut::Table* t = nullptr;
    REQUIRE(ut::TableFor(pc, t));
  }
  const hd::UnwindTableStats s = hd::GetUnwindTableStats();
  MESSAGE("tables: " << s.objects << " objects, " << s.rows << " rows, " << s.bytes << " bytes, " << s.build_ms
                     << " ms to build");
  CHECK(s.objects >= 3);  // this test, libc, libstdc++
  CHECK(s.rows > 50000);
  CHECK(s.bytes > s.rows * sizeof(ut::TableRow));
  CHECK(s.build_ms > 0);
  for (const void* pc : {reinterpret_cast<const void*>(&std::qsort), reinterpret_cast<const void*>(&unwind_test::FakeNew)}) {
    const ut::Table* t = nullptr;
    REQUIRE(ut::TableFor(pc, t));
    CHECK(t->count > 0);
    CHECK(t->fdes_bad == 0);
  }
}

TEST_CASE("one FDE at a time: the rule at every row of libc, libstdc++ and this test equals the built table's") {
  // A large object answers its first lookups from the one FDE .eh_frame_hdr
  // gives for the PC (table.hpp: LazyRuleAt). Every row start of the built
  // tables, the byte before it and a PC inside it must get the same rule.
  const std::uint64_t saved = ut::g_lazy_min_fdes.load();
  ut::g_lazy_min_fdes.store(0);  // every object with a searchable table answers one FDE at a time
  for (const void* in : {reinterpret_cast<const void*>(&std::qsort), reinterpret_cast<const void*>(&std::__throw_bad_alloc),
                         reinterpret_cast<const void*>(&unwind_test::FakeNew)}) {
    const ut::Table* t = nullptr;
    REQUIRE(ut::TableFor(in, t));
    std::size_t checked = 0, differ = 0;
    for (std::uint32_t i = 0; i < t->count; ++i) {
      const std::uintptr_t start = t->base + t->rows[i].pc;
      const std::uintptr_t end = i + 1 < t->count ? t->base + t->rows[i + 1].pc : start + 1;
      for (const std::uintptr_t pc : {start, start - 1, start + (end - start) / 2}) {
        if (pc < t->base || pc - t->base >= t->span) continue;
        bool lazy = false;
        const std::uint32_t one = ut::LazyRuleForPc(reinterpret_cast<const void*>(pc), lazy);
        REQUIRE(lazy);
        ++checked;
        if (one != ut::Lookup(*t, pc) && ++differ <= 5) {
          MESSAGE("pc " << reinterpret_cast<const void*>(pc) << ": one FDE " << one << ", table " << ut::Lookup(*t, pc));
        }
      }
    }
    MESSAGE(checked << " PCs checked, " << differ << " differ");
    CHECK(checked > 1000);
    CHECK(differ == 0);
  }
  ut::g_lazy_min_fdes.store(~std::uint64_t{0});
  bool lazy = true;
  ut::LazyRuleForPc(reinterpret_cast<const void*>(&unwind_test::FakeNew), lazy);
  CHECK_FALSE(lazy);  // an object of at most g_lazy_min_fdes FDEs builds its table
  ut::g_lazy_min_fdes.store(saved);
}

TEST_CASE("one FDE at a time: an object builds its table after 2 lookups per 5 FDEs, not before") {
  // A copy of libstdc++'s Object that has never been asked: table.hpp's
  // rent-or-buy rule (LazyBudget) lets it answer 2/5 of its FDE count in
  // lookups one FDE at a time, then TableOrLazy builds its table.
  if (ut::g_lazy_budget_min.load() != 0) return;  // unwind_tests_lazy: never builds
  const ut::Table* t = nullptr;
  REQUIRE(ut::TableFor(reinterpret_cast<const void*>(&std::__throw_bad_alloc), t));
  ut::Object fresh;
  {
    ut::ReaderSection reading;
    REQUIRE(reading.active());
    const ut::Object* o = ut::FindObject(*ut::CurrentObjects(), reinterpret_cast<std::uintptr_t>(&std::__throw_bad_alloc));
    REQUIRE(o != nullptr);
    fresh.lo = o->lo, fresh.hi = o->hi, fresh.bias = o->bias, fresh.hdr = o->hdr, fresh.hdr_size = o->hdr_size;
    fresh.eh_frame = o->eh_frame, fresh.eh_frame_size = o->eh_frame_size, fresh.fingerprint = o->fingerprint;
  }
  REQUIRE(t->fdes > 1000);
  std::uint32_t asked = 0, differ = 0;
  const ut::Table* built = nullptr;
  for (std::uint32_t i = 0; ut::TableOrLazy(&fresh) == nullptr; i = (i + 7919) % t->count) {
    REQUIRE(asked < t->count);
    const std::uintptr_t pc = t->base + t->rows[i].pc;
    differ += ut::OneFdeRule(&fresh, pc, built) != ut::Lookup(*t, pc);
    REQUIRE(built == nullptr);
    ++asked;
  }
  MESSAGE(t->fdes << " FDEs: " << asked << " lookups one FDE at a time, then the table");
  CHECK(differ == 0);
  CHECK(asked == fresh.lazy_budget.load());
  CHECK(asked >= t->fdes * 2 / 5 - 1);
  CHECK(asked <= t->fdes * 2 / 5 + 1);
  const ut::Table* own = fresh.table.load();
  REQUIRE(own != nullptr);
  CHECK(own->count == t->count);
}

namespace {

// The executable's tables built twice: as loaded (through .eh_frame_hdr), and
// as a static link would be (its PT_GNU_EH_FRAME hidden: GCC links -static
// without --eh-frame-hdr, and every stack of such a program had one frame).
struct NoHdrResult {
  bool seen = false;
  ut::ObjectInfo with_hdr, without_hdr;
  std::uintptr_t eh_frame_from_hdr = 0;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> rows_with_hdr, rows_without_hdr;
};

std::vector<std::pair<std::uint32_t, std::uint64_t>> BuiltRows(const dl_phdr_info& info, const ut::ObjectInfo& oi) {
  ut::Object o;
  o.lo = oi.lo;
  o.hi = oi.hi;
  o.bias = oi.bias;
  o.hdr = oi.hdr;
  o.hdr_size = oi.hdr_size;
  o.eh_frame = oi.eh_frame;
  o.eh_frame_size = oi.eh_frame_size;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> rows;
  ut::Table* t = ut::BuildTable(info, o);
  if (t == nullptr) return rows;
  for (std::uint32_t i = 0; i < t->count; ++i) rows.emplace_back(t->rows[i].pc, t->rows[i].rule);
  hd::g_arena.Free(t, t->bytes);
  return rows;
}

int DescribeExecutableWithoutHdr(dl_phdr_info* info, std::size_t, void* data) {
  auto& r = *static_cast<NoHdrResult*>(data);
  if (r.seen || (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0')) return 0;
  r.seen = true;
  std::vector<ElfW(Phdr)> phdrs(info->dlpi_phdr, info->dlpi_phdr + info->dlpi_phnum);
  for (ElfW(Phdr)& ph : phdrs) {
    if (ph.p_type != PT_GNU_EH_FRAME) continue;
    hd::eh::Region region;
    region.data = reinterpret_cast<const std::uint8_t*>(info->dlpi_addr + ph.p_vaddr);
    region.size = ph.p_memsz;
    region.address = info->dlpi_addr + ph.p_vaddr;
    hd::eh::Hdr hdr;
    if (hd::eh::ParseHdr(region, hdr)) r.eh_frame_from_hdr = hdr.eh_frame;
    ph.p_type = PT_NULL;
  }
  dl_phdr_info hidden = *info;
  hidden.dlpi_phdr = phdrs.data();
  if (ut::DescribeObject(*info, r.with_hdr)) r.rows_with_hdr = BuiltRows(*info, r.with_hdr);
  if (ut::DescribeObject(hidden, r.without_hdr)) r.rows_without_hdr = BuiltRows(hidden, r.without_hdr);
  return 1;
}

}  // namespace

TEST_CASE("an executable without .eh_frame_hdr (a static link) finds .eh_frame from its file: the same rows") {
  NoHdrResult r;
  dl_iterate_phdr(&DescribeExecutableWithoutHdr, &r);
  REQUIRE(r.seen);
  REQUIRE(r.eh_frame_from_hdr != 0);
  CHECK(r.with_hdr.hdr != 0);
  CHECK(r.with_hdr.eh_frame == 0);
  CHECK(r.without_hdr.hdr == 0);
  CHECK(r.without_hdr.eh_frame == r.eh_frame_from_hdr);
  CHECK(r.without_hdr.fingerprint != 0);
  CHECK(r.rows_with_hdr.size() > 100);
  CHECK(r.rows_without_hdr == r.rows_with_hdr);
}

namespace {

std::size_t CountReaderSlots() {
  std::size_t n = 0;
  for (ut::ReaderSlot* s = ut::g_reader_slots.load(); s != nullptr; s = s->next) ++n;
  return n;
}

bool IsRetired(const ut::ObjectSet* set) {
  hd::LockGuard hold(ut::g_lock);
  for (const ut::ObjectSet* s = ut::g_retired_sets; s != nullptr; s = s->next_retired) {
    if (s == set) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("samples do not ask the loader: a new object's PC refreshes at once, an unload within 64 unwinds") {
  const std::string path = DsoPath();
  const ut::ObjectSet* before = ut::CurrentObjects();
  REQUIRE(before != nullptr);
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(h != nullptr, dlerror());
  // The published snapshot does not know the library yet (nothing asked).
  CHECK(ut::g_objects.load() == before);
  auto entry = reinterpret_cast<int (*)(int, unwind_test::AllocFn)>(dlsym(h, "unwind_test_dso_entry"));
  REQUIRE(reinterpret_cast<void*>(entry) != nullptr);
  // A sample through it meets PCs in no object: the walk asks the loader,
  // publishes a fresh snapshot and unwinds again, so this very stack is whole.
  auto c = Run([entry] { entry(3, &unwind_test::FakeNew); });
  CheckMatchesLibgcc(*c, 3 + 4);
  const ut::ObjectSet* loaded = ut::g_objects.load();
  CHECK(loaded != before);
  CHECK(loaded->count == before->count + 1);
  REQUIRE(dlclose(h) == 0);
  // Unloaded: samples keep the snapshot (its table of the library is ours,
  // still readable) until a thread's periodic check, every 64th unwind.
  auto c1 = Run([] { unwind_test::UserChain(2); });
  CHECK(MatchesLibgcc(*c1));
  for (std::uint32_t i = 0; i < ut::kGenerationCheckEvery; ++i) {
    auto ci = Run([] { unwind_test::UserChain(2); });
    CHECK(MatchesLibgcc(*ci));
  }
  const ut::ObjectSet* after = ut::g_objects.load();
  CHECK(after != loaded);
  CHECK(after->count == before->count);
}

TEST_CASE("reclamation: a retired snapshot outlives the readers of its epoch, then goes") {
  const std::string path = DsoPath();
  ut::ReaderSection* reading = new ut::ReaderSection;  // this thread reads from here on
  REQUIRE(reading->active());
  const ut::ObjectSet* held = ut::CurrentObjects();
  REQUIRE(held != nullptr);
  // Another thread loads a library and publishes a new snapshot: `held` is
  // retired but must stay, this thread's section being older.
  bool loaded_ok = false;  // (doctest's checks stay on the main thread)
  std::thread loader([&path, &loaded_ok] {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return;
    const ut::ObjectSet* with = ut::CurrentObjects();
    if (dlclose(h) != 0) return;
    loaded_ok = with != nullptr && ut::CurrentObjects() != nullptr;
  });
  loader.join();
  REQUIRE(loaded_ok);
  CHECK(ut::g_objects.load() != held);
  CHECK(IsRetired(held));
  CHECK(held->count > 0);  // still readable
  delete reading;          // the last reader out frees it
  CHECK(!IsRetired(held));
  {
    hd::LockGuard hold(ut::g_lock);
    CHECK(ut::g_retired_sets == nullptr);
    CHECK(ut::g_retired_objects == nullptr);
  }
}

TEST_CASE("reader slots: one per thread alive, recycled when a thread exits") {
  auto c0 = Run([] { unwind_test::UserChain(1); });  // this thread's slot
  REQUIRE(MatchesLibgcc(*c0));
  const std::size_t slots = CountReaderSlots();
  int good = 0;
  for (int i = 0; i < 50; ++i) {
    std::thread t([&good] {
      auto c = Run([] { unwind_test::UserChain(1); });
      // A slot of its own, not marked reading between samples.
      if (MatchesLibgcc(*c) && ut::tls_reader_slot != nullptr && ut::tls_reader_slot->state.load() == 0) ++good;
    });
    t.join();
  }
  CHECK(good == 50);
  CHECK(CountReaderSlots() <= slots + 1);
  // Two threads at once hold two distinct slots.
  ut::ReaderSlot* a = nullptr;
  ut::ReaderSlot* b = nullptr;
  std::atomic<int> ready{0};
  auto body = [&ready](ut::ReaderSlot** out) {
    ut::ReaderSection reading;
    *out = ut::tls_reader_slot;
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();
  };
  std::thread ta(body, &a), tb(body, &b);
  ta.join();
  tb.join();
  CHECK(a != nullptr);
  CHECK(b != nullptr);
  CHECK(a != b);
}

TEST_CASE("CfaValid: the one-compare form equals 8-aligned and in [sp + 8, hi]") {
  std::mt19937_64 rng(15);
  const ut::ObjectSet* set = ut::CurrentObjects();
  REQUIRE(set != nullptr);
  for (int i = 0; i < 200000; ++i) {
    const std::uintptr_t sp = 0x7ff000000000ull + (rng() % 4096) * 8;  // 8-aligned, as every frame's
    // hi: aligned or not, from below sp + 8 to a few KiB above
    const std::uintptr_t hi = sp + (rng() % 8192) - (i % 3 == 0 ? 0 : 16);
    if (hi < sp) continue;  // sp <= hi holds for every frame
    std::uintptr_t cfa = sp + (rng() % 9000) - 64;
    if (i % 7 == 0) cfa = hi - (rng() % 24);
    if (i % 11 == 0) cfa = rng();
    ut::Cursor c{set, sp - 4096, hi};
    const ut::Regs r{0, sp, 0};
    const bool want = (cfa & 7) == 0 && cfa >= sp + 8 && cfa <= hi;
    if (ut::CfaValid(c, r, cfa) != want) {
      FAIL("sp " << sp << " hi " << hi << " cfa " << cfa);
    }
  }
}

TEST_CASE("CacheableRule: a cached sp-relative CFA is above sp and aligned; a rule it ends could never step") {
  // Step's frameless path (CFA = sp + off, rbp kept) checks only the stack's
  // top: it relies on what the cache holds.
  const ut::ObjectSet* set = ut::CurrentObjects();
  REQUIRE(set != nullptr);
  int ended = 0, kept = 0;
  for (std::int64_t off = -1024; off <= 1024; ++off) {
    for (std::uint32_t fp = 0; fp < 4; ++fp) {
      const std::int64_t fp_off = fp == hd::eh::kFpAtCfa || fp == hd::eh::kFpAtFp ? -16 : 0;
      const hd::eh::Rule rule = hd::eh::Rule::Make(hd::eh::kCfaSpRel, off, static_cast<hd::eh::FpKind>(fp), fp_off);
      const hd::eh::Rule cached = ut::CacheableRule(rule);
      if (cached == rule) {
        ++kept;
        REQUIRE(off >= 8);
        REQUIRE(off % 8 == 0);
        continue;
      }
      ++ended;
      REQUIRE(cached.cfa_kind() == hd::eh::kCfaEnd);
      // The step the rule would have made fails from any 8-aligned sp.
      for (std::uintptr_t k = 0; k < 64; ++k) {
        const std::uintptr_t sp = 0x7ff000000000ull + k * 8;
        const ut::Cursor c{set, sp - 4096, sp + 4096};
        REQUIRE_FALSE(ut::CfaValid(c, ut::Regs{0, sp, 0}, sp + static_cast<std::uintptr_t>(off)));
      }
    }
  }
  CHECK(kept == 4 * 128);  // 8, 16, ..., 1024
  CHECK(ended == 4 * 2049 - kept);
  // Other kinds pass unchanged.
  for (const hd::eh::Rule r : {hd::eh::Rule::Make(hd::eh::kCfaFpRel, 16, hd::eh::kFpAtCfa, -16),
                               hd::eh::Rule::Make(hd::eh::kCfaFpRel, 3, hd::eh::kFpSame, 0),
                               hd::eh::Rule::Make(hd::eh::kCfaFpDeref, -8, hd::eh::kFpAtCfa, -16),
                               hd::eh::Rule::Plt(8, 11), hd::eh::Rule::None()}) {
    CHECK(ut::CacheableRule(r) == r);
  }
}

TEST_CASE("rule cache: two return addresses that share a slot both stay cached (the neighbour slot)") {
  // Made-up return addresses in no loaded object: a lookup that reaches the
  // tables records the PC as unknown, so unknown_pc says whether it missed.
  const ut::ObjectSet* set = ut::CurrentObjects();
  REQUIRE(set != nullptr);
  auto missed = [set](std::uintptr_t ra) {
    ut::Cursor c{set, 0, 0};
    (void)ut::RuleAt(c, ra);
    return c.unknown_pc != 0;
  };
  for (std::uintptr_t base : {0x600000001234ull, 0x600000005ff1ull, 0x600000002000ull}) {
    const std::uintptr_t a = base, b = base + 7 * ut::kRuleCacheEntries, x = base + 9 * ut::kRuleCacheEntries;
    REQUIRE(ut::CacheSlot(a) == ut::CacheSlot(b));
    // The two slots empty first: an earlier test's walk may have left a live
    // entry of a return address of this slot there (the garbage stacks'),
    // which a and b would then both go around, into the neighbour, in turn.
    for (const std::size_t slot : {ut::CacheSlot(a), ut::CacheSlot(a) ^ 1}) {
      ut::g_rule_cache.e[slot].word.store(0);
      ut::g_rule_cache.e[slot].key.store(0);
    }
    CHECK(missed(a));
    CHECK(missed(b));
    for (int round = 0; round < 3; ++round) {  // alternating: each stays where it went
      CHECK_FALSE(missed(a));
      CHECK_FALSE(missed(b));
    }
    // A third one takes the neighbour; the first stays.
    CHECK(missed(x));
    CHECK_FALSE(missed(x));
    CHECK_FALSE(missed(a));
  }
}

TEST_CASE("the frameless step (CFA = sp + offset, rbp kept) equals its definition, up to the stack's top") {
  // Cache entries planted for made-up return addresses, on a page of random
  // words between two inaccessible pages: a read past the top would fault.
  GuardedPage g;
  REQUIRE(g.words != nullptr);
  const std::uintptr_t lo = g.lo(), hi = g.hi();
  const ut::ObjectSet* set = ut::CurrentObjects();
  REQUIRE(set != nullptr);
  std::mt19937_64 rng(23);
  int stepped = 0, at_top = 0, zero_ra = 0;
  for (int iter = 0; iter < 100000; ++iter) {
    for (std::size_t i = 0; i < g.n; ++i) g.words[i] = rng() % 5 == 0 ? 0 : rng();
    const std::uintptr_t sp = lo + 8 * (rng() % g.n);
    // Mostly inside the page, some just past its top, a few far past it.
    const std::uintptr_t above = (hi - sp) / 8;  // words from sp to the top
    std::int64_t off = 8 * static_cast<std::int64_t>(1 + rng() % (above + 2));
    if (iter % 13 == 0) off = 8 * static_cast<std::int64_t>(1 + rng() % 60000);
    const hd::eh::Rule rule = ut::CacheableRule(hd::eh::Rule::Make(hd::eh::kCfaSpRel, off, hd::eh::kFpSame, 0));
    REQUIRE(rule.cfa_kind() == hd::eh::kCfaSpRel);
    ut::Cursor c{set, lo, hi};
    c.guesses_left = iter % 2 == 0 ? ut::kWrongGuesses : 0;
    const std::uintptr_t ra = 0x500000000000ull + 16 * static_cast<std::uintptr_t>(iter) + 1;
    const std::uint64_t word = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(off)) << 32) | rule.bits;
    ut::RuleCacheEntry& e = ut::g_rule_cache.e[ut::CacheSlot(ra)];
    e.word.store(word);
    e.key.store(ut::CacheKey(ra, word, c.tag));
    const std::uintptr_t cfa = sp + static_cast<std::uintptr_t>(off);
    // A guess, never trusted: sometimes the right word, sometimes not.
    if (cfa <= hi) {
      ut::g_guesses.next_ra[ut::CacheSlot(ra)].store(rng() % 2 == 0 ? *reinterpret_cast<std::uintptr_t*>(cfa - 8)
                                                                   : rng());
    }
    const std::uintptr_t fp = rng();
    ut::Regs r{ra, sp, fp, 7};
    const bool ok = ut::Step(c, r);
    if (cfa > hi) {
      ++at_top;
      REQUIRE_FALSE(ok);
      continue;
    }
    const std::uintptr_t want = *reinterpret_cast<std::uintptr_t*>(cfa - 8);
    if (want == 0) {
      ++zero_ra;
      REQUIRE_FALSE(ok);
      continue;
    }
    ++stepped;
    REQUIRE(ok);
    REQUIRE(r.pc == want);
    REQUIRE(r.sp == cfa);
    REQUIRE(r.fp == fp);
    REQUIRE(r.fp_at == 0);
  }
  MESSAGE("frameless steps: " << stepped << " stepped, " << at_top << " past the top, " << zero_ra
                              << " with a zero return address");
  CHECK(stepped > 70000);
  CHECK(at_top > 5000);
  CHECK(zero_ra > 10000);
}

// ---- replay: a walk that meets the thread's previous walk checks the old
// frames against the stack instead of stepping them (table.hpp: WalkRecords)

// Clears this thread's walk records and its replay policy (kPoorWalks): a
// test that counts replayed frames must not start inside a stepped run left
// by an earlier test's random stacks.
void ResetThreadWalks() {
  if (ut::tls_reader_slot != nullptr) ut::ForgetWalks(ut::tls_reader_slot->walks);
}

TEST_CASE("replay: the same stack again is checked, not stepped, and equals the step-by-step walk") {
  ResetThreadWalks();
  using Scenario = void (*)();
  const Scenario scenarios[] = {
      +[] { unwind_test::Recurse(40); }, +[] { unwind_test::UserChain(6); },
      +[] { unwind_test::QsortWithAllocatingComparator(); }, +[] { unwind_test::OstreamCustomStreambuf(); },
      +[] { unwind_test::InThread(); }};
  for (Scenario f : scenarios) {
    // The same stack each time (one call site in the source; a trip count
    // the compiler cannot see, though clang may still peel the first run off
    // into a call site of its own). Run 0 steps every frame.
    std::unique_ptr<Capture> runs[4];
    int replayed[4] = {};
    const volatile int kRuns = 4;
    for (int i = 0; i < kRuns; ++i) {
      if (i == 0) ut::g_replay_walks.store(false);
      runs[i] = Run(f);
      replayed[i] = ut::LastWalkReplayed();
      ut::g_replay_walks.store(true);
    }
    const int depth = runs[0]->table.depth;
    for (int i = 0; i < 4; ++i) {
      const Capture& c = *runs[i];
      // Each walk equals the step-by-step walk of the same stack, taken just
      // after it, and libgcc's.
      INFO("run " << i << "\n" << Dump(c.table.pcs, c.table.depth, c.stepped.pcs, c.stepped.depth));
      CHECK(SameStack(c.table, c.stepped));
      CHECK(MatchesLibgcc(c));
    }
    // InThread walks on a new thread each time: nothing to meet, and this
    // thread's record is not the one it used.
    if (f != scenarios[4]) {
      MESSAGE("depth " << depth << ": frames replayed " << replayed[1] << ", " << replayed[2] << ", " << replayed[3]);
      CHECK(replayed[0] == 0);
      // Every frame but the first (where the walks meet), save the steps
      // that read a word the replay does not check (GCC's DRAP prologue in
      // UserChain: the walk steps it and meets the old walk again) and a
      // call site the compiler made twice.
      for (int i = 1; i < 4; ++i) CHECK(replayed[i] >= depth - 4);
    }
  }
}

TEST_CASE("replay: stacks that part and meet again, deeper than the cap, equal libgcc's") {
  ResetThreadWalks();
  // Depths in an order that makes each walk meet the last one part-way: the
  // shared outer frames are replayed, the differing inner ones stepped.
  const int depths[] = {10, 40, 25, 40, 3, HEAPPROF_MAX_FRAMES + 50, 60, HEAPPROF_MAX_FRAMES + 10, 0,
                        HEAPPROF_MAX_FRAMES - 2, HEAPPROF_MAX_FRAMES + 50, 7};
  int total_replayed = 0;
  for (int round = 0; round < 2; ++round) {
    for (int d : depths) {
      // Two call sites: the frame of this loop's call differs between them.
      auto c = (d % 2 == 0) ? Run([d] { unwind_test::Recurse(d); }) : Run([d] { unwind_test::Recurse(d); });
      const int replayed = ut::LastWalkReplayed();
      total_replayed += replayed;
      INFO("depth " << d << ", replayed " << replayed);
      REQUIRE(c->taken);
      CHECK(MatchesLibgcc(*c));
      CHECK(c->table.truncated == (d + 8 > HEAPPROF_MAX_FRAMES && c->table.depth == HEAPPROF_MAX_FRAMES));
      CHECK(c->table.depth == (c->table.truncated ? HEAPPROF_MAX_FRAMES : c->ref_n));
    }
  }
  MESSAGE("frames replayed in all: " << total_replayed);
#if !defined(HEAPPROF_ASAN)
  CHECK(total_replayed > 300);  // (ASan's instrumented frames meet less; the stacks above still equal libgcc's)
#endif
}

TEST_CASE("replay: on garbage stacks changed a few words at a time, every walk equals the step-by-step walk") {
  // A page of random words (as the garbage test above) that changes by a few
  // words between walks, so walks meet their predecessor and then find a
  // changed return address or saved fp further out.
  GuardedPage g;
  REQUIRE(g.words != nullptr);
  std::uintptr_t* const words = g.words;
  const std::size_t n = g.n;
  const long page = g.page;
  const std::uintptr_t lo = g.lo(), hi = g.hi();
  std::vector<std::uintptr_t> pcs;
  for (auto* f : {+[] { unwind_test::UserChain(3); }, +[] { unwind_test::Recurse(5); },
                  +[] { unwind_test::OstreamCustomStreambuf(); }}) {
    auto c = Run(f);
    pcs.insert(pcs.end(), c->table.pcs, c->table.pcs + c->table.depth);
  }
  REQUIRE(pcs.size() > 10);
  std::mt19937_64 rng(23);
  auto word = [&](std::size_t i) -> std::uintptr_t {
    switch (rng() % 3) {
      case 0:
        return pcs[rng() % pcs.size()];
      case 1:
        return lo + 8 * (i + 1 + rng() % 8);  // a plausible frame chain
      default:
        return lo + (rng() % static_cast<std::uintptr_t>(page + 64)) - 32;
    }
  };
  for (std::size_t i = 0; i < n; ++i) words[i] = word(i);
  auto walks = std::make_unique<ut::WalkRecords>();
  ut::ReaderSection reading;
  REQUIRE(reading.active());
  const ut::ObjectSet* set = ut::CurrentObjects();
  REQUIRE(set != nullptr);
  long replayed = 0, walked = 0, deep = 0;
  std::uintptr_t frame = lo;
  for (int iter = 0; iter < 40000; ++iter) {
    if (iter % 64 == 0) {  // a new start now and then; most walks start where the last did
      frame = lo + 8 * (rng() % (n / 4));
      words[(frame - lo) / 8 + 1] = pcs[rng() % pcs.size()];
    }
    for (int k = static_cast<int>(rng() % 3); k > 0; --k) {
      const std::size_t i = rng() % n;
      words[i] = word(i);
    }
    // The walk checks that the step out of the hook's frame gives the leaf it
    // was told: take that step here.
    ut::Regs r{words[(frame - lo) / 8 + 1], frame + 16, words[(frame - lo) / 8]};
    ut::Cursor c{set, lo, hi};
    if (!ut::Step(c, r)) continue;
    const std::uintptr_t leaf = r.pc;
    hd::CapturedStack with, without;
    // `with` replays and guesses return addresses (from guesses that earlier
    // garbage walks left: mostly wrong); `without` steps every frame.
    const bool a = ut::UnwindFrom(set, frame, leaf, lo, hi, with, nullptr, walks.get());
    ut::Cursor plain{set, lo, hi};
    const bool b = ut::Walk(plain, frame, leaf, without, nullptr);
    REQUIRE(a == b);
    if (!a) continue;
    if (!SameStack(with, without)) {
      FAIL("iteration " << iter << ": replayed walk differs\n" << Dump(with.pcs, with.depth, without.pcs, without.depth));
    }
    replayed += walks->replayed;
    walked += with.depth;
    deep += with.depth >= 8;
  }
  MESSAGE("garbage walks: " << walked << " frames, " << replayed << " replayed, " << deep << " walks of 8+ frames");
  CHECK(replayed > 1000);
}

TEST_CASE("guesses: walks leave the return address each frame's caller had, and wrong guesses change no walk") {
  // Stacks of two functions picked at random per level: each return address
  // is followed by either of two, so about half the guesses are wrong. Each
  // walk must still equal libgcc's and the plain step-by-step walk. First
  // every frame stepped (replay off); then with replay on, where walks meet
  // their predecessor by chance (equal frame sizes), replay a few frames,
  // part, and stop looking for meetings after two short ones.
  std::mt19937_64 rng(7);
  int checked = 0;
  long replayed = 0;
  for (const bool replay : {false, true}) {
    ut::g_replay_walks.store(replay);
    for (int i = 0; i < 300; ++i) {
      const int depth = 2 + static_cast<int>(rng() % 60);
      const std::uint64_t shape = rng();
      auto c = Run([&] { unwind_test::Zigzag(depth, shape); });
      INFO("replay " << replay << ", walk " << i << ", depth " << depth << "\n"
                     << Dump(c->table.pcs, c->table.depth, c->ref, c->ref_n));
      REQUIRE(c->taken);
      CHECK(MatchesLibgcc(*c));
      CHECK(SameStack(c->table, c->stepped));
      ++checked;
      if (replay) replayed += ut::LastWalkReplayed();
    }
  }
  CHECK(replayed > 0);  // the second half did meet its predecessors
  ut::g_replay_walks.store(false);
  // A stack of distinct frames, walked twice: each frame whose CFA is
  // sp-relative (the guess is taken there) has left its caller's return
  // address in its slot (unless another frame of the stack shares the slot).
  auto first = Run([] { unwind_test::UserChain(6); });
  auto again = Run([] { unwind_test::UserChain(6); });
  ut::g_replay_walks.store(true);
  REQUIRE(again->taken);
  CHECK(MatchesLibgcc(*again));
  const hd::CapturedStack& st = again->table;
  int sp_relative = 0, learned = 0;
  for (int i = 0; i + 1 < st.depth; ++i) {
    const std::uint32_t rule = ut::RuleForPc(reinterpret_cast<const void*>(st.pcs[i] - 1));
    if ((rule & 7u) != heapprof::detail::eh::kCfaSpRel) continue;
    int sharing = 0;
    for (int k = 0; k < st.depth; ++k) sharing += ut::CacheSlot(st.pcs[k]) == ut::CacheSlot(st.pcs[i]);
    if (sharing > 1) continue;
    ++sp_relative;
    learned += ut::g_guesses.next_ra[ut::CacheSlot(st.pcs[i])].load() == st.pcs[i + 1];
  }
  MESSAGE(checked << " random stacks (" << replayed << " frames replayed); UserChain(6): " << learned << " of " << sp_relative
                  << " frames with an sp-relative CFA left their guess");
  CHECK(sp_relative >= 4);
  CHECK(learned == sp_relative);
}

TEST_CASE("replay: a thread whose walks meet only by chance steps every frame for a run, then replays again") {
  // Random stacks of two same-sized functions: walks meet their predecessor
  // by chance and part a few frames on (short meetings). kPoorWalks such
  // walks start a stepped run; every walk still equals libgcc's.
  ResetThreadWalks();
  std::mt19937_64 rng(11);
  int walks_until_run = 0;
  ut::WalkRecords* w = nullptr;
  for (int i = 0; i < 400; ++i) {
    const std::uint64_t shape = rng();
    auto c = Run([&] { unwind_test::Zigzag(40, shape); });
    REQUIRE(c->taken);
    CHECK(MatchesLibgcc(*c));
    w = ut::tls_reader_slot != nullptr ? ut::tls_reader_slot->walks : nullptr;
    REQUIRE(w != nullptr);
    ++walks_until_run;
    if (w->stepped_walks > 0) break;
  }
  MESSAGE("random walks before the stepped run: " << walks_until_run);
  REQUIRE(w->stepped_walks == ut::kSteppedWalks);
  CHECK(walks_until_run >= ut::kPoorWalks);
  // The same stack over and over: the run's walks step it (nothing
  // replayed, nothing handed on), each equal to libgcc's; the walk after the
  // run replays all but its first frame, and the policy is back to normal.
  int stepped = 0;
  for (int i = 0; i < ut::kSteppedWalks; ++i) {
    auto c = Run([] { unwind_test::Recurse(20); });  // one call site
    REQUIRE(c->taken);
    CHECK(MatchesLibgcc(*c));
    stepped += ut::LastWalkReplayed() == 0;
  }
  CHECK(stepped == ut::kSteppedWalks);
  CHECK(w->stepped_walks == 0);
  auto after = Run([] { unwind_test::Recurse(20); });
  REQUIRE(after->taken);
  CHECK(MatchesLibgcc(*after));
  CHECK(ut::LastWalkReplayed() >= after->table.depth - 4);
  CHECK(w->poor_walks == 0);
  // Replay off (the benchmark's comparison) changes nothing in the policy.
  ut::g_replay_walks.store(false);
  for (int i = 0; i < 3 * ut::kPoorWalks; ++i) {
    const std::uint64_t shape = rng();
    Run([&] { unwind_test::Zigzag(40, shape); });
  }
  ut::g_replay_walks.store(true);
  CHECK(w->stepped_walks == 0);
  CHECK(w->poor_walks == 0);
}

TEST_CASE("guesses: a thread whose walks make all their wrong guesses stops guessing for a run; a recursion never") {
  // Every walk steps every frame here (replay off), so every frame with an
  // sp-relative CFA is guessed until the walk has made kWrongGuesses wrong
  // guesses (table.hpp: kWastedGuessWalks).
  ResetThreadWalks();
  ut::g_replay_walks.store(false);
  ut::WalkRecords* w = nullptr;
  // A recursion and the same frames around it: once its slots have learned
  // their words, a walk makes fewer wrong guesses than it may (the way out
  // overwrites what the way in needs, and back: two), so the thread keeps
  // guessing however many walks it makes.
  for (int i = 0; i < 2; ++i) Run([] { unwind_test::Recurse(40); });
  int most_wrong = 0;
  for (int i = 0; i < 4 * ut::kWastedGuessWalks; ++i) {
    auto c = Run([] { unwind_test::Recurse(40); });
    REQUIRE(c->taken);
    CHECK(MatchesLibgcc(*c));
    w = ut::tls_reader_slot != nullptr ? ut::tls_reader_slot->walks : nullptr;
    REQUIRE(w != nullptr);
    most_wrong = std::max(most_wrong, w->last_wrong_guesses);
    CHECK(w->unguessed_walks == 0);
  }
  MESSAGE("recursion: at most " << most_wrong << " wrong guesses a walk");
  CHECK(most_wrong < ut::kWrongGuesses);
  CHECK(w->wasted_guess_walks == 0);
  // Random stacks of two functions: a slot's word is right about half the
  // time, so walks make all their wrong guesses; kWastedGuessWalks of them
  // in a row start a run of walks that make none.
  std::mt19937_64 rng(29);
  int walks_until_run = 0, wasted = 0;
  for (int i = 0; i < 200 && w->unguessed_walks == 0; ++i) {
    const std::uint64_t shape = rng();
    auto c = Run([&] { unwind_test::Zigzag(40, shape); });
    REQUIRE(c->taken);
    CHECK(MatchesLibgcc(*c));
    ++walks_until_run;
    wasted += w->last_wrong_guesses == ut::kWrongGuesses;
  }
  MESSAGE("random walks before the unguessed run: " << walks_until_run << " (" << wasted << " made all their wrong guesses)");
  REQUIRE(w->unguessed_walks == ut::kUnguessedWalks);
  CHECK(walks_until_run >= ut::kWastedGuessWalks);
  CHECK(wasted >= ut::kWastedGuessWalks);
  // The run: no walk guesses, every walk still equals libgcc's.
  int unguessed = 0;
  for (int i = 0; i < ut::kUnguessedWalks; ++i) {
    const std::uint64_t shape = rng();
    auto c = Run([&] { unwind_test::Zigzag(40, shape); });
    REQUIRE(c->taken);
    CHECK(MatchesLibgcc(*c));
    unguessed += w->guess_budget == 0;
  }
  CHECK(unguessed == ut::kUnguessedWalks);
  CHECK(w->unguessed_walks == 0);
  // The walk after the run guesses again, and decides alone: on a random
  // stack it makes all its wrong guesses and a new run starts at once; a
  // recursion's walk ends the streak.
  {
    auto c = Run([&] { unwind_test::Zigzag(40, rng()); });
    CHECK(MatchesLibgcc(*c));
    CHECK(w->guess_budget == ut::kWrongGuesses);
    if (w->last_wrong_guesses == ut::kWrongGuesses) {
      CHECK(w->unguessed_walks == ut::kUnguessedWalks);
      for (int i = 0; i < ut::kUnguessedWalks; ++i) Run([] { unwind_test::Recurse(40); });
    }
  }
  for (int i = 0; i < 2; ++i) Run([] { unwind_test::Recurse(40); });
  CHECK(w->guess_budget == ut::kWrongGuesses);
  CHECK(w->wasted_guess_walks == 0);
  CHECK(w->unguessed_walks == 0);
  // Guesses off (the benchmark's comparison): no walk counts for or against.
  ut::g_guess_walks.store(false);
  for (int i = 0; i < 2 * ut::kWastedGuessWalks; ++i) Run([&] { unwind_test::Zigzag(40, rng()); });
  ut::g_guess_walks.store(true);
  CHECK(w->wasted_guess_walks == 0);
  CHECK(w->unguessed_walks == 0);
  ut::g_replay_walks.store(true);
  ResetThreadWalks();
}

TEST_CASE("replay: a stack equal to the last one, frame for frame, hands on what was interned for it") {
  ResetThreadWalks();
  // The engine interns a sampled stack once and stores the record in the
  // walk's slot; a walk that repeats the last one exactly finds it there.
  int marker[5] = {};
  const void* seen[5] = {};
  const int depths[5] = {12, 12, 13, 12, 12};
  const volatile int kRuns = 5;  // one call site: the loop must not be unrolled
  for (int i = 0; i < kRuns; ++i) {
    const int d = depths[i];
    auto c = Run([d] { unwind_test::Recurse(d); });  // one call site
    REQUIRE(c->taken);
    REQUIRE(c->table.interned != nullptr);
    seen[i] = *c->table.interned;
    *c->table.interned = &marker[i];
  }
  CHECK(seen[1] == &marker[0]);  // the same stack again
  CHECK(seen[2] == nullptr);     // one frame more
  CHECK(seen[3] == nullptr);     // one frame less than the last
  CHECK(seen[4] == &marker[3]);
  // Replay off: nothing is handed on.
  ut::g_replay_walks.store(false);
  auto c = Run([] { unwind_test::Recurse(12); });
  ut::g_replay_walks.store(true);
  REQUIRE(c->table.interned != nullptr);
  CHECK(*c->table.interned == nullptr);
}

namespace {

// pthread_getattr_np's [lo, hi) for the calling thread, or {0, 0}.
void GlibcStackBounds(std::uintptr_t& lo, std::uintptr_t& hi) {
  lo = hi = 0;
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
  void* addr = nullptr;
  std::size_t size = 0;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
    lo = reinterpret_cast<std::uintptr_t>(addr);
    hi = lo + size;
  }
  pthread_attr_destroy(&attr);
}

}  // namespace

TEST_CASE("the main thread's stack bounds without the maps file equal glibc's pthread_getattr_np") {
  // frame_pointers.hpp: MainStackBounds, registration's answer for the main
  // thread (doctest runs the cases on it), against glibc's (which reads
  // /proc/self/maps). Also on another thread: not the main one, no answer.
  rlimit rl{};
  REQUIRE(getrlimit(RLIMIT_STACK, &rl) == 0);
  std::uintptr_t lo = 0, hi = 0;
  const bool answered = hd::MainStackBounds(lo, hi);
  CHECK(answered == (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur <= (rlim_t{128} << 20)));  // else glibc's
  if (!answered) hd::CurrentStackBounds(lo, hi);
  std::uintptr_t g_lo = 0, g_hi = 0;
  GlibcStackBounds(g_lo, g_hi);
  REQUIRE(g_hi != 0);
  CHECK(lo == g_lo);
  CHECK(hi == g_hi);
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  CHECK(here >= lo);
  CHECK(here < hi);
  std::uintptr_t reg_lo = 0, reg_hi = 0;
  hd::CurrentStackBounds(reg_lo, reg_hi);
  CHECK(reg_lo == lo);
  CHECK(reg_hi == hi);
  std::thread([] {
    std::uintptr_t t_lo = 0, t_hi = 0;
    hd::CurrentStackBounds(t_lo, t_hi);  // pthread_getattr_np's: this thread's own stack
    const auto at = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
    CHECK(at >= t_lo);
    CHECK(at < t_hi);
  }).join();
}

namespace {

// Registration's bounds for the calling thread against glibc's, and the
// caller's frame inside them: 0 if so, else which check failed.
int CompareWithGlibc() {
  std::uintptr_t lo = 0, hi = 0, g_lo = 0, g_hi = 0;
  hd::CurrentStackBounds(lo, hi);
  GlibcStackBounds(g_lo, g_hi);
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (g_hi == 0) return 10;
  if (here < lo || here >= hi) return 11;
  if (lo != g_lo) return 12;
  if (hi != g_hi) return 13;
  return 0;
}

// Runs `body` in a forked child (killed by its own alarm if it hangs): its
// exit status, or 100 + the signal that ended it.
template <typename F>
int InChild(F body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    _exit(body());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 99;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("stack bounds in the child of a fork from another thread are that thread's stack as glibc gives them") {
  // The child's only thread has the pid as its tid, but its stack is the
  // forking thread's, not the main stack MainStackBounds describes (that
  // gave the main stack's bounds, the caller's frame outside them).
  int status = -1;
  std::thread([&status] { status = InChild([] { return CompareWithGlibc(); }); }).join();
  CHECK(status == 0);
}

TEST_CASE("the main thread's stack bounds after setrlimit raised its limit past a mapping below the stack equal glibc's") {
  // The kernel placed its mmap area by the limit at exec; a limit raised
  // later reaches past mappings there (with ASLR off, as under gdb: ld.so's,
  // 128 MiB below the stack's top). glibc stops the stack at the mapping
  // below; MainStackBounds took the whole new limit (lo 1 GiB down, across
  // them). A page 256 MiB below the stack's top stands for such a mapping.
  rlimit rl{};
  REQUIRE(getrlimit(RLIMIT_STACK, &rl) == 0);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < (rlim_t{1} << 30)) {
    MESSAGE("hard RLIMIT_STACK under 1 GiB: skipped");
    return;
  }
  std::uintptr_t lo = 0, hi = 0;
  GlibcStackBounds(lo, hi);
  REQUIRE(hi != 0);
  const int status = InChild([hi] {
    const long page = sysconf(_SC_PAGESIZE);
    void* want = reinterpret_cast<void*>(hi - (std::uintptr_t{256} << 20));
    void* got = mmap(want, static_cast<std::size_t>(page), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0);
    if (got != want) return 20;  // something is there already (or the kernel is older than 4.17)
    rlimit raised{};
    if (getrlimit(RLIMIT_STACK, &raised) != 0) return 21;
    raised.rlim_cur = rlim_t{1} << 30;
    if (setrlimit(RLIMIT_STACK, &raised) != 0) return 22;
    return CompareWithGlibc();
  });
  CHECK(status == 0);
}
