// The retention profile with the malloc family replaced (6_serving/retention.hpp):
// what a write allocates through the hooks. README: none, except that
// __cxa_demangle mallocs for the names the profile shows.
#include "common.hpp"

#include <dlfcn.h>
#include <search.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "support/child_files.hpp"

#if defined(HEAPPROF_TEST_HAVE_LEVELDB)
#include <leveldb/cache.h>
#include <leveldb/db.h>
#include <leveldb/options.h>
#endif

namespace malloc_test {
// A root with a mangled name: the profile names it "[global] malloc_test::g_retention_root".
std::vector<char*> g_retention_root;

// A tsearch tree: its nodes are allocated by glibc's tsearch.
void* g_retention_tree = nullptr;
int CompareTreeKeys(const void* a, const void* b) {
  return std::strcmp(static_cast<const char*>(a), static_cast<const char*>(b));
}
__attribute__((noinline)) char* MakeTreeKey() {
  char* key = new char[48];
  std::strcpy(key, "the key");
  return key;
}
__attribute__((noinline)) void InsertTreeKey(char* key) {
  REQUIRE(tsearch(key, &g_retention_tree, &CompareTreeKeys) != nullptr);
  asm volatile("" ::: "memory");  // not a tail call: this frame stays on tsearch's stack
}

// A 24-byte object held only by a pointer to its last member (offset 16:
// where glibc keeps the next chunk's header, which the scan skips there).
struct LastMemberHeld {
  long a, b, c;
};
long* g_retention_last_member = nullptr;
__attribute__((noinline)) LastMemberHeld* MakeLastMemberHeld() {
  auto* p = new LastMemberHeld{1, 2, 3};
  asm volatile("" ::"r"(p) : "memory");
  return p;
}

// retention_mapping (rate 1 from the start: every object known): a buffer
// held only by a word of an anonymous mapping the program made itself (a pool
// allocator's region), and leaks whose addresses stay in a freed block of a
// thread's malloc arena. Prints the mapping's address.
constexpr std::size_t kMappingHeldBytes = 1357;
constexpr std::size_t kArenaLeaks = 8;
__attribute__((noinline)) char* MakeMappingHeldBuffer() {
  char* p = static_cast<char*>(std::malloc(kMappingHeldBytes));
  asm volatile("" ::"r"(p) : "memory");
  return p;
}
__attribute__((noinline)) char* MakeArenaLeak(std::size_t i) {
  char* p = static_cast<char*>(std::malloc(200 + i));
  asm volatile("" ::"r"(p) : "memory");
  return p;
}
int RunRetentionMapping() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  void* region = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return 4;
  // From threads that then exit: no copy of the addresses stays in this
  // thread's registers or stack. The second one's blocks are in an arena of
  // its own (a heap on a 64 MiB boundary), the index freed there.
  std::thread([region] { static_cast<char**>(region)[1000] = MakeMappingHeldBuffer(); }).join();
  std::thread([] {
    auto** index = static_cast<char**>(std::malloc(kArenaLeaks * 2 * sizeof(char*)));
    for (std::size_t i = 0; i < kArenaLeaks * 2; ++i) index[i] = MakeArenaLeak(i % kArenaLeaks);
    for (std::size_t i = 0; i < kArenaLeaks; ++i) std::free(index[2 * i]);  // the other half leaks
    std::free(index);
  }).join();
  std::printf("region=%p\n", region);
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}

