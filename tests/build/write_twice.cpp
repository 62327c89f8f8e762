// Writes two heap profiles. Linked alone: undefined references naming
// HEAPPROF_IMPLEMENTATION. Linked with an implementation unit that does not
// replace operator new: one stderr line says the hooks are not installed.
#include <heapprof.hpp>

#include <sstream>

int main() {
  std::ostringstream a, b;
  return heapprof::WriteHeapProfile(a) && heapprof::WriteHeapProfile(b) ? 0 : 1;
}
