// heapprof: memory for the debug-info cache (line tables, inline scopes,
// function names, inflated sections). It lives as long as the process, so it
// comes from the profiler's arena, never the host heap: it must not show in a
// leak checker or in the user's own heap numbers. A budget bounds it; past the
// budget an allocation fails and the caller degrades to names only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "heapprof/detail/0_base/arena.hpp"

// Bytes the debug-info cache may hold (default 256 MiB). Files themselves are
// mmap'ed read-only (page cache, not counted); decoded tables and inflated
// compressed sections are counted.
#ifndef HEAPPROF_DEBUG_INFO_MAX_BYTES
#define HEAPPROF_DEBUG_INFO_MAX_BYTES (std::size_t{256} << 20)
#endif

namespace heapprof {
namespace detail {

// Set on a thread while it writes a profile that must not read DWARF it has
// not read before: oom_dump's under a reserve sized for names only
// (dumps.hpp: Dumper::OnAllocFailed). Its names come from the symbol tables
// (one file mapped at a time), its files and lines from what the cache
// already holds. Reading a large program's DWARF cold took more than any
// reserve below 80 MiB (a 31 MB test binary), and a load that ran out of
// memory half way cost the profile every name (README "A dump on
// allocation failure"). A split unit's .dwo (or .dwp) not opened yet is
// such DWARF too (dwarf_info.hpp: DwarfInfo::Split).
inline thread_local bool tls_symbolize_cached_debug_only = false;

inline std::atomic<std::size_t> g_debug_info_bytes{0};

// What the arena really hands out for `n` bytes, so the budget counts it.
inline std::size_t DebugBlockSize(std::size_t n) noexcept {
  if (n > Arena::kLargest) return (n + 4095) & ~std::size_t{4095};
  std::size_t block = Arena::kMinBlock;
  while (block < n) block <<= 1;
  return block;
}

// Zeroed memory or nullptr (budget spent or no memory).
inline void* DebugAllocate(std::size_t n) noexcept {
  if (n == 0) n = 1;
  const std::size_t charged = DebugBlockSize(n);
  const std::size_t before = g_debug_info_bytes.fetch_add(charged, std::memory_order_relaxed);
  if (before + charged > HEAPPROF_DEBUG_INFO_MAX_BYTES) {
    g_debug_info_bytes.fetch_sub(charged, std::memory_order_relaxed);
    return nullptr;
  }
  void* p = g_arena.Allocate(n);
  if (p == nullptr) g_debug_info_bytes.fetch_sub(charged, std::memory_order_relaxed);
  return p;
}

inline void DebugFree(void* p, std::size_t n) noexcept {
  if (p == nullptr) return;
  if (n == 0) n = 1;
  g_arena.Free(p, n);
  g_debug_info_bytes.fetch_sub(DebugBlockSize(n), std::memory_order_relaxed);
}

// A growable array of trivially copyable values in debug memory. Push and
// Reserve report failure instead of throwing: the cache is built in code
// compiled with or without exceptions, and running out only costs detail.
template <class T>
class DebugArray {
  static_assert(std::is_trivially_copyable<T>::value, "DebugArray holds plain values");

 public:
  DebugArray() noexcept = default;
  ~DebugArray() { Release(); }
  DebugArray(const DebugArray&) = delete;
  DebugArray& operator=(const DebugArray&) = delete;
  DebugArray(DebugArray&& o) noexcept : data_(o.data_), size_(o.size_), cap_(o.cap_) {
    o.data_ = nullptr;
    o.size_ = o.cap_ = 0;
  }
  DebugArray& operator=(DebugArray&& o) noexcept {
    if (this != &o) {
      Release();
      data_ = o.data_;
      size_ = o.size_;
      cap_ = o.cap_;
      o.data_ = nullptr;
      o.size_ = o.cap_ = 0;
    }
    return *this;
  }

