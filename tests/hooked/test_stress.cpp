// Stress: worker threads allocate and free across threads through a shared
// queue under changing labels, while one thread writes and decodes profiles
// without pause, one creates and joins short-lived allocating threads, and
// (in the first phase) one changes the sample rate and the unwinder. Then the
// exact invariants: every sampled object is accounted for, and at rate 1 the
// profile's in-use totals per label equal what the test still holds, to the
// byte. Helpers never wait on a timer: the workers keep going until every
// helper has done some rounds, so the helpers certainly ran under load.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <malloc.h>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/block_size.hpp"
#include "support/profile_io.hpp"

namespace {

#if defined(HEAPPROF_TSAN) || defined(HEAPPROF_ASAN)
constexpr int kStressIterations = 3000;
#else
constexpr int kStressIterations = 20000;
#endif
constexpr int kStressWorkers = 4;
constexpr std::size_t kQueueCapacity = 4096;
constexpr std::size_t kQueueHigh = 512;  // above this, a push also pops the oldest

const char* const kWorkerNames[] = {"w0", "w1", "w2", "w3", "spawned"};
const char* const kSteps[] = {"parse", "plan", "exec"};

// Each phase has its own leaf, so totals of one phase are not mixed with the
// other's. Each stores to its own sink: identical bodies would be folded into
// one function by GCC's identical code folding (seen under TSan).
std::atomic<void*> g_chaos_sink{nullptr}, g_exact_sink{nullptr};
__attribute__((noinline)) void* StressAllocChaos(std::size_t n) {
  void* p = ::operator new(n);
  g_chaos_sink.store(p, std::memory_order_relaxed);
  return p;
}
__attribute__((noinline)) void* StressAllocExact(std::size_t n) {
  void* p = ::operator new(n);
  g_exact_sink.store(p, std::memory_order_relaxed);
  return p;
}

struct Held {
  void* p;
  std::size_t n;
  int owner;  // index into kWorkerNames
};

// A fixed ring: its storage is allocated once, before any measurement.
class HandoffQueue {
 public:
  HandoffQueue() : ring_(kQueueCapacity) {}
  // Pushes `h`; returns an older object to free (the handoff) or {nullptr}.
  Held Exchange(const Held& h) {
    std::lock_guard<std::mutex> hold(mu_);
    Held out{nullptr, 0, 0};
    if (size_ >= kQueueHigh || size_ == kQueueCapacity) {
      out = ring_[head_];
      head_ = (head_ + 1) % kQueueCapacity;
      --size_;
    }
    ring_[(head_ + size_) % kQueueCapacity] = h;
    ++size_;
    return out;
  }
  std::vector<Held> Drain() {
    std::lock_guard<std::mutex> hold(mu_);
    std::vector<Held> out;
    out.reserve(size_);
    for (; size_ > 0; --size_, head_ = (head_ + 1) % kQueueCapacity) out.push_back(ring_[head_]);
    return out;
  }
  std::size_t Size() {
    std::lock_guard<std::mutex> hold(mu_);
    return size_;
  }

