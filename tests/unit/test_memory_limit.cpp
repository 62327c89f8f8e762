// Memory events without a process of their own: the HEAPPROF keys, and
// finding the memory limit (cgroup v1/v2 layouts as fixtures, a fake cgroup
// tree in a temporary directory).
#include <heapprof.hpp>
#include "heapprof/detail/0_base/env_config.hpp"
#include "heapprof/detail/6_serving/dumps.hpp"
#include "heapprof/detail/6_serving/memory_limit.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace hd = heapprof::detail;

TEST_CASE("oom_dump's default reserve: 64 MiB without RLIMIT_AS or with 512 MiB left, else what names need") {
  constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
  const std::uint64_t floor = 15 * MiB + 12345;  // a 7 MiB program: its file + the 8 MiB margin
  CHECK(hd::DefaultOomReserve(0, 100 * MiB, floor) == 64 * MiB);           // no limit: as always
  CHECK(hd::DefaultOomReserve(1124 * MiB, 100 * MiB, floor) == 64 * MiB);  // 1 GiB left
  CHECK(hd::DefaultOomReserve(612 * MiB, 100 * MiB, floor) == 64 * MiB);   // 512 MiB left: 64 MiB is an eighth
  // Less left: the floor, in whole pages (before: 64 MiB of 128 MiB).
  CHECK(hd::DefaultOomReserve(611 * MiB, 100 * MiB, floor) == 15 * MiB + 12288);
  CHECK(hd::DefaultOomReserve(228 * MiB, 100 * MiB, floor) == 15 * MiB + 12288);
  // Never more than half of what is left, nor more than 64 MiB.
  CHECK(hd::DefaultOomReserve(120 * MiB, 100 * MiB, floor) == 10 * MiB);
  CHECK(hd::DefaultOomReserve(400 * MiB, 100 * MiB, 100 * MiB) == 64 * MiB);
  CHECK(hd::DefaultOomReserve(100 * MiB, 100 * MiB, floor) == 0);  // nothing left
  CHECK(hd::DefaultOomReserve(50 * MiB, 100 * MiB, floor) == 0);   // a limit below the address space
}

TEST_CASE("HEAPPROF memory-event keys: peak_at_exit, dump_near_oom, rss_interval, oom_dump, oom_reserve") {
  const hd::EnvConfig c =
      hd::ParseEnvConfig("peak_at_exit=1,dump_near_oom=0.9,rss_interval=64m,oom_dump=1,oom_reserve=16m");
  CHECK(c.peak_at_exit);
  CHECK(c.dump_near_oom == 900000);
  CHECK(c.rss_interval == (std::uint64_t{64} << 20));
  CHECK(c.oom_dump);
  CHECK(c.oom_reserve == (std::uint64_t{16} << 20));
  CHECK(c.WantsDumper());
  CHECK_FALSE(hd::ParseEnvConfig("peak_at_exit=1").WantsDumper());  // written at exit, no thread
  std::uint32_t f = 0;
  CHECK((hd::ParseFraction(".95", f) && f == 950000));
  CHECK((hd::ParseFraction("1", f) && f == 1000000));
  CHECK((hd::ParseFraction("1.", f) && f == 1000000));
  CHECK((hd::ParseFraction("0.000001", f) && f == 1));
  for (const char* bad : {"", "0", "0.0", "1.5", "2", ".", "0.9x", "-0.5", "0.1234567", "90%", "0,9"}) {
    INFO(bad);
    CHECK_FALSE(hd::ParseFraction(bad, f));
  }
  CHECK(hd::ParseEnvConfig("dump_near_oom=1.5").dump_near_oom == 0);
  CHECK(hd::ParseEnvConfig("rss_interval=0").rss_interval == 0);
}

