// heapprof: profiles to files and streams.
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <ostream>
#include <string>
#include <utility>

#include "heapprof/detail/6_serving/retention.hpp"
#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/2_sampling/thread_registry.hpp"
#include "heapprof/detail/5_encoding/snapshot.hpp"

namespace heapprof {
namespace detail {

// A profile's build (the snapshot, symbolization: ELF and DWARF reading,
// libstdc++'s demangler, whose arrays on the stack grow with a name's length;
// the encoding; the retention scan) takes 30-60 KiB of stack for a small C++
// program. On a thread with less than this left, or off the thread's own
// stack (a coroutine's: how much is left there is not known), it runs on the
// profiler's own stack (256 KiB, profiler_stack.hpp), as a sample does: the
// leak report at exit of a program run under `ulimit -s 32`, or that calls
// exit() on a thread of 16 KiB, died of SIGSEGV, and so did a Write*Profile
// there or on a coroutine of 16 KiB.
constexpr std::size_t kBuildStackHeadroom = 128 * 1024;

template <class Fn>
struct BuildStackCall {
  Fn* fn = nullptr;
#if HEAPPROF_EXCEPTIONS
  std::exception_ptr thrown;  // (bad_alloc of the arena) rethrown on the caller's stack
#endif
};

// Runs fn() here, or on the profiler's stack when this thread's stack is
// short. There cancellation is held off (a forced unwind cannot leave that
// stack); a cancel that came meanwhile acts on return, and an exception fn
// throws is thrown again once back. fn must not scan from its own frame (a
// retention scan starts where the caller's registers were spilled:
// retention::WithRegistersSpilled).
//
// On a signal's alternate stack (a handler that calls exit() or writes a
// profile), asynchronous signals are held off while there: the kernel,
// seeing a stack pointer off the alternate stack, would run a nested
// SA_ONSTACK handler from the top of the alternate stack, over the live
// frames of this one.
template <class Fn>
inline void RunWithBuildStack(Fn& fn) {
  const ThreadState* ts = tls_thread_state;
  std::uintptr_t lo = 0, hi = 0;
  if (ts != nullptr && ts->stack_hi != 0) {
    lo = ts->stack_lo;
    hi = ts->stack_hi;
  } else {
    CurrentStackBounds(lo, hi);  // a thread that never allocated
  }
  const auto sp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (!StackHasRoom(sp, lo, hi, kBuildStackHeadroom)) {
    int state = PTHREAD_CANCEL_ENABLE;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
    sigset_t old_mask;
    bool masked = false;
    stack_t alternate{};
    if (sigaltstack(nullptr, &alternate) == 0 && (alternate.ss_flags & SS_ONSTACK) != 0) {
      sigset_t async;
      sigfillset(&async);
      for (const int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&async, sig);
      masked = pthread_sigmask(SIG_BLOCK, &async, &old_mask) == 0;
    }
    BuildStackCall<Fn> call;
    call.fn = &fn;
    const bool ran = RunOnProfilerStack(
        [](void* arg) noexcept {
          auto& c = *static_cast<BuildStackCall<Fn>*>(arg);
#if HEAPPROF_EXCEPTIONS
          try {
            (*c.fn)();
          } catch (...) {  // (no forced unwind: cancellation is off)
            c.thrown = std::current_exception();
          }
#else
          (*c.fn)();
#endif
        },
        &call);
    const int err = errno;
    if (masked) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    pthread_setcancelstate(state, nullptr);
    errno = err;
    if (ran) {
#if HEAPPROF_EXCEPTIONS
      if (call.thrown) std::rethrow_exception(call.thrown);
#endif
      if (state == PTHREAD_CANCEL_ENABLE) pthread_testcancel();
      return;
    }
  }
  fn();
}

// Writes `bytes` to `path` so that no reader ever sees part of it: a temporary
// file in the same directory, fsync, rename over `path`. On failure the
// temporary is removed, `path` is untouched, and `error` says why.
//
// Not noexcept, and no catch-all swallows cancellation (errors.hpp):
// pthread_cancel must unwind through here. WriteFileAtomic below holds
// cancellation off during the write, so a cancelled write leaves nothing
// behind either, with or without exceptions.
inline bool WriteFileAtomicNow(const ArenaString& given_path, const ArenaString& bytes, ArenaString* error) {
  // A failure leaves errno saying why (the public Write*(path) return only
  // false): set last, after the temporary's close and unlink.
  struct FailureErrno {
    int value = 0;
    ~FailureErrno() {
      if (value != 0) errno = value;
    }
  } failure;
  ReentrancyGuard guard;
  // What is at the path decides: nothing or a regular file is replaced; a
  // symlink is followed (its target is replaced, the link stays); anything
  // else (a FIFO, a device such as /dev/null, a socket, a directory) is
  // refused: renaming over it would replace a special file with a regular one.
  ArenaString path = given_path;
  struct stat st {};
  st.st_mode = S_IFREG;  // nothing there (yet): created
  for (int hops = 0; ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode); ++hops) {
    char target[4096];
    const ssize_t n = hops < 16 ? ::readlink(path.c_str(), target, sizeof target - 1) : -1;
    if (n <= 0) {
      failure.value = hops < 16 ? (n < 0 ? errno : ENOENT) : ELOOP;
      if (error != nullptr) *error = "cannot follow symlink " + given_path;
      return false;
    }
    if (target[0] == '/') {
      path.assign(target, static_cast<std::size_t>(n));
    } else {  // relative to the link's directory
      const std::size_t slash = path.rfind('/');
      path = (slash == ArenaString::npos ? ArenaString() : path.substr(0, slash + 1)) +
             ArenaString(target, static_cast<std::size_t>(n));
    }
    st.st_mode = S_IFREG;
  }
  if (!S_ISREG(st.st_mode)) {
    failure.value = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    if (error != nullptr) *error = "not a regular file, not replaced: " + path;
    return false;
  }
  // A file replaced keeps its permissions: the rename puts a new inode in
  // its place, and one made 0644 turned a profile the owner had made private
  // (chmod 600: label values, paths, sizes) readable by every user at the
  // next write. The temporary is private until it has the old file's mode.
  struct stat existing {};
  const bool replacing = ::stat(path.c_str(), &existing) == 0 && S_ISREG(existing.st_mode);
  static std::atomic<std::uint32_t> counter{0};
  HEAPPROF_TRY {
    // The temporary is the name plus ".tmp.<pid>.<n>"; a name within
    // NAME_MAX but too long for the suffix too is cut short first (still in
    // the same directory, so the rename stays atomic). Without this a legal
    // dump name of 240-255 bytes could not be written at all.
    const std::size_t slash = path.rfind('/');
    const std::size_t base = slash == ArenaString::npos ? 0 : slash + 1;
    auto temporary_name = [&] {
      char suffix[64];
      std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%u", static_cast<long>(getpid()),
                    counter.fetch_add(1, std::memory_order_relaxed));
      const std::size_t suffix_len = std::strlen(suffix);
      ArenaString name = path;
      if (name.size() - base + suffix_len > NAME_MAX) name.resize(base + (NAME_MAX - suffix_len));
      return name += suffix;
    };
    struct Temporary {
      ArenaString name;
      int fd = -1;
      bool keep = false;
      ~Temporary() {
        if (fd >= 0) ::close(fd);
        if (!keep) ::unlink(name.c_str());
      }
    } tmp{temporary_name()};
    auto fail = [&](const char* what, int err) {  // every step before the rename is on the temporary
      failure.value = err;
      if (error != nullptr) *error = ArenaString(what) + " " + tmp.name + ": " + std::strerror(err);
      return false;
    };
    // A name taken moves on to the next number: a program that exec()s keeps
    // its pid and numbers from 0 again, and a temporary its old image left
    // (exec in the middle of a dump) made the new image's first write fail
    // with EEXIST. That file is not removed: under another pid namespace
    // sharing the directory it can be a live process's.
    for (int tries = 0;; ++tries) {
      tmp.fd = ::open(tmp.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, replacing ? 0600 : 0644);
      if (tmp.fd >= 0) break;
      const int err = errno;
      if (err != EEXIST || tries == 63) {
        tmp.keep = true;  // not ours to remove
        return fail("cannot create", err);
      }
      tmp.name = temporary_name();
    }
    if (replacing && ::fchmod(tmp.fd, existing.st_mode & 0777) != 0) return fail("cannot set the mode of", errno);
    std::size_t done = 0;
    {
      WriteSignalsHeld held;  // past RLIMIT_FSIZE: EFBIG, not the end of the process
      while (done < bytes.size()) {
        const ssize_t n = ::write(tmp.fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          const int err = n < 0 ? errno : EIO;
          held.WriteFailed(err);
          return fail("cannot write", err);
        }
        done += static_cast<std::size_t>(n);
      }
    }
    // Not syncable (EINVAL, EROFS), or refused (ENOSYS, EPERM: a seccomp
    // filter): the bytes are written all the same. Before, such a filter
    // lost every profile the process wrote.
    if (::fsync(tmp.fd) != 0 && errno != EINVAL && errno != EROFS && errno != ENOSYS && errno != EPERM) {
      return fail("cannot fsync", errno);
    }
    const int fd = tmp.fd;
    tmp.fd = -1;
    if (::close(fd) != 0) return fail("cannot close", errno);
    if (::rename(tmp.name.c_str(), path.c_str()) != 0) {
      const int err = errno;
      failure.value = err;
      if (error != nullptr) *error = "cannot rename " + tmp.name + " to " + path + ": " + std::strerror(err);
      return false;
    }
    tmp.keep = true;
    return true;
  }
  HEAPPROF_CATCH_ALL {
    failure.value = ENOMEM;
    if (error != nullptr) error->clear();
    return false;
  }
}

