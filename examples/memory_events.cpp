// Memory events (README "Memory events"): what was using memory at the peak,
// near the memory limit, and when an allocation failed.
//
//   ./memory_events peak          a batch load peaks in LoadBatch, then the
//                                 process settles in Serve; writes peak.pb.gz
//   ./memory_events grow MIB [MS] touches MIB MiB in 8 MiB steps, MS ms apart
//                                 (for HEAPPROF=rss_interval / dump_near_oom)
//   ./memory_events oom MIB       RLIMIT_AS = address space now + MIB MiB,
//                                 then allocates 8 MiB blocks until one fails
//                                 (for HEAPPROF=oom_dump=1)
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

std::vector<std::unique_ptr<std::string>> g_cache;

__attribute__((noinline)) std::vector<std::vector<char>> LoadBatch(std::size_t rows) {
  std::vector<std::vector<char>> batch;
  for (std::size_t i = 0; i < rows; ++i) batch.emplace_back(16384, 'x');  // 16 KiB a row
  return batch;
}

__attribute__((noinline)) void Serve(std::size_t entries) {
  for (std::size_t i = 0; i < entries; ++i) g_cache.push_back(std::make_unique<std::string>(4000, 'y'));
}

__attribute__((noinline)) std::vector<char*> Grow(std::size_t mib, unsigned ms) {
  std::vector<char*> blocks;
  for (std::size_t done = 0; done < mib; done += 8) {
    char* p = new char[8u << 20];
    std::memset(p, 1, 8u << 20);
    blocks.push_back(p);
    if (ms != 0) usleep(ms * 1000);
  }
  return blocks;
}

std::size_t AddressSpace() {
  unsigned long long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return static_cast<std::size_t>(pages) * 4096;
}

__attribute__((noinline)) std::size_t FillUntilFailure(std::vector<char*>& blocks) {
  for (;;) {
    char* p = new (std::nothrow) char[8u << 20];
    if (p == nullptr) return blocks.size();
    blocks.push_back(p);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "peak";
  const std::size_t mib = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 256;
  if (mode == "peak") {
    {
      const auto batch = LoadBatch(12000);  // ~188 MiB for a moment
      std::printf("batch of %zu rows loaded\n", batch.size());
    }
    Serve(20000);  // ~78 MiB from here on
    heapprof::WritePeakHeapProfile("peak.pb.gz");
    heapprof::WriteHeapProfile("heap.pb.gz");
    std::printf("wrote peak.pb.gz and heap.pb.gz\n");
  } else if (mode == "grow") {
    const std::vector<char*> blocks = Grow(mib, argc > 3 ? static_cast<unsigned>(std::atoi(argv[3])) : 0);
    std::printf("touched %zu MiB\n", blocks.size() * 8);
  } else if (mode == "oom") {
    rlimit rl{};
    getrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = AddressSpace() + (mib << 20);
    setrlimit(RLIMIT_AS, &rl);
    std::vector<char*> blocks;
    blocks.reserve(4096);
    std::printf("RLIMIT_AS reached after %zu blocks of 8 MiB\n", FillUntilFailure(blocks));
  }
  return 0;
}
