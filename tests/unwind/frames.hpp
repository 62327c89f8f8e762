// Shared between the unwind tests and their helper sources. The helpers
// (frames.cpp, nocfi.cpp, dso.cpp) are compiled -O2 -fomit-frame-pointer (see
// BUILD.md): code shaped like a user's optimised build and the distro's libs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heapprof/detail/3_unwinding/frame_pointers.hpp"

namespace unwind_test {

constexpr int kMaxRef = 512;

// One sample: what the table unwinder, the frame-pointer unwinder and libgcc's
// _Unwind_Backtrace saw from the same fake allocation hook.
struct Capture {
  heapprof::detail::CapturedStack table;
  // The same stack walked again right after, every frame stepped (no replay,
  // no return-address guesses, the thread's walk record untouched): what
  // `table` must equal.
  heapprof::detail::CapturedStack stepped;
  heapprof::detail::CapturedStack fp;
  std::uintptr_t ref[kMaxRef];  // _Unwind_Backtrace from the hook's caller on (trailing 0 dropped)
  int ref_n = 0;
  bool ref_truncated = false;
  bool taken = false;
  // ThroughNoCfi only: _Unwind_Backtrace from ThroughNoCfi's caller on, taken
  // before it calls into nocfi.cpp (libgcc stops at code without tables).
  std::uintptr_t outer[kMaxRef];
  int outer_n = 0;
};

// Where the next FakeNew on this thread records; null: FakeNew just allocates.
Capture*& CurrentCapture();

// A stand-in for the replaced operator new: noinline, built without a frame
// pointer, calls a slow path that (like engine.hpp's OnAllocSlow) takes
// __builtin_frame_address(0) and unwinds from there.
void* FakeNew(std::size_t n);
using AllocFn = void* (*)(std::size_t);

// Scenarios. Each ends in one FakeNew with the capture armed, and returns
// something derived from its work so nothing is optimised away.
int UserChain(int levels);                // distinct frame shapes: big frame, pushes, alloca, realign
int QsortWithAllocatingComparator();      // libc's qsort calls back into us
int StdSortWithAllocatingComparator();    // std::sort with a comparator
int StdFunctionCallback();                // std::function
int OstreamCustomStreambuf();             // libstdc++.so's ostream calls our streambuf
int CallOnceCallback();                   // std::call_once: libc's pthread_once calls back
int Recurse(int depth);                   // plain recursion: depth frames
// depth frames of two functions, each calling one or the other per a bit of
// `shape` (bit 0 first): 4 return addresses, each followed by either of two
int Zigzag(int depth, std::uint64_t shape);
int ThroughNoCfi(int levels);             // via nocfi.cpp: functions without any .eh_frame
int InThread();                           // a std::thread's stack
int InSignalHandler();                    // a handler (on the thread's stack) of a signal raise()d by our code
int ViaColdFunction(int x);               // the hook reaches the slow path through a cold function, no tail call

}  // namespace unwind_test

// nocfi.cpp: built with frame pointers and without unwind tables. Records the
// return address of its outermost call (a PC inside ThroughNoCfi).
extern "C" int unwind_test_nocfi(int levels, int (*then)(int), int arg);
extern "C" std::uintptr_t unwind_test_nocfi_return;

// dso.cpp: the shared object the dlopen test loads. `alloc` is the hook.
extern "C" int unwind_test_dso_entry(int levels, unwind_test::AllocFn alloc);
