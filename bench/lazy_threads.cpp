// bench/lazy_threads: many threads sampling new code at once, while the
// objects on their stacks still find their rules one FDE at a time.
//
//   bench_lazy_threads THREADS lazy|build [ROUNDS]
//
// A fresh process at rate 1 (every allocation sampled), THREADS threads
// released together, each running ROUNDS rounds of regex, stream, map and
// sort work: stacks through many distinct functions of this binary and of
// libstdc++. Each lookup of an object still answering one FDE at a time goes
// through dl_iterate_phdr, which holds the loader's lock: threads that meet
// new return addresses at the same moment take turns there, until the
// object has had its budget of lookups and builds its table.
//  - lazy:  the default policy (tables built after 2 lookups per 5 FDEs);
//  - build: every object builds its table at its first lookup (the policy
//           before stop 48), for comparison.
// Prints the wall time from the release to the last join, the process's
// CPU time over the same span, and the lookups and builds it made.
// Side by side: bench/lazy_threads.sh.
#define HEAPPROF_REPLACE_NEW_DELETE
#define HEAPPROF_REPLACE_MALLOC
#include <heapprof.hpp>

#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

volatile std::size_t g_sink = 0;

// kFunctions functions of this binary, each calling the next through a table
// by a few bits of a random shape, the last one allocating: every new shape
// meets return addresses it has not met yet (one call site a function), as
// a large program's samples do, until each has been looked up once.
constexpr std::size_t kFunctions = 1024;
using Fn = void (*)(int depth, std::uint64_t shape);
Fn g_functions[kFunctions];  // kTable's, copied at start-up

template <std::size_t I>
__attribute__((noinline)) void Chain(int depth, std::uint64_t shape) {
  if (depth == 0) {
    auto* p = new std::uint64_t[1 + I % 8];
    g_sink = g_sink + reinterpret_cast<std::uintptr_t>(p);
    delete[] p;
    return;
  }
  shape = shape * 6364136223846793005ull + 1442695040888963407ull;
  g_functions[(shape >> 40) % kFunctions](depth - 1, shape);
  asm volatile("" ::: "memory");  // a call, not a tail call: this frame stays
}

template <std::size_t... I>
constexpr std::array<Fn, sizeof...(I)> MakeTable(std::index_sequence<I...>) {
  return {{&Chain<I>...}};
}
constexpr std::array<Fn, kFunctions> kTable = MakeTable(std::make_index_sequence<kFunctions>{});

// Library code too: regex, streams, maps, a sort.
void LibraryRound(int t, int r) {
  std::ostringstream os;
  os << "thread-" << t << " round " << r << ' ' << std::hex << (r * 2654435761u) << ' ' << std::fixed
     << (r * 0.125);
  const std::string line = os.str();
  const std::regex words("([a-z]+)-?([0-9a-f]*)");
  std::size_t n = 0;
  for (std::sregex_iterator it(line.begin(), line.end(), words), end; it != end; ++it) n += it->length(1);
  std::map<std::string, std::vector<int>> m;
  std::unordered_map<std::string, int> u;
  for (int i = 0; i < 24; ++i) {
    const std::string key = std::to_string(i * 7919 + r);
    m[key].push_back(i);
    u.emplace(key + line.substr(0, static_cast<std::size_t>(i % 8)), i);
  }
  std::vector<std::string> keys;
  for (const auto& kv : m) keys.push_back(kv.first + "/" + std::to_string(kv.second.size()));
  std::stable_sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  g_sink = g_sink + n + keys.size() + u.size();
}

void Round(int t, int r) {
  LibraryRound(t, r);
  for (int i = 0; i < 64; ++i) {
    const std::uint64_t shape = (static_cast<std::uint64_t>(t) << 32) ^ static_cast<std::uint64_t>(r * 64 + i);
    g_functions[shape % kFunctions](16, shape * 0x9e3779b97f4a7c15ull);
  }
}

struct Cpu {
  double user_ms, sys_ms;
};
Cpu CpuNow() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return {ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3, ru.ru_stime.tv_sec * 1e3 + ru.ru_stime.tv_usec / 1e3};
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const bool build = argc > 2 && std::strcmp(argv[2], "build") == 0;
  const bool lazy = argc > 2 && std::strcmp(argv[2], "lazy") == 0;
  const bool off = argc > 2 && std::strcmp(argv[2], "off") == 0;  // sampling off: the workload's own scaling
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 20;
  if (threads < 1 || threads > 256 || (!build && !lazy && !off) || rounds < 1) {
    std::fprintf(stderr, "usage: bench_lazy_threads THREADS(1-256) lazy|build|off [ROUNDS]\n");
    return 2;
  }
  namespace ut = heapprof::detail::unwind_table;
  if (build) ut::g_lazy_min_fdes.store(~std::uint64_t{0});  // every object builds at its first lookup
  std::copy(kTable.begin(), kTable.end(), g_functions);

  pthread_barrier_t start;
  pthread_barrier_init(&start, nullptr, static_cast<unsigned>(threads) + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([t, rounds, &start] {
      pthread_barrier_wait(&start);
      for (int r = 0; r < rounds; ++r) Round(t, r);
    });
  }
  heapprof::SetSampleRate(off ? 0 : 1);  // the threads' own allocations are the first sampled
  const Cpu cpu0 = CpuNow();
  const auto t0 = std::chrono::steady_clock::now();
  pthread_barrier_wait(&start);
  for (std::thread& th : pool) th.join();
  const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const Cpu cpu1 = CpuNow();
  const double user = cpu1.user_ms - cpu0.user_ms, sys = cpu1.sys_ms - cpu0.sys_ms;
  pthread_barrier_destroy(&start);

  const heapprof::Stats s = heapprof::GetStats();
  const heapprof::detail::UnwindTableStats st = heapprof::detail::GetUnwindTableStats();
  std::printf("threads %d %s wall_ms %.2f cpu_ms %.2f (sys %.2f) allocations %llu one_fde_lookups %llu tables %llu rows %llu\n", threads,
              build ? "build" : off ? "off" : "lazy", wall, user + sys, sys, static_cast<unsigned long long>(s.alloc_objects),
              static_cast<unsigned long long>(st.lazy_lookups), static_cast<unsigned long long>(st.objects),
              static_cast<unsigned long long>(st.rows));
  return 0;
}
