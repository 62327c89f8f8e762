// bench/compile_cost.sh: a translation unit shaped like a service's request
// handler, compiled with and without heapprof (-DWITH_HEAPPROF): with it, the
// handler sets per-request labels and keeps its per-request buffer in a
// heapprof::allocator vector, as the README suggests.
#ifdef WITH_HEAPPROF
#include <heapprof.hpp>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace service {

#ifdef WITH_HEAPPROF
template <class T>
using Buffer = std::vector<T, heapprof::allocator<T>>;
#else
template <class T>
using Buffer = std::vector<T>;
#endif

struct Request {
  std::string method, path, body;
  std::map<std::string, std::string> headers;
};

struct Response {
  int status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class Cache {
 public:
  std::shared_ptr<const std::string> Get(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : it->second;
  }
  void Put(std::string key, std::string value) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_[std::move(key)] = std::make_shared<const std::string>(std::move(value));
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const std::string>> entries_;
};

std::vector<std::string> SplitPath(std::string_view path) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start < path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    if (end > start) parts.emplace_back(path.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

Response Handle(const Request& request, Cache& cache) {
#ifdef WITH_HEAPPROF
  heapprof::ScopedLabels labels({{"handler", "Handle"}, {"method", request.method}});
#endif
  Response response;
  const std::vector<std::string> parts = SplitPath(request.path);
  if (parts.empty()) {
    response.status = 404;
    return response;
  }
  if (auto hit = cache.Get(request.path)) {
    response.body = *hit;
    return response;
  }
  Buffer<std::uint32_t> counts(256);
  for (unsigned char c : request.body) ++counts[c];
  Buffer<std::pair<std::uint32_t, char>> ranked;
  for (int c = 0; c < 256; ++c)
    if (counts[static_cast<std::size_t>(c)]) ranked.emplace_back(counts[static_cast<std::size_t>(c)], static_cast<char>(c));
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [count, c] : ranked) {
    response.body += c;
    response.body += ':';
    response.body += std::to_string(count);
    response.body += '\n';
  }
  for (const auto& [name, value] : request.headers) response.headers.emplace_back(name, value);
  response.headers.emplace_back("content-length", std::to_string(response.body.size()));
  cache.Put(request.path, response.body);
  return response;
}

}  // namespace service
