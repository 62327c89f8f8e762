// heapprof: standard containers on the profiler's arena.
// Writing a profile (symbol tables, the builder's tables, the encoded and
// compressed bytes), the dumps and the HTTP server keep their data in these
// containers, so the profiler never takes memory from the host's heap: none of
// it goes through the program's operator new or malloc (a leak checker, the
// program's own heap numbers and Stats::alloc_* never see it), and all of it
// is counted in Stats::profiler_bytes. Blocks up to 256 KiB come from the
// arena's size classes and go back to their free lists when a write ends, so
// the next write reuses them; larger ones are mappings of their own, unmapped
// when freed. Only the implementation unit includes this file.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/0_base/errors.hpp"

namespace heapprof {
namespace detail {

// Stateless: every instance allocates from g_arena, so all compare equal and
// containers swap and move their storage freely. Out of memory is bad_alloc,
// as from std::allocator (the writers catch it and fail the write).
template <class T>
class ArenaAllocator {
 public:
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using is_always_equal = std::true_type;

  constexpr ArenaAllocator() noexcept = default;
  template <class U>
  constexpr ArenaAllocator(const ArenaAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / 2 / sizeof(T)) ThrowBadAlloc();
    void* p = g_arena.AllocateUninitialized(n * sizeof(T));
    if (p == nullptr) ThrowBadAlloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept { g_arena.Free(p, n * sizeof(T)); }

  template <class U>
  friend bool operator==(const ArenaAllocator&, const ArenaAllocator<U>&) noexcept {
    return true;
  }
  template <class U>
  friend bool operator!=(const ArenaAllocator&, const ArenaAllocator<U>&) noexcept {
    return false;
  }
};

using ArenaString = std::basic_string<char, std::char_traits<char>, ArenaAllocator<char>>;
template <class T>
using ArenaVector = std::vector<T, ArenaAllocator<T>>;
template <class T>
using ArenaDeque = std::deque<T, ArenaAllocator<T>>;
template <class K, class V, class Less = std::less<K>>
using ArenaMap = std::map<K, V, Less, ArenaAllocator<std::pair<const K, V>>>;
template <class K, class V, class Hash = std::hash<K>, class Eq = std::equal_to<K>>
using ArenaUnorderedMap = std::unordered_map<K, V, Hash, Eq, ArenaAllocator<std::pair<const K, V>>>;

// An arena string equals a host one with the same bytes (found by ADL: the
// tests compare the writer's output with std::string).
inline bool operator==(const ArenaString& a, const std::string& b) noexcept {
  return a.size() == b.size() && a.compare(0, a.size(), b.data(), b.size()) == 0;
}
inline bool operator==(const std::string& a, const ArenaString& b) noexcept { return b == a; }
inline bool operator!=(const ArenaString& a, const std::string& b) noexcept { return !(a == b); }
inline bool operator!=(const std::string& a, const ArenaString& b) noexcept { return !(b == a); }

// One object on the arena, owned like std::unique_ptr.
template <class T>
struct ArenaDeleter {
  void operator()(T* p) const noexcept {
    if (p == nullptr) return;
    p->~T();
    g_arena.Free(p, sizeof(T));
  }
};
template <class T>
using ArenaPtr = std::unique_ptr<T, ArenaDeleter<T>>;

// Throws bad_alloc when the arena has no memory (or what T's constructor throws).
template <class T, class... Args>
ArenaPtr<T> MakeArena(Args&&... args) {
  static_assert(alignof(T) <= 16, "arena blocks are 16-byte aligned at least");
  void* p = g_arena.AllocateUninitialized(sizeof(T));
  if (p == nullptr) ThrowBadAlloc();
  struct Undo {  // T's constructor may throw
    void* p;
    ~Undo() {
      if (p != nullptr) g_arena.Free(p, sizeof(T));
    }
  } undo{p};
  T* object = new (p) T(std::forward<Args>(args)...);
  undo.p = nullptr;
  return ArenaPtr<T>(object);
}

// Decimal text of `v` (std::to_string takes the host's heap).
inline ArenaString ArenaDecimal(unsigned long long v) {
  char buf[24];
  char* p = buf + sizeof buf;
  do {
    *--p = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  return ArenaString(p, static_cast<std::size_t>(buf + sizeof buf - p));
}

}  // namespace detail
}  // namespace heapprof
