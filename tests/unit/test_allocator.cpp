// heapprof::allocator in every allocator-aware container, without the global
// operator new replacement (this executable has none): each allocation the
// containers make is counted exactly once, with the exact bytes.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <deque>
#include <list>
#include <map>
#include <memory_resource>
#include <string>
#include <unordered_map>
#include <vector>

#include "support/profile_io.hpp"

namespace {

// An upstream that counts what it hands out, to compare with Stats.
struct Ledger {
  std::uint64_t allocations = 0, bytes = 0, deallocations = 0, freed_bytes = 0;
};
Ledger g_ledger;

template <class T>
struct CountingUpstream {
  using value_type = T;
  CountingUpstream() = default;
  template <class U>
  CountingUpstream(const CountingUpstream<U>&) noexcept {}
  T* allocate(std::size_t n) {
    ++g_ledger.allocations;
    g_ledger.bytes += n * sizeof(T);
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ++g_ledger.deallocations;
    g_ledger.freed_bytes += n * sizeof(T);
    std::allocator<T>().deallocate(p, n);
  }
  friend bool operator==(const CountingUpstream&, const CountingUpstream&) { return true; }
  friend bool operator!=(const CountingUpstream&, const CountingUpstream&) { return false; }
};

template <class T>
using Alloc = heapprof::allocator<T, CountingUpstream<T>>;

template <class Body>
void CheckCountedOnce(Body&& body) {
  g_ledger = Ledger{};
  const heapprof::Stats s0 = heapprof::GetStats();
  body();
  const heapprof::Stats s1 = heapprof::GetStats();
  CHECK(g_ledger.allocations > 0);
  CHECK(s1.alloc_objects - s0.alloc_objects == g_ledger.allocations);
  CHECK(s1.alloc_bytes - s0.alloc_bytes == g_ledger.bytes);
  CHECK(s1.free_objects - s0.free_objects == g_ledger.deallocations);
  CHECK(s1.free_bytes - s0.free_bytes == g_ledger.freed_bytes);
  CHECK(g_ledger.allocations == g_ledger.deallocations);
}

struct Row {
  int id;
  double value;
};

using String = std::basic_string<char, std::char_traits<char>, Alloc<char>>;

}  // namespace

TEST_CASE("allocator: vector, deque, list, map, unordered_map, basic_string") {
  const std::size_t saved = heapprof::GetSampleRate();
  heapprof::SetSampleRate(1);
  CheckCountedOnce([] {
    std::vector<Row, Alloc<Row>> v;
    for (int i = 0; i < 1000; ++i) v.push_back(Row{i, i * 0.5});
  });
  CheckCountedOnce([] {
    std::deque<int, Alloc<int>> d;
    for (int i = 0; i < 5000; ++i) d.push_front(i);
  });
  CheckCountedOnce([] {
    std::list<int, Alloc<int>> l(100, 7);
    l.remove(7);
  });
  CheckCountedOnce([] {
    std::map<int, int, std::less<int>, Alloc<std::pair<const int, int>>> m;
    for (int i = 0; i < 500; ++i) m[i] = i;
  });
  CheckCountedOnce([] {
    std::unordered_map<int, String, std::hash<int>, std::equal_to<int>, Alloc<std::pair<const int, String>>> m;
    for (int i = 0; i < 500; ++i) m.emplace(i, String(100, 'x'));
  });
  CheckCountedOnce([] {
    String s;
    for (int i = 0; i < 100; ++i) s += "a longer string than the small buffer";
  });
  heapprof::SetSampleRate(saved);
}

namespace {
std::vector<int, heapprof::allocator<int>>* g_vec;
__attribute__((noinline)) void AllocatorLeafCaller() {
  g_vec = new std::vector<int, heapprof::allocator<int>>();
  g_vec->reserve(12345);
  asm volatile("" ::: "memory");
}
}  // namespace

TEST_CASE("allocator: samples are attributed to the container code, in the profile") {
  using namespace heapprof_test;
  const std::size_t saved = heapprof::GetSampleRate();
  heapprof::SetSampleRate(1);
  AllocatorLeafCaller();
  Profile p;
  std::string why;
  REQUIRE_MESSAGE(CaptureProfile(p, false, nullptr, &why), why);
  REQUIRE_MESSAGE(Validate(p, &why), why);
  // The global operator new is not replaced here: only the allocator counts.
  bool found = false;
  for (const Sample& s : p.samples) {
    const std::vector<std::string> names = FunctionNames(p, s);
    bool has_caller = false;
    for (const std::string& n : names) has_caller |= n.find("AllocatorLeafCaller") != std::string::npos;
    if (!has_caller) continue;
    found = true;
    CHECK(s.values.at(1) == 12345 * static_cast<std::int64_t>(sizeof(int)));
    // No heapprof function in the stack (std:: frames may name heapprof types
    // in their template arguments: at -O0 allocator_traits is the leaf).
    for (const std::string& n : names) CHECK(n.rfind("heapprof::", 0) == std::string::npos);
  }
  CHECK(found);
  delete g_vec;
  heapprof::SetSampleRate(saved);
}