// WriteFileAtomicNow with cancellation held off until the temporary is gone:
// in a build without exceptions a forced unwind runs no destructor, so a
// cancel inside the write would leave the temporary behind. A pending
// cancellation then acts right here, on the way out.
inline bool WriteFileAtomic(const ArenaString& path, const ArenaString& bytes, ArenaString* error = nullptr) {
  int state = PTHREAD_CANCEL_ENABLE;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
  const bool ok = WriteFileAtomicNow(path, bytes, error);
  const int err = errno;
  pthread_setcancelstate(state, nullptr);
  errno = err;
  if (state == PTHREAD_CANCEL_ENABLE) pthread_testcancel();
  return ok;
}


// Where a process's one-per-exit files go (<prefix>.<pid>.leaks.pb.gz and its
// .retention, .peak, .oom): "<prefix>.<pid>", or, when a file of one of
// `kinds` is already there under it, "<prefix>.<pid>.<n>" for the first n
// from 2 under which none is. Such a file is an earlier process's of the same
// pid, never this one's (each kind is written once per process): a
// container's main process is pid 1 at every start, and the leak report of
// each restart writing into a volume replaced the last one's (heap dumps
// already passed over taken numbers). `kinds` go together: a leak profile
// and its retention profile get the same name.
inline ArenaString UnusedExitFileBase(const ArenaString& prefix, std::initializer_list<const char*> kinds) {
  char pid[32];
  std::snprintf(pid, sizeof pid, ".%ld", static_cast<long>(getpid()));
  const ArenaString base = prefix + pid;
  for (unsigned n = 1; n < 100000; ++n) {
    ArenaString candidate = base;
    if (n > 1) {
      char number[16];
      std::snprintf(number, sizeof number, ".%u", n);
      candidate += number;
    }
    bool taken = false;
    for (const char* kind : kinds) {
      struct stat st {};
      taken = taken || ::lstat((candidate + "." + kind + ".pb.gz").c_str(), &st) == 0;
    }
    if (!taken) return candidate;
  }
  return base;  // (past that many: the first name, written over as before)
}
// A profile that `build` (one of the Build*ProfileBytes) serialises, gzip'ed,
// written atomically to `path`.
template <class Build>
inline bool WriteBuiltProfileFile(const ArenaString& path, ArenaString* error, Build build) {
  ReentrancyGuard guard;
  WriteHeadroom headroom;  // built without exceptions: the memory first (the file's name too), or no write
  ArenaString gz;
  if (!headroom.ok() || !build(gz)) {
    if (error != nullptr) *error = "out of memory building the profile";
    errno = ENOMEM;
    return false;
  }
  return WriteFileAtomic(path, gz, error);
}

