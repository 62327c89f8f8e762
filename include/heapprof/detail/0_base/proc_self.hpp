// heapprof: the process's files under /proc, as the calling thread sees them.
//
// A program whose main() ends with pthread_exit() goes on running on its
// other threads, and /proc/self then names the exited main thread: its
// maps, statm and cmdline read empty, its mem reads nothing, its exe cannot
// be followed, and process_vm_readv(getpid()) fails with ESRCH. The leak
// report and the retention scan then saw no memory at all, and the memory
// limit's reads saw no use. /proc/thread-self (Linux 3.17) names the calling
// thread, whose files show the same process; the thread's own id works for
// process_vm_readv. Before 3.17, or with a /proc that lacks it: /proc/self.
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace heapprof {
namespace detail {

// 1 once /proc/thread-self was seen (it never goes away); otherwise it is
// looked for again at each use (a /proc mounted later: a chroot's set-up).
inline std::atomic<int> g_thread_self_seen{0};

inline bool HaveThreadSelf() noexcept {
  if (g_thread_self_seen.load(std::memory_order_relaxed) != 0) return true;
  if (::access("/proc/thread-self/", F_OK) != 0) return false;
  g_thread_self_seen.store(1, std::memory_order_relaxed);
  return true;
}

// "/proc/thread-self/<leaf>" or "/proc/self/<leaf>". For the files of the
// process's memory and identity (maps, mem, pagemap, statm, exe, cmdline,
// status, mountinfo, cgroup), which a thread's directory has too; not for
// task/ or map_files/, which only the process's has.
class ProcSelfPath {
 public:
  explicit ProcSelfPath(const char* leaf) noexcept {
    std::snprintf(path_, sizeof path_, "%s/%s", HaveThreadSelf() ? "/proc/thread-self" : "/proc/self", leaf);
  }
  const char* c_str() const noexcept { return path_; }

 private:
  char path_[48];
};

// The program's file as /proc names it for the calling thread.
inline const char* ProcSelfExe() noexcept { return HaveThreadSelf() ? "/proc/thread-self/exe" : "/proc/self/exe"; }

// The id process_vm_readv reads this process by from the calling thread.
inline pid_t SelfTaskId() noexcept { return static_cast<pid_t>(::syscall(SYS_gettid)); }

}  // namespace detail
}  // namespace heapprof