namespace {
// An empty upstream that cannot be a base class.
template <class T>
struct FinalUpstream final {
  using value_type = T;
  FinalUpstream() = default;
  template <class U>
  FinalUpstream(const FinalUpstream<U>&) noexcept {}  // NOLINT: implicit, as rebinding requires
  T* allocate(std::size_t n) { return std::allocator<T>().allocate(n); }
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
};
template <class T, class U>
bool operator==(const FinalUpstream<T>&, const FinalUpstream<U>&) noexcept {
  return true;
}
template <class T, class U>
bool operator!=(const FinalUpstream<T>&, const FinalUpstream<U>&) noexcept {
  return false;
}
}  // namespace

// The labels are the allocator's one word: an empty upstream takes no room,
// so a container grows by a pointer, not by two.
TEST_CASE("allocator: one pointer over an empty upstream; a stateful or final one keeps its own room") {
  static_assert(sizeof(heapprof::allocator<int>) == sizeof(void*), "std::allocator takes no room");
  static_assert(sizeof(std::vector<int, heapprof::allocator<int>>) == sizeof(std::vector<int>) + sizeof(void*),
                "a vector grows by the labels alone");
  static_assert(sizeof(heapprof::allocator<int, std::pmr::polymorphic_allocator<int>>) == 2 * sizeof(void*),
                "the resource pointer and the labels");
  static_assert(sizeof(heapprof::allocator<int, FinalUpstream<int>>) == 2 * sizeof(void*), "a member, padded");
  // The final upstream works as any: allocates, rebinds, compares.
  heapprof::allocator<int, FinalUpstream<int>> a;
  heapprof::allocator<double, FinalUpstream<double>> b(a);
  CHECK(a == b);
  std::vector<int, heapprof::allocator<int, FinalUpstream<int>>> v(a);
  v.assign(100, 7);
  CHECK(v[99] == 7);
  // Labels survive the rebinding copy whatever the upstream's layout.
  const heapprof::LabelSet labels{{"k", "v"}};
  heapprof::allocator<int> la(labels);
  heapprof::allocator<double> lb(la);
  CHECK(lb.labels() == labels);
}

TEST_CASE("allocator: rebinds, compares like its upstream, propagates like its upstream") {
  using A = heapprof::allocator<int>;
  using Traits = std::allocator_traits<A>;
  static_assert(std::is_same<Traits::rebind_alloc<double>, heapprof::allocator<double, std::allocator<double>>>::value,
                "rebind");
  static_assert(Traits::is_always_equal::value, "std::allocator is always equal");
  // Default-constructible exactly when the upstream is, and nothrow when it is.
  static_assert(std::is_nothrow_default_constructible<A>::value, "as std::allocator");
  static_assert(std::is_nothrow_default_constructible<heapprof::allocator<int, std::pmr::polymorphic_allocator<int>>>::value ==
                    std::is_nothrow_default_constructible<std::pmr::polymorphic_allocator<int>>::value,
                "as the upstream");
  struct NoDefault {
    using value_type = int;
    explicit NoDefault(int) {}
    int* allocate(std::size_t n) { return std::allocator<int>().allocate(n); }
    void deallocate(int* p, std::size_t n) noexcept { std::allocator<int>().deallocate(p, n); }
  };
  static_assert(!std::is_default_constructible<heapprof::allocator<int, NoDefault>>::value, "as the upstream");
  static_assert(std::is_constructible<heapprof::allocator<int, NoDefault>, const NoDefault&>::value, "from one");
  CHECK(A() == heapprof::allocator<double>());

  using P = heapprof::allocator<int, std::pmr::polymorphic_allocator<int>>;
  using PTraits = std::allocator_traits<P>;
  static_assert(!PTraits::is_always_equal::value, "pmr is stateful");
  static_assert(!PTraits::propagate_on_container_copy_assignment::value, "pmr does not propagate");
  static_assert(!PTraits::propagate_on_container_move_assignment::value, "pmr does not propagate");
  std::pmr::monotonic_buffer_resource r1, r2;
  P a{std::pmr::polymorphic_allocator<int>(&r1)};
  P b{std::pmr::polymorphic_allocator<int>(&r2)};
  CHECK(a == P{std::pmr::polymorphic_allocator<int>(&r1)});
  CHECK(a != b);
  // A container on a pmr resource: counted by us, served by the resource.
  const heapprof::Stats s0 = heapprof::GetStats();
  {
    std::vector<int, P> v(a);
    v.resize(1000);
    CHECK(v.get_allocator() == a);
  }
  const heapprof::Stats s1 = heapprof::GetStats();
  CHECK(s1.alloc_bytes - s0.alloc_bytes == 1000 * sizeof(int));
  CHECK(s1.free_bytes - s0.free_bytes == 1000 * sizeof(int));
}

