// A second unit that includes <heapprof.hpp> beside uses_api.cpp, for check.sh
// odd_flags: both built with the flags a code base may use (-flto, -O0, -Os,
// -D_GLIBCXX_DEBUG, -static-libstdc++, ...) and linked with an implementation
// unit built without them. heapprof::allocator containers of every kind count
// exactly at rate 1, and the link has no duplicate or mismatched definition.
#include <heapprof.hpp>

#include <cstdio>
#include <deque>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

int UseApi(bool enabled);

namespace {
template <class T>
using Alloc = heapprof::allocator<T>;
struct alignas(64) Line {
  char bytes[64];
};
}  // namespace

int main() {
  int bad = UseApi(true);
  heapprof::SetSampleRate(1);
  const heapprof::Stats before = heapprof::GetStats();
  {
    std::vector<Line, Alloc<Line>> lines(100);
    std::deque<int, Alloc<int>> queue(1000, 1);
    std::list<int, Alloc<int>> list(100, 2);
    std::map<int, int, std::less<int>, Alloc<std::pair<const int, int>>> map;
    std::unordered_map<int, int, std::hash<int>, std::equal_to<int>, Alloc<std::pair<const int, int>>> hash;
    std::basic_string<char, std::char_traits<char>, Alloc<char>> text(1000, 'x');
    for (int i = 0; i < 100; ++i) map[i] = hash[i] = i;
    if (reinterpret_cast<std::uintptr_t>(lines.data()) % 64 != 0) ++bad;
    if (lines.size() + queue.size() + list.size() + map.size() + hash.size() + text.size() != 2400) ++bad;
  }
  const heapprof::Stats after = heapprof::GetStats();
  const unsigned long long allocs = after.alloc_objects - before.alloc_objects;
  const unsigned long long frees = after.free_objects - before.free_objects;
  const unsigned long long alloc_bytes = after.alloc_bytes - before.alloc_bytes;
  const unsigned long long free_bytes = after.free_bytes - before.free_bytes;
  if (allocs == 0 || allocs != frees || alloc_bytes != free_bytes) ++bad;
  std::printf("rate 1: %llu allocations, %llu bytes, freed exactly: %s; %d broken expectations\n", allocs,
              alloc_bytes, allocs == frees && alloc_bytes == free_bytes ? "yes" : "no", bad);
  return bad;
}