// retention_fiber (rate 1 from the start: every object known): a coroutine
// suspended for good on a stack the program mapped itself above a PROT_NONE
// guard page, as boost.context's protected_fixedsize_stack and
// boost.coroutine's protected_stack_allocator lay one out: the only pointer
// to a buffer it allocated is in its frame. The stack looks like a thread's
// (anonymous, above a guard) but no thread runs on it and no thread
// descriptor is at its top: it is the program's memory, which holds the
// buffer. Its context (the saved registers) is at the bottom of the same
// mapping, so nothing outside it keeps the address. Prints the stack.
constexpr std::size_t kFiberHeldBytes = 2345;
ucontext_t g_fiber_caller;
ucontext_t* g_fiber_self = nullptr;
__attribute__((noinline)) char* MakeFiberHeldBuffer() {
  char* p = static_cast<char*>(std::malloc(kFiberHeldBytes));
  asm volatile("" ::"r"(p) : "memory");
  return p;
}
void FiberBody() {
  char* volatile held = MakeFiberHeldBuffer();
  swapcontext(g_fiber_self, &g_fiber_caller);  // never resumed
  std::free(held);
}
int RunRetentionFiber() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), bytes = 64 * 1024;
  // One more page above, PROT_NONE: no anonymous neighbour merges into the
  // stack's mapping (its top would then be the neighbour's).
  void* mem = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 4;
  if (mprotect(mem, page, PROT_NONE) != 0) return 5;  // the guard, at the bottom
  if (mprotect(static_cast<char*>(mem) + bytes, page, PROT_NONE) != 0) return 5;
  auto* base = static_cast<char*>(mem) + page;
  g_fiber_self = reinterpret_cast<ucontext_t*>(base);
  if (getcontext(g_fiber_self) != 0) return 6;
  const std::size_t context_bytes = (sizeof(ucontext_t) + 63) & ~std::size_t{63};
  g_fiber_self->uc_stack.ss_sp = base + context_bytes;
  g_fiber_self->uc_stack.ss_size = bytes - page - context_bytes;
  g_fiber_self->uc_link = nullptr;
  makecontext(g_fiber_self, &FiberBody, 0);
  // From a thread that then exits: no copy of the address stays in this
  // thread's registers or stack (the saved ones are in the fiber's mapping).
  std::thread([] {
    if (swapcontext(&g_fiber_caller, g_fiber_self) != 0) std::abort();
  }).join();
  g_fiber_self = nullptr;
  std::printf("stack=%p-%p\n", static_cast<void*>(base), static_cast<void*>(static_cast<char*>(mem) + bytes));
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}

#if defined(HEAPPROF_TEST_HAVE_LEVELDB)
// retention_leveldb (rate 1 from the start): a real database (Debian's
// libleveldb-dev) held by globals: its block cache full of the tables'
// blocks, its memtable of the last writes. Prints what LevelDB says it holds.
leveldb::DB* g_leveldb = nullptr;
leveldb::Cache* g_leveldb_cache = nullptr;
int RunRetentionLevelDb() {
  const char* dir = std::getenv("HEAPPROF_TEST_DIR");
  if (dir == nullptr) return 3;
  leveldb::Options options;
  options.create_if_missing = true;
  options.write_buffer_size = 64 << 20;  // the memtable keeps the last writes
  g_leveldb_cache = leveldb::NewLRUCache(64 << 20);
  options.block_cache = g_leveldb_cache;
  if (!leveldb::DB::Open(options, std::string(dir) + "/db", &g_leveldb).ok()) return 4;
  std::string value(200, 'v');  // compressible: the blocks are decompressed into the cache
  char key[32];
  for (int i = 0; i < 20000; ++i) {
    std::snprintf(key, sizeof key, "key%09d", i);
    value[i % 200] = static_cast<char>('a' + i % 26);
    if (!g_leveldb->Put(leveldb::WriteOptions(), key, value).ok()) return 5;
  }
  g_leveldb->CompactRange(nullptr, nullptr);
  std::string got;
  for (int i = 0; i < 20000; ++i) {
    std::snprintf(key, sizeof key, "key%09d", i);
    if (!g_leveldb->Get(leveldb::ReadOptions(), key, &got).ok()) return 6;
  }
  for (int i = 0; i < 10000; ++i) {
    std::snprintf(key, sizeof key, "mem%09d", i);
    if (!g_leveldb->Put(leveldb::WriteOptions(), key, value).ok()) return 5;
  }
  // (approximate-memory-usage: the block cache's charge plus the memtables')
  std::string usage;
  g_leveldb->GetProperty("leveldb.approximate-memory-usage", &usage);
  const std::size_t cache = g_leveldb_cache->TotalCharge();
  std::printf("cache=%zu memtable=%lld\n", cache, std::strtoll(usage.c_str(), nullptr, 10) - static_cast<long long>(cache));
  if (!heapprof::WriteHeapProfile(std::string(dir) + "/heap.pb.gz")) return 8;
  return heapprof::WriteRetentionProfile(std::string(dir) + "/retention.pb.gz") ? 0 : 7;
}
#endif

