// bench/kv: a small in-memory key-value store, the "realistic" workload of
// bench/field.sh. Each thread owns a std::unordered_map<std::string,
// std::string> and runs a fixed, deterministic mix of operations on it:
// 45% insert-or-assign, 35% lookup, 20% erase, keys drawn from 16,384 per
// thread. Keys are 20-27 characters and values 16-200, so both leave the
// small-string buffer and every insert allocates a node and two strings.
// The operations run `depth` frames deep, as in a real service.
//
// Built twice from this file, like churn: bench_kv_plain (no heapprof) and
// bench_kv_heapprof (HEAPPROF_BENCH_HOOKED: the global operator new/delete
// replacement; the rate comes from the HEAPPROF environment variable).
// Usage: bench_kv_{plain,heapprof} [threads] [ops per thread] [depth]
// Prints one line: kv threads=T ops=N ns_per_op=X wall_ns_per_op=W checksum=C
// where X is the threads' CPU time per op (the same at 1 and 2 threads when
// they share nothing; time spent descheduled on a busy machine is not
// counted) and W is wall time / all ops (2 threads halve it on 2 idle cores).
#if defined(HEAPPROF_BENCH_HOOKED)
#include <heapprof.hpp>  // the light API; the hooks: bench/hooks/new_delete.cpp
#endif

#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr std::uint32_t kKeysPerThread = 16384;

std::uint64_t NextRandom(std::uint64_t& s) {  // xorshift64*: deterministic per thread
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * 0x2545F4914F6CDD1DULL;
}

std::string MakeKey(std::uint32_t k) {
  // "user:00012345:session" + 0-7 letters, without snprintf's cost.
  char buf[32] = "user:00000000:sessionabcdefgh";
  const std::size_t len = 21 + k % 8;
  for (int i = 12; i >= 5; --i, k /= 10) buf[i] = static_cast<char>('0' + k % 10);
  return std::string(buf, len);
}

__attribute__((noinline)) std::uint64_t RunOps(std::uint64_t seed, long ops) {
  std::unordered_map<std::string, std::string> map;
  std::uint64_t rng = seed | 1;
  std::uint64_t checksum = 0;
  for (long i = 0; i < ops; ++i) {
    const std::uint64_t r = NextRandom(rng);
    const std::uint32_t op = static_cast<std::uint32_t>(r % 100);
    std::string key = MakeKey(static_cast<std::uint32_t>(r >> 8) % kKeysPerThread);
    if (op < 45) {
      const std::size_t len = 16 + (r >> 40) % 185;
      map.insert_or_assign(std::move(key), std::string(len, static_cast<char>('a' + (r >> 32) % 26)));
    } else if (op < 80) {
      auto it = map.find(key);
      if (it != map.end()) checksum += it->second.size();
    } else {
      checksum += map.erase(key);
    }
  }
  return checksum + map.size();
}

__attribute__((noinline)) std::uint64_t AtDepth(int depth, std::uint64_t seed, long ops) {
  if (depth <= 1) return RunOps(seed, ops);
  std::uint64_t r = AtDepth(depth - 1, seed, ops);
  asm volatile("" : "+m"(r));  // keeps this frame: no tail call
  return r;
}

double ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const long ops = argc > 2 ? std::atol(argv[2]) : 1000000;
  const int depth = argc > 3 ? std::atoi(argv[3]) : 16;
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(threads));
  std::vector<double> cpu(static_cast<std::size_t>(threads));
  // Warm-up, on a thread of its own like the measured ones: the allocator's
  // arenas and, with heapprof, the unwind tables of every object on a worker
  // thread's stack (libstdc++'s thread entry, libc's start_thread). Building
  // them is a one-time cost (a few ms, see bench/RESULTS.md) that would
  // otherwise land in the first measured samples.
  std::thread([depth, ops] { AtDepth(depth, 12345, ops / 10); }).join();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&sums, &cpu, t, depth, ops] {
      const double c0 = ThreadCpuNs();
      sums[static_cast<std::size_t>(t)] = AtDepth(depth, 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(t + 1), ops);
      cpu[static_cast<std::size_t>(t)] = ThreadCpuNs() - c0;
    });
  }
  for (auto& th : pool) th.join();
  const auto t1 = std::chrono::steady_clock::now();
  std::uint64_t checksum = 0;
  for (auto s : sums) checksum += s;
  double cpu_ns = 0;
  for (auto c : cpu) cpu_ns += c;
  const double wall_ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
  const double all = static_cast<double>(ops * threads);
  std::printf("kv threads=%d ops=%ld ns_per_op=%.3f wall_ns_per_op=%.3f checksum=%llu\n", threads,
              ops * threads, cpu_ns / all, wall_ns / all, static_cast<unsigned long long>(checksum));
  return 0;
}