// The body of the public Write*(path) (implementation.hpp), under the
// caller's ReentrancyGuard: `write(path)` with its headroom first, false with
// errno saying why when it fails.
template <class Write>
inline bool WriteToPath(const char* path, Write write) {
  WriteHeadroom headroom;  // built without exceptions: the memory first (the path's string too)
  if (!headroom.ok()) return FailWithErrno(ENOMEM);
  HEAPPROF_TRY { return path != nullptr ? write(path) : FailWithErrno(EINVAL); }
  HEAPPROF_CATCH_ALL { return FailWithErrno(ENOMEM); }
}

// The profile, gzip'ed, written atomically to `path`.
inline bool WriteProfileFile(const ArenaString& path, bool allocs_default, ArenaString* error = nullptr) {
  bool ok = false;
  auto run = [&] {
    ok = WriteBuiltProfileFile(path, error,
                               [allocs_default](ArenaString& gz) { return BuildProfileBytes(allocs_default, gz); });
  };
  RunWithBuildStack(run);
  return ok;
}

// The peak profile (2_sampling/peak.hpp), to a file.
inline bool WritePeakProfileFile(const ArenaString& path, ArenaString* error = nullptr) {
  bool ok = false;
  auto run = [&] { ok = WriteBuiltProfileFile(path, error, [](ArenaString& gz) { return BuildPeakProfileBytes(gz); }); };
  RunWithBuildStack(run);
  return ok;
}

