// pprof_server: a small service that serves its own heap profile over HTTP,
// the way a Go service does with net/http/pprof.
//
// Four worker threads run a KV store's request loop (puts that grow the store,
// gets that render responses, scans that build temporary indexes), each
// request under {op, shard} labels. heapprof::HttpServer serves the profiles
// on the side; it stops with the process.
//
//   ./pprof_server [--listen 127.0.0.1:6060] [--seconds 5]
//   go tool pprof -http=: http://127.0.0.1:6060/debug/pprof/heap
//   go tool pprof -top -tagfocus=op=put http://127.0.0.1:6060/debug/pprof/allocs
//   go tool pprof -seconds 10 -top http://127.0.0.1:6060/debug/pprof/allocs   # the next 10 s only
//   curl -s http://127.0.0.1:6060/debug/pprof/heap?debug=1 | head
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

class KvStore {
 public:
  __attribute__((noinline)) void Put(const std::string& key, std::size_t value_bytes) {
    std::string value(value_bytes, 'v');
    std::lock_guard<std::mutex> hold(mu_);
    data_[key] = std::move(value);
    if (data_.size() > 20000) data_.erase(data_.begin());  // bounded: the heap levels off
  }
  __attribute__((noinline)) std::string Get(const std::string& key) const {
    std::lock_guard<std::mutex> hold(mu_);
    auto it = data_.find(key);
    return it == data_.end() ? std::string() : "{\"value\":\"" + it->second + "\"}";
  }
  __attribute__((noinline)) std::size_t Scan(const std::string& prefix) const {
    std::vector<std::string> keys;  // a temporary index, freed on return
    std::lock_guard<std::mutex> hold(mu_);
    for (auto it = data_.lower_bound(prefix); it != data_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
         ++it) {
      keys.push_back(it->first);
    }
    return keys.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> data_;
};

void Worker(KvStore& store, int shard, const std::atomic<bool>& stop, std::atomic<std::uint64_t>& requests) {
  std::uint64_t n = static_cast<std::uint64_t>(shard) * 7919;
  const std::string shard_name = "shard-" + std::to_string(shard);
  while (!stop.load(std::memory_order_relaxed)) {
    ++n;
    const std::string key = "k" + std::to_string(n % 50000);
    switch (n % 4) {
      case 0:
      case 1: {
        heapprof::ScopedLabels labels{{"op", "put"}, {"shard", shard_name}};
        store.Put(key, 64 + (n % 8) * 256);
        break;
      }
      case 2: {
        heapprof::ScopedLabels labels{{"op", "get"}, {"shard", shard_name}};
        volatile std::size_t size = store.Get(key).size();
        (void)size;
        break;
      }
      default: {
        heapprof::ScopedLabels labels{{"op", "scan"}, {"shard", shard_name}};
        volatile std::size_t count = store.Scan(key.substr(0, 4));
        (void)count;
        break;
      }
    }
    requests.fetch_add(1, std::memory_order_relaxed);
    if (n % 32 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a service, not a benchmark
  }
}

int Usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--listen host:port] [--seconds N]\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:6060";
  int seconds = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
      listen = argv[++i];
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atoi(argv[++i]);
      if (seconds <= 0) return Usage(argv[0]);
    } else {
      return Usage(argv[0]);
    }
  }
  heapprof::SetSampleRate(64 * 1024);  // finer than the default: a short demo

  // The std::nothrow form reports failure through serving()/error() instead
  // of throwing, so this also builds with -fno-exceptions.
  auto server = std::make_unique<heapprof::HttpServer>(listen, std::nothrow);
  if (!server->serving()) {
    std::fprintf(stderr, "pprof_server: %s\n", server->error());
    return 1;
  }
  // The bound address, with the chosen port when the listen port is 0.
  const std::string host = listen.substr(0, listen.rfind(':'));
  const std::string url = "http://" + (host.empty() ? std::string("127.0.0.1") : host) + ":" +
                          std::to_string(server->port()) + "/debug/pprof/";
  std::printf("serving %s for %d s\n", url.c_str(), seconds);
  std::printf("  go tool pprof -http=: %sheap\n", url.c_str());
  std::printf("  go tool pprof -top -tagfocus=op=put %sallocs\n", url.c_str());
  std::fflush(stdout);

  KvStore store;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> requests{0};
  std::vector<std::thread> workers;
  for (int shard = 0; shard < 4; ++shard) {
    workers.emplace_back(Worker, std::ref(store), shard, std::cref(stop), std::ref(requests));
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop.store(true);
  for (std::thread& t : workers) t.join();
  const heapprof::Stats s = heapprof::GetStats();
  std::printf("done: %llu requests, %llu MiB allocated, %llu KiB live\n",
              static_cast<unsigned long long>(requests.load()),
              static_cast<unsigned long long>(s.alloc_bytes >> 20), static_cast<unsigned long long>(s.live_bytes >> 10));
  return 0;
}