 private:
  std::mutex mu_;
  std::vector<Held> ring_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

struct Tally {
  std::atomic<std::uint64_t> allocs{0}, bytes{0};
};

struct StressResult {
  int profiles_ok = 0;
  int profiles_bad = 0;
  std::string first_bad;
  int spawned_threads = 0;
  int rate_changes = 0;
};

// Runs the workers and helpers; leaves the queue's contents allocated.
StressResult RunStress(HandoffQueue& queue, const char* phase, bool change_rate, void* (*alloc)(std::size_t),
                       Tally& tally) {
  std::atomic<bool> stop{false};
  std::atomic<int> profiles_ok{0}, profiles_bad{0}, spawned{0}, rate_changes{0};
  std::mutex bad_mu;
  std::string first_bad;

  auto allocate = [&](std::size_t n, int owner) {
    void* p = alloc(n);
    tally.allocs.fetch_add(1, std::memory_order_relaxed);
    tally.bytes.fetch_add(n, std::memory_order_relaxed);
    return Held{p, n, owner};
  };
  auto release = [](const Held& h) {
    if (h.p != nullptr) ::operator delete(h.p, h.n);
  };

  std::thread writer([&] {
    while (!stop.load()) {
      heapprof_test::Profile p;
      std::string why;
      if (heapprof_test::CaptureProfile(p, profiles_ok.load() % 2 == 1, nullptr, &why) &&
          heapprof_test::Validate(p, &why)) {
        profiles_ok.fetch_add(1);
      } else {
        std::lock_guard<std::mutex> hold(bad_mu);
        if (first_bad.empty()) first_bad = why;
        profiles_bad.fetch_add(1);
      }
    }
  });
  std::thread spawner([&] {
    while (!stop.load()) {
      std::thread t([&] {
        heapprof::ScopedLabels labels{{"worker", kWorkerNames[4]}, {"phase", phase}};
        const Held local = allocate(48, 4);
        release(queue.Exchange(allocate(96, 4)));  // outlives this thread
        release(local);
      });
      t.join();
      spawned.fetch_add(1);
    }
  });
  std::thread changer([&] {
    const std::size_t rates[] = {1, 97, 4096, 0, 65536, 524288};
    int i = 0;
    while (!stop.load()) {
      if (change_rate) heapprof::SetSampleRate(rates[i % 6]);
      heapprof::SetUnwinder(i % 2 == 0 ? heapprof::Unwinder::kFramePointer : heapprof::Unwinder::kTable);
      rate_changes.fetch_add(1);
      ++i;
      std::this_thread::yield();
    }
  });

  auto helpers_ran = [&] { return profiles_ok.load() + profiles_bad.load() >= 2 && spawned.load() >= 4 && rate_changes.load() >= 4; };
  std::vector<std::thread> workers;
  for (int t = 0; t < kStressWorkers; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < kStressIterations || !helpers_ran(); ++i) {
        heapprof::ScopedLabels labels{{"worker", kWorkerNames[t]}, {"step", kSteps[i % 3]}, {"phase", phase}};
        const std::size_t n = 16 * static_cast<std::size_t>(1 + (i * 7 + t) % 16);
        const Held h = allocate(n, t);
        if (i % 3 == 0) {
          release(h);  // freed where it was allocated
        } else {
          release(queue.Exchange(h));  // freed by whichever thread pops it
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  stop.store(true);
  writer.join();
  spawner.join();
  changer.join();
  StressResult r;
  r.profiles_ok = profiles_ok.load();
  r.profiles_bad = profiles_bad.load();
  r.first_bad = first_bad;
  r.spawned_threads = spawned.load();
  r.rate_changes = rate_changes.load();
  return r;
}

std::string LabelOf(const heapprof_test::Sample& s, const std::string& key) {
  for (const auto& l : s.labels) {
    if (l.key == key) return l.str;
  }
  return "";
}

}  // namespace

TEST_CASE("stress: cross-thread frees, labels, profiles, threads, rate and unwinder changes under load") {
  using namespace heapprof_test;
  if (std::getenv("HEAPPROF_STRESS_CHILD") == nullptr) {
    // In a process of its own: under TSan the frame-pointer phases fill the
    // stack table (see below), and the tests after this one need it empty.
    std::string out;
    const int rc = RunCommand("HEAPPROF_STRESS_CHILD=1 " + SelfExe() + " --test-case='stress:*'", out);
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.find("Status: SUCCESS") != std::string::npos);
    std::size_t at = 0;
    while ((at = out.find("MESSAGE: ", at)) != std::string::npos) {
      const std::size_t end = out.find('\n', at);
      MESSAGE(out.substr(at + 9, end - at - 9));
      at = end;
    }
    return;
  }
  heapprof_test::RateScope rate;  // saves only: the changer thread below sets rates of its own
  const heapprof_test::UnwinderScope unwinder;  // restored when the case ends, however it ends
  HandoffQueue queue;

  // Phase 1: the rate and the unwinder change all the time. Afterwards every
  // object is freed: nothing the sampler picked, at whatever rate, may stay in use.
  Tally chaos;
  const heapprof::Stats c0 = heapprof::GetStats();
  const StressResult r1 = RunStress(queue, "chaos", true, &StressAllocChaos, chaos);
  for (const Held& h : queue.Drain()) ::operator delete(h.p, h.n);
  rate.Set(1);
  const heapprof::Stats c1 = heapprof::GetStats();
  MESSAGE("chaos: " << chaos.allocs.load() << " allocations, " << r1.profiles_ok << " profiles, "
                    << r1.spawned_threads << " threads, " << r1.rate_changes << " rate/unwinder changes; "
                    << c1.stacks << " stacks, " << c1.stack_overflows - c0.stack_overflows << " stack overflows");
  INFO("first bad profile: " << r1.first_bad);
  CHECK(r1.profiles_bad == 0);
  CHECK(r1.profiles_ok >= 2);
  CHECK(c1.sampled_live_objects == c0.sampled_live_objects);
  CHECK(c1.alloc_objects - c0.alloc_objects >= chaos.allocs.load());
  CHECK(c1.samples_dropped == c0.samples_dropped);
  Profile after_chaos;
  std::string why;
  REQUIRE_MESSAGE(CaptureProfile(after_chaos, false, nullptr, &why), why);
  REQUIRE_MESSAGE(Validate(after_chaos, &why), why);
  // Nothing of this phase is in use any more, under its leaf or the overflow stack.
  std::int64_t chaos_inuse = 0, chaos_allocs = 0;
  for (const Sample& s : after_chaos.samples) {
    if (LabelOf(s, "phase") != "chaos") continue;
    chaos_inuse += s.values.at(SampleTypeIndex(after_chaos, "inuse_objects"));
    chaos_inuse += s.values.at(SampleTypeIndex(after_chaos, "inuse_space"));
    chaos_allocs += s.values.at(SampleTypeIndex(after_chaos, "alloc_objects"));
  }
  CHECK(chaos_inuse == 0);
  CHECK(chaos_allocs > 0);

  // Phase 2: rate 1 throughout (the unwinder still changes): exact totals.
  Tally exact;
  const heapprof::Stats e0 = heapprof::GetStats();
  const StressResult r2 = RunStress(queue, "exact", false, &StressAllocExact, exact);
  const heapprof::Stats e1 = heapprof::GetStats();
  std::vector<Held> held = queue.Drain();
  std::map<std::string, std::int64_t> held_bytes, held_objects;
  std::uint64_t total_held_bytes = 0;
  for (const Held& h : held) {
    held_bytes[kWorkerNames[h.owner]] += static_cast<std::int64_t>(h.n);
    held_objects[kWorkerNames[h.owner]] += 1;
    total_held_bytes += malloc_usable_size(h.p);
  }
  INFO("first bad profile: " << r2.first_bad);
  CHECK(r2.profiles_bad == 0);
  CHECK(heapprof::GetSampleRate() == 1);
  // Everything the helpers allocated is freed again (threads joined, profile
  // buffers gone), so what is live now is exactly what the queue holds.
  CHECK(e1.live_objects - e0.live_objects == held.size());
  // Bytes too: Stats count usable sizes at both ends, so the writer's own
  // allocations (some freed by unsized deletes inside libstdc++) balance.
  CHECK(e1.live_bytes - e0.live_bytes == total_held_bytes);
  CHECK(e1.sampled_live_objects - e0.sampled_live_objects == held.size());
  CHECK(e1.alloc_objects - e0.alloc_objects >= exact.allocs.load());
  CHECK(e1.samples_dropped == e0.samples_dropped);

  {
  Profile p;
  REQUIRE_MESSAGE(CaptureProfile(p, false, nullptr, &why), why);
  REQUIRE_MESSAGE(Validate(p, &why), why);
  // Every sample of this phase (label phase=exact) is under its leaf, or
  // under the overflow stack when the stack table is full: the frame-pointer
  // unwinder walking through code without frame pointers (TSan's runtime
  // under the thread entry) reads garbage frames, and each new garbage tail
  // is a new stack. Either way its counts are exact.
  const int alloc_objects = SampleTypeIndex(p, "alloc_objects");
  const int alloc_space = SampleTypeIndex(p, "alloc_space");
  const int inuse_space = SampleTypeIndex(p, "inuse_space");
  const int inuse_objects = SampleTypeIndex(p, "inuse_objects");
  std::map<std::string, std::int64_t> got_bytes, got_objects;
  std::int64_t allocs = 0, alloc_bytes = 0, overflowed = 0;
  std::map<std::string, std::int64_t> elsewhere;  // leaf -> alloc_objects, for the message
  for (const Sample& s : p.samples) {
    if (LabelOf(s, "phase") != "exact") continue;
    const std::vector<std::string> names = FunctionNames(p, s);
    const std::string leaf = names.empty() ? "" : names[0];
    if (leaf == "[heapprof: stack table full]") {
      overflowed += s.values.at(alloc_objects);
    } else if (leaf.find("StressAllocExact") == std::string::npos) {
      elsewhere[leaf] += s.values.at(alloc_objects);
      continue;
    }
    allocs += s.values.at(alloc_objects);
    alloc_bytes += s.values.at(alloc_space);
    if (s.values.at(inuse_objects) == 0) continue;
    got_bytes[LabelOf(s, "worker")] += s.values.at(inuse_space);
    got_objects[LabelOf(s, "worker")] += s.values.at(inuse_objects);
  }
  std::string where;
  for (const auto& kv : elsewhere) where += kv.first + ": " + std::to_string(kv.second) + "\n";
  INFO("samples with another leaf:\n" << where);
  MESSAGE("exact: " << exact.allocs.load() << " allocations, " << r2.profiles_ok << " profiles, " << e1.stacks
                    << " stacks, " << overflowed << " samples on the overflow stack");
  CHECK(elsewhere.empty());
  CHECK(allocs == static_cast<std::int64_t>(exact.allocs.load()));
  CHECK(alloc_bytes == static_cast<std::int64_t>(exact.bytes.load()));
  // Per label: each object kept the worker label it was allocated under,
  // whichever thread freed its neighbours.
  CHECK(got_bytes == held_bytes);
  CHECK(got_objects == held_objects);
  }

  // Everything freed (the decoded profile and the tallies too): the live map
  // is back where it was.
  for (const Held& h : held) ::operator delete(h.p, h.n);
  held_bytes.clear();
  held_objects.clear();
  std::vector<Held>().swap(held);
  const heapprof::Stats e2 = heapprof::GetStats();
  CHECK(e2.sampled_live_objects == e0.sampled_live_objects);
  Profile end;
  REQUIRE(CaptureProfile(end));
  CHECK(SumForLeaf(end, "StressAllocExact", "inuse_objects") == 0);
}
