// A non-PIE program with heapprof compiled in (the malloc family replaced)
// whose threads allocate first inside glibc's pthread_getattr_np on
// themselves. Here &pthread_getattr_np is the executable's PLT stub, not
// glibc's function: registration was not deferred, asked pthread_getattr_np
// for the stack while that same call held the thread's lock, and hung
// (engine.hpp: g_getattr_np). Prints "getattr_nopie: done".
// `getattr_nopie mmap_threshold PROFILE`: instead (a program whose own code
// frees no large block) says whether glibc served a 256 KiB malloc with mmap,
// as at its default threshold of 128 KiB (freeing a larger mmapped block
// raises it for good), after heapprof's start-up and after writing a profile.
// `getattr_nopie arenas`: instead counts glibc's arenas before and after a
// heap profile (with C++ names to demangle) is served by a heapprof::HttpServer,
// whose threads made one of their own (malloc.hpp: OwnAlloc).
#define HEAPPROF_REPLACE_NEW_DELETE
#define HEAPPROF_REPLACE_MALLOC
#include <heapprof.hpp>
#include <heapprof/http.hpp>

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {
void* Worker(void* out) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return nullptr;
  void* addr = nullptr;
  std::size_t size = 0;
  pthread_attr_getstack(&attr, &addr, &size);
  pthread_attr_destroy(&attr);
  std::free(std::malloc(1000));
  *static_cast<std::size_t*>(out) = size;
  return nullptr;
}

// glibc's chunk header: the word before the block, bit 1 set for an mmapped
// chunk. The block stays allocated: freeing it would raise the threshold.
void* volatile g_kept;
bool Mmapped(std::size_t n) {
  g_kept = std::malloc(n);
  void* p = g_kept;  // (through the volatile: GCC knows nothing of the header)
  return p != nullptr && (static_cast<const std::size_t*>(p)[-1] & 2) != 0;
}
// glibc's arenas: the <heap nr=...> elements of malloc_info.
int GlibcArenas() {
  char* text = nullptr;
  std::size_t length = 0;
  FILE* f = open_memstream(&text, &length);
  if (f == nullptr) return -1;
  malloc_info(0, f);
  std::fclose(f);
  int n = 0;
  for (const char* p = text; (p = std::strstr(p, "<heap nr=")) != nullptr; ++p) ++n;
  std::free(text);
  return n;
}

// GET /debug/pprof/heap from 127.0.0.1:port: whether a 200 came back.
bool FetchHeap(std::uint16_t port) {
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
  return response.compare(0, 12, "HTTP/1.0 200") == 0 || response.compare(0, 12, "HTTP/1.1 200") == 0;
}

std::vector<std::string>* volatile g_strings;
__attribute__((__noinline__)) void KeepStrings() {
  g_strings = new std::vector<std::string>(100, std::string(200, 'x'));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "arenas") == 0) {
    heapprof::SetSampleRate(1);  // every allocation: std:: frames, whose names are demangled
    KeepStrings();
    const int before = GlibcArenas();
    heapprof::HttpServer server("127.0.0.1:0", std::nothrow);
    const bool served = server.serving() && FetchHeap(server.port());
    std::printf("getattr_nopie: glibc arenas %d, after a profile served over HTTP (%d) %d\n", before, served ? 1 : 0,
                GlibcArenas());
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "mmap_threshold") == 0) {
    const bool at_start = Mmapped(std::size_t{256} << 10);
    const bool written = heapprof::WriteHeapProfile(argv[2]);
    std::printf("getattr_nopie: a 256 KiB block mmapped %d, after writing a profile (%d) %d\n", at_start ? 1 : 0,
                written ? 1 : 0, Mmapped(std::size_t{256} << 10) ? 1 : 0);
    return 0;
  }
  for (int i = 0; i < 4; ++i) {
    std::size_t size = 0;
    pthread_t t;
    if (pthread_create(&t, nullptr, &Worker, &size) != 0) return 3;
    pthread_join(t, nullptr);
    if (size == 0) return 4;
  }
  std::printf("getattr_nopie: done\n");
  return 0;
}
