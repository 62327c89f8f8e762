// heapprof: per-request attribution of heap samples (LabelSet, ScopedLabels).
//
//   heapprof::ScopedLabels req{{"endpoint", "/search"}, {"tenant", "acme"}};
//   ... every sampled allocation on this thread now carries both labels, and
//   keeps them until it is freed, on whatever thread.
//
// Profiles carry them as pprof string labels: `go tool pprof -tags`,
// `-tagfocus=endpoint=/search`, `-tagignore`, and every pprof UI filter and
// group by them.
#pragma once

#include "heapprof/config.hpp"

#if defined(HEAPPROF_CXX17)

#include <cstddef>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "heapprof/detail/1_hooks/fast_path.hpp"

namespace heapprof {

using Label = std::pair<std::string_view, std::string_view>;

namespace detail {
HEAPPROF_LINKED_BEGIN
// The interned set of `base`'s labels with `labels` merged over them (a later
// value for a key wins); nullptr for the empty set.
const LabelSetData* InternLabels(const LabelSetData* base, const Label* labels, std::size_t count) noexcept;
const LabelSetData* MergeLabels(const LabelSetData* base, const LabelSetData* over) noexcept;
std::size_t LabelCount(const LabelSetData* set) noexcept;
Label LabelAt(const LabelSetData* set, std::size_t i) noexcept;
// Says once on stderr that scopes were destroyed out of order; aborts when
// `abort_after` (the caller's debug build).
void ReportScopeMisuse(bool abort_after) noexcept;
HEAPPROF_LINKED_END
}  // namespace detail

// An immutable, interned set of labels: copying is a pointer copy and two sets
// are equal exactly when they hold the same (key, value) pairs.
class LabelSet {
 public:
  LabelSet() noexcept = default;  // the empty set
  LabelSet(std::initializer_list<Label> labels) noexcept
      : data_(detail::InternLabels(nullptr, labels.begin(), labels.size())) {}

  constexpr bool empty() const noexcept { return data_ == nullptr; }
  std::size_t size() const noexcept { return data_ == nullptr ? 0 : detail::LabelCount(data_); }
  // The value for `key`, or an empty view when absent.
  std::string_view Get(std::string_view key) const noexcept {
    for (std::size_t i = 0, n = size(); i < n; ++i) {
      const Label kv = detail::LabelAt(data_, i);
      if (kv.first == key) return kv.second;
    }
    return {};
  }
  // The i-th (key, value) pair, in key order.
  Label operator[](std::size_t i) const noexcept { return detail::LabelAt(data_, i); }

  friend constexpr bool operator==(const LabelSet& a, const LabelSet& b) noexcept { return a.data_ == b.data_; }
  friend constexpr bool operator!=(const LabelSet& a, const LabelSet& b) noexcept { return a.data_ != b.data_; }

  const detail::LabelSetData* data() const noexcept { return data_; }
  static LabelSet FromData(const detail::LabelSetData* data) noexcept {
    LabelSet s;
    s.data_ = data;
    return s;
  }

 private:
  const detail::LabelSetData* data_ = nullptr;
};

#if HEAPPROF_ENABLED

// The calling thread's current label set.
inline LabelSet CurrentLabels() noexcept { return LabelSet::FromData(detail::tls_current_labels); }

// Makes `set` the calling thread's current set, as is, and returns the set it
// replaces (like std::set_new_handler). For code that switches what a thread
// runs: a coroutine's promise, a fiber scheduler, an event loop. Swap the
// task's set in where it resumes and back out where it suspends, and the
// ScopedLabels inside the task stay nested whatever thread resumes it
// (README: "Labels across co_await, fibers and event loops").
inline LabelSet SetCurrentLabels(const LabelSet& set) noexcept {
  const detail::LabelSetData* previous = detail::tls_current_labels;
  detail::tls_current_labels = set.data();
  return LabelSet::FromData(previous);
}

// Adds labels to the calling thread's current set for the scope's lifetime;
// for a key already present the inner value wins. Scopes nest strictly per
// thread: the destructor restores exactly the set that was current before.
class ScopedLabels {
 public:
  ScopedLabels(std::initializer_list<Label> labels) noexcept
      : previous_(detail::tls_current_labels),
        installed_(detail::InternLabels(previous_, labels.begin(), labels.size())) {
    detail::tls_current_labels = installed_;
  }
  // Makes `set` current here, merged over this thread's set: how a thread
  // pool carries a request's labels (captured with CurrentLabels()) to a worker.
  explicit ScopedLabels(const LabelSet& set) noexcept
      : previous_(detail::tls_current_labels), installed_(detail::MergeLabels(previous_, set.data())) {
    detail::tls_current_labels = installed_;
  }
  ~ScopedLabels() {
    // Only a scope's own exit may find its set current; anything else means a
    // scope in between was destroyed out of order. Debug builds stop there;
    // release builds say so once and restore this scope's predecessor.
    if (HEAPPROF_UNLIKELY(detail::tls_current_labels != installed_)) {
#if defined(NDEBUG)
      detail::ReportScopeMisuse(false);
#else
      detail::ReportScopeMisuse(true);
#endif
    }
    detail::tls_current_labels = previous_;
  }
  ScopedLabels(const ScopedLabels&) = delete;
  ScopedLabels& operator=(const ScopedLabels&) = delete;
  ScopedLabels(ScopedLabels&&) = delete;
  ScopedLabels& operator=(ScopedLabels&&) = delete;

 private:
  const detail::LabelSetData* previous_;
  const detail::LabelSetData* installed_;
};

#else  // !HEAPPROF_ENABLED: labels are accepted and dropped.

inline LabelSet CurrentLabels() noexcept { return LabelSet(); }
inline LabelSet SetCurrentLabels(const LabelSet&) noexcept { return LabelSet(); }

class ScopedLabels {
 public:
  ScopedLabels(std::initializer_list<Label>) noexcept {}
  explicit ScopedLabels(const LabelSet&) noexcept {}
  ScopedLabels(const ScopedLabels&) = delete;
  ScopedLabels& operator=(const ScopedLabels&) = delete;
  ScopedLabels(ScopedLabels&&) = delete;
  ScopedLabels& operator=(ScopedLabels&&) = delete;
};

#endif  // HEAPPROF_ENABLED

}  // namespace heapprof

#endif  // HEAPPROF_CXX17
