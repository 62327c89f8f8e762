// heapprof: heapprof::allocator<T, Upstream>, a std-conforming allocator that
// profiles the containers using it, with or without the global operator new
// replacement.
//
// Every allocation is counted exactly once: the upstream runs inside
// AllocatorScope, so if it reaches a replaced operator new for the block it
// returns that hook stays silent and this allocator records the allocation
// itself, with itself as the hook (its caller is the sample's leaf frame).
// Other blocks the upstream allocates there (a pmr resource's chunks) the
// hooks count as any.
#pragma once

#include "heapprof/config.hpp"

#if defined(HEAPPROF_CXX17)

#include <cstddef>
#include <type_traits>
#include <utility>
// std::allocator and std::allocator_traits. libstdc++ has them in two small
// headers that <vector>, <string> and <map> include anyway; <memory> would
// add ~10,000 lines of shared_ptr and friends to every unit using labels.
#if defined(__GLIBCXX__) && defined(__has_include)
#if __has_include(<bits/allocator.h>) && __has_include(<bits/alloc_traits.h>)
#define HEAPPROF_DETAIL_SMALL_ALLOC_TRAITS 1
#endif
#endif
#if defined(HEAPPROF_DETAIL_SMALL_ALLOC_TRAITS)
#include <bits/allocator.h>
#include <bits/alloc_traits.h>
#else
#include <memory>
#endif

#include "heapprof/detail/1_hooks/fast_path.hpp"
#include "heapprof/labels.hpp"

namespace heapprof {
namespace detail {

// heapprof::allocator's state: its upstream and its labels. An empty upstream
// (std::allocator) takes no room, as under C++20's [[no_unique_address]]: it
// is a base of this holder (the empty base optimization), and the holder a
// member of heapprof::allocator, so that the upstream's own conversions and
// operators never apply to heapprof::allocator. sizeof(heapprof::allocator<T>)
// is then one pointer, and a container's footprint grows by that alone.
template <class Upstream, bool = std::is_empty<Upstream>::value && !std::is_final<Upstream>::value>
class AllocatorState : private Upstream {
 public:
  template <class U = Upstream, typename std::enable_if<std::is_default_constructible<U>::value, int>::type = 0>
  constexpr AllocatorState() noexcept(std::is_nothrow_default_constructible<U>::value) : Upstream(), labels_() {}
  constexpr AllocatorState(const Upstream& upstream, const LabelSet& labels) noexcept(
      std::is_nothrow_copy_constructible<Upstream>::value)
      : Upstream(upstream), labels_(labels) {}
  constexpr Upstream& upstream() noexcept { return *this; }
  constexpr const Upstream& upstream() const noexcept { return *this; }
  constexpr const LabelSet& labels() const noexcept { return labels_; }

 private:
  LabelSet labels_;
};
template <class Upstream>
class AllocatorState<Upstream, false> {
 public:
  template <class U = Upstream, typename std::enable_if<std::is_default_constructible<U>::value, int>::type = 0>
  constexpr AllocatorState() noexcept(std::is_nothrow_default_constructible<U>::value) : upstream_(), labels_() {}
  constexpr AllocatorState(const Upstream& upstream, const LabelSet& labels) noexcept(
      std::is_nothrow_copy_constructible<Upstream>::value)
      : upstream_(upstream), labels_(labels) {}
  constexpr Upstream& upstream() noexcept { return upstream_; }
  constexpr const Upstream& upstream() const noexcept { return upstream_; }
  constexpr const LabelSet& labels() const noexcept { return labels_; }

 private:
  Upstream upstream_;
  LabelSet labels_;
};

}  // namespace detail

template <class T, class Upstream = std::allocator<T>>
class allocator {
  using upstream_traits = std::allocator_traits<Upstream>;
  static_assert(std::is_same<typename upstream_traits::value_type, T>::value,
                "Upstream must allocate T (rebind it first)");
  static_assert(std::is_same<typename upstream_traits::pointer, T*>::value,
                "heapprof::allocator needs an upstream with raw pointers");

 public:
  using value_type = T;
  using upstream_type = Upstream;
  using pointer = T*;
  using const_pointer = const T*;
  using size_type = typename upstream_traits::size_type;
  using difference_type = typename upstream_traits::difference_type;
  using propagate_on_container_copy_assignment = typename upstream_traits::propagate_on_container_copy_assignment;
  using propagate_on_container_move_assignment = typename upstream_traits::propagate_on_container_move_assignment;
  using propagate_on_container_swap = typename upstream_traits::propagate_on_container_swap;
  using is_always_equal = typename upstream_traits::is_always_equal;

  template <class U>
  struct rebind {
    using other = allocator<U, typename upstream_traits::template rebind_alloc<U>>;
  };

