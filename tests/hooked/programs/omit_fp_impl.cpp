// The implementation unit of tests/hooked/programs/omit_fp_main.cpp, built
// with -O2 -fomit-frame-pointer (CMakeLists.txt, meson.build) while the
// program's own code keeps frame pointers: the hooks and their cold halves
// may then use rbp as a general register.
#define HEAPPROF_REPLACE_NEW_DELETE
#define HEAPPROF_REPLACE_MALLOC
#include <heapprof.hpp>
