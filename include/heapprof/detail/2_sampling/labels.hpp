// heapprof: label sets, interned, and the calling thread's current set.
//
// A label set is an immutable, sorted list of (key, value) strings stored once
// in the arena and never freed, so a set is identified by its address: copying
// is a pointer copy, equality is pointer equality, and a bucket can key on it.
// A sampled object's bucket holds the set that was current when it was
// allocated, so the attribution lasts for the object's lifetime whichever
// thread frees it (what golang/go#23458 asks of Go's heap profiles).
//
// Memory is bounded: at most max_label_sets distinct sets (HEAPPROF key, 4096
// by default) and kLabelSetBudgetBytes of them, keys and values cut at
// kMaxLabelBytes, kMaxLabels per set. Past either cap, and for a set of more
// than kMaxLabels labels, the set maps to one overflow set whose single label
// says so; the number of such mappings is counted in Stats.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <unistd.h>
#include <utility>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/0_base/hash.hpp"
#include "heapprof/detail/0_base/intern_table.hpp"
#include "heapprof/detail/0_base/spinlock.hpp"
#include "heapprof/detail/1_hooks/fast_path.hpp"

namespace heapprof {
namespace detail {

constexpr std::size_t kMaxLabels = 32;
constexpr std::size_t kMaxLabelBytes = 256;
constexpr std::uint64_t kDefaultMaxLabelSets = 4096;
// All label sets together take at most this much arena memory (each set
// counted at its arena block size): 4096 sets of 32 labels of 256-byte keys
// and values would otherwise take 128 MiB. Past it, the overflow set.
constexpr std::size_t kLabelSetBudgetBytes = std::size_t{16} << 20;

struct LabelEntry {
  std::string_view key;
  std::string_view value;
};

struct LabelSetData {
  std::uint64_t hash;
  std::uint32_t count;
  std::uint32_t bytes;  // arena bytes of this record, strings included
  // `count` entries, sorted by key, then their string bytes, after the record.
  const LabelEntry* entries() const noexcept { return reinterpret_cast<const LabelEntry*>(this + 1); }
  LabelEntry* entries() noexcept { return reinterpret_cast<LabelEntry*>(this + 1); }
};

// A set under construction on the stack: sorted by key, unique keys.
struct LabelBuilder {
  LabelEntry entries[kMaxLabels];
  std::size_t count = 0;
  bool dropped = false;  // a label did not fit (more than kMaxLabels)

  void AddAll(const LabelSetData* set) noexcept {
    if (set == nullptr) return;
    for (std::uint32_t i = 0; i < set->count; ++i) Put(set->entries()[i].key, set->entries()[i].value);
  }
  // `text` cut to at most kMaxLabelBytes, at a UTF-8 character boundary: a
  // cut inside a character would put invalid UTF-8 into the profile's
  // string table, a proto3 `string` that strict decoders (protobuf-go's)
  // reject, losing the whole profile. A character is at most 4 bytes, so at
  // most 3 continuation bytes are given back (text that is not UTF-8 is cut
  // within 3 bytes of the limit all the same).
  static std::string_view Cut(std::string_view text) noexcept {
    if (text.size() <= kMaxLabelBytes) return text;
    std::size_t n = kMaxLabelBytes;
    for (int back = 0; back < 3 && n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80; ++back) --n;
    if ((static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) n = kMaxLabelBytes;  // not UTF-8 here
    return text.substr(0, n);
  }
  // Inserts or overrides `key` (the later value wins, as an inner scope does).
  void Put(std::string_view key, std::string_view value) noexcept {
    key = Cut(key);
    value = Cut(value);
    std::size_t i = 0;
    while (i < count && entries[i].key < key) ++i;
    if (i < count && entries[i].key == key) {
      entries[i].value = value;
      return;
    }
    if (count == kMaxLabels) {
      dropped = true;
      return;
    }
    for (std::size_t j = count; j > i; --j) entries[j] = entries[j - 1];
    entries[i] = LabelEntry{key, value};
    ++count;
  }
  std::uint64_t Hash() const noexcept {
    std::uint64_t h = 0x2545F4914F6CDD1Dull ^ count;
    for (std::size_t i = 0; i < count; ++i) {
      h = HashBytes(entries[i].key.data(), entries[i].key.size(), h);
      h = HashBytes(entries[i].value.data(), entries[i].value.size(), h);
    }
    return Mix64(h);
  }
  bool Equals(const LabelSetData& set) const noexcept {
    if (set.count != count) return false;
    for (std::size_t i = 0; i < count; ++i) {
      if (set.entries()[i].key != entries[i].key || set.entries()[i].value != entries[i].value) return false;
    }
    return true;
  }
};

class LabelRegistry {
 public:
  constexpr LabelRegistry() noexcept = default;

