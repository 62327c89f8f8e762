// heapprof: whether the program's own threads have all ended.
//
// glibc ends a process with exit(0) when its last thread ends: a program
// whose main() calls pthread_exit() ends once its other threads have. The
// profiler's background threads (the dump thread, HEAPPROF=http's server)
// are threads too, and they never end by themselves: such a program never
// ended, and since those threads block every signal and its main thread was
// gone, a SIGTERM was never delivered either (only SIGKILL ended it). They
// ask here, about once a second, whether any thread but theirs is left, and
// when none is, the process ends as glibc would have ended it
// (startup.hpp: EndWithProgramThreads).
#pragma once

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace heapprof {
namespace detail {

// The profiler's own threads alive now: (pid << 32) | kernel thread id, 0
// for a free slot. A slot of another pid is free too: a forked child inherits
// its parent's marks, whose threads it does not have.
constexpr int kMaxOwnThreads = 16;
inline std::atomic<std::uint64_t> g_own_tids[kMaxOwnThreads] = {};

inline std::uint64_t OwnTidKey(long tid) noexcept {
  return (static_cast<std::uint64_t>(::getpid()) << 32) | static_cast<std::uint32_t>(tid);
}

// For the life of a profiler thread's loop.
class OwnThreadMark {
 public:
  OwnThreadMark() noexcept {
    const std::uint64_t key = OwnTidKey(syscall(SYS_gettid));
    const std::uint64_t pid = key >> 32;
    for (std::atomic<std::uint64_t>& slot : g_own_tids) {
      std::uint64_t seen = slot.load(std::memory_order_acquire);
      while (seen == 0 || (seen >> 32) != pid) {  // free, or a parent's
        if (slot.compare_exchange_weak(seen, key, std::memory_order_acq_rel)) {
          slot_ = &slot;
          key_ = key;
          return;
        }
      }
    }
  }
  ~OwnThreadMark() {
    if (slot_ == nullptr) return;
    std::uint64_t expected = key_;
    slot_->compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
  }
  OwnThreadMark(const OwnThreadMark&) = delete;
  OwnThreadMark& operator=(const OwnThreadMark&) = delete;

 private:
  std::uint64_t key_ = 0;
  std::atomic<std::uint64_t>* slot_ = nullptr;
};

inline bool IsOwnTid(long tid) noexcept {
  const std::uint64_t key = OwnTidKey(tid);
  for (const std::atomic<std::uint64_t>& slot : g_own_tids) {
    if (slot.load(std::memory_order_acquire) == key) return true;
  }
  return false;
}

// A task's state letter from /proc/self/task/TID/stat ('R', 'S', 'Z', ...):
// 'X' when it is gone, '?' when it cannot be told (no /proc). No allocation.
inline char TaskState(long tid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? 'X' : '?';
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return n == 0 ? 'X' : '?';
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the name may hold anything, ')' too
  return paren != nullptr && paren[1] == ' ' && paren[2] != '\0' ? paren[2] : '?';
}

// True when every thread of the process but the profiler's own has ended
// (the main thread a zombie, no other task alive). Keeps errno. Cheap while
// the main thread runs: one small file read.
inline bool ProgramThreadsGone() noexcept {
  const int saved = errno;
  const long pid = static_cast<long>(::getpid());
  bool gone = false;
  const char main_state = TaskState(pid);
  if ((main_state == 'Z' || main_state == 'X') && !IsOwnTid(pid)) {
    const int dir = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      gone = true;
      alignas(8) char buf[4096];
      for (;;) {
        const long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
        if (n < 0) gone = false;
        if (n <= 0 || !gone) break;
        for (long at = 0; at < n && gone;) {
          // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name
          std::uint16_t reclen;
          std::memcpy(&reclen, buf + at + 16, sizeof reclen);
          const char* name = buf + at + 19;
          if (name[0] >= '0' && name[0] <= '9') {
            long tid = 0;
            for (const char* c = name; *c >= '0' && *c <= '9'; ++c) tid = tid * 10 + (*c - '0');
            if (tid != pid && !IsOwnTid(tid)) {
              const char state = TaskState(tid);
              if (state != 'Z' && state != 'X') gone = false;
            }
          }
          at += reclen;
        }
      }
      ::close(dir);
    }
  }
  errno = saved;
  return gone;
}

// Set by the start-up (startup.hpp) for the threads HEAPPROF starts: what to
// call once the program's threads are gone. It does not return.
inline std::atomic<void (*)()> g_end_with_program{nullptr};

// A profiler thread's check, at most once a second (`last_ms`: its own clock).
inline void EndIfProgramThreadsGone(std::int64_t now_ms, std::int64_t& last_ms) noexcept {
  void (*end)() = g_end_with_program.load(std::memory_order_acquire);
  if (end == nullptr || now_ms - last_ms < 1000) return;
  last_ms = now_ms;
  if (ProgramThreadsGone()) end();
}

}  // namespace detail
}  // namespace heapprof
