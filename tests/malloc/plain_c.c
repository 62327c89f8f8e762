/* A plain C program, not built with heapprof: the preload test runs it under
 * LD_PRELOAD=libheapprof_preload.so. It keeps 4,000 blocks of 1000 bytes
 * (malloc), 100 of 10,000 (calloc) and one realloc'd buffer of 1 MiB, frees
 * the rest, and prints what it kept. On the way it grows and frees arrays
 * with reallocarray, pvalloc and free_sized, which jemalloc (all three) and
 * tcmalloc (the first and last) do not define: listed before the library in
 * LD_PRELOAD, they still call its.
 * `plain_c plugin PATH`: instead loads a library that compiled heapprof in
 * (programs/labels_plugin.cpp), runs it, closes it and allocates on.
 * `plain_c mmap_threshold`: instead says whether glibc served a 256 KiB
 * malloc with mmap, as it does at its default threshold of 128 KiB (a start-up
 * that freed a larger mmapped block would have raised it for good).
 * `plain_c heap_at_start`: instead prints the size of glibc's heap when main
 * starts (mallinfo2's arena).
 * `plain_c pthread_exit`: instead starts a thread that allocates and ends
 * main with pthread_exit (the process ends when that thread has, exit(0)).
 * `plain_c pthread_exit_atexit`: the same, with an exit handler that drops a
 * block of 123,457 bytes (plain_c_exit_handler).
 * `plain_c dead_stderr`: instead makes stderr a pipe whose reader has gone,
 * keeps a few blocks and exits 0 (heapprof's exit lines raised SIGPIPE). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void* volatile g_sink;

__attribute__((noinline)) void* plain_c_keep_malloc(size_t n) {
  void* p = malloc(n);
  g_sink = p;
  return p;
}

__attribute__((noinline)) void* plain_c_keep_calloc(size_t c, size_t n) {
  void* p = calloc(c, n);
  g_sink = p;
  return p;
}

__attribute__((noinline)) void* plain_c_grow(void* p, size_t n) {
  void* q = realloc(p, n);
  g_sink = q;
  return q;
}

__attribute__((noinline)) void plain_c_churn(int rounds) {
  for (int i = 0; i < rounds; ++i) {
    char* s = strdup("temporary string");
    g_sink = s;
    free(s);
    void* p = malloc((size_t)(i % 4096) + 1);
    g_sink = p;
    free(p);
  }
}

/* C23; glibc defines it from 2.40 only: weak, so that the program links. */
extern void free_sized(void* p, size_t n) __attribute__((weak));

__attribute__((noinline)) int plain_c_arrays(int rounds) {
  for (int i = 0; i < rounds; ++i) {
    int* a = NULL;
    for (size_t n = 1; n <= 4096; n *= 4) {
      int* b = reallocarray(a, n, sizeof(int));
      if (b == NULL) return 0;
      b[n - 1] = i;
      a = b;
    }
    g_sink = a;
    free(a);
    char* page = pvalloc(100);
    if (page == NULL) return 0;
    page[0] = 1;
    g_sink = page;
    free(page);
    char* s = malloc(64);
    if (s == NULL) return 0;
    g_sink = s;
    if (free_sized != NULL) free_sized(s, 64);
    else free(s);
  }
  return 1;
}

/* The plugin's copy of heapprof hands the preload library its label
 * functions when it starts; the library calls them at every sample after.
 * So the plugin must stay loaded through dlclose (that copy pins it), or
 * this process's next sample calls into unmapped code. */
static int run_plugin(const char* path) {
  void* plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (plugin == NULL) {
    printf("plain_c: dlopen: %s\n", dlerror());
    return 3;
  }
  int (*run)(void) = (int (*)(void))dlsym(plugin, "labels_plugin_run");
  if (run == NULL) return 4;
  printf("plain_c: the plugin kept %d blocks\n", run());
  dlclose(plugin);
  void* again = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  printf("plain_c: the plugin is %s after dlclose\n", again != NULL ? "loaded" : "unloaded");
  fflush(stdout);
  for (int i = 0; i < 1000; ++i) g_sink = plain_c_keep_malloc(100);
  printf("plain_c: allocated after dlclose\n");
  return 0;
}

/* glibc's chunk header: the word before the block, bit 1 set for an mmapped
 * chunk. The block stays allocated: freeing it would raise the threshold. */
static int plain_c_mmapped(size_t n) {
  void* p = plain_c_keep_malloc(n);
  return p != NULL && (((const size_t*)p)[-1] & 2) != 0;
}

static void* plain_c_worker(void* arg) {
  (void)arg;
  for (int i = 0; i < 100; ++i) free(plain_c_keep_malloc(1000));
  printf("plain_c: worker done\n");
  fflush(stdout);
  return NULL;
}

__attribute__((noinline)) static void plain_c_exit_handler(void) {
  g_sink = plain_c_keep_malloc(123457);
  g_sink = NULL; /* unreachable: a leak */
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "plugin") == 0) return run_plugin(argv[2]);
  if (argc == 2 && strcmp(argv[1], "mmap_threshold") == 0) {
    printf("plain_c: a 256 KiB block mmapped %d\n", plain_c_mmapped((size_t)256 << 10));
    return 0;
  }
  if (argc == 2 && strcmp(argv[1], "heap_at_start") == 0) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)
    printf("plain_c: heap %zu\n", mallinfo2().arena);
#else
    printf("plain_c: heap unknown\n");
#endif
    return 0;
  }
  if (argc == 2 && (strcmp(argv[1], "pthread_exit") == 0 || strcmp(argv[1], "pthread_exit_atexit") == 0)) {
    pthread_t worker;
    if (strcmp(argv[1], "pthread_exit_atexit") == 0) atexit(plain_c_exit_handler);
    if (pthread_create(&worker, NULL, plain_c_worker, NULL) != 0) return 3;
    pthread_exit(NULL);
  }
  if (argc == 2 && strcmp(argv[1], "dead_stderr") == 0) {
    int fds[2];
    signal(SIGPIPE, SIG_DFL); /* as a shell starts a program */
    if (pipe(fds) != 0 || close(fds[0]) != 0 || dup2(fds[1], 2) != 2) return 3;
    close(fds[1]);
    for (int i = 0; i < 100; ++i) plain_c_keep_malloc(1000);
    printf("plain_c: stderr is a pipe nobody reads\n");
    return 0;
  }
  static void* kept[4100];
  int k = 0;
  for (int i = 0; i < 4000; ++i) kept[k++] = plain_c_keep_malloc(1000);
  for (int i = 0; i < 100; ++i) kept[k++] = plain_c_keep_calloc(10, 1000);
  void* buffer = NULL;
  for (size_t n = 1024; n <= (size_t)1 << 20; n *= 2) buffer = plain_c_grow(buffer, n);
  plain_c_churn(200000);
  if (!plain_c_arrays(100)) return 2;
  for (int i = 0; i < k; ++i) {
    if (kept[i] == NULL) return 1;
  }
  printf("plain_c: kept %d blocks and a 1 MiB buffer\n", k);
  return buffer == NULL;
}
