// The costs of the memory events (README "Memory events"):
//  - a peak snapshot (the walk of the bucket list into the arena buffer), per
//    bucket, at 1,000 / 16,000 / 64,000 buckets, and its buffer's memory;
//  - what the peak check adds to one sample (the weight and the atomic add);
//  - how many snapshots a heap growing to 1 GiB takes at the default rate;
//  - reading the memory limit and the usage (dump_near_oom, rss_interval).
//
//   build/bench/bench_peak
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

namespace hd = heapprof::detail;

namespace {

double NowNs() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::vector<void*> g_keep;

// One bucket per distinct size, all from this call site.
__attribute__((noinline)) void MakeBuckets(std::size_t from, std::size_t to) {
  for (std::size_t n = from; n < to; ++n) g_keep.push_back(::operator new(n));
}

}  // namespace

int main() {
  heapprof::SetSampleRate(1);
  g_keep.reserve(70000);
  std::size_t made = 16;
  for (std::size_t buckets : {1000, 16000, 64000}) {
    MakeBuckets(made, 16 + buckets);
    made = 16 + buckets;
    const int reps = buckets > 10000 ? 50 : 500;
    double best = 1e300;
    for (int r = 0; r < reps; ++r) {
      const double t0 = NowNs();
      hd::g_peak.Reset();  // takes one snapshot, the same walk as the sampled path's
      const double t = NowNs() - t0;
      if (t < best) best = t;
    }
    std::printf("snapshot of %zu buckets (%zu in the table): best %.1f us, %.1f ns/bucket; buffer %zu KiB\n",
                buckets, hd::g_buckets.BucketCount(), best / 1000, best / static_cast<double>(hd::g_buckets.BucketCount()),
                hd::g_peak.BufferBytes() / 1024);
  }
  for (void* p : g_keep) ::operator delete(p);
  g_keep.clear();

  // The peak check's share of a sample: SampleWeight (expm1) + two atomics.
  {
    hd::Bucket b{};
    b.size = 4000;
    b.rate = 524288;
    const int n = 10000000;
    std::atomic<std::uint64_t> inuse{0}, max{0};
    const double t0 = NowNs();
    for (int i = 0; i < n; ++i) {  // what OnSampledAlloc does below its mark
      asm volatile("" : : "r"(&b) : "memory");
      const std::uint64_t w = hd::SampleWeight(&b);
      const std::uint64_t now = inuse.fetch_add(w, std::memory_order_relaxed) + w;
      std::uint64_t m = max.load(std::memory_order_relaxed);
      while (now > m && !max.compare_exchange_weak(m, now, std::memory_order_relaxed)) {
      }
    }
    const double t = NowNs() - t0;
    std::printf("in-use estimate update (weight + atomic add), per sample: %.1f ns\n", t / n);
  }

  // A heap growing to 1 GiB in 64 KiB blocks at the default rate.
  heapprof::SetSampleRate(524288);
  heapprof::ResetPeak();
  hd::PeakInfo info;
  std::vector<char*> blocks;
  for (int i = 0; i < 16384; ++i) blocks.push_back(new char[65536]);
  std::vector<hd::BucketCounts> counts(hd::g_peak.Count() + 16);
  hd::g_peak.Copy(counts.data(), counts.size(), info);
  std::printf("heap grown by 1 GiB in 64 KiB blocks at 512 KiB: %llu snapshots; peak %.1f MiB\n",
              static_cast<unsigned long long>(info.snapshots), static_cast<double>(info.bytes) / (1 << 20));
  for (char* p : blocks) delete[] p;

  // dump_near_oom / rss_interval reads.
  {
    const int n = 2000;
    double t0 = NowNs();
    hd::MemoryLimit m;
    for (int i = 0; i < n; ++i) m = hd::FindMemoryLimit();
    const double find = (NowNs() - t0) / n;
    t0 = NowNs();
    std::uint64_t sink = 0;
    for (int i = 0; i < n; ++i) sink += m.Usage();
    const double usage = (NowNs() - t0) / n;
    t0 = NowNs();
    for (int i = 0; i < n; ++i) sink += hd::ResidentBytes();
    const double rss = (NowNs() - t0) / n;
    std::printf("memory limit: %s, %.1f MiB; finding it %.1f us, reading the usage (%s) %.1f us, RSS %.1f us (%llu)\n",
                m.Name(), static_cast<double>(m.limit) / (1 << 20), find / 1000, m.UsageName(), usage / 1000, rss / 1000,
                static_cast<unsigned long long>(sink % 10));
  }
  return 0;
}