// The retention profile (retention.hpp), to a file. The scan starts at the
// caller's frame, its registers spilled there, wherever the build runs.
inline bool WriteRetentionProfileFile(const ArenaString& path, ArenaString* error = nullptr) {
  bool ok = false;
  auto spilled = [&](std::uintptr_t from) {
    auto run = [&] {
      ok = WriteBuiltProfileFile(path, error, [from](ArenaString& gz) { return BuildRetentionProfileBytes(gz, from); });
    };
    RunWithBuildStack(run);
  };
  retention::WithRegistersSpilled(spilled);
  return ok;
}

// `gz` (a built profile) to `out`; false if the stream fails.
inline bool WriteProfileBytes(std::ostream& out, const ArenaString& gz) {
  HEAPPROF_TRY {
    out.write(gz.data(), static_cast<std::streamsize>(gz.size()));
    out.flush();
    return !out.fail();
  }
  HEAPPROF_CATCH_ALL {  // a stream with exceptions() enabled
    return false;
  }
}

inline bool WriteRetentionProfile(std::ostream& out) {
  ReentrancyGuard guard;
  ArenaString gz;  // the build holds the write's headroom (built without exceptions)
  bool built = false;
  auto spilled = [&](std::uintptr_t from) {
    auto build = [&] { built = BuildRetentionProfileBytes(gz, from); };
    RunWithBuildStack(build);  // (the stream's write is the caller's, on its stack)
  };
  retention::WithRegistersSpilled(spilled);
  return built && WriteProfileBytes(out, gz);
}

inline bool WriteProfile(std::ostream& out, bool allocs_default, bool peak = false) {
  ReentrancyGuard guard;
  ArenaString gz;  // the build holds the write's headroom (built without exceptions)
  bool built = false;
  auto build = [&] { built = peak ? BuildPeakProfileBytes(gz) : BuildProfileBytes(allocs_default, gz); };
  RunWithBuildStack(build);  // (the stream's write is the caller's, on its stack)
  return built && WriteProfileBytes(out, gz);
}

}  // namespace detail
}  // namespace heapprof
