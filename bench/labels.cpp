// bench/labels: cost of entering and leaving a label scope.
//  - two labels, same values every time (the common per-request pattern with
//    a bounded set of endpoints and tenants)
//  - nested: a one-label scope inside it
//  - capture + carry: CurrentLabels() then ScopedLabels(set) on the same thread
#define HEAPPROF_IMPLEMENTATION  // a one-file program: the implementation is compiled here
#include <heapprof.hpp>

#include <chrono>
#include <cstdio>

namespace {
using Clock = std::chrono::steady_clock;
volatile int g_sink;

template <class F>
double NsPer(long n, F&& f) {
  for (long i = 0; i < n / 10; ++i) f(i);
  const auto t0 = Clock::now();
  for (long i = 0; i < n; ++i) f(i);
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n);
}
}  // namespace

int main() {
  const long n = 2000000;
  static const char* kEndpoints[4] = {"/search", "/users", "/orders", "/health"};
  const double two = NsPer(n, [](long i) {
    heapprof::ScopedLabels s{{"endpoint", kEndpoints[i & 3]}, {"tenant", "acme"}};
    g_sink = 1;
  });
  const double nested = NsPer(n, [](long i) {
    heapprof::ScopedLabels s{{"endpoint", kEndpoints[i & 3]}, {"tenant", "acme"}};
    heapprof::ScopedLabels inner{{"phase", "parse"}};
    g_sink = 1;
  });
  heapprof::LabelSet captured;
  {
    heapprof::ScopedLabels s{{"endpoint", "/search"}, {"tenant", "acme"}};
    captured = heapprof::CurrentLabels();
  }
  const double carry = NsPer(n, [&](long) {
    heapprof::ScopedLabels s(captured);
    g_sink = 1;
  });
  std::printf("scope_two_labels_ns %.1f\nscope_nested_ns %.1f\nscope_carry_captured_ns %.1f\n", two, nested, carry);
  return 0;
}
