// Replaces operator new/delete, but allocates only with malloc before it
// writes: the profile's stderr line must say that new/delete are hooked and
// malloc is not, not that the hooks are not installed (it did).
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cstdlib>
#include <sstream>

int main() {
  void* p = std::malloc(100);
  std::free(p);
  std::ostringstream a, b;
  return heapprof::WriteHeapProfile(a) && heapprof::WriteHeapProfile(b) ? 0 : 1;
}