  // Every member in the initializer lists: g++ -Weffc++ warns in each unit that
  // instantiates a constructor without (a defaulted one included). A template,
  // so that an allocator of an Upstream without a default constructor has none
  // either (std::is_default_constructible says so), as with `= default`.
  // constexpr, as std::allocator's are in C++20: a namespace-scope
  // std::vector<T, heapprof::allocator<T>> is then constant-initialized like a
  // std::vector<T> (and may be constinit), so another unit's static
  // constructor can fill it before this unit's initializers run. Not
  // constexpr, it was initialized dynamically, in its unit's turn: a registry
  // filled earlier was emptied again (its elements lost, its buffer leaked).
  template <class U = Upstream, typename std::enable_if<std::is_default_constructible<U>::value, int>::type = 0>
  constexpr allocator() noexcept(std::is_nothrow_default_constructible<U>::value) : state_() {}
  constexpr explicit allocator(const Upstream& upstream) noexcept(std::is_nothrow_copy_constructible<Upstream>::value)
      : state_(upstream, LabelSet()) {}
  // Every allocation gets `labels`, merged over the allocating thread's set.
  constexpr explicit allocator(const LabelSet& labels, const Upstream& upstream = Upstream()) noexcept(
      std::is_nothrow_copy_constructible<Upstream>::value)
      : state_(upstream, labels) {}
  template <class U, class UpstreamU>
  constexpr allocator(const allocator<U, UpstreamU>& other) noexcept  // NOLINT: implicit, as rebinding requires
      : state_(Upstream(other.upstream()), other.labels()) {}

  // noinline: its return address is the sample's leaf (the container code).
  HEAPPROF_NOINLINE T* allocate(size_type n) {
#if HEAPPROF_ENABLED
    T* p;
    std::uint8_t since;
    {
      detail::AllocatorScope scope(nullptr);
      since = scope.base();
      p = upstream_traits::allocate(state_.upstream(), n);
    }
    if (HEAPPROF_UNLIKELY(detail::tls_thread_flags.scope_blocks != since)) {
      detail::SettleAllocatorScope(p, static_cast<std::size_t>(n) * sizeof(T), since);
    }
    // Restored, not cleared: a signal handler's allocate may run inside
    // another's, which then samples with its own labels still.
    const detail::LabelSetData* outer = detail::tls_allocator_labels;
    detail::tls_allocator_labels = state_.labels().data();
    detail::OnAlloc(p, static_cast<std::size_t>(n) * sizeof(T), __builtin_return_address(0));
    detail::tls_allocator_labels = outer;
    return p;
#else
    return upstream_traits::allocate(state_.upstream(), n);
#endif
  }

  void deallocate(T* p, size_type n) noexcept {
    if (p == nullptr) return;
    // Before the memory is reused. True: a signal handler freed a sampled
    // object while its thread held the lock its removal needs; the profiler
    // then releases it once that lock is let go, through ReleaseLater. Only
    // an upstream without state can be made again there; a free through one
    // with state is counted now and its sampled entry retired later.
    if (detail::OnFree(p, static_cast<std::size_t>(n) * sizeof(T), DeferredRelease())) return;
    detail::AllocatorScope scope(p);
    upstream_traits::deallocate(state_.upstream(), p, n);
  }

  // Elements are made and destroyed by the upstream, as without heapprof: a
  // std::pmr::polymorphic_allocator or std::scoped_allocator_adaptor passes
  // its resource to elements that take an allocator (uses-allocator
  // construction), so a pmr::string in the container allocates from the
  // container's resource. (allocator_traits' default, placement new, would
  // give such elements the default resource instead.)
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    upstream_traits::construct(state_.upstream(), p, std::forward<Args>(args)...);
  }
  template <class U>
  void destroy(U* p) {
    upstream_traits::destroy(state_.upstream(), p);
  }

  size_type max_size() const noexcept { return upstream_traits::max_size(state_.upstream()); }

  allocator select_on_container_copy_construction() const {
    return allocator(state_.labels(), upstream_traits::select_on_container_copy_construction(state_.upstream()));
  }

  constexpr const Upstream& upstream() const noexcept { return state_.upstream(); }
  constexpr const LabelSet& labels() const noexcept { return state_.labels(); }

  // Equal when the upstreams are: labels are attribution, not ownership, so
  // memory from one is always freeable by the other exactly when the
  // upstreams say so.
  template <class U, class UpstreamU>
  friend constexpr bool operator==(const allocator& a, const allocator<U, UpstreamU>& b) noexcept {
    return a.upstream() == b.upstream();
  }
  template <class U, class UpstreamU>
  friend constexpr bool operator!=(const allocator& a, const allocator<U, UpstreamU>& b) noexcept {
    return !(a == b);
  }

 private:
  // std::allocator and its kind: any instance frees what another allocated.
  static constexpr bool kStateless = std::is_empty<Upstream>::value &&
                                     std::is_nothrow_default_constructible<Upstream>::value &&
                                     upstream_traits::is_always_equal::value;
  // ReleaseLater for a stateless upstream, else none. Named only in the
  // discarded branch otherwise: its body default-constructs the upstream,
  // which an upstream with state need not allow (an arena's handle), and
  // `kStateless ? &ReleaseLater : nullptr` instantiated it for every upstream.
  static constexpr detail::ReleaseFn DeferredRelease() noexcept {
    if constexpr (kStateless) {
      return &ReleaseLater;
    } else {
      return nullptr;
    }
  }
  static void ReleaseLater(void* p, std::size_t bytes) noexcept {
    Upstream upstream;
    detail::AllocatorScope scope(p);
    upstream_traits::deallocate(upstream, static_cast<T*>(p), static_cast<size_type>(bytes / sizeof(T)));
  }

  detail::AllocatorState<Upstream> state_;
};

}  // namespace heapprof

#endif  // HEAPPROF_CXX17
