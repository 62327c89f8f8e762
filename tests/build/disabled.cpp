// Built with -DHEAPPROF_DISABLE, as on a platform heapprof does not support:
// the same source compiles and links, and every call is a documented no-op.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cstdio>
#include <memory>

int UseApi(bool enabled);

int main() {
  int bad = UseApi(false);
  auto p = std::make_unique<char[]>(1 << 20);
  const heapprof::Stats s = heapprof::GetStats();
  if (s.alloc_objects != 0 || s.alloc_bytes != 0) ++bad;
  if (heapprof::WriteHeapProfile("/tmp/heapprof-disabled-never-written.pb.gz")) ++bad;
  if (heapprof::WriteAllocsProfile(std::string("/tmp/heapprof-disabled-never-written.pb.gz"))) ++bad;
  heapprof::SetUnwinder(heapprof::Unwinder::kTable);
  std::printf("%d broken expectations\n", bad);
  return bad;
}