// leak_joined_thread (rate 1 and the leak report from the start): one thread
// created and joined, nothing of the program's left. Its stack stays in
// glibc's cache, and the DTV the loader calloc'ed for it with it.
int RunLeakJoinedThread() {
  std::thread([] { std::free(std::malloc(100)); }).join();
  return 0;
}

// dlerror_after_start (rate 1 from the start): the program's first dlerror()
// (start-up's failed look-ups must leave it nothing), then a failed dlsym
// of the program's whose message is kept until exit, as libomp's is.
int RunDlerrorAfterStart() {
  const char* pending = dlerror();
  std::printf("dlerror at start: %s\n", pending != nullptr ? pending : "(none)");
  if (dlsym(RTLD_DEFAULT, "heapprof_test_no_such_symbol") != nullptr) return 3;
  return 0;
}

// getattr_first_thread: threads whose first allocation is glibc's, inside
// pthread_getattr_np on themselves (as every JVM thread starts), then more.
int RunGetattrFirstThread() {
  for (int i = 0; i < 4; ++i) {
    std::size_t size = 0;
    std::thread([&size] {
      pthread_attr_t attr;
      if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
      void* addr = nullptr;
      pthread_attr_getstack(&attr, &addr, &size);
      pthread_attr_destroy(&attr);
      std::free(std::malloc(1000));
    }).join();
    if (size == 0) return 4;
  }
  std::printf("getattr_first_thread: done\n");
  return 0;
}
}  // namespace malloc_test

int RunMallocChildScenario(const char* name) {
  if (std::strcmp(name, "retention_mapping") == 0) return malloc_test::RunRetentionMapping();
  if (std::strcmp(name, "retention_fiber") == 0) return malloc_test::RunRetentionFiber();
  if (std::strcmp(name, "leak_joined_thread") == 0) return malloc_test::RunLeakJoinedThread();
  if (std::strcmp(name, "dlerror_after_start") == 0) return malloc_test::RunDlerrorAfterStart();
  if (std::strcmp(name, "getattr_first_thread") == 0) return malloc_test::RunGetattrFirstThread();
#if defined(HEAPPROF_TEST_HAVE_LEVELDB)
  if (std::strcmp(name, "retention_leveldb") == 0) return malloc_test::RunRetentionLevelDb();
#endif
  return -1;
}

