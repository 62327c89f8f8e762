// hello_heap: a program that profiles itself.
//
// It builds an in-memory index (a map of strings to vectors), keeps a cache,
// churns through temporary buffers, then writes heap.pb.gz and prints what
// heapprof counted. Read the profile with:
//   go tool pprof -top hello_heap heap.pb.gz
//   go tool pprof -http=: hello_heap heap.pb.gz
#define HEAPPROF_REPLACE_NEW_DELETE  // exactly one .cpp of a program does this
#include <heapprof.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Document {
  std::string title;
  std::vector<std::uint32_t> postings;
};

// Keeps ~50 MiB live: what `-sample_index=inuse_space` shows.
__attribute__((noinline)) std::map<std::string, Document> BuildIndex() {
  std::map<std::string, Document> index;
  for (int i = 0; i < 20000; ++i) {
    Document doc;
    doc.title = "document number " + std::to_string(i) + " with a title long enough for the heap";
    doc.postings.resize(500, static_cast<std::uint32_t>(i));
    index.emplace("key" + std::to_string(i), std::move(doc));
  }
  return index;
}

char* volatile g_last_buffer;  // keeps the compiler from eliding the buffers

// Allocates ~1 GiB in short-lived buffers: what `-sample_index=alloc_space` shows.
__attribute__((noinline)) std::size_t ChurnBuffers() {
  std::size_t checksum = 0;
  for (int i = 0; i < 16384; ++i) {
    auto buffer = std::make_unique<char[]>(65536);
    g_last_buffer = buffer.get();
    buffer[i % 65536] = static_cast<char>(i);
    checksum += static_cast<unsigned char>(buffer[i % 65536]);
  }
  return checksum;
}

// A leak: 8 MiB that nobody frees.
__attribute__((noinline)) void LeakSomething() {
  for (int i = 0; i < 128; ++i) {
    auto* leaked = new std::vector<char>(65536);
    (void)leaked;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "heap.pb.gz";
  const auto index = BuildIndex();
  const std::size_t checksum = ChurnBuffers();
  LeakSomething();

  std::ofstream out(path, std::ios::binary);
  if (!heapprof::WriteHeapProfile(out)) {
    std::fprintf(stderr, "hello_heap: could not write %s\n", path);
    return 1;
  }
  out.close();

  const heapprof::Stats s = heapprof::GetStats();
  std::printf("hello_heap: %zu documents indexed (checksum %zu)\n", index.size(), checksum);
  std::printf("allocations: %llu (%.1f MiB), frees: %llu, live: %llu objects, %.1f MiB\n",
              static_cast<unsigned long long>(s.alloc_objects), s.alloc_bytes / 1048576.0,
              static_cast<unsigned long long>(s.free_objects), static_cast<unsigned long long>(s.live_objects),
              s.live_bytes / 1048576.0);
  std::printf("sample rate %zu bytes: %llu live objects sampled; profiler memory %.1f KiB\n",
              heapprof::GetSampleRate(), static_cast<unsigned long long>(s.sampled_live_objects),
              s.profiler_bytes / 1024.0);
  std::printf("wrote %s; read it with: go tool pprof -top %s %s\n", path, argv[0], path);
  return 0;
}
