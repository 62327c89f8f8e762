// heapprof: one-line messages on stderr, and the small formatting helpers
// that the dumps, the leak report and the HTTP server share.
#pragma once

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>

#include "heapprof/detail/0_base/arena_allocator.hpp"
#include "heapprof/detail/0_base/env_config.hpp"
#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/config.hpp"

namespace heapprof {
namespace detail {

// `text` to stderr (or where HEAPPROF log= says: env_config.hpp) with
// write(2): no stdio buffer, no allocation, so it is safe from inside an
// allocation hook.
inline void ReportRaw(const char* text) noexcept { WriteReport(text, std::strlen(text)); }

// "heapprof: <line>\n" to stderr with a single writev(2), so lines from
// threads don't mix, and without allocating.
inline void ReportLine(std::string_view line) noexcept {
  bool opened;
  const int fd = ReportFd(&opened);
  if (fd < 0) return;
  const int saved = errno;
  WriteSignalsHeld held;  // a reader gone: EPIPE, not the end of the program (env_config.hpp)
  char prefix[] = "heapprof: ";
  char newline[] = "\n";
  iovec parts[3] = {{prefix, sizeof prefix - 1}, {const_cast<char*>(line.data()), line.size()}, {newline, 1}};
  std::size_t left = parts[0].iov_len + parts[1].iov_len + 1;
  iovec* at = parts;
  int count = 3;
  while (left > 0) {
    const ssize_t n = ::writev(fd, at, count);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) held.WriteFailed(errno);
    if (n <= 0) break;
    left -= static_cast<std::size_t>(n);
    for (std::size_t done = static_cast<std::size_t>(n); done > 0 && count > 0;) {  // a short write
      const std::size_t take = done < at->iov_len ? done : at->iov_len;
      at->iov_base = static_cast<char*>(at->iov_base) + take;
      at->iov_len -= take;
      done -= take;
      if (at->iov_len == 0) {
        ++at;
        --count;
      }
    }
  }
  errno = saved;
  ReportFdDone(fd, opened);
}

inline std::int64_t MonotonicMillis() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

inline std::uint64_t MonotonicNanos() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

// 1536 → "1.50 KiB".
inline ArenaString FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t u = 0;
  const bool negative = bytes < 0;
  double v = negative ? -bytes : bytes;
  while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%s%.0f %s", negative ? "-" : "", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%s%.2f %s", negative ? "-" : "", v, units[u]);
  }
  return ArenaString(buf);
}

}  // namespace detail
}  // namespace heapprof
