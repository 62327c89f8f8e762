// heapprof: which loaded object holds an address, without dladdr's symbol
// search (start-up's hook and allocator checks ask it a dozen times).
#pragma once

#include <dlfcn.h>
#include <link.h>

namespace heapprof {
namespace detail {

// The loaded object that holds `addr`: its start and its link map (dladdr1's
// dli_fbase and RTLD_DL_LINKMAP). False if none. glibc 2.35's
// _dl_find_object answers from the loader's sorted table; dladdr also
// searches the object's symbols for the nearest one: ~80,000 instructions
// for an address in libc, and start-up asked 12 times (0.9M instructions, a
// third of a small program's whole run). dladdr1 stays the fallback (older
// glibc, an object the table does not hold yet).
inline bool ObjectMapOf(const void* addr, const void*& base, link_map*& map) noexcept {
#if defined(__GLIBC__) && defined(__GLIBC_PREREQ)
#if __GLIBC_PREREQ(2, 35)
  dl_find_object found;
  if (_dl_find_object(const_cast<void*>(addr), &found) == 0 && found.dlfo_link_map != nullptr) {
    base = found.dlfo_map_start;
    map = found.dlfo_link_map;
    return base != nullptr;
  }
#endif
#endif
  Dl_info info{};
  map = nullptr;
  if (dladdr1(addr, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 || map == nullptr) return false;
  base = info.dli_fbase;
  return base != nullptr;
}

// The start of the object that holds `addr` (dladdr's dli_fbase), or nullptr.
inline const void* ObjectBaseOf(const void* addr) noexcept {
  const void* base = nullptr;
  link_map* map = nullptr;
  return ObjectMapOf(addr, base, map) ? base : nullptr;
}

// The file name of the object that holds `addr` (dladdr's dli_fname: the
// link map's l_name; "" for the main program), or nullptr.
inline const char* ObjectFileOf(const void* addr) noexcept {
  const void* base = nullptr;
  link_map* map = nullptr;
  return ObjectMapOf(addr, base, map) ? map->l_name : nullptr;
}

// dlsym for a symbol that may be absent, leaving no error behind. A failed
// dlsym stores its message in the thread's dlerror state, with (the first
// time on that thread) a block that holds it, allocated inside the profiler:
// unrecorded, or in malloc's bootstrap buffer while the hooks resolve. The
// program's next failed dl* call put its own message, a recorded block, in
// that holder: at rate 1 the leak report called it unreachable (a leak for
// leak_exit_code: libomp, a plugin probe, any dlsym of an optional symbol),
// and the program's first dlerror() returned ours ("undefined symbol:
// heapprof_preload_engine_v1"). dlerror() twice: the message, then the
// holder freed (in the scope that allocated it) and the state empty.
inline void* FindSymbol(void* handle, const char* name) noexcept {
  void* f = dlsym(handle, name);
  if (f == nullptr) {
    for (int i = 0; i < 3 && dlerror() != nullptr; ++i) {
    }
  }
  return f;
}

}  // namespace detail
}  // namespace heapprof
