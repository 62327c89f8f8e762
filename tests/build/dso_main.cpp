// The program of check.sh's `dsos`: its implementation unit and two shared
// libraries (dso_lib.cpp) that include <heapprof.hpp>, all built with
// -fvisibility=hidden -fvisibility-inlines-hidden. One engine serves them all:
// it links ("hidden symbol ... is referenced by DSO" before), a library's
// ScopedLabels are the labels the program sees and the program's are the
// library's, and a library's heapprof::allocator allocations are counted
// once, exactly (twice before: its own hidden copy of the fast path's state
// kept the global hook from seeing that the allocator was calling upstream).
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cstdio>
#include <cstring>
#include <string_view>

extern "C" void lib_a_work(int count, std::size_t bytes, void (*seen)());
extern "C" void lib_b_work(int count, std::size_t bytes, void (*seen)());
extern "C" std::size_t lib_a_label(const char* key, char* out, std::size_t cap);
extern "C" std::size_t lib_b_label(const char* key, char* out, std::size_t cap);

namespace {
int g_bad = 0;
char g_seen[64];
void Seen() {
  const std::string_view v = heapprof::CurrentLabels().Get("lib");
  const std::size_t n = v.size() < sizeof g_seen - 1 ? v.size() : sizeof g_seen - 1;
  std::memcpy(g_seen, v.data(), n);
  g_seen[n] = '\0';
}
void ExpectCount(const char* what, unsigned long long got, unsigned long long want) {
  if (got != want) {
    std::printf("FAILED: %s: got %llu, want %llu\n", what, got, want);
    ++g_bad;
  }
}
void ExpectText(const char* what, const char* got, const char* want) {
  if (std::strcmp(got, want) != 0) {
    std::printf("FAILED: %s: got \"%s\", want \"%s\"\n", what, got, want);
    ++g_bad;
  }
}
}  // namespace

int main() {
  constexpr int kCount = 1000;
  constexpr std::size_t kBytes = 1000;
  for (const std::size_t rate : {std::size_t{1}, std::size_t{524288}}) {
    heapprof::SetSampleRate(rate);
    for (int lib = 0; lib < 2; ++lib) {
      const heapprof::Stats before = heapprof::GetStats();
      (lib == 0 ? lib_a_work : lib_b_work)(kCount, kBytes, &Seen);
      const heapprof::Stats after = heapprof::GetStats();
      char what[96];
      std::snprintf(what, sizeof what, "lib %c at rate %zu: alloc_objects", "ab"[lib], rate);
      ExpectCount(what, after.alloc_objects - before.alloc_objects, kCount);
      std::snprintf(what, sizeof what, "lib %c at rate %zu: alloc_bytes", "ab"[lib], rate);
      ExpectCount(what, after.alloc_bytes - before.alloc_bytes, kCount * kBytes);
      std::snprintf(what, sizeof what, "lib %c at rate %zu: free_objects", "ab"[lib], rate);
      ExpectCount(what, after.free_objects - before.free_objects, kCount);
      std::snprintf(what, sizeof what, "lib %c: its ScopedLabels, seen by the program", "ab"[lib]);
      ExpectText(what, g_seen, lib == 0 ? "a" : "b");
    }
  }
  {
    heapprof::ScopedLabels scope{{"lib", "program"}};
    char got[64];
    lib_a_label("lib", got, sizeof got);
    ExpectText("the program's ScopedLabels, seen by lib a", got, "program");
    lib_b_label("lib", got, sizeof got);
    ExpectText("the program's ScopedLabels, seen by lib b", got, "program");
  }
  if (g_bad == 0) std::printf("one engine: exact counts and shared labels across 2 hidden-visibility libraries\n");
  return g_bad == 0 ? 0 : 1;
}
