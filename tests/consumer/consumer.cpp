// Built by .ci/run against an installed heapprof, once through
// find_package(heapprof) and once through `pkg-config --cflags --libs heapprof`:
// proves the installed headers are complete and the global operator new
// replacement links in an ordinary program.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cstdio>
#include <memory>

int main() {
  auto block = std::make_unique<char[]>(1 << 20);
  block[0] = 1;
  const auto rate = heapprof::GetSampleRate();
  std::printf("heapprof consumer: sample rate %lld\n", static_cast<long long>(rate));
  return block[0] == 1 ? 0 : 1;
}
