// libheapprof_preload.so: heapprof for a program that cannot be rebuilt.
//
//   LD_PRELOAD=/usr/local/lib/libheapprof_preload.so HEAPPROF=http=127.0.0.1:6060 ./server
//
// Both hook families (the malloc family and operator new/delete) and the
// whole engine; configured by the HEAPPROF variable alone (README: HEAPPROF),
// which starts the HTTP server, the periodic dumps and the exit actions when
// the library is loaded.
#define HEAPPROF_REPLACE_MALLOC
#define HEAPPROF_REPLACE_NEW_DELETE
#define HEAPPROF_PRELOAD_LIBRARY
#include <heapprof.hpp>
