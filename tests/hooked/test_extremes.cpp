// Extremes a profiler inside someone else's process meets: very deep
// recursion, a thread with a tiny stack, a corrupted frame-pointer chain,
// allocation in thread-exit destructors, a dlopen'ed library that allocates
// through the hook and is dlclosed while its objects live, and a million
// distinct stacks. Every one must end in a valid profile, never a crash.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <malloc.h>

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "child_scenarios.hpp"
#include "support/block_size.hpp"
#include "support/profile_io.hpp"

namespace {

using heapprof_test::Profile;
using heapprof_test::Sample;

// The object size each scenario allocates, found again through the sample's
// numeric "bytes" label.
std::int64_t BytesLabel(const Sample& s) {
  for (const auto& l : s.labels) {
    if (l.key == "bytes") return l.num;
  }
  return -1;
}

// Samples of this object size whose leaf function contains `leaf`: the
// profile also holds whatever the other tests of this process allocated.
std::vector<const Sample*> SamplesOfSize(const Profile& p, std::int64_t size, const char* leaf) {
  std::vector<const Sample*> out;
  for (const Sample& s : p.samples) {
    if (BytesLabel(s) != size) continue;
    const std::vector<std::string> names = heapprof_test::FunctionNames(p, s);
    if (!names.empty() && names[0].find(leaf) != std::string::npos) out.push_back(&s);
  }
  return out;
}

std::int64_t SumOfSize(const Profile& p, std::int64_t size, const char* type, const char* leaf) {
  const int idx = heapprof_test::SampleTypeIndex(p, type);
  std::int64_t total = 0;
  for (const Sample* s : SamplesOfSize(p, size, leaf)) total += s->values.at(idx);
  return total;
}

const heapprof::Unwinder kUnwinders[] = {heapprof::Unwinder::kFramePointer, heapprof::Unwinder::kTable};

// ---- recursion 10,000 deep ----

__attribute__((noinline)) int DeepRecurse(int n, std::size_t size, void** out) {
  if (n == 0) {
    *out = ::operator new(size);
    asm volatile("" ::: "memory");
    return 1;
  }
  int r = DeepRecurse(n - 1, size, out);
  asm volatile("" : "+r"(r)::"memory");  // no tail call: every level is a frame
  return r + 1;
}

}  // namespace

TEST_CASE("recursion 10,000 deep: the stack is cut at HEAPPROF_MAX_FRAMES, marked, not overflowed") {
  const heapprof_test::UnwinderScope unwinder;  // restored when the case ends, however it ends
  heapprof_test::RateScope rate(1);
  void* objects[2] = {};
  for (int i = 0; i < 2; ++i) {
    heapprof::SetUnwinder(kUnwinders[i]);
    CHECK(DeepRecurse(10000, 7001 + static_cast<std::size_t>(i), &objects[i]) == 10001);
  }
  Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::CaptureProfile(p, false, nullptr, &why), why);
  REQUIRE_MESSAGE(heapprof_test::Validate(p, &why), why);
  for (int i = 0; i < 2; ++i) {
    INFO("unwinder " << (i == 0 ? "fp" : "table"));
    const auto samples = SamplesOfSize(p, 7001 + i, "DeepRecurse");
    REQUIRE(samples.size() == 1);
    const std::vector<std::string> names = heapprof_test::FunctionNames(p, *samples[0]);
    REQUIRE(names.size() == HEAPPROF_MAX_FRAMES + 1);
    for (int f = 0; f < HEAPPROF_MAX_FRAMES; ++f) CHECK(names[f].find("DeepRecurse") != std::string::npos);
    CHECK(names.back() == "[heapprof: stack truncated at " + std::to_string(HEAPPROF_MAX_FRAMES) + " frames]");
    ::operator delete(objects[i]);
  }
}

namespace {

// ---- a thread with a tiny stack ----

struct TinyResult {
  void* objects[4] = {};
  int done = 0;
};

__attribute__((noinline)) void TinyStackLeaf(TinyResult* r, std::size_t size) {
  r->objects[r->done++] = ::operator new(size);
  asm volatile("" ::: "memory");
}

void* TinyStackMain(void* arg) {
  auto* r = static_cast<TinyResult*>(arg);
  for (int i = 0; i < 2; ++i) {
    heapprof::SetUnwinder(kUnwinders[i]);
    TinyStackLeaf(r, 7101 + static_cast<std::size_t>(i));
    TinyStackLeaf(r, 7101 + static_cast<std::size_t>(i));
  }
  return nullptr;
}

}  // namespace

