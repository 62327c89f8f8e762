// heapprof: profiles to files and streams.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>

#include "heapprof/detail/2_sampling/thread_registry.hpp"
#include "heapprof/detail/5_encoding/snapshot.hpp"

namespace heapprof {
namespace detail {

// Writes `bytes` to `path` so that no reader ever sees part of it: a temporary
// file in the same directory, fsync, rename over `path`. On failure the
// temporary is removed, `path` is untouched, and `error` says why.
inline bool WriteFileAtomic(const std::string& path, const std::string& bytes, std::string* error = nullptr) noexcept {
  ReentrancyGuard guard;
  static std::atomic<std::uint32_t> counter{0};
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%u", static_cast<long>(getpid()),
                counter.fetch_add(1, std::memory_order_relaxed));
  HEAPPROF_TRY {
    const std::string tmp = path + suffix;
    auto fail = [&](const char* what, int err, bool unlink_tmp) {
      if (unlink_tmp) ::unlink(tmp.c_str());
      if (error != nullptr) *error = std::string(what) + " " + (unlink_tmp ? tmp : path) + ": " + std::strerror(err);
      return false;
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return fail("cannot create", errno, false);
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        ::close(fd);
        return fail("cannot write", err, true);
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
      const int err = errno;
      ::close(fd);
      return fail("cannot fsync", err, true);
    }
    if (::close(fd) != 0) return fail("cannot close", errno, true);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      if (error != nullptr) *error = "cannot rename " + tmp + " to " + path + ": " + std::strerror(err);
      return false;
    }
    return true;
  }
  HEAPPROF_CATCH_ALL {
    if (error != nullptr) error->clear();
    return false;
  }
}

// The profile, gzip'ed, written atomically to `path`.
inline bool WriteProfileFile(const std::string& path, bool allocs_default, std::string* error = nullptr) noexcept {
  ReentrancyGuard guard;
  std::string gz;
  if (!BuildProfileBytes(allocs_default, gz)) {
    if (error != nullptr) *error = "out of memory building the profile";
    return false;
  }
  return WriteFileAtomic(path, gz, error);
}

inline bool WriteProfile(std::ostream& out, bool allocs_default) noexcept {
  ReentrancyGuard guard;
  std::string gz;
  if (!BuildProfileBytes(allocs_default, gz)) return false;
  HEAPPROF_TRY {
    out.write(gz.data(), static_cast<std::streamsize>(gz.size()));
    out.flush();
    return !out.fail();
  }
  HEAPPROF_CATCH_ALL {  // a stream with exceptions() enabled
    return false;
  }
}

}  // namespace detail
}  // namespace heapprof
