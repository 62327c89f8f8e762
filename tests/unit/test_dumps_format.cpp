// Pieces of the dump/leak-report code that need no process of their own.
#include <heapprof.hpp>
#include "heapprof/detail/0_base/env_config.hpp"
#include "heapprof/detail/0_base/report.hpp"
#include "heapprof/detail/6_serving/leak_report.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <string>

using heapprof::detail::FormatBytes;
using heapprof::detail::ParseEnvConfig;
using heapprof::detail::SimplifyFunctionName;

TEST_CASE("leak report names: template arguments, parameters, return types and clones dropped") {
  CHECK(SimplifyFunctionName("main") == "main");
  CHECK(SimplifyFunctionName("LoadConfig(char const*)") == "LoadConfig");
  CHECK(SimplifyFunctionName("void std::vector<std::__cxx11::basic_string<char, std::char_traits<char>, "
                             "std::allocator<char> >, std::allocator<std::__cxx11::basic_string<char> > >::"
                             "_M_realloc_insert<char const*>(__gnu_cxx::__normal_iterator<int*, int>, int&&) "
                             "[clone .isra.0]") == "std::vector::_M_realloc_insert");
  CHECK(SimplifyFunctionName("(anonymous namespace)::Leaf(unsigned long)") == "(anonymous namespace)::Leaf");
  CHECK(SimplifyFunctionName("Foo::operator<(Foo const&) const") == "Foo::operator<");
  CHECK(SimplifyFunctionName("Foo::operator()(int)") == "Foo::operator()");
  CHECK(SimplifyFunctionName("int* Make<int>(unsigned long)") == "Make");
  // Operators keep their names (the report once printed "new" and
  // "std::thread::_Invoker::operator").
  CHECK(SimplifyFunctionName("operator new(unsigned long)") == "operator new");
  CHECK(SimplifyFunctionName("operator delete[](void*, unsigned long)") == "operator delete[]");
  CHECK(SimplifyFunctionName("std::thread::_Invoker<std::tuple<void (*)(int), int> >::operator()()") ==
        "std::thread::_Invoker::operator()");
  CHECK(SimplifyFunctionName("std::ostream& operator<< <char>(std::ostream&, Foo const&)") == "operator<<");
  CHECK(SimplifyFunctionName("Foo::operator bool() const") == "Foo::operator bool");
  CHECK(SimplifyFunctionName("bool std::operator==<char>(std::string const&, char const*)") == "std::operator==");
  CHECK(SimplifyFunctionName("main::{lambda(int)#1}::operator()(int) const") == "main::{lambda(int)#1}::operator()");
  CHECK(SimplifyFunctionName("Foo::operator->() const") == "Foo::operator->");
  CHECK(SimplifyFunctionName("Foo::~Foo()") == "Foo::~Foo");
}

TEST_CASE("leak report rows start at the first frame outside the allocator machinery") {
  using heapprof::detail::IsAllocatorMachinery;
  CHECK(IsAllocatorMachinery("std::__new_allocator::allocate"));
  CHECK(IsAllocatorMachinery("std::vector::_M_realloc_insert"));
  CHECK(IsAllocatorMachinery("operator new"));
  CHECK(IsAllocatorMachinery("heapprof::allocator::allocate"));
  CHECK_FALSE(IsAllocatorMachinery("MakeStrings"));
  CHECK_FALSE(IsAllocatorMachinery("myns::Cache::Fill"));
  // The C allocation functions by their whole name: the program's functions
  // that merely start like them are its own (a leak allocated in
  // reallocate_buffer was shown from its caller).
  for (const char* function : {"malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign"}) {
    CHECK(IsAllocatorMachinery(function));
  }
  CHECK_FALSE(IsAllocatorMachinery("reallocate_buffer"));
  CHECK_FALSE(IsAllocatorMachinery("malloc_pool::Grow"));
  CHECK_FALSE(IsAllocatorMachinery("calloc_zeroed"));
  CHECK(ParseEnvConfig("leak_frames=12").leak_frames == 12);
  CHECK(ParseEnvConfig("leak_frames=0").leak_frames == 0);
  CHECK(ParseEnvConfig("leak_frames=65").leak_frames == 0);
}

TEST_CASE("FormatBytes: binary units, two decimals") {
  CHECK(FormatBytes(0) == "0 B");
  CHECK(FormatBytes(1023) == "1023 B");
  CHECK(FormatBytes(15000) == "14.65 KiB");
  CHECK(FormatBytes(3 << 20) == "3.00 MiB");
  CHECK(FormatBytes(-2048) == "-2.00 KiB");
}