TEST_CASE("a thread with a tiny stack samples with both unwinders") {
  const heapprof_test::UnwinderScope unwinder;  // restored when the case ends, however it ends
  heapprof_test::RateScope rate(1);
  TinyResult r;
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, heapprof_test::TinyStackSize()) == 0);
  pthread_t t;
  REQUIRE(pthread_create(&t, &attr, &TinyStackMain, &r) == 0);
  REQUIRE(pthread_join(t, nullptr) == 0);
  pthread_attr_destroy(&attr);
  REQUIRE(r.done == 4);
  Profile p;
  REQUIRE(heapprof_test::CaptureProfile(p));
  for (int i = 0; i < 2; ++i) {
    CHECK(SumOfSize(p, 7101 + i, "inuse_objects", "TinyStackLeaf") == 2);
    for (const Sample* s : SamplesOfSize(p, 7101 + i, "TinyStackLeaf")) {
      const auto names = heapprof_test::FunctionNames(p, *s);
      REQUIRE(names.size() >= 2);
      CHECK(names[0].find("TinyStackLeaf") != std::string::npos);
      CHECK(names[1].find("TinyStackMain") != std::string::npos);
    }
  }
  for (void* o : r.objects) ::operator delete(o);
}

namespace {

// ---- a stack the program switched to: a coroutine, a sigaltstack handler ----

struct SwitchedStack {
  ucontext_t caller, coroutine;
  void* objects[2] = {};
  std::size_t size = 0;
  int done = 0;
};
SwitchedStack* g_switched = nullptr;

__attribute__((noinline)) void SwitchedLeaf(std::size_t size) {
  g_switched->objects[g_switched->done++] = ::operator new(size);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void SwitchedMiddle(std::size_t size) {
  SwitchedLeaf(size);
  asm volatile("" ::: "memory");  // no tail call: every level is a frame
}
void CoroutineEntry() {
  SwitchedMiddle(g_switched->size);
  asm volatile("" ::: "memory");
}
void AltStackHandler(int) {
  SwitchedMiddle(g_switched->size);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void RaiseSignal(int sig) {
  REQUIRE(raise(sig) == 0);
  asm volatile("" ::: "memory");
}

// The test's sample: its three frames, leaf first, on whatever stack it ran;
// `interrupted`: a frame further out, past a signal frame.
void CheckSwitchedStack(const Profile& p, std::int64_t size, const char* entry, const char* interrupted = nullptr) {
  CAPTURE(size);
  const auto samples = SamplesOfSize(p, size, "SwitchedLeaf");
  REQUIRE(samples.size() == 1);
  const auto names = heapprof_test::FunctionNames(p, *samples[0]);
  std::string all;
  for (const std::string& n : names) all += "  " + n + "\n";
  INFO("stack:\n" << all);
  REQUIRE(names.size() >= 3);
  CHECK(names[1].find("SwitchedMiddle") != std::string::npos);
  CHECK(names[2].find(entry) != std::string::npos);
  if (interrupted != nullptr) {
    bool found = false;
    for (std::size_t i = 3; i < names.size(); ++i) found |= names[i].find(interrupted) != std::string::npos;
    CHECK(found);
  }
}

}  // namespace

TEST_CASE("a stack the program switched to (makecontext, sigaltstack): the walk follows its frames, both unwinders") {
  // Every frame read is checked against the thread's stack bounds; a sample
  // taken on another stack (a coroutine's, a signal handler's alternate
  // stack) failed every check, so its stack was the leaf alone. Past a
  // sigaltstack handler's signal frame, the table unwinder walks the
  // interrupted code on the thread's own stack.
  const heapprof_test::UnwinderScope unwinder;  // restored when the case ends, however it ends
  heapprof_test::RateScope rate(1);
  SwitchedStack st;
  g_switched = &st;
  // The coroutine's stack between two inaccessible guard pages: the walk
  // must stop below the upper one, never read it.
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t stack_size = 64 * 1024;
  auto* region = static_cast<char*>(
      mmap(nullptr, stack_size + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(region != MAP_FAILED);
  REQUIRE(mprotect(region + page, stack_size, PROT_READ | PROT_WRITE) == 0);
  // getcontext out of line (GCC inlines no function that calls it): with the
  // rate scope's cleanup around it, g++ -Wextra warns the loop counter might
  // be clobbered.
  const auto run_coroutine = [&] {
    REQUIRE(getcontext(&st.coroutine) == 0);
    st.coroutine.uc_stack.ss_sp = region + page;
    st.coroutine.uc_stack.ss_size = stack_size;
    st.coroutine.uc_link = &st.caller;
    makecontext(&st.coroutine, &CoroutineEntry, 0);
    REQUIRE(swapcontext(&st.caller, &st.coroutine) == 0);
  };
  for (int i = 0; i < 2; ++i) {
    heapprof::SetUnwinder(kUnwinders[i]);
    st.size = 7151 + static_cast<std::size_t>(i);
    run_coroutine();
  }
  REQUIRE(st.done == 2);
  void* coroutine_objects[2] = {st.objects[0], st.objects[1]};
  st.objects[0] = st.objects[1] = nullptr;
  st.done = 0;
#if defined(HEAPPROF_TSAN)
  // TSan reports the handler's allocation itself (a signal-unsafe call).
  MESSAGE("the sigaltstack handler half skipped under TSan");
#else
  // A handler on its alternate stack (SA_ONSTACK).
  std::vector<char> alt(256 * 1024);
  stack_t ss{}, old_ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  REQUIRE(sigaltstack(&ss, &old_ss) == 0);
  struct sigaction sa {}, old_sa {};
  sa.sa_handler = &AltStackHandler;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR2, &sa, &old_sa) == 0);
  for (int i = 0; i < 2; ++i) {
    heapprof::SetUnwinder(kUnwinders[i]);
    st.size = 7161 + static_cast<std::size_t>(i);
    RaiseSignal(SIGUSR2);
  }
  REQUIRE(sigaction(SIGUSR2, &old_sa, nullptr) == 0);
  REQUIRE(sigaltstack(&old_ss, nullptr) == 0);
  REQUIRE(st.done == 2);
#endif
  Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::CaptureProfile(p, false, nullptr, &why), why);
  REQUIRE_MESSAGE(heapprof_test::Validate(p, &why), why);
  for (int i = 0; i < 2; ++i) {
    INFO("unwinder " << std::string(i == 0 ? "fp" : "table"));
    CheckSwitchedStack(p, 7151 + i, "CoroutineEntry");
#if !defined(HEAPPROF_TSAN)
    // The table unwinder goes on through the signal frame, onto the thread's
    // own stack: the code the signal interrupted.
    CheckSwitchedStack(p, 7161 + i, "AltStackHandler", i == 1 ? "RaiseSignal" : nullptr);
#endif
  }
  for (void* o : coroutine_objects) ::operator delete(o);
  for (void* o : st.objects) ::operator delete(o);
  munmap(region, stack_size + 2 * page);
  g_switched = nullptr;
}

namespace {

// ---- a sample in a signal handler: on into the code the signal interrupted ----

struct SignalSample {
  void* objects[6] = {};
  std::size_t size = 0;
  int done = 0;
};
SignalSample g_signal_sample;

__attribute__((noinline)) void SignalFrameLeaf(std::size_t size) {
  g_signal_sample.objects[g_signal_sample.done++] = ::operator new(size);
  asm volatile("" ::: "memory");
}
void SignalFrameHandler(int) {
  SignalFrameLeaf(g_signal_sample.size);
  asm volatile("" ::: "memory");
}
#if defined(__x86_64__)
// Sends `sig` to this thread with a tgkill system call made here, not in
// libc (built without frame pointers): the signal is delivered as the call
// returns, so the interrupted PC is in this function, whose rbp is its
// frame record.
__attribute__((noinline)) void SignalSite(int sig) {
  const long pid = getpid(), tid = syscall(SYS_gettid);
  long ret = SYS_tgkill;
  asm volatile("syscall" : "+a"(ret) : "D"(pid), "S"(tid), "d"(static_cast<long>(sig)) : "rcx", "r11", "memory");
  asm volatile("" ::: "memory");
}
#endif
__attribute__((noinline)) void SignalCaller(int sig) {
#if defined(__x86_64__)
  SignalSite(sig);
#else
  (void)sig;
#endif
  asm volatile("" ::: "memory");
}

}  // namespace

TEST_CASE("a sample in a signal handler: both unwinders step through the signal frame into the interrupted code") {
  // The frame-pointer walk stopped at the signal frame (or, on the thread's
  // own stack, went on from the interrupted code's rbp without its PC):
  // the stack was the handler's frames, then at most the interrupted
  // function's callers. Now it reads the interrupted registers from the
  // kernel's signal frame, like the table unwinder: the interrupted
  // function, then its callers; on the thread's own stack when the handler
  // ran on its sigaltstack.
#if !defined(__x86_64__) || defined(HEAPPROF_TSAN)
  MESSAGE("x86-64 only (the interrupted PC's frame), and not under TSan (the handler allocates)");
#else
  const heapprof_test::UnwinderScope unwinder;  // restored when the case ends, however it ends
  heapprof_test::RateScope rate(1);
  // Modes: the handler on the thread's stack; on a sigaltstack elsewhere
  // (the heap); on a sigaltstack that is an array on the thread's own stack,
  // above the interrupted code (whose frames are below the sample's then).
  std::vector<char> alt(256 * 1024);
  alignas(64) char local_alt[128 * 1024];
  stack_t old_ss{};
  REQUIRE(sigaltstack(nullptr, &old_ss) == 0);
  struct sigaction old_sa {};
  g_signal_sample = SignalSample{};
  const char* const kModes[3] = {"on the thread's stack", "on a sigaltstack", "on a sigaltstack on the thread's stack"};
  for (int mode = 0; mode < 3; ++mode) {
    stack_t ss{};
    ss.ss_sp = mode == 2 ? local_alt : alt.data();
    ss.ss_size = mode == 2 ? sizeof local_alt : alt.size();
    REQUIRE(sigaltstack(&ss, nullptr) == 0);
    struct sigaction sa {};
    sa.sa_handler = &SignalFrameHandler;
    sa.sa_flags = mode != 0 ? SA_ONSTACK : 0;
    sigemptyset(&sa.sa_mask);
    REQUIRE(sigaction(SIGUSR2, &sa, mode == 0 ? &old_sa : nullptr) == 0);
    for (int i = 0; i < 2; ++i) {
      heapprof::SetUnwinder(kUnwinders[i]);
      g_signal_sample.size = 7171 + static_cast<std::size_t>(2 * mode + i);
      SignalCaller(SIGUSR2);
    }
  }
  REQUIRE(sigaction(SIGUSR2, &old_sa, nullptr) == 0);
  REQUIRE(sigaltstack(&old_ss, nullptr) == 0);
  REQUIRE(g_signal_sample.done == 6);
  Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::CaptureProfile(p, false, nullptr, &why), why);
  REQUIRE_MESSAGE(heapprof_test::Validate(p, &why), why);
  for (int k = 0; k < 6; ++k) {
    INFO("unwinder " << std::string(k % 2 == 0 ? "fp" : "table") << ", handler " << std::string(kModes[k / 2]));
    const auto samples = SamplesOfSize(p, 7171 + k, "SignalFrameLeaf");
    REQUIRE(samples.size() == 1);
    const auto names = heapprof_test::FunctionNames(p, *samples[0]);
    std::string all;
    for (const std::string& n : names) all += "  " + n + "\n";
    INFO("stack:\n" << all);
    REQUIRE(names.size() >= 2);
    CHECK(names[1].find("SignalFrameHandler") != std::string::npos);
    // Past the handler (and the trampoline's frame): the interrupted
    // function, then its caller.
    std::size_t site = 0;
    for (std::size_t f = 2; f < names.size() && site == 0; ++f) {
      if (names[f].find("SignalSite") != std::string::npos) site = f;
    }
    CHECK(site != 0);
    if (site == 0) continue;
    CHECK(site <= 3);
    REQUIRE(site + 1 < names.size());
    CHECK(names[site + 1].find("SignalCaller") != std::string::npos);
  }
  for (void* o : g_signal_sample.objects) ::operator delete(o);
#endif
}

