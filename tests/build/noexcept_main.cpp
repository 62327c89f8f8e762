// The hooks and the implementation built with -fno-exceptions -fno-rtti, as
// Google-style code bases build everything: rate-1 totals are exact to the
// byte, profiles are written, std::bad_alloc is still thrown the standard way
// (through the library; with nothing to catch it, std::terminate) and nothrow
// new still returns null.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cerrno>
#include <cstdio>
#include <malloc.h>
#include <cstdlib>
#include <exception>
#include <new>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#if defined(__cpp_exceptions) || defined(__cpp_rtti)
#error "build this with -fno-exceptions -fno-rtti"
#endif

int UseApi(bool enabled);

namespace {
int g_bad = 0;
void Expect(bool ok, const char* what, unsigned long long got, unsigned long long want) {
  if (!ok) {
    std::printf("FAILED: %s: got %llu, want %llu\n", what, got, want);
    ++g_bad;
  }
}
void* volatile g_sink;
volatile std::size_t g_absurd = ~std::size_t{0} / 4;
}  // namespace

int main() {
  heapprof::SetSampleRate(1);
  // Exact totals over every form the program uses.
  const heapprof::Stats before = heapprof::GetStats();
  constexpr int kRounds = 1000;
  unsigned long long want_bytes = 0;
  for (int i = 1; i <= kRounds; ++i) {
    int* one = new int(i);
    char* array = new char[static_cast<std::size_t>(i)];
    g_sink = one;
    g_sink = array;
    // Stats count the blocks' usable sizes (heapprof::allocator: the requested ones).
    want_bytes += malloc_usable_size(one) + malloc_usable_size(array);
    delete one;
    delete[] array;
  }
  {
    std::vector<long, heapprof::allocator<long>> v;
    v.reserve(4096);
    want_bytes += 4096 * sizeof(long);
  }
  const heapprof::Stats after = heapprof::GetStats();
  Expect(after.alloc_objects - before.alloc_objects == 2 * kRounds + 1, "alloc_objects",
         after.alloc_objects - before.alloc_objects, 2 * kRounds + 1);
  Expect(after.alloc_bytes - before.alloc_bytes == want_bytes, "alloc_bytes",
         after.alloc_bytes - before.alloc_bytes, want_bytes);
  Expect(after.free_objects - before.free_objects == 2 * kRounds + 1, "free_objects",
         after.free_objects - before.free_objects, 2 * kRounds + 1);
  Expect(after.live_bytes == before.live_bytes, "live_bytes", after.live_bytes, before.live_bytes);

  // A profile, and the light API from another unit.
  std::ostringstream out;
  Expect(heapprof::WriteAllocsProfile(out), "WriteAllocsProfile", 0, 1);
  const std::string bytes = out.str();
  Expect(bytes.size() > 20 && static_cast<unsigned char>(bytes[0]) == 0x1f, "gzip profile", bytes.size(), 1);
  Expect(UseApi(true) == 0, "UseApi", 1, 0);

  // nothrow: null, no exception machinery needed.
  Expect(::operator new(g_absurd, std::nothrow) == nullptr, "nothrow new of an absurd size", 1, 0);
  // Plain new: std::bad_alloc from the library, which nothing here can catch.
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::set_terminate([] { ::_exit(42); });
    g_sink = ::operator new(g_absurd);
    ::_exit(0);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  Expect(WIFEXITED(status) && WEXITSTATUS(status) == 42, "bad_alloc reaches std::terminate",
         static_cast<unsigned long long>(status), 42 << 8);

  std::printf("rate 1: %llu allocations, %llu bytes, exact; profile %zu bytes; bad_alloc thrown; nothrow null%s\n",
              static_cast<unsigned long long>(after.alloc_objects - before.alloc_objects),
              static_cast<unsigned long long>(after.alloc_bytes - before.alloc_bytes), bytes.size(),
              g_bad ? " (FAILED)" : "");
  return g_bad;
}
