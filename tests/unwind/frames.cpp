// Helper code for the unwind tests, compiled -O2 -fomit-frame-pointer (see
// BUILD.md): no frame pointers anywhere, so the frame-pointer unwinder stops
// after a frame or two and the table unwinder must do the work.
#include "frames.hpp"

#include <signal.h>
#include <unwind.h>

#include <atomic>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <ostream>
#include <streambuf>
#include <thread>

#include "heapprof/detail/3_unwinding/table.hpp"

namespace unwind_test {

namespace {

// Keeps results observable without volatile arithmetic everywhere.
// Atomic: several test threads write it (a plain global would be a data race).
std::atomic<void*> g_sink{nullptr};

struct RefState {
  Capture* c;
  int skip;
};

_Unwind_Reason_Code RefFrame(_Unwind_Context* ctx, void* arg) {
  auto* st = static_cast<RefState*>(arg);
  if (st->skip > 0) {
    --st->skip;
    return _URC_NO_REASON;
  }
  if (st->c->ref_n == kMaxRef) {
    st->c->ref_truncated = true;
    return _URC_END_OF_STACK;
  }
  // Our stacks hold return addresses (the instruction is at pc - 1). The
  // frame a signal interrupted has the interrupted instruction's own address
  // (libgcc says so with ip_before_insn): ours holds it + 1.
  int ip_before_insn = 0;
  const std::uintptr_t ip = _Unwind_GetIPInfo(ctx, &ip_before_insn);
  st->c->ref[st->c->ref_n++] = ip != 0 && ip_before_insn != 0 ? ip + 1 : ip;
  return _URC_NO_REASON;
}

void Bounds(std::uintptr_t& lo, std::uintptr_t& hi) {
  thread_local std::uintptr_t t_lo = 0, t_hi = 0;
  if (t_hi == 0) heapprof::detail::CurrentStackBounds(t_lo, t_hi);
  lo = t_lo;
  hi = t_hi;
}

// The slow path: like engine.hpp's OnAllocSlow it is noinline and takes its
// own frame address, so it has a frame record whatever the flags say.
__attribute__((noinline)) void FakeSlow(void* p, const void* hook_return, int hook_frames = 1) {
  Capture* c = CurrentCapture();
  if (c == nullptr || c->taken) return;
  c->taken = true;
  const void* frame = __builtin_frame_address(0);
  std::uintptr_t lo, hi;
  Bounds(lo, hi);
  const auto f = reinterpret_cast<std::uintptr_t>(frame);
  if (lo < f) lo = f;  // as engine.hpp's CaptureStack: nothing below us is a caller
  heapprof::detail::UnwindWithTable(frame, hook_return, lo, hi, c->table);
  {
    namespace ut = heapprof::detail::unwind_table;
    ut::ReaderSection reading;
    const ut::ObjectSet* set = reading.active() ? ut::CurrentObjects() : nullptr;
    c->stepped.depth = -1;
    if (set != nullptr) {
      // Without the rule cache's return-address guesses either (a Cursor
      // of its own makes none): plain steps.
      ut::Cursor cursor{set, lo, hi};
      ut::Walk(cursor, f, reinterpret_cast<std::uintptr_t>(hook_return), c->stepped, nullptr);
    }
  }
#if !defined(HEAPPROF_ASAN)
  heapprof::detail::UnwindFramePointers(frame, hook_return, lo, hi, c->fp);
#else
  // unwind_fp.hpp's walk is instrumented: following rbp through code built
  // without frame pointers it can read an alloca redzone, which ASan reports.
  c->fp.depth = 0;
#endif
  // libgcc's view from here: frame 0 is FakeSlow, frame 1 FakeNew, then the
  // hook's caller, which is where our stacks start.
  c->ref_n = 0;
  RefState st{c, 1 + hook_frames};
  _Unwind_Backtrace(&RefFrame, &st);
  while (c->ref_n > 0 && c->ref[c->ref_n - 1] == 0) --c->ref_n;  // libgcc ends with IP 0 past _start
  g_sink.store(p, std::memory_order_relaxed);
  asm volatile("" ::: "memory");  // not a tail position: our frame must outlive the unwind
}

}  // namespace

Capture*& CurrentCapture() {
  thread_local Capture* t_capture = nullptr;
  return t_capture;
}

__attribute__((noinline)) void* FakeNew(std::size_t n) {
  void* p = std::malloc(n);
  FakeSlow(p, __builtin_return_address(0));
  asm volatile("" ::: "memory");
  return p;
}

// The shape of a hook whose rare path is a cold function (block_hooks.hpp)
// that the hook calls without a tail call (as at -O0): one more frame between
// the slow path and the hook's caller.
__attribute__((noinline)) void* FakeCold(std::size_t n, const void* hook_return) {
  void* p = std::malloc(n);
  FakeSlow(p, hook_return, 2);
  asm volatile("" ::: "memory");
  return p;
}

__attribute__((noinline)) void* FakeNewViaCold(std::size_t n) {
  void* p = FakeCold(n, __builtin_return_address(0));
  asm volatile("" ::: "memory");  // no tail call: FakeCold's frame stays between
  return p;
}

__attribute__((noinline)) int ViaColdFunction(int x) {
  void* p = FakeNewViaCold(48);
  std::free(p);
  asm volatile("" ::: "memory");
  return x + 1;
}

// ---- user chain: several frame shapes, each a real function of its own

namespace {

__attribute__((noinline)) int Leaf(int x) {
  void* p = FakeNew(32);
  std::free(p);
  return x + 1;
}

// A large fixed frame: CFA = rsp + big offset.
__attribute__((noinline)) int BigFrame(int x) {
  volatile char buf[5000];
  buf[x % 5000] = static_cast<char>(x);
  return Leaf(x) + buf[x % 5000];
}

// Many callee-saved registers live across the call: a row per push.
__attribute__((noinline)) int ManyPushes(int a, int b, int c, int d) {
  int r1 = a * 3, r2 = b * 5, r3 = c * 7, r4 = d * 11, r5 = a ^ d, r6 = b ^ c;
  asm volatile("" : "+r"(r1), "+r"(r2), "+r"(r3), "+r"(r4), "+r"(r5), "+r"(r6));
  const int v = BigFrame(a + b);
  asm volatile("" : "+r"(r1), "+r"(r2), "+r"(r3), "+r"(r4), "+r"(r5), "+r"(r6));
  return v + r1 + r2 + r3 + r4 + r5 + r6;
}

// A variable-size frame: GCC sets up rbp and the CFA becomes rbp + 16.
__attribute__((noinline)) int VariableFrame(int n) {
  char* p = static_cast<char*>(__builtin_alloca(static_cast<std::size_t>(n)));
  std::memset(p, n, static_cast<std::size_t>(n));
  g_sink.store(p, std::memory_order_relaxed);
  const int v = ManyPushes(n, p[1], n + 2, n + 3);
  return v + p[0];
}

// Realigned and variable-size: GCC's DRAP prologue, CFA = *(rbp - 8), rbp
// saved at [rbp] (DW_CFA_def_cfa_expression / DW_CFA_expression).
__attribute__((noinline)) int Realigned(int n) {
  alignas(64) char buf[64];
  char* p = static_cast<char*>(__builtin_alloca(static_cast<std::size_t>(n)));
  std::memset(buf, n, sizeof buf);
  std::memset(p, n, static_cast<std::size_t>(n));
  g_sink.store(buf, std::memory_order_relaxed);
  g_sink.store(p, std::memory_order_relaxed);
  return VariableFrame(n + 8) + buf[5] + p[0];
}

__attribute__((noinline)) int Level(int levels) {
  if (levels <= 0) return Realigned(24);
  volatile int pad[3] = {levels, levels, levels};
  int v = Level(levels - 1);
  asm volatile("" : "+r"(v));  // keeps the recursion a recursion (no accumulator loop)
  return v + pad[1];
}

}  // namespace

int UserChain(int levels) { return Level(levels); }

// ---- libc: qsort's merge sort calls our comparator

namespace {
int CompareAndAllocate(const void* a, const void* b) {
  void* p = FakeNew(16);
  std::free(p);
  const int x = *static_cast<const int*>(a), y = *static_cast<const int*>(b);
  return (x > y) - (x < y);
}
}  // namespace

int QsortWithAllocatingComparator() {
  int v[64];
  for (int i = 0; i < 64; ++i) v[i] = (i * 37) % 64;
  std::qsort(v, 64, sizeof v[0], &CompareAndAllocate);  // through the PLT into libc
  return v[0] + v[63];
}

// ---- std::sort with a comparator (template code, built here without frame pointers)

int StdSortWithAllocatingComparator() {
  int v[100];
  for (int i = 0; i < 100; ++i) v[i] = (i * 53) % 100;
  std::sort(v, v + 100, [](int a, int b) {
    if (a == 50) std::free(FakeNew(8));
    return a < b;
  });
  return v[0] + v[99];
}

// ---- std::function

namespace {
__attribute__((noinline)) int Invoke(const std::function<int(int)>& f, int x) { return f(x) + 1; }
}  // namespace

int StdFunctionCallback() {
  int captured = 7;
  std::function<int(int)> f = [&captured](int x) {
    std::free(FakeNew(24));
    return x * captured;
  };
  return Invoke(f, 6);
}

// ---- libstdc++.so: std::ostream formatting calls our streambuf

namespace {
class AllocatingBuf : public std::streambuf {
 protected:
  int_type overflow(int_type ch) override {
    std::free(FakeNew(40));
    count_ += 1;
    return traits_type::not_eof(ch);
  }
  std::streamsize xsputn(const char*, std::streamsize n) override {
    std::free(FakeNew(40));
    count_ += static_cast<int>(n);
    return n;
  }

