// C++20 coroutines that hold a ScopedLabels across co_await, resumed on an
// event loop and on a worker thread, with labels of their own (README:
// "Labels across co_await, fibers and event loops"). The task's promise swaps
// its labels in where it resumes and out where it suspends
// (heapprof::SetCurrentLabels), so each request's allocations carry its
// labels on whatever thread runs it, and the threads' own allocations carry
// theirs. Run by the hooked suite (test_labels.cpp), which reads the profile:
//
//   heapprof_coroutine_labels OUT.pb.gz     (prints loop_iterations=N)
//
// Every allocation is recorded (rate 1); the ones counted are CoroAlloc's.
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <condition_variable>
#include <coroutine>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

namespace {

// Where allocations are counted; kept live so that the heap profile has them.
void* g_kept[256];
int g_kept_count = 0;
std::mutex g_kept_mutex;

__attribute__((noinline)) void CoroAlloc(std::size_t size) {
  void* p = ::operator new(size);
  std::lock_guard<std::mutex> lock(g_kept_mutex);
  g_kept[g_kept_count++] = p;
}

// A queue of coroutines to resume; a null handle ends a worker.
class Queue {
 public:
  void Push(std::coroutine_handle<> h) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      handles_.push_back(h);
    }
    ready_.notify_one();
  }
  std::coroutine_handle<> Pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [this] { return !handles_.empty(); });
    std::coroutine_handle<> h = handles_.front();
    handles_.pop_front();
    return h;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::coroutine_handle<>> handles_;
};

Queue g_loop, g_worker;
int g_running = 0;  // requests not finished (the loop thread's only)
std::mutex g_running_mutex;

// co_await MoveTo{q}: suspends and has q's thread resume the coroutine.
struct MoveTo {
  Queue& queue;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) { queue.Push(h); }
  void await_resume() const noexcept {}
};

// A fire-and-forget task whose labels travel with it. `own` is the task's
// set while it is suspended; `outer` the set of the thread that resumed it,
// given back when it suspends. Both start as the creator's set: the task
// inherits its creator's labels, as a goroutine does.
struct Request {
  struct promise_type {
    heapprof::LabelSet own = heapprof::CurrentLabels();
    heapprof::LabelSet outer = own;

    Request get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept {
      heapprof::SetCurrentLabels(outer);  // the thread that ran the task's last part
      std::lock_guard<std::mutex> lock(g_running_mutex);
      --g_running;
      return {};
    }
    void return_void() noexcept {}
    void unhandled_exception() noexcept {}

    template <class Awaiter>
    struct Switch {
      Awaiter inner;
      promise_type& promise;
      bool await_ready() { return inner.await_ready(); }
      // Swap out before handing the coroutine on: another thread may resume
      // it before this call returns.
      auto await_suspend(std::coroutine_handle<> h) {
        promise.own = heapprof::SetCurrentLabels(promise.outer);
        return inner.await_suspend(h);
      }
      decltype(auto) await_resume() {
        promise.outer = heapprof::SetCurrentLabels(promise.own);
        return inner.await_resume();
      }
    };
    template <class Awaiter>
    Switch<Awaiter> await_transform(Awaiter a) {
      return Switch<Awaiter>{a, *this};
    }
  };
};

Request Handle(const char* name, std::size_t size) {
  {
    heapprof::ScopedLabels request{{"request", name}};
    CoroAlloc(size);  // on the loop, before the first co_await
    co_await MoveTo{g_loop};
    CoroAlloc(size);  // on the loop, after the other request ran
    co_await MoveTo{g_worker};
    CoroAlloc(size);  // on the worker
    co_await MoveTo{g_loop};
    CoroAlloc(size);  // on the loop again
  }  // the scope ends on the loop thread, after three suspensions
  CoroAlloc(size + 1);  // the inherited set only
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.pb.gz\n", argv[0]);
    return 2;
  }
  heapprof::SetSampleRate(1);
  std::thread worker([] {
    while (std::coroutine_handle<> h = g_worker.Pop()) {
      heapprof::ScopedLabels own{{"thread", "worker"}};
      CoroAlloc(70);
      h.resume();  // runs until the task suspends: this scope is current again
    }
  });
  g_running = 2;
  {
    heapprof::ScopedLabels creator{{"tenant", "acme"}};
    Handle("A", 1000);
    Handle("B", 2000);
  }
  int iterations = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(g_running_mutex);
      if (g_running == 0) break;
    }
    std::coroutine_handle<> h = g_loop.Pop();
    CoroAlloc(50);  // the loop's own: no labels
    ++iterations;
    h.resume();
  }
  g_worker.Push(nullptr);
  worker.join();
  CoroAlloc(50);
  ++iterations;
  std::printf("loop_iterations=%d\n", iterations);
  return heapprof::WriteHeapProfile(std::string(argv[1])) ? 0 : 1;
}