namespace {

// ---- a coroutine stack deeper than the probe's 256 KiB ----

struct DeepCoroutine {
  ucontext_t caller, coroutine;
  void* objects[2] = {};
  std::size_t size = 0;
  int levels = 0;  // frames of kDeepFrameBytes below the entry
  int done = 0;
};
DeepCoroutine* g_deep = nullptr;
constexpr std::size_t kDeepFrameBytes = 200 * 1024;

__attribute__((noinline)) void DeepCoroutineLeaf(std::size_t size) {
  g_deep->objects[g_deep->done++] = ::operator new(size);
  asm volatile("" ::: "memory");
}
// A frame of ~200 KiB of locals. Their address escapes: clang -O2 shrank a
// volatile array of which two bytes were used to those bytes (an 8-byte
// frame), and the 9 MiB stack was 400 bytes.
__attribute__((noinline)) void DeepCoroutineFrame(int n) {
  char locals[kDeepFrameBytes];
  locals[0] = static_cast<char>(n);
  asm volatile("" : : "r"(locals) : "memory");
  if (n <= 1) {
    DeepCoroutineLeaf(g_deep->size);
  } else {
    DeepCoroutineFrame(n - 1);
  }
  asm volatile("" : : "r"(locals) : "memory");  // no tail call
}
void DeepCoroutineEntry() {
  DeepCoroutineFrame(g_deep->levels);
  asm volatile("" ::: "memory");
}

}  // namespace