TEST_CASE("retention profile of a real leveldb database: its cache and memtable are held by the globals that own them") {
#if !HEAPPROF_MALLOC_HOOKS || !defined(HEAPPROF_TEST_HAVE_LEVELDB)
  MESSAGE("needs the malloc family replaced and leveldb (apt-get install libleveldb-dev)");
  return;
#else
  const std::string dir = heapprof_test::MakeTempDir("retention_leveldb");
  REQUIRE(!dir.empty());
  std::string out;
  const int rc = heapprof_test::RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_leveldb", out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t at = out.find("cache=");
  REQUIRE(at != std::string::npos);
  const std::int64_t cache = std::strtoll(out.c_str() + at + 6, nullptr, 10);
  const std::size_t mem_at = out.find("memtable=");
  REQUIRE(mem_at != std::string::npos);
  const std::int64_t memtable = std::strtoll(out.c_str() + mem_at + 9, nullptr, 10);
  CHECK(cache > (1 << 20));
  CHECK(memtable > (1 << 20));
  heapprof_test::Profile heap, p;
  REQUIRE(heapprof_test::ReadProfileFile(dir + "/heap.pb.gz", heap));
  REQUIRE(heapprof_test::ReadProfileFile(dir + "/retention.pb.gz", p));
  const int space = heapprof_test::SampleTypeIndex(p, "inuse_space");
  REQUIRE(space >= 0);
  std::int64_t by_cache = 0, by_db = 0, total = 0, unreachable = 0;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> frames = heapprof_test::FunctionNames(p, s);
    REQUIRE(!frames.empty());
    const std::int64_t bytes = s.values.at(static_cast<std::size_t>(space));
    total += bytes;
    if (frames.back() == "[global] malloc_test::g_leveldb_cache") by_cache += bytes;
    if (frames.back() == "[global] malloc_test::g_leveldb") by_db += bytes;
    // (Of the database's objects: libtcmalloc_minimal_debug's free queue
    // mallocs a block through the hooks that only its own globals, no root,
    // hold: "[unreachable]", not this test's concern.)
    bool database = false;
    for (const std::string& f : frames) database = database || f.find("leveldb") != std::string::npos;
    if (database && frames.back() == "[unreachable]") unreachable += bytes;
  }
  // The cache's charge is its blocks' sizes; the memtable's usage is its
  // arena's blocks: each held, with LevelDB's own overheads on top, by the
  // global that owns it. Under tcmalloc the arena's blocks (4 KiB, written
  // in part) were reused memory whose unwritten tails still held pointers to
  // cache blocks, and the shorter path to 1.4 MB of them went through those
  // (README: stale values): the sum only, there.
  CHECK(by_cache + by_db >= cache + memtable);
  if (malloc_test::RealMallocIsGlibc()) {
    CHECK(by_cache >= cache);
    CHECK(by_db >= memtable);
  }
  CHECK(unreachable == 0);
  // Valued as the heap profile values the same objects.
  const int heap_space = heapprof_test::SampleTypeIndex(heap, "inuse_space");
  REQUIRE(heap_space >= 0);
  std::int64_t heap_total = 0;
  for (const heapprof_test::Sample& s : heap.samples) heap_total += s.values.at(static_cast<std::size_t>(heap_space));
  CHECK(total == heap_total);
  heapprof_test::RemoveDir(dir);
#endif
}

TEST_CASE("retention profile with every object known: an anonymous mapping of the program's holds what it points at") {
#if !HEAPPROF_MALLOC_HOOKS
  MESSAGE("the malloc family is not replaced here: heapprof does not know every object");
  return;
#else
  if (!malloc_test::RealMallocIsGlibc()) {
    MESSAGE("the mappings are read under glibc's malloc only (another allocator's heaps are anonymous mappings)");
    return;
  }
  const std::string dir = heapprof_test::MakeTempDir("retention_mapping");
  REQUIRE(!dir.empty());
  std::string out;
  const int rc = heapprof_test::RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_mapping", out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t at = out.find("region=0x");
  REQUIRE(at != std::string::npos);
  const std::uintptr_t region = std::strtoull(out.c_str() + at + 9, nullptr, 16);
  heapprof_test::Profile p;
  REQUIRE(heapprof_test::ReadProfileFile(dir + "/retention.pb.gz", p));
  bool every_object_known = false;
  for (const std::int64_t c : p.comment_indices) {
    every_object_known = every_object_known ||
                         p.string_table.at(static_cast<std::size_t>(c)).find("every object known") != std::string::npos;
  }
  REQUIRE(every_object_known);
  const int objects = heapprof_test::SampleTypeIndex(p, "inuse_objects");
  REQUIRE(objects >= 0);
  std::int64_t held = 0, leaks = 0;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> frames = heapprof_test::FunctionNames(p, s);
    if (frames.empty()) continue;
    std::string joined;
    for (const std::string& f : frames) joined += f + "\n";
    INFO(joined);
    if (frames.front().find("MakeMappingHeldBuffer") != std::string::npos) {
      // Was "[unreachable]": a leak, for leak_exit_code.
      held += s.values.at(static_cast<std::size_t>(objects));
      const std::string& root = frames.back();
      REQUIRE(root.find("[anonymous mapping] 0x") == 0);
      const std::size_t dash = root.find('-');
      REQUIRE(dash != std::string::npos);
      const std::uintptr_t lo = std::strtoull(root.c_str() + 20, nullptr, 16);
      const std::uintptr_t hi = std::strtoull(root.c_str() + dash + 1, nullptr, 16);
      CHECK(lo <= region + 8000);
      CHECK(region + 8000 < hi);
    } else if (frames.front().find("MakeArenaLeak") != std::string::npos) {
      // The freed index in the thread's arena still holds their addresses:
      // that heap is no root.
      leaks += s.values.at(static_cast<std::size_t>(objects));
      CHECK(frames.back() == "[unreachable]");
    }
  }
  CHECK(held == 1);
  CHECK(leaks == static_cast<std::int64_t>(malloc_test::kArenaLeaks));
  heapprof_test::RemoveDir(dir);
