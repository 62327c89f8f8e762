// heapprof: the process's memory limit and its usage, for dump_near_oom and
// rss_interval (dumps.hpp).
//
// The limits:
//   1. the memory cgroup's: v2 memory.max / memory.high, v1
//      memory.limit_in_bytes, of the process's cgroup and every ancestor up
//      to the mount's root (the one with the least room left);
//      usage: that cgroup's memory.current / memory.usage_in_bytes, what the
//      kernel charges (page cache included, as the OOM killer sees it);
//   2. RLIMIT_AS; usage: the address space (VmSize, /proc/self/statm);
//      RLIMIT_DATA (ulimit -d, systemd's LimitDATA=: since Linux 4.7 it
//      limits every private writable mapping, so malloc fails at it); usage:
//      statm's data field (VmData + VmStk: the main thread's stack, usually
//      132 KiB, is counted too). Before, RLIMIT_DATA was not looked at:
//      under `ulimit -d` dump_near_oom watched physical memory and wrote
//      nothing before the bad_alloc;
//   3. physical memory; usage: RSS (/proc/self/statm).
// Of 1 and 2, the one with the least room left (limit - usage) when the
// limit is read (FindMemoryLimit).
// Cgroup mount points come from /proc/self/mountinfo, and the cgroup's path
// from /proc/self/cgroup (relative to the mount's root, so a container that
// mounts its own cgroup at / works). A cgroup "without a limit" (v1 shows
// 2^63 rounded down to pages) does not count.
//
// Cost: finding the limit reads /proc/self/cgroup, /proc/self/mountinfo and a
// file or two per cgroup level (done at the dump thread's start and again
// once a second, so a limit set later, or setrlimit, is seen); reading the
// usage is one open/read/close of a small file (measured in the README).
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "heapprof/detail/0_base/proc_self.hpp"