  // The interned set equal to `b`; nullptr for the empty set. Past the cap (or
  // out of memory) the overflow set.
  const LabelSetData* Intern(const LabelBuilder& b) noexcept {
    if (b.count == 0) return nullptr;
    const std::uint64_t hash = b.Hash();
    LockGuard hold(lock_);
    // More than kMaxLabels labels: the overflow set, counted, rather than a
    // set silently missing the labels that did not fit (an inner scope's
    // {"endpoint", ...} over 32 others vanished from its samples).
    if (b.dropped) return OverflowLocked();
    if (const LabelSetData* found = table_.Find(hash, [&](const LabelSetData& s) { return b.Equals(s); })) {
      return found;
    }
    if (table_.size() >= max_sets_.load(std::memory_order_relaxed)) return OverflowLocked();
    if (budget_used_ + BlockBytes(SetBytes(b)) > kLabelSetBudgetBytes) return OverflowLocked();
    const LabelSetData* made = MakeLocked(b, hash);
    return made != nullptr ? made : OverflowLocked();
  }

  // Whether `set` is the overflow set (read without the lock: once set, the
  // pointer never changes, and a set made before it cannot be it).
  bool IsOverflow(const LabelSetData* set) const noexcept {
    return set == __atomic_load_n(&overflow_, __ATOMIC_ACQUIRE);
  }

  void SetMaxSets(std::uint64_t n) noexcept { max_sets_.store(n, std::memory_order_relaxed); }
  std::uint64_t SetCount() noexcept {
    LockGuard hold(lock_);
    return table_.size();
  }
  std::uint64_t Overflows() const noexcept { return overflows_.load(std::memory_order_relaxed); }
  SpinLock& lock() noexcept { return lock_; }  // for fork handlers

 private:
  static std::size_t SetBytes(const LabelBuilder& b) noexcept {
    std::size_t bytes = sizeof(LabelSetData) + b.count * sizeof(LabelEntry);
    for (std::size_t i = 0; i < b.count; ++i) bytes += b.entries[i].key.size() + b.entries[i].value.size();
    return bytes;
  }
  // What the arena hands out for `bytes`: the next power of two, at least 16.
  static std::size_t BlockBytes(std::size_t bytes) noexcept {
    std::size_t block = 16;
    while (block < bytes) block <<= 1;
    return block;
  }

  const LabelSetData* MakeLocked(const LabelBuilder& b, std::uint64_t hash) noexcept {
    const std::size_t bytes = SetBytes(b);
    auto* set = static_cast<LabelSetData*>(g_arena.Allocate(bytes));
    if (set == nullptr) return nullptr;
    set->hash = hash;
    set->count = static_cast<std::uint32_t>(b.count);
    set->bytes = static_cast<std::uint32_t>(bytes);
    char* text = reinterpret_cast<char*>(set->entries() + b.count);
    for (std::size_t i = 0; i < b.count; ++i) {
      std::memcpy(text, b.entries[i].key.data(), b.entries[i].key.size());
      const std::string_view key(text, b.entries[i].key.size());
      text += key.size();
      std::memcpy(text, b.entries[i].value.data(), b.entries[i].value.size());
      const std::string_view value(text, b.entries[i].value.size());
      text += value.size();
      set->entries()[i] = LabelEntry{key, value};
    }
    if (!table_.Insert(set)) {
      g_arena.Free(set, bytes);
      return nullptr;
    }
    budget_used_ += BlockBytes(bytes);
    return set;
  }

  const LabelSetData* OverflowLocked() noexcept {
    overflows_.fetch_add(1, std::memory_order_relaxed);
    if (overflow_ == nullptr) {
      // Built outside the table so it never counts against the cap.
      const std::size_t bytes = sizeof(LabelSetData) + sizeof(LabelEntry);
      auto* set = static_cast<LabelSetData*>(g_arena.Allocate(bytes));
      if (set == nullptr) return nullptr;
      set->hash = 0;
      set->count = 1;
      set->bytes = static_cast<std::uint32_t>(bytes);
      set->entries()[0] = LabelEntry{"heapprof", "label-set-overflow"};
      __atomic_store_n(&overflow_, set, __ATOMIC_RELEASE);
    }
    return overflow_;
  }