#endif
}

TEST_CASE("retention profile with every object known: a suspended coroutine's guarded stack holds what its frames point at") {
#if !HEAPPROF_MALLOC_HOOKS
  MESSAGE("the malloc family is not replaced here: heapprof does not know every object");
  return;
#else
  if (!malloc_test::RealMallocIsGlibc()) {
    MESSAGE("the mappings are read under glibc's malloc only (another allocator's heaps are anonymous mappings)");
    return;
  }
  const std::string dir = heapprof_test::MakeTempDir("retention_fiber");
  REQUIRE(!dir.empty());
  std::string out;
  const int rc = heapprof_test::RunChildScenario("HEAPPROF=rate=1 HEAPPROF_TEST_DIR=" + dir, "retention_fiber", out);
  INFO(out);
  REQUIRE(rc == 0);
  const std::size_t at = out.find("stack=0x");
  REQUIRE(at != std::string::npos);
  char* end = nullptr;
  const std::uintptr_t stack_lo = std::strtoull(out.c_str() + at + 6, &end, 16);
  REQUIRE(end != nullptr);
  REQUIRE(*end == '-');
  const std::uintptr_t stack_hi = std::strtoull(end + 1, nullptr, 16);
  heapprof_test::Profile p;
  REQUIRE(heapprof_test::ReadProfileFile(dir + "/retention.pb.gz", p));
  const int objects = heapprof_test::SampleTypeIndex(p, "inuse_objects");
  REQUIRE(objects >= 0);
  std::int64_t held = 0;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> frames = heapprof_test::FunctionNames(p, s);
    if (frames.empty() || frames.front().find("MakeFiberHeldBuffer") == std::string::npos) continue;
    std::string joined;
    for (const std::string& f : frames) joined += f + "\n";
    INFO(joined);
    held += s.values.at(static_cast<std::size_t>(objects));
    // Was "[unreachable]": the guarded mapping was taken for a thread's
    // stack and not read (a leak, for leak_exit_code).
    const std::string& root = frames.back();
    REQUIRE(root.find("[anonymous mapping] 0x") == 0);
    const std::size_t dash = root.find('-');
    REQUIRE(dash != std::string::npos);
    const std::uintptr_t lo = std::strtoull(root.c_str() + 20, nullptr, 16);
    const std::uintptr_t hi = std::strtoull(root.c_str() + dash + 1, nullptr, 16);
    CHECK(lo <= stack_lo);
    CHECK(stack_hi <= hi);
  }
  CHECK(held == 1);
  heapprof_test::RemoveDir(dir);
#endif
}

TEST_CASE("leak report at rate 1: a failed dlsym's message is no leak, and start-up leaves dlerror() empty") {
#if !HEAPPROF_MALLOC_HOOKS
  MESSAGE("the malloc family is not replaced here: heapprof does not know every object");
  return;
#else
  // Start-up's own failed look-ups (heapprof_preload_engine_v1, free_sized,
  // nallocx...) left the thread's dlerror state holding their message in a
  // block allocated inside the profiler (unrecorded, or in the bootstrap
  // buffer). The program's first dlerror() returned that message, and the
  // program's own failed dlsym stored its message there: held by nothing
  // heapprof knew, "[unreachable]" (53 bytes, _dl_exception_create_format <
  // dlsym), and the status 42.
  const std::string dir = heapprof_test::MakeTempDir("dlerror_after_start");
  REQUIRE(!dir.empty());
  const std::string supp = dir + "/allocator.supp";  // as in the joined-thread case above
  std::string ignored;
  REQUIRE(heapprof_test::RunCommand("printf 'leak:ProcessFreeQueue\\n' > " + supp, ignored) == 0);
  std::string out;
  const int rc = heapprof_test::RunChildScenario(
      "HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,leak_suppressions=" + supp + ",dump_prefix=" + dir + "/d",
      "dlerror_after_start", out);
  INFO(out);
  CHECK(out.find("dlerror at start: (none)") != std::string::npos);
  CHECK(out.find("heapprof: leak report: unreachable (leaked): 0 objects") != std::string::npos);
  CHECK(rc == 0);
  heapprof_test::RemoveDir(dir);
#endif
}

