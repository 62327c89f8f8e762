/* A plain C program, not built with heapprof: the preload test runs it under
 * LD_PRELOAD=libheapprof_preload.so. It keeps 4,000 blocks of 1000 bytes
 * (malloc), 100 of 10,000 (calloc) and one realloc'd buffer of 1 MiB, frees
 * the rest, and prints what it kept. */
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

int main(void) {
  static void* kept[4100];
  int k = 0;
  for (int i = 0; i < 4000; ++i) kept[k++] = plain_c_keep_malloc(1000);
  for (int i = 0; i < 100; ++i) kept[k++] = plain_c_keep_calloc(10, 1000);
  void* buffer = NULL;
  for (size_t n = 1024; n <= (size_t)1 << 20; n *= 2) buffer = plain_c_grow(buffer, n);
  plain_c_churn(200000);
  for (int i = 0; i < k; ++i) {
    if (kept[i] == NULL) return 1;
  }
  printf("plain_c: kept %d blocks and a 1 MiB buffer\n", k);
  return buffer == NULL;
}