namespace {
// A resource that counts what it serves, to see where elements allocate.
struct CountingResource : std::pmr::memory_resource {
  std::size_t bytes = 0;
  void* do_allocate(std::size_t n, std::size_t align) override {
    bytes += n;
    return std::pmr::new_delete_resource()->allocate(n, align);
  }
  void do_deallocate(void* p, std::size_t n, std::size_t align) override {
    std::pmr::new_delete_resource()->deallocate(p, n, align);
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
};
}  // namespace

TEST_CASE("allocator: elements are constructed by the upstream (pmr uses-allocator construction)") {
  // Without heapprof a pmr::vector<pmr::string> gives each string the
  // vector's resource; wrapped in heapprof::allocator it must still.
  using Upstream = std::pmr::polymorphic_allocator<std::pmr::string>;
  using A = heapprof::allocator<std::pmr::string, Upstream>;
  CountingResource resource;
  {
    std::vector<std::pmr::string, A> v{A(Upstream(&resource))};
    v.reserve(4);
    const std::size_t vector_bytes = resource.bytes;
    CHECK(vector_bytes == 4 * sizeof(std::pmr::string));
    v.emplace_back(1000, 'x');  // longer than the small-string buffer
    CHECK(v[0].get_allocator().resource() == &resource);
    CHECK(resource.bytes == vector_bytes + 1001);
  }
  // Nodes of a map: the pair's pmr::string gets the map's resource too.
  using PairUpstream = std::pmr::polymorphic_allocator<std::pair<const int, std::pmr::string>>;
  using M = std::map<int, std::pmr::string, std::less<int>, heapprof::allocator<std::pair<const int, std::pmr::string>, PairUpstream>>;
  CountingResource map_resource;
  {
    M m{M::allocator_type(PairUpstream(&map_resource))};
    m.emplace(1, std::string(500, 'y'));
    CHECK(m.at(1).get_allocator().resource() == &map_resource);
  }
}

#if HEAPPROF_ENABLED
// The free filter's bits (1_hooks/fast_path.hpp): a bit is set while a live
// sampled object hashes to its counter and cleared when none does, so a
// sampled object's free is always found (MaybeSampled) and the unsampled free
// of an address that once hashed there reads 0 again.
TEST_CASE("free filter: a bit per counter, set while a live sampled object hashes there") {
  namespace hd = heapprof::detail;
  const std::size_t saved = heapprof::GetSampleRate();
  heapprof::SetSampleRate(1);
  heapprof::allocator<char> a;
  constexpr int kBlocks = 3000;
  auto size = [](int i) { return 16 + static_cast<std::size_t>(i % 7) * 8; };
  std::vector<char*> blocks;
  blocks.reserve(kBlocks);
  for (int i = 0; i < kBlocks; ++i) blocks.push_back(a.allocate(size(i)));
  auto counter = [](const void* p) { return hd::LoadRelaxed(hd::g_free_filter[hd::FreeFilterIndex(p)]); };
  int set = 0;
  for (char* p : blocks) {
    set += hd::MaybeSampled(p) ? 1 : 0;
    CHECK(counter(p) != 0);
  }
  CHECK(set == kBlocks);  // every sampled object: its free will look it up
  for (int i = 0; i < kBlocks; ++i) a.deallocate(blocks[static_cast<std::size_t>(i)], size(i));
  // Freed: each address's bit equals "its counter is not 0" (other live
  // sampled objects may share a counter; none of ours is left).
  int stale = 0, cleared = 0;
  for (char* p : blocks) {
    stale += hd::MaybeSampled(p) != (counter(p) != 0) ? 1 : 0;
    cleared += hd::MaybeSampled(p) ? 0 : 1;
  }
  CHECK(stale == 0);
  CHECK(cleared > kBlocks / 2);  // 3,000 of 65,536 counters: most had no other object
  heapprof::SetSampleRate(saved);
}
#endif  // HEAPPROF_ENABLED

namespace {
// An arena's handle: no default constructor (as allocators need not have).
template <class T>
struct HandleUpstream {
  using value_type = T;
  int* arena;
  explicit HandleUpstream(int* a) noexcept : arena(a) {}
  template <class U>
  HandleUpstream(const HandleUpstream<U>& o) noexcept : arena(o.arena) {}  // NOLINT: implicit, as rebinding requires
  T* allocate(std::size_t n) {
    ++*arena;
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    --*arena;
    std::allocator<T>().deallocate(p, n);
  }
};
template <class T, class U>
bool operator==(const HandleUpstream<T>& a, const HandleUpstream<U>& b) noexcept {
  return a.arena == b.arena;
}
template <class T, class U>
bool operator!=(const HandleUpstream<T>& a, const HandleUpstream<U>& b) noexcept {
  return a.arena != b.arena;
}
// The same without state: empty, yet made only from a tag.
template <class T>
struct TaggedUpstream {
  using value_type = T;
  explicit TaggedUpstream(int) noexcept {}
  template <class U>
  TaggedUpstream(const TaggedUpstream<U>&) noexcept {}  // NOLINT: implicit, as rebinding requires
  T* allocate(std::size_t n) { return std::allocator<T>().allocate(n); }
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
};
template <class T, class U>
bool operator==(const TaggedUpstream<T>&, const TaggedUpstream<U>&) noexcept {
  return true;
}
template <class T, class U>
bool operator!=(const TaggedUpstream<T>&, const TaggedUpstream<U>&) noexcept {
  return false;
}
}  // namespace

// deallocate named ReleaseLater (the deferred release of a stateless
// upstream, which default-constructs one) for every upstream: an upstream
// without a default constructor did not compile as soon as a container freed.
TEST_CASE("allocator: an upstream without a default constructor allocates and frees") {
  static_assert(!std::is_default_constructible<heapprof::allocator<int, HandleUpstream<int>>>::value, "none either");
  int arena = 0;
  {
    std::vector<int, heapprof::allocator<int, HandleUpstream<int>>> v{
        heapprof::allocator<int, HandleUpstream<int>>(HandleUpstream<int>(&arena))};
    for (int i = 0; i < 1000; ++i) v.push_back(i);
    CHECK(v[999] == 999);
    CHECK(arena == 1);
  }
  CHECK(arena == 0);
  std::vector<long, heapprof::allocator<long, TaggedUpstream<long>>> w{
      heapprof::allocator<long, TaggedUpstream<long>>(TaggedUpstream<long>(1))};
  w.assign(1000, 7);
  w.shrink_to_fit();
  CHECK(w[999] == 7);
}

namespace {
// An upstream whose constructors and == are constexpr, as std::allocator's
// are from C++20 on: heapprof::allocator over it must be a literal type too.
template <class T>
struct LiteralUpstream {
  using value_type = T;
  constexpr LiteralUpstream() noexcept = default;
  template <class U>
  constexpr LiteralUpstream(const LiteralUpstream<U>&) noexcept {}  // NOLINT: implicit, as rebinding requires
  T* allocate(std::size_t n) { return std::allocator<T>().allocate(n); }
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
  template <class U>
  constexpr bool operator==(const LiteralUpstream<U>&) const noexcept {
    return true;
  }
  template <class U>
  constexpr bool operator!=(const LiteralUpstream<U>&) const noexcept {
    return false;
  }
};
constexpr heapprof::allocator<int, LiteralUpstream<int>> kLiteral{};
constexpr heapprof::allocator<long, LiteralUpstream<long>> kLiteralRebound(kLiteral);
static_assert(kLiteral == kLiteralRebound, "compared at compile time");
static_assert(kLiteralRebound.labels().empty(), "no labels");
#if __cplusplus >= 202002L
// What the constexpr constructors are for: constant initialization of a
// namespace-scope container, as with std::allocator (check.sh: static_init).
constinit std::vector<int, heapprof::allocator<int>> g_constinit_registry;
#endif
}  // namespace

// A namespace-scope container of another unit may be filled by a static
// constructor that runs before this unit's initializers: with std::allocator
// (C++20) the container is constant-initialized, so nothing empties it later.
// heapprof::allocator's constructors were not constexpr: such a container was
// initialized dynamically, and what was pushed into it before was lost.
TEST_CASE("allocator: constexpr constructors, as std::allocator's (constant initialization)") {
  CHECK(kLiteral == kLiteralRebound);
  std::vector<int, heapprof::allocator<int, LiteralUpstream<int>>> v(kLiteral);
  v.assign(100, 3);
  CHECK(v[99] == 3);
#if __cplusplus >= 202002L
  g_constinit_registry.push_back(1);
  CHECK(g_constinit_registry.size() == 1);
#endif
}
