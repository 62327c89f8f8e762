// The retention profile with the malloc family replaced (6_serving/retention.hpp):
// what a write allocates through the hooks. README: none, except that
// __cxa_demangle mallocs for the names the profile shows.
#include "common.hpp"

#include <search.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/child_files.hpp"

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
}  // namespace malloc_test

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
