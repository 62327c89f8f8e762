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

#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "heapprof/detail/engine.hpp"
#include "heapprof/detail/labels.hpp"

namespace heapprof {

class ScopedLabels;

// An immutable, interned set of labels: copying is a pointer copy and two sets
// are equal exactly when they hold the same (key, value) pairs.
class LabelSet {
 public:
  LabelSet() noexcept = default;  // the empty set
  LabelSet(std::initializer_list<std::pair<std::string_view, std::string_view>> labels) noexcept {
    detail::LabelBuilder b;
    for (const auto& kv : labels) b.Put(kv.first, kv.second);
    data_ = Intern(b);
  }

  bool empty() const noexcept { return data_ == nullptr; }
  std::size_t size() const noexcept { return data_ == nullptr ? 0 : data_->count; }
  // The value for `key`, or an empty view when absent.
  std::string_view Get(std::string_view key) const noexcept {
    for (std::size_t i = 0; i < size(); ++i) {
      if (data_->entries()[i].key == key) return data_->entries()[i].value;
    }
    return {};
  }
  // The i-th (key, value) pair, in key order.
  std::pair<std::string_view, std::string_view> operator[](std::size_t i) const noexcept {
    return {data_->entries()[i].key, data_->entries()[i].value};
  }

  friend bool operator==(const LabelSet& a, const LabelSet& b) noexcept { return a.data_ == b.data_; }
  friend bool operator!=(const LabelSet& a, const LabelSet& b) noexcept { return a.data_ != b.data_; }

  const detail::LabelSetData* data() const noexcept { return data_; }
  static LabelSet FromData(const detail::LabelSetData* data) noexcept {
    LabelSet s;
    s.data_ = data;
    return s;
  }

 private:
  static const detail::LabelSetData* Intern(const detail::LabelBuilder& b) noexcept {
    detail::EnsureInit();  // HEAPPROF=max_label_sets applies before the first set
    return detail::g_labels.Intern(b);
  }
  const detail::LabelSetData* data_ = nullptr;
  friend class ScopedLabels;
};

// The calling thread's current label set.
inline LabelSet CurrentLabels() noexcept { return LabelSet::FromData(detail::tls_current_labels); }

// Adds labels to the calling thread's current set for the scope's lifetime;
// for a key already present the inner value wins. Scopes nest strictly per
// thread: the destructor restores exactly the set that was current before.
class ScopedLabels {
 public:
  ScopedLabels(std::initializer_list<std::pair<std::string_view, std::string_view>> labels) noexcept
      : previous_(detail::tls_current_labels) {
    detail::LabelBuilder b;
    b.AddAll(previous_);
    for (const auto& kv : labels) b.Put(kv.first, kv.second);
    Enter(b);
  }
  // Makes `set` current here, merged over this thread's set: how a thread
  // pool carries a request's labels (captured with CurrentLabels()) to a worker.
  explicit ScopedLabels(const LabelSet& set) noexcept : previous_(detail::tls_current_labels) {
    if (previous_ == nullptr || set.data_ == nullptr) {
      installed_ = previous_ == nullptr ? set.data_ : previous_;
      detail::tls_current_labels = installed_;
      return;
    }
    detail::LabelBuilder b;
    b.AddAll(previous_);
    b.AddAll(set.data_);
    Enter(b);
  }
  ~ScopedLabels() {
    // Only a scope's own exit may find its set current; anything else means a
    // scope in between was destroyed out of order. Debug builds stop there;
    // release builds say so once and restore this scope's predecessor.
    if (HEAPPROF_UNLIKELY(detail::tls_current_labels != installed_)) {
      detail::ReportScopeMisuse();
#if !defined(NDEBUG)
      std::abort();
#endif
    }
    detail::tls_current_labels = previous_;
  }
  ScopedLabels(const ScopedLabels&) = delete;
  ScopedLabels& operator=(const ScopedLabels&) = delete;
  ScopedLabels(ScopedLabels&&) = delete;
  ScopedLabels& operator=(ScopedLabels&&) = delete;

 private:
  void Enter(const detail::LabelBuilder& b) noexcept {
    installed_ = LabelSet::Intern(b);
    detail::tls_current_labels = installed_;
  }
  const detail::LabelSetData* previous_;
  const detail::LabelSetData* installed_ = nullptr;
};

}  // namespace heapprof
