// The unit of heapprof's Stats for the global hooks: the allocator's usable
// size of a block (README: "What Stats count"). The tests compute expected
// totals with it.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <malloc.h>

namespace heapprof_test {

// The usable size malloc gives a block of `n` bytes: a block's size class.
// (glibc may hand out a chunk up to 31 bytes larger when the rest of a split
// would be too small to keep; tests that cannot tolerate that ask each block.)
// Call it before a measurement: its malloc and free are counted too.
inline std::size_t UsableFor(std::size_t n) {
  void* p = std::malloc(n);
  const std::size_t u = malloc_usable_size(p);
  std::free(p);
  return u;
}

}  // namespace heapprof_test