namespace heapprof {
namespace detail {

// The whole of a small file (at most `cap` - 1 bytes) into `buf`; its length, or -1.
inline long ReadSmallFile(const char* path, char* buf, std::size_t cap) noexcept {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::size_t n = 0;
  while (n + 1 < cap) {
    const ssize_t r = ::read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += static_cast<std::size_t>(r);
  }
  ::close(fd);
  buf[n] = '\0';
  return static_cast<long>(n);
}

// A cgroup limit or counter file: a number, or "max" (no limit: 0).
inline bool ReadCgroupNumber(const std::string& path, std::uint64_t& out) noexcept {
  char buf[64];
  if (ReadSmallFile(path.c_str(), buf, sizeof buf) <= 0) return false;
  if (std::strncmp(buf, "max", 3) == 0) {
    out = 0;
    return true;
  }
  std::uint64_t v = 0;
  const char* p = buf;
  if (*p < '0' || *p > '9') return false;
  for (; *p >= '0' && *p <= '9'; ++p) v = v * 10 + static_cast<std::uint64_t>(*p - '0');
  out = v;
  return true;
}

inline std::uint64_t PhysicalMemoryBytes() noexcept {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

// Field `index` (0: size, 1: resident, 5: data) of /proc/self/statm, in bytes.
inline std::uint64_t StatmBytes(int index) noexcept {
  char buf[256];
  if (ReadSmallFile(ProcSelfPath("statm").c_str(), buf, sizeof buf) <= 0) return 0;
  const char* p = buf;
  for (int i = 0; i < index; ++i) {
    while (*p != '\0' && *p != ' ') ++p;
    while (*p == ' ') ++p;
  }
  std::uint64_t v = 0;
  for (; *p >= '0' && *p <= '9'; ++p) v = v * 10 + static_cast<std::uint64_t>(*p - '0');
  return v * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

inline std::uint64_t ResidentBytes() noexcept { return StatmBytes(1); }

struct MemoryLimit {
  enum Source { kNone, kCgroupV2Max, kCgroupV2High, kCgroupV1, kRlimitAs, kRlimitData, kPhysical };
  Source source = kNone;
  std::uint64_t limit = 0;
  std::string usage_file;  // cgroup sources: the counter to read

  const char* Name() const noexcept {
    switch (source) {
      case kCgroupV2Max: return "cgroup memory.max";
      case kCgroupV2High: return "cgroup memory.high";
      case kCgroupV1: return "cgroup v1 memory.limit_in_bytes";
      case kRlimitAs: return "RLIMIT_AS";
      case kRlimitData: return "RLIMIT_DATA";
      case kPhysical: return "physical memory";
      case kNone: break;
    }
    return "no limit";
  }
  const char* UsageName() const noexcept {
    switch (source) {
      case kCgroupV2Max: case kCgroupV2High: return "cgroup memory.current";
      case kCgroupV1: return "cgroup memory.usage_in_bytes";
      case kRlimitAs: return "address space";
      case kRlimitData: return "data";
      case kPhysical: return "RSS";
      case kNone: break;
    }
    return "";
  }

  // The matching usage now; 0 if it cannot be read.
  std::uint64_t Usage() const noexcept {
    std::uint64_t v = 0;
    switch (source) {
      case kCgroupV2Max: case kCgroupV2High: case kCgroupV1:
        return ReadCgroupNumber(usage_file, v) ? v : 0;
      case kRlimitAs: return StatmBytes(0);
      case kRlimitData: return StatmBytes(5);
      case kPhysical: return StatmBytes(1);
      case kNone: break;
    }
    return 0;
  }
};

// In /proc/self/mountinfo's text: the mount point and root of the cgroup2
// hierarchy (v2) or of the v1 hierarchy with the memory controller.
inline bool CgroupMountIn(std::string_view text, bool v2, std::string& mount_point, std::string& root) {
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    std::string_view f[5];
    std::string_view rest = line;
    int k = 0;
    for (; k < 5 && !rest.empty(); ++k) {
      const std::size_t sp = rest.find(' ');
      f[k] = rest.substr(0, sp);
      rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
    }
    if (k < 5) continue;
    const std::size_t dash = rest.find("- ") == 0 ? 0 : rest.find(" - ");
    if (dash == std::string_view::npos) continue;
    std::string_view tail = rest.substr(dash == 0 ? 2 : dash + 3);
    const std::size_t sp1 = tail.find(' ');
    const std::string_view fstype = tail.substr(0, sp1);
    std::string_view super = sp1 == std::string_view::npos ? std::string_view{} : tail.substr(sp1 + 1);
    const std::size_t sp2 = super.find(' ');  // past the source
    super = sp2 == std::string_view::npos ? std::string_view{} : super.substr(sp2 + 1);
    bool match = false;
    if (v2) {
      match = fstype == "cgroup2";
    } else if (fstype == "cgroup") {
      while (!super.empty() && !match) {
        const std::size_t c = super.find(',');
        match = super.substr(0, c) == "memory";
        super = c == std::string_view::npos ? std::string_view{} : super.substr(c + 1);
      }
    }
    if (match) {
      root.assign(f[3].data(), f[3].size());
      mount_point.assign(f[4].data(), f[4].size());
      return true;
    }
  }
  return false;
}

// In /proc/self/cgroup's text: the process's path in the v2 hierarchy
// ("0::/path") or in the v1 one with the memory controller.
inline bool CgroupPathIn(std::string_view text, bool v2, std::string& path) {
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    const std::size_t c1 = line.find(':');
    const std::size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    bool match = false;
    if (v2) {
      match = line.substr(0, c1) == "0" && controllers.empty();
    } else {
      while (!controllers.empty() && !match) {
        const std::size_t c = controllers.find(',');
        match = controllers.substr(0, c) == "memory";
        controllers = c == std::string_view::npos ? std::string_view{} : controllers.substr(c + 1);
      }
    }
    if (match) {
      const std::string_view p = line.substr(c2 + 1);
      path.assign(p.data(), p.size());
      return true;
    }
  }
  return false;
}

// Of the limits on the way from the cgroup at `path` (as /proc/self/cgroup
// gives it) up to the root of the hierarchy mounted at `mount` (whose root is
// `root`), the one with the least room left (limit - that cgroup's usage,
// which counts its children's); false if none is set. The lowest limit was
// taken before: a parent (a pod, a systemd slice) whose children together
// neared its limit was not watched while the process's own cgroup, with a
// lower limit, had room.
// The room left under `limit` at usage `used`: how much more use it allows.
inline std::uint64_t RoomUnder(std::uint64_t limit, std::uint64_t used) noexcept {
  return limit > used ? limit - used : 0;
}

inline bool CgroupLimitUnder(const std::string& mount, const std::string& root, std::string path, bool v2,
                             MemoryLimit& out) {
  if (root != "/" && path.compare(0, root.size(), root) == 0) path = path.substr(root.size());
  if (path.empty() || path[0] != '/') path.insert(path.begin(), '/');
  const std::uint64_t unlimited = std::uint64_t{1} << 62;  // v1's "no limit" is 2^63 - a page
  bool found = false;
  std::uint64_t best_room = 0;
  for (;;) {
    const std::string dir = mount + (path == "/" ? std::string() : path);
    const std::string usage_file = dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes");
    bool usage_read = false;  // read once per directory, when it has a limit
    std::uint64_t used = 0, v = 0;
    const char* files[2] = {v2 ? "/memory.max" : "/memory.limit_in_bytes", v2 ? "/memory.high" : nullptr};
    for (int i = 0; i < 2; ++i) {
      if (files[i] == nullptr) continue;
      if (!ReadCgroupNumber(dir + files[i], v) || v == 0 || v >= unlimited) continue;
      if (!usage_read && !ReadCgroupNumber(usage_file, used)) used = 0;
      usage_read = true;
      const std::uint64_t room = RoomUnder(v, used);
      if (!found || room < best_room || (room == best_room && v < out.limit)) {
        found = true;
        best_room = room;
        out.limit = v;
        out.source = !v2 ? MemoryLimit::kCgroupV1 : i == 0 ? MemoryLimit::kCgroupV2Max : MemoryLimit::kCgroupV2High;
        out.usage_file = usage_file;
      }
    }
    if (path == "/") break;
    const std::size_t slash = path.rfind('/');
    path = slash == 0 ? std::string("/") : path.substr(0, slash);
  }
  return found;
}

inline bool FindCgroupLimit(bool v2, MemoryLimit& out) {
  char mountinfo[16384], cgroup[4096];
  if (ReadSmallFile(ProcSelfPath("mountinfo").c_str(), mountinfo, sizeof mountinfo) <= 0) return false;
  if (ReadSmallFile(ProcSelfPath("cgroup").c_str(), cgroup, sizeof cgroup) <= 0) return false;
  std::string mount, root, path;
  if (!CgroupMountIn(mountinfo, v2, mount, root) || !CgroupPathIn(cgroup, v2, path)) return false;
  return CgroupLimitUnder(mount, root, path, v2, out);
}

// Of the limits that apply (the cgroup's, RLIMIT_AS, RLIMIT_DATA), the one
// with the least room left now: the one the process will hit first, if it
// grows as it is growing. A fixed order (the cgroup's first, then
// RLIMIT_AS) watched a limit the process never reached when another,
// tighter one was set as well (a container's memory.max and a service's
// `ulimit -v`; RLIMIT_DATA was not read at all). Physical memory when none.
inline MemoryLimit FindMemoryLimit() {
  MemoryLimit best;
  std::uint64_t best_room = 0;
  auto consider = [&best, &best_room](const MemoryLimit& m) {
    const std::uint64_t room = RoomUnder(m.limit, m.Usage());
    if (best.source == MemoryLimit::kNone || room < best_room) {
      best = m;
      best_room = room;
    }
  };
  MemoryLimit cgroup;
  if (FindCgroupLimit(true, cgroup) || FindCgroupLimit(false, cgroup)) {
    // A cgroup limit above physical memory never binds.
    const std::uint64_t phys = PhysicalMemoryBytes();
    if (phys == 0 || cgroup.limit < phys) consider(cgroup);
  }
  const struct {
    int resource;
    MemoryLimit::Source source;
  } rlimits[2] = {{RLIMIT_AS, MemoryLimit::kRlimitAs}, {RLIMIT_DATA, MemoryLimit::kRlimitData}};
  for (const auto& r : rlimits) {
    rlimit rl{};
    if (getrlimit(r.resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
    MemoryLimit m;
    m.source = r.source;
    m.limit = rl.rlim_cur;
    consider(m);
  }
  if (best.source != MemoryLimit::kNone) return best;
  best.limit = PhysicalMemoryBytes();
  best.source = best.limit != 0 ? MemoryLimit::kPhysical : MemoryLimit::kNone;
  return best;
}

}  // namespace detail
}  // namespace heapprof
