// A real library we did not write: LevelDB's LRU cache (Debian's
// libleveldb-dev) mallocs one handle per Insert (LRUCache::Insert:
// malloc(sizeof(LRUHandle) - 1 + key.size())). Through the malloc hooks those
// blocks appear in the profile with their stacks, and go when the cache does.
#include "common.hpp"

#include <malloc.h>
#include <string>

#if HEAPPROF_MALLOC_HOOKS && defined(HEAPPROF_TEST_HAVE_LEVELDB)

#include <leveldb/cache.h>
#include <leveldb/slice.h>

namespace {

using malloc_test::Delta;
using malloc_test::RateScope;

void DeleteValue(const leveldb::Slice&, void* value) { delete static_cast<int*>(value); }

__attribute__((noinline)) void LevelDbInsertAll(leveldb::Cache* cache, int n) {
  for (int i = 0; i < n; ++i) {
    const std::string key = "key-" + std::to_string(i) + std::string(90, 'k');
    cache->Release(cache->Insert(key, new int(i), 1, &DeleteValue));
  }
  asm volatile("" ::: "memory");
}

// In-use objects and bytes of samples with `frame` in their stack whose leaf
// is not `frame` itself (the allocation happened inside LevelDB).
void InsideLevelDb(const heapprof_test::Profile& p, const std::string& frame, std::int64_t& objects,
                   std::int64_t& bytes, std::string& a_leaf) {
  const int io = heapprof_test::SampleTypeIndex(p, "inuse_objects");
  const int is = heapprof_test::SampleTypeIndex(p, "inuse_space");
  objects = bytes = 0;
  for (const heapprof_test::Sample& s : p.samples) {
    const std::vector<std::string> names = heapprof_test::FunctionNames(p, s);
    if (names.empty() || names[0].find(frame) != std::string::npos) continue;
    bool under = false;
    for (const std::string& n : names) under = under || n.find(frame) != std::string::npos;
    if (!under || s.values.at(static_cast<std::size_t>(io)) == 0) continue;
    // The int values are new'd by this file, with the std::string's buffer
    // freed at once: what is left inside LevelDB is its own.
    if (names[0].find("operator new") != std::string::npos) continue;
    objects += s.values.at(static_cast<std::size_t>(io));
    bytes += s.values.at(static_cast<std::size_t>(is));
    a_leaf = names[0];
  }
}

}  // namespace

TEST_CASE("leveldb: LRUCache::Insert's mallocs appear with their stacks, and leave with the cache") {
  RateScope rate(1);
  {
    // Warm-up: the first profile with LevelDB frames loads its symbols, which
    // the symbolizer keeps (on the host's heap, for now): not part of the count.
    leveldb::Cache* warm = leveldb::NewLRUCache(1 << 20);
    LevelDbInsertAll(warm, 10);
    heapprof_test::Profile p;
    REQUIRE(heapprof_test::CaptureProfile(p));
    delete warm;
    REQUIRE(heapprof_test::CaptureProfile(p));
  }
  // Stats over the cache's life, the profile writes left out (the symbolizer
  // keeps the names it looks up: see README, Limits).
  Delta built;
  leveldb::Cache* cache = leveldb::NewLRUCache(1 << 30);
  LevelDbInsertAll(cache, 2000);
  built.Stop();
  CHECK(built.live_objects() >= 2000);
  {
    heapprof_test::Profile p;
    std::string why;
    REQUIRE_MESSAGE(heapprof_test::CaptureProfile(p, false, nullptr, &why), why);
    std::int64_t objects = 0, bytes = 0;
    std::string leaf;
    InsideLevelDb(p, "LevelDbInsertAll", objects, bytes, leaf);
    INFO("inside LevelDB: " << objects << " objects, " << bytes << " bytes; a leaf: " << leaf);
    CHECK(objects >= 2000);           // one handle per entry
    CHECK(bytes >= 2000 * (94 + 40));  // the key is copied into the handle
  }
  Delta torn_down;
  delete cache;
  torn_down.Stop();
  CHECK(built.live_objects() + torn_down.live_objects() == 0);
  CHECK(built.live_bytes() + torn_down.live_bytes() == 0);
  {
    heapprof_test::Profile p;
    REQUIRE(heapprof_test::CaptureProfile(p));
    std::int64_t objects = 0, bytes = 0;
    std::string leaf;
    InsideLevelDb(p, "LevelDbInsertAll", objects, bytes, leaf);
    CHECK(objects == 0);
  }
}

#endif
