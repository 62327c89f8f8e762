// The implementation unit, compiled with -DHEAPPROF_IMPLEMENTATION. Two of
// them in one program must not link.
#include <heapprof.hpp>