TEST_CASE("a coroutine stack deeper than 256 KiB: followed to its entry, or cut with the truncation marker") {
  // A sample on a stack of unknown extent read at most 256 KiB above the
  // sample (ForeignStackBounds): the frames beyond were dropped, unmarked,
  // so the profile showed the innermost frames as if they were the whole
  // stack. Now the walk asks for the pages up to a frame above that limit
  // and goes on (2 frames of 200 KiB: the entry is found), up to 8 MiB
  // (45 such frames, 9 MiB: cut there and marked).
  const heapprof_test::UnwinderScope unwinder;  // restored when the case ends, however it ends
  heapprof_test::RateScope rate(1);
  DeepCoroutine st;
  g_deep = &st;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t stack_size = 12 << 20;
  auto* region = static_cast<char*>(
      mmap(nullptr, stack_size + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  REQUIRE(region != MAP_FAILED);
  REQUIRE(mprotect(region + page, stack_size, PROT_READ | PROT_WRITE) == 0);
  const int kLevels[2] = {2, 45};
  // getcontext out of line, as in the case above (-Wclobbered).
  const auto run_coroutine = [&] {
    REQUIRE(getcontext(&st.coroutine) == 0);
    st.coroutine.uc_stack.ss_sp = region + page;
    st.coroutine.uc_stack.ss_size = stack_size;
    st.coroutine.uc_link = &st.caller;
    makecontext(&st.coroutine, &DeepCoroutineEntry, 0);
    st.done = 0;
    REQUIRE(swapcontext(&st.caller, &st.coroutine) == 0);
  };
  for (int deep = 0; deep < 2; ++deep) {
    for (int i = 0; i < 2; ++i) {
      heapprof::SetUnwinder(kUnwinders[i]);
      st.size = 7181 + static_cast<std::size_t>(2 * deep + i);
      st.levels = kLevels[deep];
      run_coroutine();
      REQUIRE(st.done == 1);
      ::operator delete(st.objects[0]);  // (the sample stays in the allocs profile)
    }
  }
  Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::CaptureProfile(p, true, nullptr, &why), why);
  REQUIRE_MESSAGE(heapprof_test::Validate(p, &why), why);
  for (int k = 0; k < 4; ++k) {
    INFO("unwinder " << std::string(k % 2 == 0 ? "fp" : "table") << ", " << kLevels[k / 2] << " frames of 200 KiB");
    const auto samples = SamplesOfSize(p, 7181 + k, "DeepCoroutineLeaf");
    REQUIRE(samples.size() == 1);
    const auto names = heapprof_test::FunctionNames(p, *samples[0]);
    std::string all;
    for (const std::string& n : names) all += "  " + n + "\n";
    INFO("stack:\n" << all);
    REQUIRE(names.size() >= 3);
    int frames = 0;
    bool entry = false;
    for (const std::string& n : names) {
      frames += n.find("DeepCoroutineFrame") != std::string::npos;
      entry |= n.find("DeepCoroutineEntry") != std::string::npos;
    }
    if (k < 2) {
      CHECK(frames == 2);
      CHECK(entry);
      CHECK(names.back().find("[heapprof: stack truncated") == std::string::npos);
    } else {
      // 8 MiB of 200 KiB frames: 40 of them, give or take the frame below.
      CHECK(frames >= 38);
      CHECK(frames <= 41);
      CHECK_FALSE(entry);
      CHECK(names.back() == "[heapprof: stack truncated at " + std::to_string(names.size() - 1) + " frames]");
    }
  }
  munmap(region, stack_size + 2 * page);
  g_deep = nullptr;
}

TEST_CASE("the frame-pointer unwinder when only the implementation unit is built without frame pointers") {
  // tests/hooked/programs/omit_fp_main.cpp (frame pointers) with its
  // implementation unit built -O2 -fomit-frame-pointer: the hooks' cold
  // halves and posix_memalign & co. reused rbp as a general register, so the
  // walk from the slow path found garbage past the leaf and every stack was
  // one frame. Every hook's sample must now show its callers.
#if !defined(HEAPPROF_OMIT_FP_PROGRAM_PATH)
  MESSAGE("HEAPPROF_OMIT_FP_PROGRAM_PATH not defined: the program is not built here");
#else
  const std::string profile = heapprof_test::TempPath(".omit_fp.pb.gz");
  std::string out;
  REQUIRE(heapprof_test::RunCommand(std::string(HEAPPROF_OMIT_FP_PROGRAM_PATH) + " " + profile, out) == 0);
  Profile p;
  REQUIRE(heapprof_test::ReadProfileFile(profile, p));
  std::remove(profile.c_str());
  for (int k = 0; k < 10; ++k) {
    CAPTURE(k);
    const auto samples = SamplesOfSize(p, 9001 + k, "OmitFpLeaf");
    REQUIRE(samples.size() == 1);
    const auto names = heapprof_test::FunctionNames(p, *samples[0]);
    std::string all;
    for (const std::string& n : names) all += "  " + n + "\n";
    INFO("stack:\n" << all);
    REQUIRE(names.size() >= 4);
    CHECK(names[1].find("OmitFpMiddle") != std::string::npos);
    CHECK(names[2].find("OmitFpOuter") != std::string::npos);
    CHECK(names[3] == "main");
  }
#endif
}

TEST_CASE("a tiny-stack thread is the first to sample: unwind tables built there, also after a dlopen") {
  // In a child: the first sample of the process (which builds the unwind
  // tables) must happen on the tiny stack.
  std::string out;
  const int rc = heapprof_test::RunCommand(
      "HEAPPROF=rate=0 HEAPPROF_TEST_CHILD=tiny_stack_first " + heapprof_test::SelfExe(), out);
  INFO(out);
  CHECK(rc == 0);
}

namespace {

// ---- hostile frame pointers ----

void* g_hostile_object = nullptr;
std::uintptr_t g_fake_chain[8];  // a fake frame chain outside every stack

__attribute__((noinline)) void HostileLeaf(std::size_t size) {
  g_hostile_object = ::operator new(size);
  asm volatile("" ::: "memory");
}

// Overwrites this function's own frame record (saved frame pointer and,
// optionally, return address) while it calls the allocating leaf, then puts
// it back before returning: the unwinders walk a corrupted chain.
__attribute__((noinline)) void HostileFrame(std::size_t size, std::uintptr_t bad_fp, bool bad_ret,
                                            std::uintptr_t ret_value) {
  auto* record = static_cast<volatile std::uintptr_t*>(__builtin_frame_address(0));
  const std::uintptr_t saved_fp = record[0];
  const std::uintptr_t saved_ret = record[1];
  record[0] = bad_fp;
  if (bad_ret) record[1] = ret_value;
  HostileLeaf(size);
  record[0] = saved_fp;
  record[1] = saved_ret;
  asm volatile("" ::: "memory");
}

}  // namespace

TEST_CASE("hostile frame pointers: a corrupted chain ends the stack cleanly with both unwinders") {
  const heapprof_test::UnwinderScope unwinder;  // restored when the case ends, however it ends
  heapprof_test::RateScope rate(1);
  // A frame chain on this stack that loops back on itself.
  volatile std::uintptr_t loop[4];
  loop[0] = reinterpret_cast<std::uintptr_t>(&loop[2]);
  loop[1] = reinterpret_cast<std::uintptr_t>(&HostileLeaf) + 4;
  loop[2] = reinterpret_cast<std::uintptr_t>(&loop[0]);
  loop[3] = reinterpret_cast<std::uintptr_t>(&HostileFrame) + 4;
  // One outside every stack (in .bss), looping too.
  g_fake_chain[0] = reinterpret_cast<std::uintptr_t>(&g_fake_chain[2]);
  g_fake_chain[1] = reinterpret_cast<std::uintptr_t>(&HostileLeaf) + 4;
  g_fake_chain[2] = reinterpret_cast<std::uintptr_t>(&g_fake_chain[0]);
  g_fake_chain[3] = reinterpret_cast<std::uintptr_t>(&HostileFrame) + 4;
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  const std::uintptr_t bad_fps[] = {
      0,                                              // null
      0x10,                                           // unmapped, low
      here + 3,                                       // misaligned
      here - 256,                                     // below: into callees' frames
      reinterpret_cast<std::uintptr_t>(&loop[0]),     // a cycle on the stack
      reinterpret_cast<std::uintptr_t>(g_fake_chain),  // outside the stack
      ~std::uintptr_t{0} & ~std::uintptr_t{7},        // top of the address space
      std::uintptr_t{0xffff800000000000ull},          // kernel half
      std::uintptr_t{0x00007ffffffff000ull},          // near the user-space top
  };
  const std::uintptr_t bad_rets[] = {0, 1, 0xdeadbeef, reinterpret_cast<std::uintptr_t>(g_fake_chain),
                                     std::uintptr_t{0xffff800000001234ull}};
  std::size_t size = 7200;
  int cases = 0;
  for (const heapprof::Unwinder u : kUnwinders) {
    heapprof::SetUnwinder(u);
    for (const std::uintptr_t fp : bad_fps) {
      for (int r = -1; r < static_cast<int>(sizeof bad_rets / sizeof bad_rets[0]); ++r) {
        HostileFrame(++size, fp, r >= 0, r >= 0 ? bad_rets[r] : 0);
        ::operator delete(g_hostile_object);
        ++cases;
      }
    }
  }
  Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::CaptureProfile(p, false, nullptr, &why), why);
  REQUIRE_MESSAGE(heapprof_test::Validate(p, &why), why);
  int seen = 0;
  for (std::size_t s = 7201; s <= size; ++s) {
    const auto samples = SamplesOfSize(p, static_cast<std::int64_t>(s), "HostileLeaf");
    REQUIRE(samples.size() == 1);
    const auto names = heapprof_test::FunctionNames(p, *samples[0]);
    INFO("case " << s - 7201 << ": " << names.size() << " frames");
    // The leaf and its caller are intact; what follows the corrupted record
    // is cut or garbage, but bounded and never a crash.
    REQUIRE(names.size() >= 2);
    CHECK(names[0].find("HostileLeaf") != std::string::npos);
    CHECK(names[1].find("HostileFrame") != std::string::npos);
    CHECK(names.size() <= HEAPPROF_MAX_FRAMES + 1);
    CHECK(SumOfSize(p, static_cast<std::int64_t>(s), "alloc_objects", "HostileLeaf") == 1);
    ++seen;
  }
  CHECK(seen == cases);
  // The unwinders are unharmed: a clean stack afterwards goes all the way up.
  for (const heapprof::Unwinder u : kUnwinders) {
    heapprof::SetUnwinder(u);
    HostileLeaf(7199);
    Profile after;
    REQUIRE(heapprof_test::CaptureProfile(after));
    const auto samples = SamplesOfSize(after, 7199, "HostileLeaf");
    REQUIRE(!samples.empty());
    const auto names = heapprof_test::FunctionNames(after, *samples.back());
    CHECK(std::any_of(names.begin(), names.end(), [](const std::string& n) { return n == "main"; }));
    ::operator delete(g_hostile_object);
  }
}

