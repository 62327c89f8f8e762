// Code with frame pointers and without any unwind table (see BUILD.md:
// -fno-omit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables),
// like hand-written assembly or JIT stubs: the table has no row for these PCs,
// so the table unwinder must take frame-pointer steps through them.
#include <cstdint>

extern "C" {

std::uintptr_t unwind_test_nocfi_return = 0;

__attribute__((noinline)) static int Inner(int levels, int (*then)(int), int arg) {
  if (levels <= 0) {
    int v = then(arg);
    asm volatile("" : "+r"(v));
    return v + 1;
  }
  volatile int keep = levels;
  int v = Inner(levels - 1, then, arg);
  asm volatile("" : "+r"(v));  // a real recursion, not a loop
  return v + keep;
}

__attribute__((noinline)) int unwind_test_nocfi(int levels, int (*then)(int), int arg) {
  unwind_test_nocfi_return = reinterpret_cast<std::uintptr_t>(__builtin_return_address(0));
  int v = Inner(levels, then, arg);
  asm volatile("" : "+r"(v));
  return v;
}

}  // extern "C"
