// bench/write_profile: time and size of writing a profile with N distinct
// stacks (default 10,000), each ~20 frames deep.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<void*> g_keep;

// Each level calls the next from one of two call sites chosen by a bit of
// `id`, so ids 0..2^levels-1 give that many distinct stacks.
__attribute__((noinline)) void Level(unsigned id, int level);

__attribute__((noinline)) void Leaf(unsigned id) {
  g_keep.push_back(::operator new(64 + (id & 7) * 8));
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void Level(unsigned id, int level) {
  if (level == 0) {
    Leaf(id);
  } else if ((id >> (level - 1)) & 1) {
    Level(id, level - 1);
    asm volatile("" ::: "memory");
  } else {
    Level(id, level - 1);
    asm volatile("nop" ::: "memory");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned stacks = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 10000;
  int levels = 0;
  while ((1u << levels) < stacks) ++levels;
  g_keep.reserve(stacks);
  heapprof::SetSampleRate(1);
  for (unsigned id = 0; id < stacks; ++id) Level(id, levels);
  heapprof::SetSampleRate(524288);

  // The first write also reads the DWARF of the units its PCs fall in (then
  // cached); the best of the next five is the steady cost.
  double best = 1e18, first = 0;
  std::size_t bytes = 0;
  for (int rep = 0; rep < 6; ++rep) {
    std::ostringstream out;
    const auto t0 = std::chrono::steady_clock::now();
    if (!heapprof::WriteHeapProfile(out)) return 1;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rep == 0) first = ms;
    else if (ms < best) best = ms;
    bytes = out.str().size();
  }
  std::printf("stacks %u\nlevels %d\nfirst_write_ms %.1f\nwrite_ms_best_of_5 %.1f\nprofile_bytes %zu\n", stacks,
              levels + 3, first, best, bytes);

  // The host heap a write to a path takes through the hooks (operator new;
  // the profiler's own memory is its arena, Stats::profiler_bytes), and what
  // the profiler holds after it. Five writes: the first reads the DWARF.
  const char* path = std::getenv("HEAPPROF_BENCH_PATH");
  const std::string file = path != nullptr ? path : "/tmp/heapprof_bench_write_profile.pb.gz";
  for (int rep = 0; rep < 5; ++rep) {
    const heapprof::Stats before = heapprof::GetStats();
    const auto t0 = std::chrono::steady_clock::now();
    if (!heapprof::WriteHeapProfile(file)) return 1;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const heapprof::Stats after = heapprof::GetStats();
    std::printf("path_write %d: %.1f ms, host heap through the hooks: %llu allocations, %llu bytes, %lld bytes kept; "
                "profiler_bytes %llu\n",
                rep, ms, static_cast<unsigned long long>(after.alloc_objects - before.alloc_objects),
                static_cast<unsigned long long>(after.alloc_bytes - before.alloc_bytes),
                static_cast<long long>(after.live_bytes) - static_cast<long long>(before.live_bytes),
                static_cast<unsigned long long>(after.profiler_bytes));
  }
  std::remove(file.c_str());
  for (void* p : g_keep) ::operator delete(p);
  return 0;
}
