// heapprof: the one lock type of the engine.
// A test-and-test-and-set spinlock that yields after a short spin. The engine's
// critical sections are a few hash-table operations; a futex mutex would add a
// syscall path and pthread_mutex_t cannot be constant-initialised portably in a
// way TSan and fork handling both like.
#pragma once

#include <atomic>
#include <sched.h>

namespace heapprof {
namespace detail {

class SpinLock {
 public:
  constexpr SpinLock() noexcept = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  // The free lock's one exchange inline; waiting out of line (inline, the
  // loop made the compiler keep all of lock() out of line: a call, a frame
  // and saved registers for every sample's three locks).
  void lock() noexcept {
    if (__builtin_expect(!locked_.exchange(true, std::memory_order_acquire), 1)) return;
    LockContended();
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  __attribute__((__noinline__)) void LockContended() noexcept {
    for (unsigned spins = 0;;) {
      while (locked_.load(std::memory_order_relaxed)) {
        // On 2 cores a preempted holder only progresses if we give the CPU back.
        if (++spins > 64) sched_yield();
      }
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  std::atomic<bool> locked_{false};
};

class LockGuard {
 public:
  explicit LockGuard(SpinLock& lock) noexcept : lock_(lock) { lock_.lock(); }
  ~LockGuard() { lock_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  SpinLock& lock_;
};

}  // namespace detail
}  // namespace heapprof
