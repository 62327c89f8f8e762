// The registry pattern (static_init in check.sh): a namespace-scope container
// that other units' static constructors fill, whatever order the units'
// initializers run in. With std::allocator (C++20) the vector is
// constant-initialized, before any constructor runs; heapprof::allocator's
// constructors must be constexpr for the same to hold (constinit says so).
#include <heapprof.hpp>

#include <vector>

constinit std::vector<int, heapprof::allocator<int>> g_registry;
constinit std::vector<int, heapprof::allocator<int>> g_labeled_registry{heapprof::allocator<int>()};

int Register(int id) {
  g_registry.push_back(id);
  g_labeled_registry.push_back(id);
  return id;
}