  SpinLock lock_;
  InternTable<LabelSetData> table_;
  const LabelSetData* overflow_ = nullptr;
  std::size_t budget_used_ = 0;  // arena bytes of the interned sets
  std::atomic<std::uint64_t> max_sets_{kDefaultMaxLabelSets};
  std::atomic<std::uint64_t> overflows_{0};
};

inline LabelRegistry g_labels;

// The sets of the calling thread's recent label scopes (InternLabels, in
// implementation.hpp). Keyed by the scope's enclosing set and the addresses
// of its first label's strings, a hint only: a hit is checked against the
// labels' bytes (IsMergeOf), so a stale entry (a reused buffer), a torn one
// (a signal handler's scope wrote it half way) or a recycled thread's costs a
// lookup, never a wrong set. Sets are never freed, so a pointer read here
// stays valid. The default TLS model, not HEAPPROF_TLS_MODEL: these 512
// bytes are not on an allocation's path, and in a shared object they must
// not take glibc's static TLS surplus, which a dlopen'ed library may need.
struct LabelMemos {
  struct Memo {
    const void* base;
    const void* key;
    const void* value;
    const LabelSetData* set;
  };
  static constexpr std::size_t kCount = 16;  // direct-mapped (Slot)
  Memo memo[kCount];
  static std::size_t Slot(const void* base, const void* key, const void* value) noexcept {
    // (size_t, not uint64_t: g++'s -Wuseless-cast flags the cast from one to the other.)
    const std::size_t h = (reinterpret_cast<std::uintptr_t>(base) ^ reinterpret_cast<std::uintptr_t>(key) * 3 ^
                           reinterpret_cast<std::uintptr_t>(value) * 5) *
                          std::size_t{0x9e3779b97f4a7c15ull};
    return h >> 60;
  }
};
inline thread_local LabelMemos tls_label_memos;

// Labels are short (keys, endpoints, tenants): up to 16 bytes are compared
// inline, as two words that may overlap, never reading outside either string.
inline bool LabelBytesEqual(std::string_view a, std::string_view b) noexcept {
  const std::size_t n = a.size();
  if (n != b.size()) return false;
  const char* p = a.data();
  const char* q = b.data();
  if (n >= 8 && n <= 16) {
    std::uint64_t p0, q0, p1, q1;
    std::memcpy(&p0, p, 8), std::memcpy(&q0, q, 8), std::memcpy(&p1, p + n - 8, 8), std::memcpy(&q1, q + n - 8, 8);
    return ((p0 ^ q0) | (p1 ^ q1)) == 0;
  }
  if (n >= 4 && n < 8) {
    std::uint32_t p0, q0, p1, q1;
    std::memcpy(&p0, p, 4), std::memcpy(&q0, q, 4), std::memcpy(&p1, p + n - 4, 4), std::memcpy(&q1, q + n - 4, 4);
    return ((p0 ^ q0) | (p1 ^ q1)) == 0;
  }
  if (n < 4) {
    for (std::size_t i = 0; i < n; ++i) {
      if (p[i] != q[i]) return false;
    }
    return true;
  }
  return p == q || std::memcmp(p, q, n) == 0;
}
inline const LabelEntry* FindLabel(const LabelSetData& set, std::string_view key) noexcept {
  for (std::uint32_t i = 0; i < set.count; ++i) {
    if (LabelBytesEqual(set.entries()[i].key, key)) return &set.entries()[i];
  }
  return nullptr;
}
// Whether labels[0, n) has a label with key `key`.
template <class LabelT>
bool HasKey(const LabelT* labels, std::size_t n, std::string_view key) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    if (LabelBytesEqual(labels[i].first, key)) return true;
  }
  return false;
}
// Whether `set` is exactly `base` with labels[0, n) merged over it (what
// InternLabels makes of them): every label's value in it, every label of
// `base` whose key no label overrides in it too, and nothing else. False for
// a label longer than kMaxLabelBytes (its set holds it cut) and for keys
// given twice with different values (the earlier one is not in the set):
// those are interned every time. Used to check a memo hit (InternLabels).
template <class LabelT>
bool IsMergeOf(const LabelSetData* set, const LabelSetData* base, const LabelT* labels, std::size_t n) noexcept {
  if (set == nullptr || n > kMaxLabels) return false;
  std::size_t keys = 0;  // distinct keys of the result
  for (std::size_t i = 0; i < n; ++i) {
    const std::string_view key = labels[i].first, value = labels[i].second;
    if (key.size() > kMaxLabelBytes || value.size() > kMaxLabelBytes) return false;
    const LabelEntry* e = FindLabel(*set, key);
    if (e == nullptr || !LabelBytesEqual(e->value, value)) return false;
    if (!HasKey(labels, i, key)) ++keys;  // (a key given again counts once)
  }
  if (base != nullptr) {
    for (std::uint32_t b = 0; b < base->count; ++b) {
      const LabelEntry& kept = base->entries()[b];
      if (HasKey(labels, n, kept.key)) continue;  // overridden
      const LabelEntry* e = FindLabel(*set, kept.key);
      if (e == nullptr || !LabelBytesEqual(e->value, kept.value)) return false;
      ++keys;
    }
  }
  return keys == set->count;
}

// The labels of a program that compiled heapprof in, while libheapprof_preload.so
// records the process (implementation.hpp: heapprof_detail_engine_role). The
// program's ScopedLabels set its own copy's thread-local set, interned in its
// own table; the library reads it through these (the program's functions)
// and interns the same labels in its own. Published once.
struct ProgramLabels {
  const LabelSetData* (*current)() noexcept;  // the calling thread's set, the program's
  std::size_t (*count)(const LabelSetData* set) noexcept;
  std::pair<std::string_view, std::string_view> (*at)(const LabelSetData* set, std::size_t i) noexcept;  // a Label
};
inline std::atomic<const ProgramLabels*> g_program_labels{nullptr};

// The thread's last program set and the library's equal one. A program's sets
// are interned for good, so a pointer names its labels for the process's
// life. `theirs` is cleared while the pair changes and read again after
// `ours`: a signal handler's sample in between sees no pair or a whole one.
struct ProgramLabelsMemo {
  const LabelSetData* theirs;
  const LabelSetData* ours;
};
inline thread_local ProgramLabelsMemo tls_program_labels_memo HEAPPROF_TLS_MODEL = {nullptr, nullptr};

inline const LabelSetData* ProgramSampleLabels(const ProgramLabels& program) noexcept {
  const LabelSetData* theirs = program.current();
  if (theirs == nullptr) return nullptr;
  ProgramLabelsMemo& memo = tls_program_labels_memo;
  if (__atomic_load_n(&memo.theirs, __ATOMIC_RELAXED) == theirs) {
    const LabelSetData* ours = __atomic_load_n(&memo.ours, __ATOMIC_RELAXED);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (__atomic_load_n(&memo.theirs, __ATOMIC_RELAXED) == theirs) return ours;
  }
  LabelBuilder b;
  const std::size_t n = program.count(theirs);
  for (std::size_t i = 0; i < n; ++i) {
    const std::pair<std::string_view, std::string_view> label = program.at(theirs, i);
    b.Put(label.first, label.second);
  }
  const LabelSetData* ours = g_labels.Intern(b);
  __atomic_store_n(&memo.theirs, nullptr, __ATOMIC_RELAXED);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  __atomic_store_n(&memo.ours, ours, __ATOMIC_RELAXED);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  __atomic_store_n(&memo.theirs, theirs, __ATOMIC_RELAXED);
  return ours;
}

// The set a sample taken now is attributed to: the thread's (1_hooks/fast_path.hpp),
// or the program's (above), with an allocator's labels merged over it.
inline const LabelSetData* CurrentSampleLabels() noexcept {
  const ProgramLabels* program = g_program_labels.load(std::memory_order_acquire);
  const LabelSetData* thread = HEAPPROF_LIKELY(program == nullptr) ? tls_current_labels : ProgramSampleLabels(*program);
  const LabelSetData* extra = tls_allocator_labels;
  if (extra == nullptr) return thread;
  if (thread == nullptr) return extra;
  LabelBuilder b;
  b.AddAll(thread);
  b.AddAll(extra);
  return g_labels.Intern(b);
}

}  // namespace detail
}  // namespace heapprof
