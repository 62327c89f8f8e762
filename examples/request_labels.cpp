// request_labels: per-request attribution with scoped labels.
//
// A small request loop: each request runs under {endpoint, tenant} labels,
// allocates a response buffer and some cache entries, and hands work to a
// worker thread that carries the request's labels. Objects stay attributed
// to the request that allocated them for as long as they live.
//
//   ./request_labels labels.pb.gz
//   go tool pprof -tags labels.pb.gz                                  # heap per label value
//   go tool pprof -top -tagfocus=endpoint=/search labels.pb.gz         # one endpoint's heap
//   go tool pprof -top -tagfocus=tenant=acme -tagignore=endpoint=/health labels.pb.gz
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

std::map<std::string, std::vector<char>> g_cache;  // lives past the requests

__attribute__((noinline)) std::string RenderResponse(std::size_t bytes) { return std::string(bytes, 'x'); }

__attribute__((noinline)) void CacheResult(const std::string& key, std::size_t bytes) {
  g_cache[key].resize(bytes);
}

// Runs on a worker thread, under the request's labels.
__attribute__((noinline)) std::unique_ptr<std::vector<int>> Index(std::size_t n) {
  return std::make_unique<std::vector<int>>(n, 7);
}

void HandleRequest(int id, const char* endpoint, const char* tenant) {
  heapprof::ScopedLabels labels{{"endpoint", endpoint}, {"tenant", tenant}};
  const std::string response = RenderResponse(endpoint[1] == 's' ? 200000 : 20000);
  if (id % 10 == 0) CacheResult(std::string(endpoint) + "/" + std::to_string(id), 64 * 1024);
  // Hand part of the work to another thread: it carries the request's labels.
  const heapprof::LabelSet request = heapprof::CurrentLabels();
  std::unique_ptr<std::vector<int>> index;
  std::thread worker([&] {
    heapprof::ScopedLabels carried(request);
    index = Index(50000);
  });
  worker.join();
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "labels.pb.gz";
  heapprof::SetSampleRate(64 * 1024);  // finer than the default: a short demo
  static const char* kEndpoints[] = {"/search", "/users", "/health"};
  static const char* kTenants[] = {"acme", "globex"};
  for (int id = 0; id < 600; ++id) HandleRequest(id, kEndpoints[id % 3], kTenants[id % 2]);

  std::ofstream out(path, std::ios::binary);
  if (!heapprof::WriteAllocsProfile(out)) {
    std::fprintf(stderr, "request_labels: could not write %s\n", path);
    return 1;
  }
  std::printf("wrote %s (%zu cache entries live); try:\n  go tool pprof -tags %s\n"
              "  go tool pprof -top -tagfocus=endpoint=/search %s\n",
              path, g_cache.size(), path, path);
  return 0;
}