TEST_CASE("retention profile: a write demangles the names of its roots only") {
#if !HEAPPROF_MALLOC_HOOKS
  MESSAGE("the malloc family is not replaced here: __cxa_demangle's allocations are not seen");
  return;
#endif
  malloc_test::RateScope rate(1);
  malloc_test::g_retention_root.push_back(new char[100]);
  const std::string dir = heapprof_test::MakeTempDir("retention_malloc");
  REQUIRE(!dir.empty());
  const std::string path = dir + "/retention.pb.gz";
  REQUIRE(heapprof::WriteRetentionProfile(path));  // whatever a first write sets up for good
  malloc_test::Delta d;
  REQUIRE(heapprof::WriteRetentionProfile(path));
  d.Stop();
  // Demangling every data symbol of each module with a root (this program's,
  // libstdc++'s...) took 314 here; the names shown take a handful (5).
  MESSAGE("allocations through the hooks during one write: " << d.allocs());
  CHECK(d.allocs() < 50);
  delete[] malloc_test::g_retention_root.back();
  malloc_test::g_retention_root.pop_back();
  heapprof_test::RemoveDir(dir);
}

TEST_CASE("retention profile: a holder libc allocated is named by the program's function that called libc") {
#if !HEAPPROF_MALLOC_HOOKS
  MESSAGE("the malloc family is not replaced here: libc's tsearch nodes are not seen");
  return;
#endif
  malloc_test::RateScope rate(1);
  char* key = malloc_test::MakeTreeKey();
  malloc_test::InsertTreeKey(key);
  const std::string dir = heapprof_test::MakeTempDir("retention_tsearch");
  REQUIRE(!dir.empty());
  const std::string path = dir + "/retention.pb.gz";
  REQUIRE(heapprof::WriteRetentionProfile(path));
  heapprof_test::Profile p;
  REQUIRE(heapprof_test::ReadProfileFile(path, p));
  // The key: held by the tree's node (allocated in glibc's tsearch, called by
  // InsertTreeKey), held by the global. Before, the node's frame was glibc's
  // internal name (__GI___tsearch with libc6-dbg, else tsearch).
  bool found = false;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> frames = heapprof_test::FunctionNames(p, s);
    bool key_sample = false;
    for (const std::string& f : frames) {
      if (f.find('[') == 0) break;  // the object's own allocation stack ends here
      key_sample = key_sample || f.find("MakeTreeKey") != std::string::npos;
    }
    if (!key_sample) continue;
    found = true;
    std::string joined;
    for (const std::string& f : frames) joined += f + "\n";
    INFO(joined);
    CHECK(joined.find("[held by] malloc_test::InsertTreeKey") != std::string::npos);
    CHECK(joined.find("tsearch") == std::string::npos);
    CHECK(joined.find("[global] malloc_test::g_retention_tree") != std::string::npos);
  }
  CHECK(found);
  tdelete(key, &malloc_test::g_retention_tree, &malloc_test::CompareTreeKeys);
  delete[] key;
  heapprof_test::RemoveDir(dir);
}

