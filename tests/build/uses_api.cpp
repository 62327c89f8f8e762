// A unit of a user's program: the light API only (no HEAPPROF_IMPLEMENTATION).
// Compiled alone it must fail to link; -std=c++14 must give one clear error.
#include <heapprof.hpp>

#include <sstream>
#include <string>
#include <vector>

// Returns the number of broken expectations; `enabled`: heapprof is active.
int UseApi(bool enabled) {
  int bad = 0;
  const std::size_t saved = heapprof::GetSampleRate();
  heapprof::SetSampleRate(1);
  if ((heapprof::GetSampleRate() == 1) != enabled) ++bad;
  {
    heapprof::ScopedLabels scope({{"handler", "build_check"}});
    std::vector<int, heapprof::allocator<int>> v(1000, 7);
    if (v[999] != 7) ++bad;
    // Every constructor a unit may instantiate (check.sh compiles this unit
    // with strict warnings, g++ -Weffc++ included).
    const heapprof::allocator<int> labeled(heapprof::LabelSet({{"cache", "build_check"}}));
    std::vector<int, heapprof::allocator<int>> w(labeled);
    w.push_back(1);
    std::vector<long, heapprof::allocator<long>> x{heapprof::allocator<long>(std::allocator<long>())};
    x.push_back(2);
    if (w.size() + x.size() != 2) ++bad;
    const heapprof::LabelSet& labels = heapprof::CurrentLabels();
    if ((labels.size() == 1) != enabled) ++bad;
  }
  heapprof::SetSampleRate(saved);
  std::ostringstream out;
  if (heapprof::WriteHeapProfile(out) != enabled) ++bad;
  if (out.str().empty() == enabled) ++bad;
  heapprof::HttpServer server("127.0.0.1:0", std::nothrow);
  if (server.serving() != enabled) ++bad;
  return bad;
}
