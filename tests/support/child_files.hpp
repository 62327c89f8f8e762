// Test helpers for scenarios that run this test binary again as a child
// process and look at the files it leaves in a temporary directory.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "support/profile_io.hpp"

namespace heapprof_test {

// A fresh directory /tmp/heapprof_<tag>_XXXXXX; "" if it cannot be made.
std::string MakeTempDir(const std::string& tag);

// The names in `dir` ("." and ".." left out), sorted.
std::vector<std::string> ListDir(const std::string& dir);

// The names in `dir` matching the regular expression `pattern`, sorted.
std::vector<std::string> Matching(const std::string& dir, const std::string& pattern);

// Removes `dir` and everything in it.
void RemoveDir(const std::string& dir);

// This test binary as a child running HEAPPROF_TEST_CHILD=`scenario` with
// `env` prepended, killed after `seconds` (a hang is a failure, never a hung
// suite). Returns its exit status (128 + signal when killed); `output` gets
// its stdout and stderr.
int RunChildScenario(const std::string& env, const char* scenario, std::string& output, int seconds = 120);

#ifdef HEAPPROF_TEST_SUPPORT_IMPLEMENTATION  // compiled once: tests/support/support_impl.cpp

std::string MakeTempDir(const std::string& tag) {
  std::string tmpl = "/tmp/heapprof_" + tag + "_XXXXXX";
  const char* dir = mkdtemp(&tmpl[0]);
  return dir != nullptr ? std::string(dir) : std::string();
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> Matching(const std::string& dir, const std::string& pattern) {
  std::vector<std::string> out;
  const std::regex re(pattern);
  for (const std::string& name : ListDir(dir)) {
    if (std::regex_match(name, re)) out.push_back(name);
  }
  return out;
}

void RemoveDir(const std::string& dir) {
  std::string output;
  RunCommand("rm -rf '" + dir + "'", output);
}

int RunChildScenario(const std::string& env, const char* scenario, std::string& output, int seconds) {
  return RunCommand(env + " HEAPPROF_TEST_CHILD=" + scenario + " timeout -s KILL " + std::to_string(seconds) + " " +
                        SelfExe(),
                    output);
}

#endif  // HEAPPROF_TEST_SUPPORT_IMPLEMENTATION

}  // namespace heapprof_test
