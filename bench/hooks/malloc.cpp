// The implementation unit of the bench_*_heapprof builds whose source names
// this file: heapprof compiled once, with the malloc family's hooks and the
// global operator new/delete hooks, in a unit of its own (see new_delete.cpp).
#define HEAPPROF_REPLACE_MALLOC
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>
