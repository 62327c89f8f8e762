// A non-PIE program with heapprof compiled in (the malloc family replaced)
// whose threads allocate first inside glibc's pthread_getattr_np on
// themselves. Here &pthread_getattr_np is the executable's PLT stub, not
// glibc's function: registration was not deferred, asked pthread_getattr_np
// for the stack while that same call held the thread's lock, and hung
// (engine.hpp: g_getattr_np). Prints "getattr_nopie: done".
#define HEAPPROF_REPLACE_NEW_DELETE
#define HEAPPROF_REPLACE_MALLOC
#include <heapprof.hpp>

#include <pthread.h>

#include <cstdio>
#include <cstdlib>

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
}  // namespace

int main() {
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