namespace {

// ---- thread exit: thread_local destructors and pthread key destructors ----

void* g_exit_kept = nullptr;

// The usable size of each block as allocated (Stats count usable sizes): it
// depends on the heap's state (a split that leaves less than a minimum chunk
// gives the whole chunk), so it is read from the block itself, not predicted.
std::size_t g_exit_usable[6];

__attribute__((noinline)) void* ExitAlloc(std::size_t size) {
  void* p = ::operator new(size);
  asm volatile("" ::"r"(p) : "memory");
  if (size > 7800 && size <= 7805) g_exit_usable[size - 7800] = malloc_usable_size(p);
  return p;
}

struct ThreadLocalProbe {
  void* mine = nullptr;
  ~ThreadLocalProbe() {
    // Runs at thread exit, before pthread key destructors: frees what the
    // thread allocated, allocates and frees, and leaves one object behind.
    ::operator delete(mine, 7801);
    ::operator delete(ExitAlloc(7802), 7802);
    g_exit_kept = ExitAlloc(7803);
  }
};

pthread_key_t g_late_key;
void LateKeyDestructor(void* value) {
  // A key created after heapprof's runs after heapprof's own thread-exit
  // destructor: the thread is unregistered by now, and still every free of
  // a sampled object must find it.
  ::operator delete(value, 7804);
  ::operator delete(ExitAlloc(7805), 7805);
}

void* ThreadExitMain(void*) {
  static thread_local ThreadLocalProbe probe;
  probe.mine = ExitAlloc(7801);
  pthread_setspecific(g_late_key, ExitAlloc(7804));
  return nullptr;
}

}  // namespace

