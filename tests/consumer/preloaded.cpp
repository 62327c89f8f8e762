// Built by tests/consumer/CMakeLists.txt (with -DHEAPPROF_CONSUMER_PRELOAD=ON)
// against an installed heapprof's imported target heapprof::preload: a program
// that knows nothing of heapprof and runs itself again under
// LD_PRELOAD=$<TARGET_FILE:heapprof::preload>, which proves the target names
// the installed library and that the library loads and owns malloc there.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#ifndef HEAPPROF_CONSUMER_PRELOAD_PATH
#error "HEAPPROF_CONSUMER_PRELOAD_PATH: the path of heapprof::preload"
#endif

int main(int argc, char** argv) {
  (void)argc;
  if (std::getenv("HEAPPROF_CONSUMER_PRELOADED") == nullptr) {
    // First run: again, preloaded.
    setenv("LD_PRELOAD", HEAPPROF_CONSUMER_PRELOAD_PATH, 1);
    setenv("HEAPPROF_CONSUMER_PRELOADED", "1", 1);
    execv("/proc/self/exe", argv);
    std::perror("heapprof consumer: execv /proc/self/exe");
    return 1;
  }
  void* engine = dlsym(RTLD_DEFAULT, "heapprof_preload_engine_v1");
  void* malloc_fn = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info{};
  if (engine == nullptr || malloc_fn == nullptr || dladdr(malloc_fn, &info) == 0 ||
      info.dli_fname == nullptr) {
    std::printf("heapprof consumer: %s is not loaded (LD_PRELOAD=%s)\n", HEAPPROF_CONSUMER_PRELOAD_PATH,
                std::getenv("LD_PRELOAD"));
    return 1;
  }
  const std::string owner = info.dli_fname;
  if (owner.find("libheapprof_preload") == std::string::npos) {
    std::printf("heapprof consumer: malloc is %s's, not the preload library's\n", owner.c_str());
    return 1;
  }
  void* block = std::malloc(1 << 20);
  std::memset(block, 1, 1 << 20);
  std::free(block);
  std::printf("heapprof consumer: %s preloaded, malloc is its own\n", HEAPPROF_CONSUMER_PRELOAD_PATH);
  return 0;
}
