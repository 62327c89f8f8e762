// A program that compiles heapprof in (operator new/delete only) and that the
// malloc suite also runs under libheapprof_preload.so: one engine must record,
// counting each allocation once. Prints the Stats delta of 1000 news of 100
// bytes (every form: new[], new, nothrow, aligned) and 1000 malloc(50), all
// kept live, each kind under a label of its own, and writes the heap profile to argv[1]:
// with the API, or with argv[2] "http" as its heapprof::HttpServer serves it.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>
#include <heapprof/http.hpp>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

// GET http://127.0.0.1:port/debug/pprof/heap into `path`: the body of a 200.
static bool FetchHeap(std::uint16_t port, const char* path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return false;
  const char request[] = "GET /debug/pprof/heap HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (::write(fd, request, sizeof request - 1) != static_cast<ssize_t>(sizeof request - 1)) return false;
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) response.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const std::size_t body = response.find("\r\n\r\n");
  if (response.compare(0, 7, "HTTP/1.") != 0 || response.compare(8, 5, " 200 ") != 0 || body == std::string::npos) {
    std::printf("one_engine: the server answered: %.200s\n", response.c_str());
    return false;
  }
  FILE* f = std::fopen(path, "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(response.data() + body + 4, 1, response.size() - body - 4, f) == response.size() - body - 4;
  return std::fclose(f) == 0 && ok;
}

static void* volatile g_sink;
struct Block100 {
  char bytes[100];
};
struct alignas(64) Aligned100 {
  char bytes[100];
};
static void* g_kept[2000];

// Each form of new once in four: new[], new, nothrow new, aligned new.
__attribute__((noinline)) void OneEngineNew(int i) {
  switch (i % 4) {
    case 0: g_kept[i] = new char[100]; break;
    case 1: g_kept[i] = new Block100; break;
    case 2: g_kept[i] = new (std::nothrow) char[100]; break;
    default: g_kept[i] = new Aligned100; break;
  }
  g_sink = g_kept[i];
}
__attribute__((noinline)) void OneEngineMalloc(int i) {
  g_kept[1000 + i] = std::malloc(50);
  g_sink = g_kept[1000 + i];
}
void Release(int i) {
  switch (i % 4) {
    case 0: case 2: delete[] static_cast<char*>(g_kept[i]); break;
    case 1: delete static_cast<Block100*>(g_kept[i]); break;
    default: delete static_cast<Aligned100*>(g_kept[i]); break;
  }
}

// As a copy of heapprof built before Stats grew would: the preloaded
// engine's get_stats, its result in a 17-field Stats with a word after it.
// The slot must write those 17 fields, no more (it returned the whole
// Stats, by then 18: the word after was overwritten).
static int OldCopysStats() {
  using GetterFn = const heapprof::detail::EngineApi* (*)() noexcept;
  auto getter = reinterpret_cast<GetterFn>(dlsym(RTLD_DEFAULT, "heapprof_preload_engine_v1"));
  if (getter == nullptr || getter() == nullptr) return 2;
  struct OldStats {
    std::uint64_t fields[17];
  };
  using OldGetStats = OldStats (*)() noexcept;
  const auto get_stats = reinterpret_cast<OldGetStats>(reinterpret_cast<void (*)()>(getter()->get_stats));
  struct {
    OldStats stats;
    volatile std::uint64_t after;
  } slot;
  slot.after = 0x1122334455667788u;
  new (&slot.stats) OldStats(get_stats());  // the result written straight into its slot
  std::printf("one_engine: old copy's stats: allocs %s, the word after %s\n",
              slot.stats.fields[0] != 0 ? "counted" : "none", slot.after == 0x1122334455667788u ? "intact" : "overwritten");
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "old_stats") == 0) return OldCopysStats();
  heapprof::SetSampleRate(1);
  const heapprof::Stats s0 = heapprof::GetStats();
  {
    // Labels set through the program's copy: on the samples of either engine.
    heapprof::ScopedLabels scope{{"engine", "news"}};
    for (int i = 0; i < 1000; ++i) OneEngineNew(i);
  }
  {
    heapprof::ScopedLabels scope{{"engine", "mallocs"}};
    for (int i = 0; i < 1000; ++i) OneEngineMalloc(i);
  }
  const heapprof::Stats s1 = heapprof::GetStats();
  std::printf("one_engine: allocs %llu live_objects %llu rate %zu\n",
              static_cast<unsigned long long>(s1.alloc_objects - s0.alloc_objects),
              static_cast<unsigned long long>(s1.live_objects - s0.live_objects), heapprof::GetSampleRate());
  bool ok;
  if (argc > 2 && std::strcmp(argv[2], "http") == 0) {
    heapprof::HttpServer server("127.0.0.1:0");
    ok = server.serving() && FetchHeap(server.port(), argv[1]);
  } else {
    ok = argc > 1 && heapprof::WriteHeapProfile(argv[1]);
  }
  for (int i = 0; i < 1000; ++i) Release(i);
  for (int i = 1000; i < 2000; ++i) std::free(g_kept[i]);
  return ok ? 0 : 1;
}