TEST_CASE("dump_near_oom: limits that take turns keep their thresholds; a limit not seen before starts again") {
  // Two limits with nearly the same room take turns as the one watched:
  // before, each turn restarted the thresholds (halvings 0), and the next
  // poll dumped again, once a second.
  using Source = hd::MemoryLimit::Source;
  hd::NearOomProgress p;
  constexpr std::uint64_t kCgroup = 2000000000, kAs = 3000000000;
  // Watching the cgroup's limit, dumped for 2 thresholds; the turn to RLIMIT_AS.
  hd::NearOomProgress::Entry e = p.Switch({hd::MemoryLimit::kNone, 0, 0, false}, Source::kCgroupV2Max, kCgroup);
  CHECK(e.halvings == 0);
  e = p.Switch({Source::kCgroupV2Max, kCgroup, 2, false}, Source::kRlimitAs, kAs);
  CHECK(e.halvings == 0);  // not seen before: from the first threshold
  CHECK(!e.done);
  // RLIMIT_AS dumped for 1; back to the cgroup: it goes on from its 2.
  e = p.Switch({Source::kRlimitAs, kAs, 1, false}, Source::kCgroupV2Max, kCgroup);
  CHECK(e.halvings == 2);
  e = p.Switch({Source::kCgroupV2Max, kCgroup, 3, true}, Source::kRlimitAs, kAs);
  CHECK(e.halvings == 1);
  e = p.Switch({Source::kRlimitAs, kAs, 1, false}, Source::kCgroupV2Max, kCgroup);
  CHECK(e.halvings == 3);
  CHECK(e.done);
  // The cgroup resized: another limit, from the first threshold.
  e = p.Switch({Source::kCgroupV2Max, kCgroup, 3, true}, Source::kCgroupV2Max, kCgroup * 2);
  CHECK(e.halvings == 0);
  CHECK(!e.done);
  // Four limits left are remembered; a fifth pushes out the one left longest ago.
  e = p.Switch({Source::kCgroupV2Max, kCgroup * 2, 1, false}, Source::kRlimitData, 100);
  e = p.Switch({Source::kRlimitData, 100, 4, false}, Source::kPhysical, 200);
  CHECK(p.count == hd::NearOomProgress::kEntries);  // data, the resized cgroup, the cgroup, RLIMIT_AS
  e = p.Switch({Source::kPhysical, 200, 5, false}, Source::kRlimitAs, kAs);
  CHECK(e.halvings == 1);  // the fourth: still there
  e = p.Switch({Source::kRlimitAs, kAs, 1, false}, Source::kCgroupV1, 300);
  CHECK(p.count == hd::NearOomProgress::kEntries);  // RLIMIT_AS, physical, data, the resized cgroup
  e = p.Switch({Source::kCgroupV1, 300, 6, false}, Source::kCgroupV2Max, kCgroup);
  CHECK(e.halvings == 0);  // pushed out
  CHECK(p.count == hd::NearOomProgress::kEntries);
}

TEST_CASE("memory limit: cgroup mounts and paths from mountinfo and /proc/self/cgroup") {
  // A Debian 12 host with the v1 hierarchies (this repository's test VM) and
  // an unused cgroup2 mount.
  const char* v1_mountinfo =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  const char* v1_cgroup = "9:name=systemd:/\n4:memory:/process_api/f03a\n1:cpu:/\n0::/\n";
  std::string mount, root, path;
  REQUIRE(hd::CgroupMountIn(v1_mountinfo, false, mount, root));
  CHECK(mount == "/sys/fs/cgroup/memory");
  CHECK(root == "/");
  REQUIRE(hd::CgroupPathIn(v1_cgroup, false, path));
  CHECK(path == "/process_api/f03a");
  REQUIRE(hd::CgroupMountIn(v1_mountinfo, true, mount, root));
  CHECK(mount == "/sys/fs/cgroup/unified");
  REQUIRE(hd::CgroupPathIn(v1_cgroup, true, path));
  CHECK(path == "/");
  // A v2-only container: its own cgroup mounted as the root of the hierarchy.
  const char* v2_mountinfo = "1200 1100 0:26 /kubepods/pod1/c1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n";
  REQUIRE(hd::CgroupMountIn(v2_mountinfo, true, mount, root));
  CHECK(mount == "/sys/fs/cgroup");
  CHECK(root == "/kubepods/pod1/c1");
  CHECK_FALSE(hd::CgroupMountIn(v2_mountinfo, false, mount, root));
  CHECK_FALSE(hd::CgroupPathIn("0::/x\n", false, path));
  CHECK((hd::CgroupPathIn("5:cpuacct,memory:/a/b\n", false, path) && path == "/a/b"));
}

