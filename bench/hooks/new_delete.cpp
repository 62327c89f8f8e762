// The implementation unit of the bench_*_heapprof builds whose source names
// this file: heapprof compiled once, with the global operator new/delete
// hooks, in a unit of its own, as README asks of a program. The workload's
// unit is then compiled the same in the plain and the hooked build (with the
// implementation in the same unit, GCC inlined the workload differently:
// bench_kv_heapprof ran 2.2M more memcpy calls in 200k operations than
// bench_kv_plain, work that was not heapprof's).
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>
