// heapprof: the program's own file when /proc/self/exe cannot be read (no
// /proc: a chroot, a minimal container, a build sandbox). The kernel's
// AT_EXECFN is the name the program was started by; a relative one
// ("./server") is made absolute against the working directory at start-up,
// since a daemon changes directory later. Only a fallback: whoever opens it
// checks the file's build id against the loaded program's.
#pragma once

#include <sys/auxv.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "heapprof/detail/0_base/proc_self.hpp"

namespace heapprof {
namespace detail {

struct ExecPathAtStart {
  std::atomic<bool> known{false};
  char path[4096] = {};
};
inline ExecPathAtStart g_exec_path;

// Once, at start-up (EnsureInit): no allocation, one getcwd at most.
inline void RememberExecPath() noexcept {
  const auto* name = reinterpret_cast<const char*>(::getauxval(AT_EXECFN));
  if (name == nullptr || name[0] == '\0') return;
  ExecPathAtStart& e = g_exec_path;
  std::size_t at = 0;
  if (name[0] != '/') {
    if (::getcwd(e.path, sizeof e.path) == nullptr) return;
    at = std::strlen(e.path);
    if (at > 0 && e.path[at - 1] != '/') e.path[at++] = '/';
  }
  const std::size_t n = std::strlen(name);
  if (at + n >= sizeof e.path) return;
  std::memcpy(e.path + at, name, n + 1);
  e.known.store(true, std::memory_order_release);
}

// The path RememberExecPath found, or nullptr.
inline const char* ExecPathFromStart() noexcept {
  return g_exec_path.known.load(std::memory_order_acquire) ? g_exec_path.path : nullptr;
}

// A name that opens the program's file: /proc's exe link (proc_self.hpp), or
// without /proc the name it was started by; nullptr when there is neither.
inline const char* SelfExeFile() noexcept {
  const char* exe = ProcSelfExe();
  return ::access(exe, F_OK) == 0 ? exe : ExecPathFromStart();
}

}  // namespace detail
}  // namespace heapprof