TEST_CASE("thread exit: thread_local and pthread key destructors allocate and free") {
  heapprof_test::RateScope rate(1);
  REQUIRE(pthread_key_create(&g_late_key, &LateKeyDestructor) == 0);
  const std::size_t* u = g_exit_usable;
  const heapprof::Stats s0 = heapprof::GetStats();
  // pthread_create, not std::thread: its state object would be one more
  // allocation in the totals.
  pthread_t t;
  REQUIRE(pthread_create(&t, nullptr, &ThreadExitMain, nullptr) == 0);
  REQUIRE(pthread_join(t, nullptr) == 0);
  const heapprof::Stats s1 = heapprof::GetStats();
  pthread_key_delete(g_late_key);
  // 7801, 7802, 7803, 7804, 7805 allocated; all but 7803 freed.
  CHECK(s1.alloc_objects - s0.alloc_objects == 5);
  CHECK(s1.free_objects - s0.free_objects == 4);
  CHECK(s1.alloc_bytes - s0.alloc_bytes == u[1] + u[2] + u[3] + u[4] + u[5]);
  CHECK(s1.free_bytes - s0.free_bytes == u[1] + u[2] + u[4] + u[5]);
  CHECK(s1.sampled_live_objects - s0.sampled_live_objects == 1);
  Profile p;
  REQUIRE(heapprof_test::CaptureProfile(p));
  CHECK(SumOfSize(p, 7801, "alloc_objects", "ExitAlloc") == 1);
  CHECK(SumOfSize(p, 7801, "inuse_objects", "ExitAlloc") == 0);
  CHECK(SumOfSize(p, 7802, "alloc_objects", "ExitAlloc") == 1);
  CHECK(SumOfSize(p, 7803, "inuse_space", "ExitAlloc") == 7803);
  CHECK(SumOfSize(p, 7804, "inuse_objects", "ExitAlloc") == 0);
  // 7805 comes after heapprof's own thread-exit destructor: counted in Stats
  // (above), not sampled.
  CHECK(SumOfSize(p, 7805, "alloc_objects", "ExitAlloc") == 0);
  ::operator delete(g_exit_kept, 7803);
}

