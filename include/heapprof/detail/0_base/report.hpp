// heapprof: one-line messages on stderr, and the small formatting helpers
// that the dumps, the leak report and the HTTP server share.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/config.hpp"

namespace heapprof {
namespace detail {

// `text` to stderr with write(2): no stdio buffer, no allocation, so it is
// safe from inside an allocation hook.
inline void ReportRaw(const char* text) noexcept {
  const int saved = errno;
  std::size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(2, text, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text += n;
    left -= static_cast<std::size_t>(n);
  }
  errno = saved;
}

// "heapprof: <line>\n" to stderr with a single write(2), so lines from
// threads don't mix.
inline void ReportLine(const std::string& line) noexcept {
  HEAPPROF_TRY {
    const std::string out = "heapprof: " + line + "\n";
    ReportRaw(out.c_str());
  }
  HEAPPROF_CATCH_ALL_NOEXCEPT {}
}

inline std::int64_t MonotonicMillis() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// 1536 → "1.50 KiB".
inline std::string FormatBytes(double bytes) {
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
  return buf;
}

}  // namespace detail
}  // namespace heapprof
