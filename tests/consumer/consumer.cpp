// Built by .ci/run against an installed heapprof, once through
// find_package(heapprof) and once through `pkg-config --cflags --libs heapprof`:
// proves the installed headers are complete and the global operator new
// replacement links in an ordinary program.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cstdio>
#include <cstring>
#include <memory>

#define HEAPPROF_CONSUMER_STR2(x) #x
#define HEAPPROF_CONSUMER_STR(x) HEAPPROF_CONSUMER_STR2(x)

int main() {
  auto block = std::make_unique<char[]>(1 << 20);
  block[0] = 1;
  const auto rate = heapprof::GetSampleRate();
  std::printf("heapprof consumer: sample rate %lld\n", static_cast<long long>(rate));
#if defined(HEAPPROF_CONSUMER_PACKAGE_VERSION)
  // The version find_package or pkg-config --modversion gave: the headers' own.
  const char* headers = HEAPPROF_CONSUMER_STR(HEAPPROF_VERSION_MAJOR) "." HEAPPROF_CONSUMER_STR(
      HEAPPROF_VERSION_MINOR) "." HEAPPROF_CONSUMER_STR(HEAPPROF_VERSION_PATCH);
  if (std::strcmp(HEAPPROF_CONSUMER_PACKAGE_VERSION, headers) != 0) {
    std::printf("heapprof consumer: the package says version %s, its headers %s\n",
                HEAPPROF_CONSUMER_PACKAGE_VERSION, headers);
    return 1;
  }
  std::printf("heapprof consumer: package and headers are version %s\n", headers);
#endif
  return block[0] == 1 ? 0 : 1;
}