  bool Reserve(std::size_t n) noexcept {
    if (n <= cap_) return true;
    if (n > (~std::size_t{0}) / sizeof(T) / 2) return false;
    T* fresh = static_cast<T*>(DebugAllocate(n * sizeof(T)));
    if (fresh == nullptr) return false;
    if (size_ != 0) std::memcpy(static_cast<void*>(fresh), data_, size_ * sizeof(T));
    if (data_ != nullptr) DebugFree(data_, cap_ * sizeof(T));
    data_ = fresh;
    cap_ = n;
    return true;
  }
  bool Push(const T& value) noexcept {
    if (size_ == cap_ && !Reserve(cap_ < 8 ? 8 : cap_ * 2)) return false;
    data_[size_++] = value;
    return true;
  }
  // n zeroed (value-initialised for plain types) elements.
  bool Resize(std::size_t n) noexcept {
    if (!Reserve(n)) return false;
    if (n > size_) std::memset(static_cast<void*>(data_ + size_), 0, (n - size_) * sizeof(T));
    size_ = n;
    return true;
  }
  void Clear() noexcept { size_ = 0; }
  void Pop() noexcept { --size_; }
  void Release() noexcept {
    if (data_ != nullptr) DebugFree(data_, cap_ * sizeof(T));
    data_ = nullptr;
    size_ = cap_ = 0;
  }

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  T& back() noexcept { return data_[size_ - 1]; }
  std::size_t bytes() const noexcept { return cap_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t cap_ = 0;
};

// Append-only NUL-terminated strings in 64 KiB chunks; pointers stay valid for
// the life of the pool.
class DebugStringPool {
 public:
  DebugStringPool() noexcept = default;
  ~DebugStringPool() {
    while (chunks_ != nullptr) {
      Chunk* next = chunks_->next;
      DebugFree(chunks_, chunks_->size);
      chunks_ = next;
    }
  }
  DebugStringPool(const DebugStringPool&) = delete;
  DebugStringPool& operator=(const DebugStringPool&) = delete;

  // A copy of s[0..n) plus NUL, or nullptr when the budget is spent.
  const char* Add(const char* s, std::size_t n) noexcept {
    if (n >= kChunk / 4) return AddLarge(s, n);
    if (chunks_ == nullptr || used_ + n + 1 > chunks_->size) {
      Chunk* c = NewChunk(kChunk);
      if (c == nullptr) return nullptr;
      c->next = chunks_;
      chunks_ = c;
      used_ = sizeof(Chunk);
    }
    char* out = reinterpret_cast<char*>(chunks_) + used_;
    std::memcpy(out, s, n);
    out[n] = '\0';
    used_ += n + 1;
    return out;
  }
  const char* Add(const char* s) noexcept { return Add(s, std::strlen(s)); }

 private:
  // Out of line: inlined into callers with small buffers, GCC's -Warray-bounds
  // would see this branch read past them.
  __attribute__((__noinline__)) const char* AddLarge(const char* s, std::size_t n) noexcept {
    Chunk* big = NewChunk(sizeof(Chunk) + n + 1);
    if (big == nullptr) return nullptr;
    // Linked behind the current chunk so that chunks_ keeps bumping.
    if (chunks_ != nullptr) {
      big->next = chunks_->next;
      chunks_->next = big;
    } else {
      chunks_ = big;
      used_ = big->size;
    }
    char* out = reinterpret_cast<char*>(big + 1);
    std::memcpy(out, s, n);
    out[n] = '\0';
    return out;
  }

  static constexpr std::size_t kChunk = std::size_t{64} << 10;
  struct Chunk {
    Chunk* next;
    std::size_t size;
  };
  static Chunk* NewChunk(std::size_t size) noexcept {
    Chunk* c = static_cast<Chunk*>(DebugAllocate(size));
    if (c == nullptr) return nullptr;
    c->next = nullptr;
    c->size = size;
    return c;
  }

  Chunk* chunks_ = nullptr;
  std::size_t used_ = 0;
};

// One object of type T in debug memory (for the cache's long-lived nodes).
template <class T, class... Args>
T* DebugNew(Args&&... args) noexcept {
  void* p = DebugAllocate(sizeof(T));
  if (p == nullptr) return nullptr;
  return new (p) T(std::forward<Args>(args)...);
}
template <class T>
void DebugDelete(T* p) noexcept {
  if (p == nullptr) return;
  p->~T();
  DebugFree(p, sizeof(T));
}

}  // namespace detail
}  // namespace heapprof