// ---- a dlopen'ed library allocating through the hook, then dlclosed ----

#ifdef HEAPPROF_HOOKED_DSO_PATH
TEST_CASE("a dlopen'ed library allocates through the hook; dlclose with its objects live; profiles still write") {
  const heapprof_test::UnwinderScope unwinder;  // restored when the case ends, however it ends
  heapprof_test::RateScope rate(1);
  void* objects[2][3] = {};
  for (int round = 0; round < 2; ++round) {
    void* h = dlopen(HEAPPROF_HOOKED_DSO_PATH, RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(h != nullptr, dlerror());
    auto alloc = reinterpret_cast<void* (*)(std::size_t)>(dlsym(h, "heapprof_hooked_dso_alloc"));
    auto release = reinterpret_cast<void (*)(void*)>(dlsym(h, "heapprof_hooked_dso_free"));
    REQUIRE(reinterpret_cast<void*>(alloc) != nullptr);
    REQUIRE(reinterpret_cast<void*>(release) != nullptr);
    heapprof::SetUnwinder(kUnwinders[round]);
    for (int i = 0; i < 3; ++i) objects[round][i] = alloc(7401 + static_cast<std::size_t>(round));
    release(alloc(7401 + static_cast<std::size_t>(round)));
    Profile loaded;
    std::string why;
    REQUIRE_MESSAGE(heapprof_test::CaptureProfile(loaded, false, nullptr, &why), why);
    REQUIRE_MESSAGE(heapprof_test::Validate(loaded, &why), why);
    CHECK(SumOfSize(loaded, 7401 + round, "inuse_objects", "DsoInner") == 3);
    CHECK(SumOfSize(loaded, 7401 + round, "alloc_objects", "DsoInner") == 4);
    for (const Sample* s : SamplesOfSize(loaded, 7401 + round, "DsoInner")) {
      const auto names = heapprof_test::FunctionNames(loaded, *s);
      REQUIRE(names.size() >= 3);
      CHECK(names[0].find("DsoInner") != std::string::npos);
      CHECK(names[1].find("DsoMiddle") != std::string::npos);
      CHECK(names[2].find("heapprof_hooked_dso_alloc") != std::string::npos);
    }
    REQUIRE(dlclose(h) == 0);
  }
  // The library is gone: the profile still writes, and still names its frames
  // (the library's file, read by name; the objects were seen loaded).
  Profile closed;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::CaptureProfile(closed, false, nullptr, &why), why);
  REQUIRE_MESSAGE(heapprof_test::Validate(closed, &why), why);
  CHECK(SumOfSize(closed, 7401, "inuse_objects", "DsoInner") == 3);
  CHECK(SumOfSize(closed, 7402, "inuse_space", "DsoInner") == 3 * 7402);
  // Its objects are freed by the program after the library is gone.
  for (auto& round : objects) {
    for (void* o : round) delete[] static_cast<char*>(o);
  }
  Profile freed;
  REQUIRE(heapprof_test::CaptureProfile(freed));
  CHECK(SumOfSize(freed, 7401, "inuse_objects", "") == 0);
  CHECK(SumOfSize(freed, 7402, "inuse_objects", "") == 0);
  CHECK(SumOfSize(freed, 7402, "alloc_objects", "") == 4);
}
#endif

