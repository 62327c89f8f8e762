// Fills static_init_registry.cpp's registry from a static constructor, which
// may run before or after that unit's initializers (check.sh links both
// orders): nothing registered may be lost.
#include <heapprof.hpp>

#include <cstdio>
#include <vector>

extern constinit std::vector<int, heapprof::allocator<int>> g_registry;
extern constinit std::vector<int, heapprof::allocator<int>> g_labeled_registry;
int Register(int id);

namespace {
const int registered = Register(7);
}  // namespace

int main() {
  std::printf("registered %d: registry holds %zu and %zu\n", registered, g_registry.size(), g_labeled_registry.size());
  return g_registry.size() == 1 && g_labeled_registry.size() == 1 ? 0 : 1;
}
