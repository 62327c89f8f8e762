// Many threads allocating and freeing (also across threads) while another
// writes profiles: exact totals at the end, every profile valid.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "support/profile_io.hpp"

namespace {

constexpr int kThreads = 4;
constexpr int kPerThread = 20000;

__attribute__((noinline)) char* ThreadedAlloc(std::size_t n) {
  char* p = new char[n];
  asm volatile("" ::"r"(p) : "memory");
  return p;
}

}  // namespace

TEST_CASE("threads allocate and free across threads while profiles are written") {
  using namespace heapprof_test;
  heapprof_test::RateScope rate(1);
  const heapprof::Stats s0 = heapprof::GetStats();

  std::mutex handoff_mu;
  std::vector<char*> handoff;  // objects allocated on one thread, freed on another
  std::atomic<bool> stop{false};
  std::atomic<int> profiles_ok{0}, profiles_bad{0};

  std::thread writer([&] {
    while (!stop.load()) {
      Profile p;
      std::string why;
      if (CaptureProfile(p, false, nullptr, &why) && Validate(p, &why)) {
        profiles_ok.fetch_add(1);
      } else {
        profiles_bad.fetch_add(1);
      }
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        char* p = ThreadedAlloc(16 + static_cast<std::size_t>((i + t) % 8) * 16);
        if (i % 2 == 0) {
          delete[] p;
          continue;
        }
        char* other = nullptr;
        {
          std::lock_guard<std::mutex> hold(handoff_mu);
          if (!handoff.empty()) {
            other = handoff.back();
            handoff.pop_back();
          }
          handoff.push_back(p);
        }
        delete[] other;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (char* p : handoff) delete[] p;
  handoff.clear();
  handoff.shrink_to_fit();
  // At least one profile written during the churn, then stop.
  while (profiles_ok.load() + profiles_bad.load() == 0) std::this_thread::yield();
  stop.store(true);
  writer.join();
  CHECK(profiles_bad.load() == 0);
  CHECK(profiles_ok.load() >= 1);

  Profile p;
  REQUIRE(CaptureProfile(p));
  CHECK(SumForLeaf(p, "ThreadedAlloc", "alloc_objects") == kThreads * kPerThread);
  CHECK(SumForLeaf(p, "ThreadedAlloc", "inuse_objects") == 0);
  CHECK(SumForLeaf(p, "ThreadedAlloc", "inuse_space") == 0);
  std::int64_t expected_bytes = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) expected_bytes += 16 + ((i + t) % 8) * 16;
  }
  CHECK(SumForLeaf(p, "ThreadedAlloc", "alloc_space") == expected_bytes);
  // Stats count threads that have exited (their slots were folded in).
  const heapprof::Stats s1 = heapprof::GetStats();
  CHECK(s1.alloc_objects - s0.alloc_objects >= static_cast<std::uint64_t>(kThreads * kPerThread));
  CHECK(s1.sampled_live_objects <= s1.live_objects);
}

TEST_CASE("live = alloc - free exactly once every thread is done") {
  const heapprof::Stats s0 = heapprof::GetStats();
  {
    // Scoped, so the vector's own block is freed before s1 (shrink_to_fit
    // is a no-op in libstdc++ built with -fno-exceptions).
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([] {
        for (int i = 0; i < 1000; ++i) {
          auto* v = new std::vector<int>(static_cast<std::size_t>(i % 50));
          // Escapes: clang -O2 may elide a new/delete pair it can see whole
          // (allowed since C++14), and did for the empty vectors.
          asm volatile("" ::"r"(v) : "memory");
          delete v;
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  const heapprof::Stats s1 = heapprof::GetStats();
  // Thread start-up allocates (and frees) in the library; everything the
  // threads did balanced out, so live is back where it was.
  CHECK(s1.live_objects == s0.live_objects);
  CHECK(s1.live_bytes == s0.live_bytes);
  CHECK(s1.alloc_objects - s0.alloc_objects >= 8 * 1000);
}