namespace {

void Put(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

}  // namespace

TEST_CASE("memory limit: the limit with the least room from the process's cgroup up to the root and its usage file") {
  char tmpl[] = "/tmp/heapprof_cgroup_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string top = tmpl;
  mkdir((top + "/a").c_str(), 0755);
  mkdir((top + "/a/b").c_str(), 0755);
  Put(top + "/memory.max", "max\n");
  Put(top + "/a/memory.max", "2000000000\n");
  Put(top + "/a/memory.high", "1500000000\n");
  Put(top + "/a/memory.current", "1234\n");
  Put(top + "/a/b/memory.max", "max\n");
  Put(top + "/a/b/memory.high", "max\n");
  hd::MemoryLimit m;
  REQUIRE(hd::CgroupLimitUnder(top, "/", "/a/b", true, m));
  CHECK(m.source == hd::MemoryLimit::kCgroupV2High);
  CHECK(m.limit == 1500000000u);
  CHECK(m.usage_file == top + "/a/memory.current");
  CHECK(m.Usage() == 1234u);
  CHECK(std::string(m.Name()) == "cgroup memory.high");
  // The mount's root is stripped: /kube/a/b under a mount of /kube.
  hd::MemoryLimit n;
  REQUIRE(hd::CgroupLimitUnder(top, "/kube", "/kube/a/b", true, n));
  CHECK(n.limit == 1500000000u);
  // v1: "no limit" (2^63 less a page) does not count.
  Put(top + "/a/memory.limit_in_bytes", "9223372036854771712\n");
  Put(top + "/a/b/memory.limit_in_bytes", "536870912\n");
  Put(top + "/a/b/memory.usage_in_bytes", "4096\n");
  hd::MemoryLimit v1;
  REQUIRE(hd::CgroupLimitUnder(top, "/", "/a/b", false, v1));
  CHECK(v1.source == hd::MemoryLimit::kCgroupV1);
  CHECK(v1.limit == 536870912u);
  CHECK(v1.Usage() == 4096u);
  hd::MemoryLimit none;
  CHECK_FALSE(hd::CgroupLimitUnder(top, "/", "/nothing/here", false, none));
  // A parent whose children together near its limit: its room (100 MB) is
  // less than the process's own cgroup's (500 MB under a lower limit).
  Put(top + "/a/memory.max", "2000000000\n");
  Put(top + "/a/memory.high", "max\n");
  Put(top + "/a/memory.current", "1900000000\n");
  Put(top + "/a/b/memory.max", "1500000000\n");
  Put(top + "/a/b/memory.current", "1000000000\n");
  hd::MemoryLimit parent;
  REQUIRE(hd::CgroupLimitUnder(top, "/", "/a/b", true, parent));
  CHECK(parent.source == hd::MemoryLimit::kCgroupV2Max);
  CHECK(parent.limit == 2000000000u);
  CHECK(parent.usage_file == top + "/a/memory.current");
  // The child's own use grows: its room (50 MB) is now the least.
  Put(top + "/a/b/memory.current", "1450000000\n");
  hd::MemoryLimit child;
  REQUIRE(hd::CgroupLimitUnder(top, "/", "/a/b", true, child));
  CHECK(child.limit == 1500000000u);
  CHECK(child.usage_file == top + "/a/b/memory.current");
  for (const char* f : {"/a/b/memory.max", "/a/b/memory.high", "/a/b/memory.limit_in_bytes", "/a/b/memory.usage_in_bytes",
                        "/a/b/memory.current",
                        "/a/memory.max", "/a/memory.high", "/a/memory.current", "/a/memory.limit_in_bytes", "/memory.max"}) {
    std::remove((top + f).c_str());
  }
  rmdir((top + "/a/b").c_str());
  rmdir((top + "/a").c_str());
  rmdir(top.c_str());
}

TEST_CASE("memory limit: this process's limit and usage can be read") {
  const hd::MemoryLimit m = hd::FindMemoryLimit();
  MESSAGE("limit: " << m.Name() << " " << m.limit << ", usage (" << m.UsageName() << ") " << m.Usage());
  CHECK(m.source != hd::MemoryLimit::kNone);
  CHECK(m.limit > 0);
  CHECK(m.Usage() > 0);
  CHECK(hd::ResidentBytes() > 0);
}
