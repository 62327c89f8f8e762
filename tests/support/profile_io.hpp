// Test helpers: write a profile through the public API, read it back with our
// inflater and decoder, and run the real `go tool pprof` on it.
#pragma once

#include <heapprof.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "support/inflate.hpp"
#include "support/profile_decoder.hpp"

namespace heapprof_test {

// Writes with WriteHeapProfile (or WriteAllocsProfile), gunzips, decodes.
inline bool CaptureProfile(Profile& out, bool allocs = false, std::string* gz_bytes = nullptr,
                           std::string* why = nullptr) {
  std::ostringstream os;
  const bool ok = allocs ? heapprof::WriteAllocsProfile(os) : heapprof::WriteHeapProfile(os);
  if (!ok) {
    if (why) *why = "Write*Profile returned false";
    return false;
  }
  const std::string gz = os.str();
  if (gz_bytes) *gz_bytes = gz;
  std::string raw;
  if (!Gunzip(gz, raw)) {
    if (why) *why = "our gunzip rejected the profile";
    return false;
  }
  return DecodeProfile(raw, out, why);
}

// Index of a sample type by name, or -1.
int SampleTypeIndex(const Profile& p, const std::string& type);

// Sums values[index] over samples whose leaf function name contains `leaf`.
std::int64_t SumForLeaf(const Profile& p, const std::string& leaf, const std::string& type);

// Path of the go binary, or "" when Go is not installed.
std::string GoBinary();

// The profile's duration in seconds as `go tool pprof` printed it, or -1
// when there is none or it is not in seconds. -top prints Go's
// time.Duration ("1.000523s", "999.6ms"); -raw prints its first four
// characters ("1.00", "999."), so a unitless value counts as seconds only in
// the forms d.dd and dd.d.
double PprofDurationSeconds(const std::string& out);

// Runs a shell command, returns its stdout (stderr merged) and exit status.
int RunCommand(const std::string& cmd, std::string& output);

// Whether `name` is a command on PATH (tests that need a tool skip without it).
bool HaveTool(const char* name);

// This test binary's own path (to re-run it as a child process).
std::string SelfExe();

// A unique temp file path (the file is created empty).
std::string TempPath(const std::string& suffix);

bool WriteFile(const std::string& path, const std::string& bytes);

// The whole file, "" if it cannot be read.
std::string ReadFile(const std::string& path);

// A gzip'ed profile file: inflated, decoded and validated.
bool ReadProfileFile(const std::string& path, Profile& p);

// This test binary again, as a child process with `env` prepended.
int RunSelf(const std::string& env, std::string& output);

// Sets the sample rate for a scope and restores the previous one, also when
// a REQUIRE fails or the case returns early (a rate left behind would make
// every later case in the process run at it). RateScope() only saves: for a
// case that calls SetSampleRate itself. Set() changes it again within the
// scope; Restore() goes back to the saved rate before the scope ends.
struct RateScope {
  std::size_t saved = heapprof::GetSampleRate();
  RateScope() = default;
  explicit RateScope(std::size_t rate) { heapprof::SetSampleRate(rate); }
  ~RateScope() { heapprof::SetSampleRate(saved); }
  void Set(std::size_t rate) const { heapprof::SetSampleRate(rate); }
  void Restore() const { heapprof::SetSampleRate(saved); }
  RateScope(const RateScope&) = delete;
  RateScope& operator=(const RateScope&) = delete;
};

// Restores the unwinder the scope began with, also when a REQUIRE fails.
struct UnwinderScope {
  heapprof::Unwinder saved = heapprof::GetUnwinder();
  UnwinderScope() = default;
  ~UnwinderScope() { heapprof::SetUnwinder(saved); }
  UnwinderScope(const UnwinderScope&) = delete;
  UnwinderScope& operator=(const UnwinderScope&) = delete;
};

// Before a test loop whose iterations must share one call site (one stack):
// clang -O2 fully unrolls a short constant-count loop into a call site each.
#if defined(__clang__)
#define HEAPPROF_TEST_NO_UNROLL _Pragma("clang loop unroll(disable)")
#else
#define HEAPPROF_TEST_NO_UNROLL _Pragma("GCC unroll 1")
#endif

// `go tool pprof <args> <file>` with a private GOCACHE; "" go means skip.
int GoPprof(const std::string& args, const std::string& file, std::string& output);

#ifdef HEAPPROF_TEST_SUPPORT_IMPLEMENTATION  // compiled once: tests/support/support_impl.cpp

int SampleTypeIndex(const Profile& p, const std::string& type) {
  for (std::size_t i = 0; i < p.sample_types.size(); ++i) {
    if (p.sample_types[i].type == type) return static_cast<int>(i);
  }
  return -1;
}

std::int64_t SumForLeaf(const Profile& p, const std::string& leaf, const std::string& type) {
  const int idx = SampleTypeIndex(p, type);
  std::int64_t total = 0;
  for (const Sample& s : p.samples) {
    const std::vector<std::string> names = FunctionNames(p, s);
    if (!names.empty() && names[0].find(leaf) != std::string::npos) total += s.values.at(idx);
  }
  return total;
}

std::string GoBinary() {
  for (const char* candidate : {"/usr/lib/go/bin/go", "/usr/bin/go", "/usr/local/go/bin/go"}) {
    if (access(candidate, X_OK) == 0) return candidate;
  }
  return "";
}

double PprofDurationSeconds(const std::string& out) {
  const std::string key = "Duration: ";
  const std::size_t at = out.find(key);
  if (at == std::string::npos) return -1;
  std::size_t end = at + key.size();
  while (end < out.size() && (std::isdigit(static_cast<unsigned char>(out[end])) || out[end] == '.')) ++end;
  const std::string number = out.substr(at + key.size(), end - at - key.size());
  if (number.empty() || number.back() == '.') return -1;
  const char unit = end < out.size() ? out[end] : '\n';
  const bool seconds = unit == 's' || (!std::isalpha(static_cast<unsigned char>(unit)) && number.size() == 4 &&
                                       (number[1] == '.' || number[2] == '.'));
  return seconds ? std::strtod(number.c_str(), nullptr) : -1;
}

int RunCommand(const std::string& cmd, std::string& output) {
  output.clear();
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) output.append(buf, n);
  const int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool HaveTool(const char* name) {
  std::string out;
  return RunCommand(std::string("command -v ") + name, out) == 0;
}

std::string SelfExe() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  return n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : std::string();
}

std::string TempPath(const std::string& suffix) {
  std::string tmpl = "/tmp/heapprof_test_XXXXXX" + suffix;
  const int fd = mkstemps(&tmpl[0], static_cast<int>(suffix.size()));
  if (fd >= 0) close(fd);
  return tmpl;
}

bool WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(f);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool ReadProfileFile(const std::string& path, Profile& p) {
  std::string raw;
  return Gunzip(ReadFile(path), raw) && DecodeProfile(raw, p) && Validate(p);
}

int RunSelf(const std::string& env, std::string& output) { return RunCommand(env + " " + SelfExe(), output); }

int GoPprof(const std::string& args, const std::string& file, std::string& output) {
  const std::string go = GoBinary();
  if (go.empty()) return -2;
  const char* cache = std::getenv("GOCACHE");
  const std::string env = cache ? "" : "GOCACHE=/tmp/heapprof-gocache HOME=${HOME:-/tmp} ";
  return RunCommand(env + go + " tool pprof " + args + " " + file, output);
}

#endif  // HEAPPROF_TEST_SUPPORT_IMPLEMENTATION

}  // namespace heapprof_test
