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
#define HEAPPROF_REPLACE_NEW_DELETE
#define HEAPPROF_REPLACE_MALLOC
#include <heapprof.hpp>

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

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
}  // namespace

int main(int argc, char** argv) {
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