TEST_CASE("a thread whose first allocation is inside pthread_getattr_np on itself does not hang") {
#if !HEAPPROF_MALLOC_HOOKS || !defined(__GLIBC__)
  MESSAGE("needs the malloc family replaced on glibc");
  return;
#else
  // Registration asked pthread_getattr_np for the thread's stack while glibc
  // held the thread's lock for that same call's realloc: the thread waited
  // on itself (every JVM thread does this first: java -version hung under
  // the preload library). At the default rate and at rate 1 (every block
  // sampled, the stack walk needs the bounds). Under gperftools' debug
  // allocator (malloc_tests_tcmalloc_debug) glibc's free there allocates
  // too, from the allocator's code, on the thread not registered yet.
  for (const char* rate : {"HEAPPROF=rate=512k", "HEAPPROF=rate=1"}) {
    std::string out;
    const int rc = heapprof_test::RunChildScenario(rate, "getattr_first_thread", out, 20);
    INFO(rate);
    INFO(out);
    CHECK(rc == 0);
    CHECK(out == "getattr_first_thread: done\n");
  }
#endif
}

TEST_CASE("a non-PIE program whose thread allocates first inside pthread_getattr_np on itself does not hang") {
#if !defined(HEAPPROF_GETATTR_NOPIE_PATH) || !defined(__GLIBC__)
  MESSAGE("needs the non-PIE test program on glibc");
  return;
#else
  // There &pthread_getattr_np is the executable's PLT stub, not glibc's
  // function, so the deferral above never matched: the thread hung.
  for (const char* rate : {"HEAPPROF=rate=512k ", "HEAPPROF=rate=1 "}) {
    std::string out;
    const int rc = heapprof_test::RunCommand(std::string(rate) + "timeout 20 " + HEAPPROF_GETATTR_NOPIE_PATH, out);
    INFO(rate);
    INFO(out);
    CHECK(rc == 0);
    CHECK(out == "getattr_nopie: done\n");
  }
#endif
}

TEST_CASE("leak report at rate 1: a thread created and joined leaves no leak and no leak_exit_code status") {
#if !HEAPPROF_MALLOC_HOOKS || !defined(__x86_64__) || !defined(__GLIBC__)
  MESSAGE("needs the malloc family replaced (the loader callocs the DTV) on x86-64 glibc");
  return;
#else
  // glibc keeps a joined thread's stack for the next pthread_create, its
  // descriptor and that descriptor's DTV with it. The DTV was "[unreachable]":
  // 1 object, 304 bytes (allocate_dtv < _dl_allocate_tls < pthread_create),
  // and the status 42 (also python3 with one thread; tar, xz).
  const std::string dir = heapprof_test::MakeTempDir("leak_joined_thread");
  REQUIRE(!dir.empty());
  // gperftools' debug allocator (malloc_tests_tcmalloc_debug) mallocs a
  // free queue of its own inside free(), which nothing of ours points at:
  // suppressed, so that the exit status speaks of the DTV alone.
  const std::string supp = dir + "/allocator.supp";
  std::string ignored;
  REQUIRE(heapprof_test::RunCommand("printf 'leak:ProcessFreeQueue\\n' > " + supp, ignored) == 0);
  std::string out;
  const int rc = heapprof_test::RunChildScenario(
      "HEAPPROF=rate=1,leak_report=1,leak_exit_code=42,leak_suppressions=" + supp + ",dump_prefix=" + dir + "/j",
      "leak_joined_thread", out);
  INFO(out);
  CHECK(rc == 0);
  // The DTV is held by the exited thread's cached descriptor, not leaked.
  const std::size_t unreachable = out.find("heapprof: leak report: unreachable (leaked): ");
  const std::size_t reachable = out.find("heapprof: leak report: reachable (held by a root");
  REQUIRE(unreachable != std::string::npos);
  REQUIRE(reachable != std::string::npos);
  CHECK(out.substr(unreachable, reachable - unreachable).find("allocate_dtv") == std::string::npos);
  CHECK(out.find("[exited thread] glibc's cached descriptor") != std::string::npos);
  heapprof_test::RemoveDir(dir);
#endif
}