TEST_CASE("HEAPPROF dump keys parse into the config without allocating") {
  const auto cfg = ParseEnvConfig(
      "dump_prefix=/var/tmp/srv,dump_interval=1g,inuse_interval=64m,dump_time=600,dump_signal=SIGUSR2,"
      "dump_at_exit=1,leak_report=true,http=127.0.0.1:6060");
  CHECK(std::string(cfg.dump_prefix) == "/var/tmp/srv");
  CHECK(cfg.dump_interval == (std::uint64_t{1} << 30));
  CHECK(cfg.inuse_interval == (std::uint64_t{64} << 20));
  CHECK(cfg.dump_time == 600);
  CHECK(cfg.dump_signal == SIGUSR2);
  CHECK(cfg.dump_at_exit);
  CHECK(cfg.leak_report);
  CHECK(std::string(cfg.http) == "127.0.0.1:6060");
  CHECK(cfg.WantsDumper());
  CHECK(ParseEnvConfig("dump_signal=USR1").dump_signal == SIGUSR1);
  CHECK(ParseEnvConfig("dump_signal=HUP").dump_signal == SIGHUP);
  CHECK(ParseEnvConfig("dump_at_exit=1").WantsDumper() == false);  // exit-only: no thread
  // Too long a prefix is refused whole, never cut.
  const std::string long_prefix = "dump_prefix=/" + std::string(2000, 'a');
  CHECK(ParseEnvConfig(long_prefix).dump_prefix[0] == '\0');
  CHECK(ParseEnvConfig("dump_signal=KILL").dump_signal == 0);
  CHECK(ParseEnvConfig("dump_signal=SEGV").dump_signal == 0);
  CHECK(ParseEnvConfig("dump_time=0").dump_time == 0);
}

TEST_CASE("ParseByteSize takes every value up to UINT64_MAX and saturates past it (found by fuzz_env_config)") {
  std::uint64_t v = 0;
  CHECK(heapprof::detail::ParseByteSize("18446744073709551615", v));
  CHECK(v == UINT64_MAX);
  CHECK(heapprof::detail::ParseByteSize("0000000000000018446744073709551615", v));
  CHECK(v == UINT64_MAX);
  CHECK(heapprof::detail::ParseByteSize("18446744073709551614", v));
  CHECK(v == UINT64_MAX - 1);
  // Past it: UINT64_MAX, never a wrapped value (the caller clamps).
  v = 0;
  CHECK(heapprof::detail::ParseByteSize("18446744073709551616", v));
  CHECK(v == UINT64_MAX);
  v = 0;
  CHECK(heapprof::detail::ParseByteSize("99999999999999999999999", v));
  CHECK(v == UINT64_MAX);
  CHECK(heapprof::detail::ParseByteSize("17179869183g", v));  // (2^34 - 1) << 30 fits
  CHECK(v == ((std::uint64_t{1} << 34) - 1) << 30);
  CHECK(heapprof::detail::ParseByteSize("17179869184g", v));
  CHECK(v == UINT64_MAX);
  CHECK_FALSE(heapprof::detail::ParseByteSize("1x", v));
}

TEST_CASE("HEAPPROF numbers of 20 digits and more are clamped like any value above the maximum") {
  // Before: "bad value" and ignored, while the README says clamped.
  const std::string huge = "123456789012345678901234567890";
  auto cfg = ParseEnvConfig("rate=" + huge + ",max_stacks=" + huge + ",max_label_sets=" + huge +
                            ",leak_exit_code=" + huge);
  CHECK(cfg.has_rate);
  CHECK(cfg.rate == heapprof::detail::kMaxConfigRate);
  CHECK(cfg.has_max_stacks);
  CHECK(cfg.max_stacks == heapprof::detail::kMaxConfigStacks);
  CHECK(cfg.has_max_label_sets);
  CHECK(cfg.max_label_sets == heapprof::detail::kMaxConfigLabelSets);
  CHECK(cfg.leak_exit_code == 255);
  cfg = ParseEnvConfig("max_stacks=00000000000000000000042");  // leading zeros: still 42
  CHECK(cfg.max_stacks == 42);
  // Ranges that are not clamped still refuse the value.
  CHECK(ParseEnvConfig("dump_time=" + huge).dump_time == 0);
  CHECK(ParseEnvConfig("dump_time=315360001").dump_time == 0);
  CHECK(ParseEnvConfig("dump_time=315360000").dump_time == 315360000);
}
