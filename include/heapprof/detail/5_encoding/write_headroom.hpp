// heapprof: the memory a profile write maps before it starts, in builds
// without exceptions.
//
// A write allocates through containers (ArenaString, ArenaVector) on the
// profiler's arena, which report running out of memory with std::bad_alloc.
// With exceptions the writers catch it and the write fails. Built without
// exceptions nothing can catch it, and the process would end (std::terminate)
// for want of a profile. So there, the outermost write on a thread first maps
// the memory it expects to need and fails at once, cleanly, when the OS
// refuses; the arena carves the write's chunks and large blocks from that
// headroom before it asks the OS (0_base/arena.hpp), and what is left is
// unmapped at the end. How much: twice what the last write drew from the
// arena, less what it added to the debug-info cache (kept for later writes,
// so not needed again), between kMinWriteHeadroom and kMaxWriteHeadroom;
// kFirstWriteHeadroom before any write. A write that needs more than that
// still asks the OS for the rest, and a refusal there still ends the process.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/4_symbolization/debug_memory.hpp"

namespace heapprof {
namespace detail {

constexpr std::size_t kFirstWriteHeadroom = std::size_t{64} << 20;
constexpr std::size_t kMinWriteHeadroom = std::size_t{8} << 20;
constexpr std::size_t kMaxWriteHeadroom = std::size_t{1} << 30;

// What the last recorded write needed, for the next one to map.
struct WriteNeeds {
  std::atomic<std::size_t> last{0};
  std::atomic<bool> seen{false};
  void Note(std::size_t bytes) noexcept {
    last.store(bytes, std::memory_order_relaxed);
    seen.store(true, std::memory_order_relaxed);
  }
};
inline WriteNeeds g_write_needs;

inline std::size_t WriteHeadroomBytes(const WriteNeeds& needs = g_write_needs) noexcept {
  if (!needs.seen.load(std::memory_order_relaxed)) return kFirstWriteHeadroom;
  const std::size_t last = needs.last.load(std::memory_order_relaxed);
  const std::size_t want = last > kMaxWriteHeadroom / 2 ? kMaxWriteHeadroom : 2 * last;
  return want < kMinWriteHeadroom ? kMinWriteHeadroom : want;
}

// This thread's outermost scope holds the headroom; `record` says whether a
// scope inside it wants the write's growth recorded.
struct HeadroomThreadState {
  bool held = false;
  bool record = false;
};
inline thread_local HeadroomThreadState tls_headroom HEAPPROF_TLS_MODEL;

// Holds the headroom for a write (WriteHeadroom below: only without
// exceptions; the unit tests use it directly in every build). Scopes nest: an
// inner one (a dump's file, then the profile it builds) shares the outer
// one's region. `record` false: this scope alone would not size the next
// write (a piece of a streamed text profile, a trigger check); the outermost
// scope records when any scope inside it asked to. Cancellation is held off
// while the region is held (unwound without exceptions, no destructor would
// give it back: a thread cancelled inside a write leaked its slot, and after
// 8 every write was refused) and acts when the outermost scope ends.
class HeadroomScope {
 public:
  explicit HeadroomScope(bool record = true, Arena& arena = g_arena, WriteNeeds& needs = g_write_needs) noexcept
      : arena_(arena), needs_(needs) {
    if (tls_headroom.held) {
      tls_headroom.record |= record;
      return;
    }
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state_);
    drawn_at_ = arena.DrawnBytes();
    debug_at_ = g_debug_info_bytes.load(std::memory_order_relaxed);
    slot_ = arena.AddHeadroom(WriteHeadroomBytes(needs));
    if (slot_ < 0) {
      refused_ = true;
      pthread_setcancelstate(cancel_state_, nullptr);
      return;
    }
    tls_headroom.held = true;
    tls_headroom.record = record;
  }
  ~HeadroomScope() {
    if (slot_ < 0) return;
    arena_.DropHeadroom(slot_);
    if (tls_headroom.record) {
      const std::size_t drawn = arena_.DrawnBytes() - drawn_at_;
      const std::size_t debug_now = g_debug_info_bytes.load(std::memory_order_relaxed);
      const std::size_t kept = debug_now > debug_at_ ? debug_now - debug_at_ : 0;
      needs_.Note(drawn > kept ? drawn - kept : 0);
    }
    tls_headroom = HeadroomThreadState{};
    pthread_setcancelstate(cancel_state_, nullptr);
#if !HEAPPROF_EXCEPTIONS
    // A cancellation that came during the write acts here, the region given
    // back (as in WriteFileAtomic). With exceptions (the unit tests) it acts
    // at the thread's next cancellation point: a destructor must not unwind.
    if (cancel_state_ == PTHREAD_CANCEL_ENABLE) pthread_testcancel();
#endif
  }
  HeadroomScope(const HeadroomScope&) = delete;
  HeadroomScope& operator=(const HeadroomScope&) = delete;
  bool ok() const noexcept { return !refused_; }

 private:
  Arena& arena_;
  WriteNeeds& needs_;
  std::size_t drawn_at_ = 0;
  std::size_t debug_at_ = 0;
  int slot_ = -1;
  int cancel_state_ = PTHREAD_CANCEL_ENABLE;
  bool refused_ = false;
};

#if HEAPPROF_EXCEPTIONS
// With exceptions a write that runs out of memory half way is caught and fails.
struct WriteHeadroom {
  constexpr explicit WriteHeadroom(bool record = true) noexcept { (void)record; }
  constexpr bool ok() const noexcept { return true; }
};
#else
using WriteHeadroom = HeadroomScope;
#endif

}  // namespace detail
}  // namespace heapprof