// ---- a million distinct stacks ----
// Not under TSan: these children are single-threaded capacity checks (TSan has
// no race to find in them) and took over a minute each there; the plain,
// clang and ASan builds run them.
#if !defined(HEAPPROF_TSAN)

TEST_CASE("a million distinct stacks: the stack table stops at max_stacks, the rest is counted and exact") {
  std::string out;
  const int rc = heapprof_test::RunCommand("HEAPPROF=rate=1 HEAPPROF_TEST_CHILD=stack_cap " + heapprof_test::SelfExe(), out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("stack_cap: ok") != std::string::npos);
}

TEST_CASE("HEAPPROF=max_stacks: a small cap, and past it both tables' limits") {
  std::string out;
  const int rc = heapprof_test::RunCommand(
      "HEAPPROF=rate=1,max_stacks=1000 HEAPPROF_TEST_CHILD=stack_cap_small " + heapprof_test::SelfExe(), out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("stack_cap_small: ok") != std::string::npos);
}
#endif  // !HEAPPROF_TSAN

TEST_CASE("the stack tables' worst case stays under the README's bound: 128-frame stacks past the cap, every bucket limit reached") {
  // Before the arena kept runs of one size class together, 2 KiB stack
  // records interleaved with 64 B buckets took 4 KiB each: 70 MiB here,
  // against a stated 43 MiB.
  std::string out;
  const int rc =
      heapprof_test::RunCommand("HEAPPROF=rate=1 HEAPPROF_TEST_CHILD=stack_cap_deep " + heapprof_test::SelfExe(), out);
  MESSAGE(out);
  CHECK(rc == 0);
  CHECK(out.find("stack_cap_deep: ok") != std::string::npos);
}