 public:
  int count_ = 0;
};
}  // namespace

int OstreamCustomStreambuf() {
  AllocatingBuf buf;
  std::ostream os(&buf);
  os << 1234567.25 << ' ' << 42L;  // num_put in libstdc++.so writes through our buffer
  return buf.count_;
}

// ---- std::call_once: libc's pthread_once calls the callable (through a
// proxy that GCC 12's <mutex> defines inline, so it lands in this file)

int CallOnceCallback() {
  static std::once_flag once;
  int r = 0;
  std::call_once(once, [&r] {
    std::free(FakeNew(8));
    r = 5;
  });
  return r;
}

// ---- recursion

__attribute__((noinline)) int Recurse(int depth) {
  if (depth <= 0) {
    std::free(FakeNew(8));
    return 0;
  }
  volatile int keep = depth;
  int v = Recurse(depth - 1);
  asm volatile("" : "+r"(v));
  return v + keep;
}

namespace {
// Zig<0> and Zig<1>: one body, two functions (different sizes and results,
// so they are not folded into one).
template <int kWhich>
__attribute__((noinline)) int Zig(int depth, std::uint64_t shape) {
  if (depth <= 1) {
    std::free(FakeNew(8 + 8 * kWhich));
    return 0;
  }
  int v = (shape & 1) != 0 ? Zig<0>(depth - 1, shape >> 1) : Zig<1>(depth - 1, shape >> 1);
  asm volatile("" : "+r"(v));
  return v + 1 + kWhich;
}
}  // namespace

int Zigzag(int depth, std::uint64_t shape) { return Zig<0>(depth, shape); }

// ---- through code with no unwind tables at all

namespace {
int AfterNoCfi(int x) { return Leaf(x) + Leaf(x + 1) * 0; }
}  // namespace

int ThroughNoCfi(int levels) {
  Capture* c = CurrentCapture();
  if (c != nullptr) {
    Capture tmp;  // reuse the reference walker, then copy out
    tmp.ref_n = 0;
    RefState st{&tmp, 1};  // skip ThroughNoCfi itself
    _Unwind_Backtrace(&RefFrame, &st);
    while (tmp.ref_n > 0 && tmp.ref[tmp.ref_n - 1] == 0) --tmp.ref_n;
    std::memcpy(c->outer, tmp.ref, sizeof tmp.ref);
    c->outer_n = tmp.ref_n;
  }
  int v = unwind_test_nocfi(levels, &AfterNoCfi, 3);
  asm volatile("" : "+r"(v));
  return v;
}

// ---- a signal handler, and the code the signal interrupted

namespace {
void AllocatingHandler(int) {
  int v = Level(3);
  asm volatile("" : "+r"(v));
  g_sink.store(reinterpret_cast<void*>(static_cast<std::uintptr_t>(v)), std::memory_order_relaxed);
}
__attribute__((noinline)) int Interrupted(int x) {
  raise(SIGUSR2);
  asm volatile("" : "+r"(x));
  return x + 1;
}
}  // namespace

int InSignalHandler() {
  struct sigaction sa {}, old {};
  sa.sa_handler = &AllocatingHandler;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR2, &sa, &old) != 0) return -1;
  int v = Interrupted(4);
  asm volatile("" : "+r"(v));
  sigaction(SIGUSR2, &old, nullptr);
  return v;
}

// ---- another thread's stack

int InThread() {
  int r = 0;
  Capture* c = CurrentCapture();
  std::thread t([&r, c] {
    CurrentCapture() = c;
    r = Level(3);
    CurrentCapture() = nullptr;
  });
  t.join();
  return r;
}

}  // namespace unwind_test