TEST_CASE("retention profile: a dlopen'ed library's TLS block on the main thread is held by it, not leaked") {
#if !HEAPPROF_MALLOC_HOOKS || !defined(HEAPPROF_HOOKED_DSO_PATH)
  MESSAGE("needs the malloc family replaced (glibc mallocs the block) and the test library");
  return;
#else
  REQUIRE(::syscall(SYS_gettid) == ::getpid());  // the main thread: its DTV is ld.so's, scanned by no root
  malloc_test::RateScope rate(1);
  void* h = dlopen(HEAPPROF_HOOKED_DSO_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(h != nullptr);
  auto keep = reinterpret_cast<void (*)(std::size_t)>(dlsym(h, "heapprof_hooked_dso_tls_keep"));
  const bool exported = keep != nullptr;
  REQUIRE(exported);
  keep(4321);  // the first use on this thread: glibc mallocs its block of the library's TLS
  const std::string dir = heapprof_test::MakeTempDir("retention_dtls");
  REQUIRE(!dir.empty());
  const std::string path = dir + "/retention.pb.gz";
  REQUIRE(heapprof::WriteRetentionProfile(path));
  heapprof_test::Profile p;
  REQUIRE(heapprof_test::ReadProfileFile(path, p));
  // Both the buffer and the block holding the pointer to it (allocated by
  // __tls_get_addr under heapprof_hooked_dso_tls_keep) are this thread's:
  // the block was "[unreachable]" (a leak for leak_exit_code) or
  // "[unsampled heap]" before.
  const std::string root = "[tls] thread " + std::to_string(::getpid());
  int buffers = 0, blocks = 0;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> frames = heapprof_test::FunctionNames(p, s);
    bool in_keep = false, buffer = false;
    for (const std::string& f : frames) {
      if (f.find('[') == 0) break;  // the object's own allocation stack ends here
      in_keep = in_keep || f.find("heapprof_hooked_dso_tls_keep") != std::string::npos;
      buffer = buffer || f.find("DsoTlsBuffer") != std::string::npos;
    }
    if (!in_keep) continue;
    std::string joined;
    for (const std::string& f : frames) joined += f + "\n";
    INFO(joined);
    CHECK(frames.back() == root);
    ++(buffer ? buffers : blocks);
  }
  CHECK(buffers == 1);
  CHECK(blocks == 1);
  heapprof_test::RemoveDir(dir);
#endif
}

TEST_CASE("retention profile: under jemalloc or tcmalloc a pointer to a 24-byte object's last member holds it") {
#if !HEAPPROF_MALLOC_HOOKS
  MESSAGE("the malloc family is not replaced here");
  return;
#else
  const char* preload = std::getenv("LD_PRELOAD");
  const std::string allocator = preload != nullptr ? preload : "";
  if (allocator.find("jemalloc") == std::string::npos && allocator.find("tcmalloc") == std::string::npos) {
    MESSAGE("glibc's malloc: that word is the next chunk's header, skipped (README); run under jemalloc/tcmalloc");
    return;
  }
  malloc_test::RateScope rate(1);
  malloc_test::LastMemberHeld* object = malloc_test::MakeLastMemberHeld();
  malloc_test::g_retention_last_member = &object->c;
  object = nullptr;
  const std::string dir = heapprof_test::MakeTempDir("retention_last_member");
  REQUIRE(!dir.empty());
  const std::string path = dir + "/retention.pb.gz";
  REQUIRE(heapprof::WriteRetentionProfile(path));
  heapprof_test::Profile p;
  REQUIRE(heapprof_test::ReadProfileFile(path, p));
  // glibc's header word was skipped under every allocator: "[unreachable]".
  int found = 0;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> frames = heapprof_test::FunctionNames(p, s);
    if (frames.empty() || frames.front().find("MakeLastMemberHeld") == std::string::npos) continue;
    ++found;
    CHECK(frames.back() == "[global] malloc_test::g_retention_last_member");
  }
  CHECK(found == 1);
  delete reinterpret_cast<malloc_test::LastMemberHeld*>(malloc_test::g_retention_last_member - 2);
  malloc_test::g_retention_last_member = nullptr;
  heapprof_test::RemoveDir(dir);
#endif
}
