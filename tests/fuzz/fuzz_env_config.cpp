// libFuzzer target for the HEAPPROF environment variable parser (it runs
// inside the first operator new of every program, on whatever the
// environment holds): ParseEnvConfig and ParseByteSize on arbitrary bytes.
// Checks: no crash, no UB, and the results are what the grammar says,
// against a straightforward reference parser.
// HEAPPROF_FUZZ_CI_RUNS=300000 (4 s in CI's fuzz stage)
//
// The parser reports each bad pair on stderr, so run libFuzzer with
// -close_fd_mask=2 (.ci/run does); the smoke runner (no libFuzzer) sends its
// stderr to /dev/null itself and keeps sanitizer reports on the old stderr.
//
//   ./build-fuzz/fuzz_env_config -close_fd_mask=2 -max_total_time=60
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "heapprof/detail/0_base/env_config.hpp"

namespace hd = heapprof::detail;

extern "C" void __sanitizer_set_report_fd(void* fd) __attribute__((weak));

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// The byte-size grammar, with 128-bit arithmetic instead of overflow checks;
// past UINT64_MAX the value saturates there (the caller clamps it).
bool ReferenceByteSize(std::string_view text, std::uint64_t& out) {
  if (text.empty()) return false;
  unsigned shift = 0;
  const char last = text.back();
  if (last == 'k' || last == 'K') shift = 10;
  if (last == 'm' || last == 'M') shift = 20;
  if (last == 'g' || last == 'G') shift = 30;
  if (shift != 0) text.remove_suffix(1);
  if (text.empty()) return false;
  constexpr unsigned __int128 kPast = static_cast<unsigned __int128>(UINT64_MAX) + 1;
  unsigned __int128 v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
    if (v > UINT64_MAX) v = kPast;
  }
  v <<= shift;
  out = v > UINT64_MAX ? UINT64_MAX : static_cast<std::uint64_t>(v);
  return true;
}

// dump_near_oom's fraction: [digits][.digits (at most 6)], in (0, 1], as millionths.
bool ReferenceFraction(std::string_view text, std::uint32_t& out) {
  if (text.empty() || text.size() > 12) return false;
  const std::size_t dot = text.find('.');
  const std::string_view whole = text.substr(0, dot);
  const std::string_view frac = dot == std::string_view::npos ? std::string_view{} : text.substr(dot + 1);
  if (whole.find_first_not_of("0123456789") != std::string_view::npos) return false;
  if (frac.find_first_not_of("0123456789") != std::string_view::npos) return false;
  if ((whole.empty() && frac.empty()) || frac.size() > 6) return false;
  const unsigned long long w = whole.empty() ? 0 : std::stoull(std::string(whole));
  if (w > 1) return false;
  std::string f(frac);
  f.resize(6, '0');
  const unsigned long long v = w * 1000000 + std::stoull(f);
  if (v == 0 || v > 1000000) return false;
  out = static_cast<std::uint32_t>(v);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
#ifndef HEAPPROF_LIBFUZZER
  // The smoke runner: the parser's complaints would be most of the output.
  const int saved = dup(2);
  if (saved >= 0 && &__sanitizer_set_report_fd != nullptr) {
    __sanitizer_set_report_fd(reinterpret_cast<void*>(static_cast<std::intptr_t>(saved)));
  }
  const int null = open("/dev/null", O_WRONLY);
  if (null >= 0) {
    dup2(null, 2);
    close(null);
  }
#endif
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  std::uint64_t got = 0, want = 0;
  const bool ok = hd::ParseByteSize(text, got);
  Check(ok == ReferenceByteSize(text, want));
  if (ok) Check(got == want);

  const hd::EnvConfig cfg = hd::ParseEnvConfig(text);
  // The last good value of each key wins; recompute it pair by pair.
  bool has_rate = false, has_sets = false, has_unwinder = false, has_stacks = false;
  std::uint64_t rate = 0, sets = 0, stacks = 0;
  auto count = [](std::string_view value, std::uint64_t& out) {
    if (value.empty() || value.find_first_not_of("0123456789") != std::string_view::npos) return false;
    (void)ReferenceByteSize(value, out);  // digits only: the same saturating value
    return out > 0;
  };
  bool table = true;
  std::uint32_t near_oom = 0;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view pair = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t eq = pair.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = pair.substr(0, eq), value = pair.substr(eq + 1);
    std::uint64_t v = 0;
    if (key == "rate" && ReferenceByteSize(value, v)) {
      has_rate = true;
      rate = v;
    } else if (key == "max_label_sets" && count(value, v)) {
      has_sets = true;
      sets = v;
    } else if (key == "max_stacks" && count(value, v)) {
      has_stacks = true;
      stacks = v;
    } else if (key == "unwinder" && (value == "fp" || value == "table")) {
      has_unwinder = true;
      table = value == "table";
    } else if (key == "dump_near_oom") {
      std::uint32_t f = 0;
      if (ReferenceFraction(value, f)) near_oom = f;
    }
  }
  // Values past the limits are clamped (env_config.hpp).
  auto clamp = [](std::uint64_t x, std::uint64_t max) { return x < max ? x : max; };
  Check(cfg.has_rate == has_rate);
  if (has_rate) Check(cfg.rate == clamp(rate, (std::uint64_t{1} << 40) - 1));
  Check(cfg.has_max_label_sets == has_sets);
  if (has_sets) Check(cfg.max_label_sets == clamp(sets, std::uint64_t{1} << 20));
  Check(cfg.has_unwinder == has_unwinder);
  if (has_unwinder) Check(cfg.unwinder_table == table);
  Check(cfg.has_max_stacks == has_stacks);
  if (has_stacks) Check(cfg.max_stacks == clamp(stacks, std::uint64_t{1} << 24));
  Check(cfg.dump_near_oom == near_oom);
  return 0;
}
