// The retention profile with the malloc family replaced (6_serving/retention.hpp):
// what a write allocates through the hooks. README: none, except that
// __cxa_demangle mallocs for the names the profile shows.
#include "common.hpp"

#include <string>
#include <vector>

#include "support/child_files.hpp"

namespace malloc_test {
// A root with a mangled name: the profile names it "[global] malloc_test::g_retention_root".
std::vector<char*> g_retention_root;
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
