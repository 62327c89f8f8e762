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
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace heapprof {
namespace detail {

// The stack of each of the profiler's threads: glibc's default size, kept
// between these bounds. That default is the program's: RLIMIT_STACK at
// start-up, or what it set with pthread_setattr_default_np. Under `ulimit -s
// 48` the dump thread had 48 KiB, and a profile's build (symbolization: ELF
// and DWARF reading, libstdc++'s demangler) overflowed it: SIGSEGV at the
// first dump. Under `ulimit -s` of a GiB, each of them reserved a GiB of
// address space, counted against RLIMIT_AS and dump_near_oom's limit.
constexpr std::size_t kOwnThreadMinStackBytes = 1024 * 1024;
constexpr std::size_t kOwnThreadMaxStackBytes = 8 * 1024 * 1024;

inline std::size_t OwnThreadStackBytes() noexcept {
  std::size_t size = 0;
  pthread_attr_t defaults;
  if (pthread_getattr_default_np(&defaults) == 0) {
    if (pthread_attr_getstacksize(&defaults, &size) != 0) size = 0;
    pthread_attr_destroy(&defaults);
  }
  if (size < kOwnThreadMinStackBytes) return kOwnThreadMinStackBytes;
  return size > kOwnThreadMaxStackBytes ? kOwnThreadMaxStackBytes : size;
}

// pthread_create for a profiler thread: every signal blocked in it (the
// program's handlers run on the program's threads) but SIGSYS, and a stack of
// OwnThreadStackBytes. Returns pthread_create's result.
//
// SIGSYS is what a seccomp filter's SECCOMP_RET_TRAP raises in the thread
// that made the call, for the program's handler to answer (Chrome's and
// Firefox's sandboxes emulate or refuse calls so). Blocked, the kernel
// resets it to its default action and the process dies: a dump thread's
// trapped fsync killed a program whose own threads' calls were answered.
inline int StartOwnThread(pthread_t* thread, void* (*fn)(void*), void* arg) noexcept {
  sigset_t all, old;
  sigfillset(&all);
  sigdelset(&all, SIGSYS);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  int rc = pthread_attr_init(&attr);
  if (rc == 0) {
    pthread_attr_setstacksize(&attr, OwnThreadStackBytes());
    rc = pthread_create(thread, &attr, fn, arg);
    pthread_attr_destroy(&attr);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return rc;
}

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

// How many of the profiler's own threads of this process are marked now. A
// thread counts only between its mark and its unmark, inside its lifetime:
// never more than are alive.
inline long OwnThreadCount() noexcept {
  const std::uint64_t pid = static_cast<std::uint64_t>(::getpid());
  long n = 0;
  for (const std::atomic<std::uint64_t>& slot : g_own_tids) {
    const std::uint64_t seen = slot.load(std::memory_order_acquire);
    if (seen != 0 && (seen >> 32) == pid) ++n;
  }
  return n;
}

// True when every thread of the process but the profiler's own has ended: the
// main thread a zombie and the process's thread count (the kernel's, which
// counts that zombie) one more than the profiler's marked threads. Both come
// from one read of /proc/self/stat, whose thread count is the kernel's
// counter at one instant. (Listing /proc/self/task and then reading each
// task's state was not one instant: a thread that started another and
// returned between the listing and the read of its state left the new one
// unseen, and the process ended under a program still running: a chain of
// threads each starting the next, seen end in 2 of 5 runs of 15 s.) A
// profiler thread not marked yet, or marked no more, counts as the
// program's: the answer is then false until the next look. False too when
// /proc/self/stat cannot be read, or is another pid namespace's. No
// allocation; keeps errno.
inline bool ProgramThreadsGone() noexcept {
  const int saved = errno;
  bool gone = false;
  const int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[1024];
    ssize_t n;
    do {
      n = ::read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    ::close(fd);
    if (n > 0) {
      buf[n] = '\0';
      // "pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt
      // majflt cmajflt utime stime cutime cstime priority nice num_threads ..."
      long pid = 0;
      const char* c = buf;
      for (; *c >= '0' && *c <= '9'; ++c) pid = pid * 10 + (*c - '0');
      const char* paren = std::strrchr(buf, ')');  // the name may hold anything, ')' too
      if (pid == static_cast<long>(::getpid()) && paren != nullptr && paren[1] == ' ' && paren[2] == 'Z') {
        // From the state (field 3) on to num_threads (field 20).
        const char* f = paren + 2;
        int field = 3;
        while (field < 20 && *f != '\0') {
          if (*f++ == ' ') ++field;
        }
        long threads = 0;
        bool digits = false;
        for (; *f >= '0' && *f <= '9'; ++f, digits = true) threads = threads * 10 + (*f - '0');
        gone = field == 20 && digits && *f == ' ' && threads == 1 + OwnThreadCount();
      }
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
