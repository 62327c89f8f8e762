// bench/symbolize: first and warm cost of symbolizing and encoding a profile
// of 10,000 stacks x 30 frames whose PCs are spread over the text of one
// loaded object, with file:line and inline frames from its DWARF.
//
//   symbolize [substring of the object's path]   default: this program
//
// e.g. with Debian's libstdc++6-12-dbg (a libstdc++ built with full DWARF):
//   LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/debug bench/symbolize libstdc++
// "first" includes reading the object's DWARF (its unit index, then each unit
// a PC falls in); "warm" is a later write in the same process, which finds
// everything in the debug-info cache.
#define HEAPPROF_IMPLEMENTATION
#include <heapprof.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace heapprof::detail;
  using Clock = std::chrono::steady_clock;
  const char* want = argc > 1 ? argv[1] : nullptr;
  std::string sink = std::to_string(argc);  // keeps libstdc++ loaded and used
  const heapprof::detail::ArenaVector<LoadedObject> objects = CollectProfileObjects();
  const LoadedObject* target = nullptr;
  for (const LoadedObject& o : objects) {
    if (want == nullptr || o.path.find(want) != std::string::npos) {
      if (target == nullptr || (want != nullptr && o.limit - o.start > target->limit - target->start)) target = &o;
      if (want == nullptr) break;
    }
  }
  if (target == nullptr) {
    std::fprintf(stderr, "no loaded object matches '%s'\n", want != nullptr ? want : "");
    return 2;
  }
  constexpr std::size_t kDistinctPcs = 5000, kStacks = 10000, kFrames = 30;
  std::vector<std::uintptr_t> pool;
  const std::uintptr_t span = target->limit - target->start;
  for (std::size_t i = 0; i < kDistinctPcs; ++i) pool.push_back(target->start + 1 + (span - 1) * i / kDistinctPcs);
  ProfileData data;
  data.period = 524288;
  std::uint64_t rng = 42;
  for (std::size_t s = 0; s < kStacks; ++s) {
    ProfileSample sample;
    sample.alloc_objects = sample.inuse_objects = 1;
    sample.alloc_bytes = sample.inuse_bytes = sample.object_size = 64;
    for (std::size_t f = 0; f < kFrames; ++f) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      const std::size_t spread = f < 10 ? kDistinctPcs : 50 + f * 5;  // shared roots, varied leaves
      sample.pcs.push_back(pool[(rng >> 33) % spread]);
    }
    data.samples.push_back(std::move(sample));
  }
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  double first = 0, warm = 1e18, warm_symtab = 0, warm_encode = 0, warm_gzip = 0;
  std::size_t bytes = 0;
  const std::size_t debug_before = g_debug_info_bytes.load();
  for (int rep = 0; rep < 6; ++rep) {
    ReentrancyGuard guard;
    const auto t0 = Clock::now();
    Symbolizer symbolizer(objects);  // as every write does: symbol tables per write, DWARF cached
    const auto t1 = Clock::now();
    const ArenaString raw = EncodeProfile(data, objects, symbolizer);
    const auto t2 = Clock::now();
    ArenaString gz;
    GzipCompress(raw, gz);
    const double t = ms(Clock::now() - t0);
    if (rep == 0) {
      first = t;
    } else if (t < warm) {
      warm = t;
      warm_symtab = ms(t1 - t0);
      warm_encode = ms(t2 - t1);
      warm_gzip = ms(Clock::now() - t2);
    }
    bytes = gz.size();
  }
  // Lines and inline frames found, for the record.
  Symbolizer symbolizer(objects);
  std::size_t with_line = 0, inlined = 0;
  const auto s0 = Clock::now();
  for (std::uintptr_t pc : pool) {
    SymbolizedFrame frames[32];
    SymbolizedQuality q;
    const int n = symbolizer.Symbolize(pc - 1, frames, 32, &q);
    with_line += q.line;
    inlined += n > 1;
  }
  const double symbolize_ms = ms(Clock::now() - s0);
  std::printf("object %s\ntext_bytes %zu\ndistinct_pcs %zu\nstacks %zu x %zu frames\n"
              "pcs_with_line %zu\npcs_with_inline_frames %zu\nfirst_write_ms %.1f\nwarm_write_ms_best_of_5 %.1f\n"
              "  of which symbol tables %.1f, symbolize+encode %.1f, gzip %.1f\nwarm_symbolize_5000_pcs_ms %.1f\n"
              "profile_bytes %zu\ndebug_info_cache_bytes %zu\n",
              target->path.c_str(), static_cast<std::size_t>(span), kDistinctPcs, kStacks, kFrames, with_line,
              inlined, first, warm, warm_symtab, warm_encode, warm_gzip, symbolize_ms, bytes, g_debug_info_bytes.load() - debug_before);
  return sink.empty() ? 1 : 0;
}
