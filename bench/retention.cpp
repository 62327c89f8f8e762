// The retention scan's cost (README "Who keeps it alive"): a 1 GiB heap of
// 1 KiB objects, each pointing at the next, held by one global pointer to the
// first: at rate 1 a walk a million objects deep; at the default rate nearly
// every link is unsampled, so the sampled objects are found by the
// unsampled-heap pass over the whole heap (the worst case). Prints the scan's
// time, the bytes it read, the profiler memory it took, and the whole
// WriteRetentionProfile.
//
//   build/bench/bench_retention            (default rate, 512 KiB)
//   build/bench/bench_retention 1          (rate 1: every object)
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace hd = heapprof::detail;

namespace {

constexpr std::size_t kObjectBytes = 1024;
constexpr std::size_t kObjects = (std::size_t{1} << 30) / kObjectBytes;

struct Node {
  Node* next;
  char payload[kObjectBytes - sizeof(Node*)];
};

Node* g_head;  // the first node; each node points at the next

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t rate = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 512 * 1024;
  heapprof::SetSampleRate(rate);
  Node* prev = nullptr;
  for (std::size_t i = 0; i < kObjects; ++i) {
    Node* n = new Node;
    n->next = nullptr;
    n->payload[0] = static_cast<char>(i);
    if (prev != nullptr) prev->next = n;
    if (g_head == nullptr) g_head = n;
    prev = n;
  }
  const heapprof::Stats before = heapprof::GetStats();
  std::printf("heap: %zu objects of %zu B (%.2f GiB), rate %zu: %llu sampled live objects; profiler %.1f MiB\n",
              kObjects, kObjectBytes, static_cast<double>(kObjects * kObjectBytes) / (1 << 30), rate,
              static_cast<unsigned long long>(before.sampled_live_objects),
              static_cast<double>(before.profiler_bytes) / (1 << 20));
  for (int run = 0; run < 3; ++run) {
    hd::ScanResultForBench r = hd::RetentionScanForBench();
    std::printf("scan %d: %.3f s, %.1f MiB read, %.1f MiB of profiler memory mapped for it (%zu objects)\n", run,
                static_cast<double>(r.nanos) / 1e9, static_cast<double>(r.bytes_scanned) / (1 << 20),
                static_cast<double>(r.memory_bytes) / (1 << 20), r.objects);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::ostringstream os;
  const bool ok = heapprof::WriteRetentionProfile(os);
  const auto t1 = std::chrono::steady_clock::now();
  const heapprof::Stats after = heapprof::GetStats();
  std::printf("WriteRetentionProfile: %s, %.3f s, %zu bytes; profiler memory now %.1f MiB\n", ok ? "ok" : "FAILED",
              Seconds(t0, t1), os.str().size(), static_cast<double>(after.profiler_bytes) / (1 << 20));
  return ok ? 0 : 1;
}
