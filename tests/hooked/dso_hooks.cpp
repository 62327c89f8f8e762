// A plugin that (wrongly) defines heapprof's hooks: the hooked tests dlopen it
// in a child process and expect the one stderr line saying they never take
// effect (hook_check.hpp). Built as a module like dso.cpp, its path passed as
// HEAPPROF_HOOKS_PLUGIN_PATH.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

extern "C" __attribute__((visibility("default"))) int heapprof_hooks_plugin_alloc() {
  int* p = new int(42);
  const int v = *p;
  delete p;
  return v;
}
