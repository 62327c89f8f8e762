// heapprof: hooks that never take effect, said once on stderr.
// A replacement operator new or malloc works only where the dynamic linker
// finds it first: the executable comes before every library, so hooks
// compiled into a dlopen'ed plugin (or a library after libstdc++/libc in the
// lookup order) are never called; the plugin's own `new` binds to the
// executable's or libstdc++'s, and the profile stays empty. At the static
// initialisation of the unit that defines the hooks, the object the dynamic
// linker resolves the symbol to is compared with the object holding this
// code. Included only by the hook definitions (new_delete.hpp, malloc.hpp).
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdio>

#include "heapprof/detail/0_base/object_base.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/1_hooks/fast_path.hpp"  // g_hook_families

namespace heapprof {
namespace detail {

// Internal linkage: its address is always this object's own code.
[[maybe_unused]] static void HookCheckAnchor() noexcept {}

struct MainProgramQuery {
  std::uintptr_t address;
  bool covered;
};

// dl_iterate_phdr lists the main program first.
inline int MainProgramCovers(dl_phdr_info* info, std::size_t, void* data) noexcept {
  auto* q = static_cast<MainProgramQuery*>(data);
  for (std::size_t i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (q->address >= lo && q->address - lo < ph.p_memsz) q->covered = true;
  }
  return 1;
}

// One line even when both hook families are compiled in.
inline bool g_hooks_not_in_effect_reported = false;

// `symbol`: a (mangled) name the hooks define; `hooks`: what they are called
// in the message; `family`: its bit in g_hook_families (snapshot.hpp), set
// when they are in effect.
inline void ReportHooksNotInEffect(const char* symbol, const char* hooks, unsigned family) noexcept {
#if !defined(HEAPPROF_PRELOAD_LIBRARY)  // the preload library says which engine records itself
  const void* own = reinterpret_cast<const void*>(&HookCheckAnchor);
  MainProgramQuery q{reinterpret_cast<std::uintptr_t>(own), false};
  dl_iterate_phdr(&MainProgramCovers, &q);
  if (q.covered) {  // the executable's always come first
    g_hook_families.fetch_or(family, std::memory_order_relaxed);
    return;
  }
  if (g_hooks_not_in_effect_reported) return;
  void* resolved = FindSymbol(RTLD_DEFAULT, symbol);
  Dl_info ours{}, theirs{};
  if (resolved == nullptr || dladdr(own, &ours) == 0 || dladdr(resolved, &theirs) == 0) return;
  if (ours.dli_fbase == theirs.dli_fbase) {
    g_hook_families.fetch_or(family, std::memory_order_relaxed);
    return;
  }
  g_hooks_not_in_effect_reported = true;
  const char* here = ours.dli_fname != nullptr && ours.dli_fname[0] != '\0' ? ours.dli_fname : "a shared object";
  const char* there = theirs.dli_fname != nullptr && theirs.dli_fname[0] != '\0' ? theirs.dli_fname : "the executable";
  char line[1536];
  std::snprintf(line, sizeof line,
                "heapprof: the %s hooks compiled into %s never take effect: the process's %s is the one in %s, "
                "which the dynamic linker finds first (hooks in a dlopen'ed plugin or a library never run). "
                "Define HEAPPROF_REPLACE_NEW_DELETE/HEAPPROF_REPLACE_MALLOC in a .cpp file of the executable, "
                "or preload libheapprof_preload.so\n",
                hooks, here, symbol, there);
  ReportRaw(line);
#else
  (void)symbol;
  (void)hooks;
  g_hook_families.fetch_or(family, std::memory_order_relaxed);
#endif
}

}  // namespace detail
}  // namespace heapprof
