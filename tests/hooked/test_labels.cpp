// Scoped labels at rate 1: exact attribution, kept for each object's lifetime.
#include <heapprof.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/profile_io.hpp"

namespace {

using heapprof_test::Profile;
using heapprof_test::Sample;

void* g_keep[64];

__attribute__((noinline)) void LabeledLeaf(int first, int n, std::size_t size) {
  for (int i = first; i < first + n; ++i) g_keep[i] = ::operator new(size);
  asm volatile("" ::: "memory");
}

std::string LabelValue(const Sample& s, const std::string& key) {
  for (const auto& l : s.labels) {
    if (l.key == key) return l.str;
  }
  return "";
}

// Sums a value over samples with leaf LabeledLeaf, object size `size`, and
// the given string labels exactly (other string labels absent).
std::int64_t Sum(const Profile& p, std::size_t size, const std::vector<std::pair<std::string, std::string>>& want,
                 const char* type) {
  const int idx = heapprof_test::SampleTypeIndex(p, type);
  std::int64_t total = 0;
  for (const Sample& s : p.samples) {
    const auto names = heapprof_test::FunctionNames(p, s);
    if (names.empty() || names[0].find("LabeledLeaf") == std::string::npos) continue;
    bool size_ok = false;
    std::size_t string_labels = 0;
    for (const auto& l : s.labels) {
      if (l.key == "bytes") size_ok = l.num == static_cast<std::int64_t>(size);
      if (!l.str.empty()) ++string_labels;
    }
    if (!size_ok || string_labels != want.size()) continue;
    bool match = true;
    for (const auto& kv : want) match = match && LabelValue(s, kv.first) == kv.second;
    if (match) total += s.values.at(idx);
  }
  return total;
}

void FreeKept(int first, int n) {
  for (int i = first; i < first + n; ++i) ::operator delete(g_keep[i]);
}

}  // namespace

TEST_CASE("labels: nesting, override, restore, and lifetime attribution in the profile") {
  heapprof_test::RateScope rate(1);
  CHECK(heapprof::CurrentLabels().empty());
  {
    heapprof::ScopedLabels outer{{"endpoint", "/search"}, {"tenant", "acme"}};
    CHECK(heapprof::CurrentLabels().Get("endpoint") == "/search");
    LabeledLeaf(0, 3, 1001);
    {
      heapprof::ScopedLabels inner{{"endpoint", "/inner"}, {"phase", "parse"}};
      const heapprof::LabelSet now = heapprof::CurrentLabels();
      CHECK(now.size() == 3);
      CHECK(now.Get("endpoint") == "/inner");  // the inner value wins
      CHECK(now.Get("tenant") == "acme");
      CHECK(now.Get("phase") == "parse");
      LabeledLeaf(3, 2, 1001);
    }
    // Leaving restores exactly the previous set (the same interned set).
    CHECK(heapprof::CurrentLabels() == heapprof::LabelSet{{"tenant", "acme"}, {"endpoint", "/search"}});
  }
  CHECK(heapprof::CurrentLabels().empty());
  LabeledLeaf(5, 1, 1001);

  Profile p;
  std::string why;
  REQUIRE_MESSAGE(heapprof_test::CaptureProfile(p, false, nullptr, &why), why);
  REQUIRE_MESSAGE(heapprof_test::Validate(p, &why), why);
  CHECK(Sum(p, 1001, {{"endpoint", "/search"}, {"tenant", "acme"}}, "inuse_objects") == 3);
  CHECK(Sum(p, 1001, {{"endpoint", "/inner"}, {"tenant", "acme"}, {"phase", "parse"}}, "inuse_objects") == 2);
  CHECK(Sum(p, 1001, {}, "inuse_objects") == 1);

  // Freed after their scope ended, on another thread: in-use leaves exactly
  // their label set; the allocation totals stay with it.
  std::thread([] { FreeKept(0, 6); }).join();
  Profile after;
  REQUIRE(heapprof_test::CaptureProfile(after));
  CHECK(Sum(after, 1001, {{"endpoint", "/search"}, {"tenant", "acme"}}, "inuse_objects") == 0);
  CHECK(Sum(after, 1001, {{"endpoint", "/search"}, {"tenant", "acme"}}, "alloc_objects") == 3);
  CHECK(Sum(after, 1001, {{"endpoint", "/inner"}, {"tenant", "acme"}, {"phase", "parse"}}, "alloc_space") ==
        2 * 1001);
}

TEST_CASE("labels: a captured set carried to a worker thread") {
  heapprof_test::RateScope rate(1);
  heapprof::LabelSet captured;
  {
    heapprof::ScopedLabels req{{"request", "r-42"}};
    captured = heapprof::CurrentLabels();
  }
  std::thread worker([captured] {
    heapprof::ScopedLabels base{{"pool", "io"}};
    heapprof::ScopedLabels carried(captured);  // merged over the worker's own set
    CHECK(heapprof::CurrentLabels().Get("request") == "r-42");
    CHECK(heapprof::CurrentLabels().Get("pool") == "io");
    LabeledLeaf(10, 4, 2002);
  });
  worker.join();
  Profile p;
  REQUIRE(heapprof_test::CaptureProfile(p));
  CHECK(Sum(p, 2002, {{"request", "r-42"}, {"pool", "io"}}, "inuse_objects") == 4);
  FreeKept(10, 4);
}

// A scope's set comes from the thread's memo when its enclosing set and its
// first label's string addresses match an earlier scope's; the memo's set must
// still be checked against the labels' bytes. Each case below passes the same
// addresses with other contents (or other labels after the first), so a memo
// that trusted the addresses returns the earlier set. The expected sets are
// read label by label (Holds), not built through the code under test.
bool Holds(const heapprof::LabelSet& set, std::initializer_list<std::pair<const char*, const char*>> want) {
  if (set.size() != want.size()) return false;
  for (const auto& kv : want) {
    if (set.Get(kv.first) != kv.second) return false;
  }
  return true;
}

TEST_CASE("labels: a scope entered again gets its own labels, whatever the memo of earlier scopes holds") {
  using heapprof::LabelSet;
  using heapprof::ScopedLabels;
  char key[16] = "endpoint";
  char value[16] = "/search";
  const std::string_view k(key, 8);
  const std::string_view v(value, 7);
  LabelSet first;
  {
    ScopedLabels s{{k, v}, {"tenant", "acme"}};
    first = heapprof::CurrentLabels();
    CHECK(Holds(first, {{"endpoint", "/search"}, {"tenant", "acme"}}));
  }
  {
    ScopedLabels s{{k, v}, {"tenant", "acme"}};  // the same: the same set
    CHECK(heapprof::CurrentLabels() == first);
  }
  std::memcpy(value, "/orders", 7);  // same addresses, same length, other bytes
  {
    ScopedLabels s{{k, v}, {"tenant", "acme"}};
    CHECK(Holds(heapprof::CurrentLabels(), {{"endpoint", "/orders"}, {"tenant", "acme"}}));
  }
  std::memcpy(key, "handler", 8);  // the key's bytes change (and "handler\0" is 8 bytes)
  const std::string_view h(key, 7);
  {
    ScopedLabels s{{h, v}, {"tenant", "acme"}};
    CHECK(Holds(heapprof::CurrentLabels(), {{"handler", "/orders"}, {"tenant", "acme"}}));
  }
  {
    ScopedLabels s{{h, v}, {"tenant", "beta"}};  // the second label differs
    CHECK(Holds(heapprof::CurrentLabels(), {{"handler", "/orders"}, {"tenant", "beta"}}));
  }
  {
    ScopedLabels s{{h, v}};  // one label fewer
    CHECK(Holds(heapprof::CurrentLabels(), {{"handler", "/orders"}}));
  }
  {
    // A key given twice: the later value wins, every time.
    ScopedLabels s{{h, v}, {"handler", "/late"}};
    CHECK(Holds(heapprof::CurrentLabels(), {{"handler", "/late"}}));
  }
  {
    ScopedLabels s{{h, v}, {"handler", "/late"}};
    CHECK(Holds(heapprof::CurrentLabels(), {{"handler", "/late"}}));
  }
  {
    // Inside a scope: the enclosing set's labels stay unless overridden. The
    // first inner scope overrides "tier"; the second, with the same first
    // label, does not, and must see the enclosing value (the memo's set has
    // the same count of labels and the second's one label in it).
    ScopedLabels outer{{"tier", "gold"}};
    {
      ScopedLabels inner{{h, v}, {"tier", "silver"}};
      CHECK(Holds(heapprof::CurrentLabels(), {{"handler", "/orders"}, {"tier", "silver"}}));
    }
    {
      ScopedLabels inner{{h, v}};
      CHECK(Holds(heapprof::CurrentLabels(), {{"handler", "/orders"}, {"tier", "gold"}}));
    }
  }
  // Every length up to 40 bytes (the short ones are compared a word at a
  // time): one buffer, so every scope has the same addresses; before each
  // change the memo holds the all-'x' set, and the scope after it differs
  // from that set in that one byte only.
  for (std::size_t n = 1; n <= 40; ++n) {
    std::string buf(n, 'x');
    const std::string_view label(buf.data(), n);
    LabelSet all_x;
    {
      ScopedLabels s{{"len", label}};
      all_x = heapprof::CurrentLabels();
      CHECK(all_x.Get("len") == std::string(n, 'x'));
    }
    for (std::size_t at = 0; at < n; ++at) {
      {
        ScopedLabels s{{"len", label}};  // the memo now holds the all-'x' set
        CHECK(heapprof::CurrentLabels() == all_x);
      }
      buf[at] = 'y';
      {
        ScopedLabels s{{"len", label}};
        CHECK(heapprof::CurrentLabels().Get("len") == buf);
      }
      buf[at] = 'x';
    }
  }
}

TEST_CASE("labels: heapprof::allocator carries a LabelSet merged over the thread's") {
  heapprof_test::RateScope rate(1);
  using Alloc = heapprof::allocator<char>;
  Alloc tagged(heapprof::LabelSet{{"cache", "users"}});
  CHECK(tagged == Alloc());  // labels are attribution, not ownership
  CHECK(Alloc(tagged).labels() == tagged.labels());
  heapprof::allocator<int> rebound(tagged);
  CHECK(rebound.labels().Get("cache") == "users");
  {
    heapprof::ScopedLabels req{{"endpoint", "/users"}};
    std::vector<char, Alloc> buffer(tagged);
    buffer.reserve(3003);
    Profile p;
    REQUIRE(heapprof_test::CaptureProfile(p));
    const int idx = heapprof_test::SampleTypeIndex(p, "inuse_space");
    std::int64_t found = 0;
    for (const Sample& s : p.samples) {
      if (LabelValue(s, "cache") == "users" && LabelValue(s, "endpoint") == "/users") found += s.values[idx];
    }
    CHECK(found == 3003);
  }
}

TEST_CASE("labels: a million distinct request ids stay within the label-set cap (HEAPPROF=max_label_sets)") {
  // In a child process: the cap, once reached, holds for the process's life.
  std::string out;
  const int rc =
      heapprof_test::RunCommand("HEAPPROF=max_label_sets=1000 HEAPPROF_TEST_CHILD=label_cap " + heapprof_test::SelfExe(), out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("label_sets=1000\n") != std::string::npos);
  CHECK(out.find("overflow_label=label-set-overflow\n") != std::string::npos);
}

TEST_CASE("labels: a set of more than 32 labels is the overflow set, counted, not a set missing labels") {
  const std::uint64_t overflows = heapprof::GetStats().label_set_overflows;
  heapprof::ScopedLabels many{{"a01", "1"}, {"a02", "1"}, {"a03", "1"}, {"a04", "1"}, {"a05", "1"}, {"a06", "1"},
                              {"a07", "1"}, {"a08", "1"}, {"a09", "1"}, {"a10", "1"}, {"a11", "1"}, {"a12", "1"},
                              {"a13", "1"}, {"a14", "1"}, {"a15", "1"}, {"a16", "1"}, {"a17", "1"}, {"a18", "1"},
                              {"a19", "1"}, {"a20", "1"}, {"a21", "1"}, {"a22", "1"}, {"a23", "1"}, {"a24", "1"},
                              {"a25", "1"}, {"a26", "1"}, {"a27", "1"}, {"a28", "1"}, {"a29", "1"}, {"a30", "1"},
                              {"a31", "1"}, {"a32", "1"}};
  CHECK(heapprof::CurrentLabels().size() == 32);  // 32 fit
  CHECK(heapprof::CurrentLabels().Get("a32") == "1");
  CHECK(heapprof::GetStats().label_set_overflows == overflows);
  {
    // One more, nested: before, the set kept the 32 and dropped "endpoint"
    // silently, so this scope's samples had no endpoint and nothing said why.
    heapprof::ScopedLabels inner{{"endpoint", "/search"}};
    const heapprof::LabelSet now = heapprof::CurrentLabels();
    CHECK(now.size() == 1);
    CHECK(now.Get("heapprof") == "label-set-overflow");
    CHECK(heapprof::GetStats().label_set_overflows == overflows + 1);
  }
  // Overriding a key keeps the count at 32: an ordinary set.
  heapprof::ScopedLabels same{{"a01", "2"}};
  CHECK(heapprof::CurrentLabels().size() == 32);
  CHECK(heapprof::CurrentLabels().Get("a01") == "2");
  // 33 in one scope, and a LabelSet carried over 32 others: the overflow set too.
  const heapprof::LabelSet carried{{"tenant", "acme"}};
  heapprof::ScopedLabels worker{carried};
  CHECK(heapprof::CurrentLabels().Get("heapprof") == "label-set-overflow");
  CHECK(heapprof::GetStats().label_set_overflows == overflows + 2);
}

namespace {
bool ValidUtf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}
}  // namespace

TEST_CASE("labels: a key or value cut at 256 bytes stays valid UTF-8") {
  // "x" then 150 two-byte characters: byte 256 is the second byte of one.
  // Cut there, the value ended in half a character, which a strict protobuf
  // decoder (string fields must be UTF-8) rejects along with the whole profile.
  std::string value = "x";
  for (int i = 0; i < 150; ++i) value += "\xc3\xa9";  // U+00E9
  std::string key = "kk";
  for (int i = 0; i < 100; ++i) key += "\xe2\x82\xac";  // U+20AC, 3 bytes: byte 256 is a third byte (cut at 254)
  heapprof::ScopedLabels scope{{key, value}};
  const heapprof::LabelSet now = heapprof::CurrentLabels();
  REQUIRE(now.size() == 1);
  const heapprof::Label kv = now[0];
  CHECK(kv.second.size() == 255);
  CHECK(ValidUtf8(kv.second));
  CHECK(kv.second == std::string_view(value).substr(0, 255));
  CHECK(kv.first.size() == 254);
  CHECK(ValidUtf8(kv.first));
  // ASCII is cut at exactly 256, as before.
  const std::string ascii(300, 'a');
  heapprof::ScopedLabels plain{{"plain", ascii}};
  CHECK(heapprof::CurrentLabels().Get("plain").size() == 256);
}

TEST_CASE("labels: the largest label sets stop at the 16 MiB budget") {
  // Before: 4096 sets of 32 labels of 256-byte keys and values took 136 MiB.
  std::string out;
  const int rc = heapprof_test::RunCommand("HEAPPROF_TEST_CHILD=label_budget " + heapprof_test::SelfExe(), out);
  MESSAGE(out);
  CHECK(rc == 0);
  CHECK(out.find("label_budget: ok") != std::string::npos);
}

TEST_CASE("labels: destroying scopes out of order is reported (and aborts in debug builds)") {
  std::string out;
  const int rc = heapprof_test::RunCommand("HEAPPROF_TEST_CHILD=scope_misuse " + heapprof_test::SelfExe(), out);
  INFO(out);
  CHECK(out.find("heapprof: ScopedLabels destroyed out of order") != std::string::npos);
#if defined(NDEBUG)
  CHECK(rc == 0);
  CHECK(out.find("survived") != std::string::npos);
#else
  CHECK(rc != 0);  // std::abort
  CHECK(out.find("survived") == std::string::npos);
#endif
}

TEST_CASE("labels: go tool pprof -tags and -tagfocus read them") {
  using namespace heapprof_test;
  if (GoBinary().empty()) {
    MESSAGE("go not installed: skipped");
    return;
  }
  heapprof_test::RateScope rate(1);
  {
    heapprof::ScopedLabels req{{"endpoint", "/tagged"}};
    LabeledLeaf(20, 5, 4004);
  }
  std::string gz;
  Profile p;
  REQUIRE(CaptureProfile(p, false, &gz));
  const std::string path = TempPath(".pb.gz");
  REQUIRE(WriteFile(path, gz));
  std::string out;
  REQUIRE(GoPprof("-tags -sample_index=inuse_objects", path, out) == 0);
  INFO(out);
  CHECK(out.find("endpoint") != std::string::npos);
  CHECK(out.find("/tagged") != std::string::npos);
  REQUIRE(GoPprof("-top -tagfocus=endpoint=/tagged -sample_index=inuse_objects", path, out) == 0);
  INFO(out);
  CHECK(out.find("LabeledLeaf") != std::string::npos);
  CHECK(out.find("Showing nodes accounting for 5,") != std::string::npos);  // 5 objects pass the focus
  FreeKept(20, 5);
  std::remove(path.c_str());
}

TEST_CASE("labels: SetCurrentLabels swaps the thread's set as is and returns the one it replaces") {
  REQUIRE(heapprof::CurrentLabels().empty());
  const heapprof::LabelSet task{{"request", "A"}};
  heapprof::LabelSet outer;
  {
    heapprof::ScopedLabels thread_scope{{"thread", "loop"}};
    const heapprof::LabelSet loop = heapprof::CurrentLabels();
    // A task resumes: its set in, as is (not merged over the thread's).
    CHECK(heapprof::SetCurrentLabels(task) == loop);
    CHECK(heapprof::CurrentLabels() == task);
    heapprof::LabelSet suspended;
    {
      // A scope the task enters before its first suspension...
      std::optional<heapprof::ScopedLabels> scope;
      scope.emplace(std::initializer_list<heapprof::Label>{{"step", "1"}});
      CHECK(heapprof::CurrentLabels() == heapprof::LabelSet{{"request", "A"}, {"step", "1"}});
      LabeledLeaf(0, 1, 24);
      // ...suspends: the thread gets its own set back, the task keeps its.
      suspended = heapprof::SetCurrentLabels(loop);
      CHECK(heapprof::CurrentLabels() == loop);
      // The task resumes later (here on the same thread) and ends the scope:
      // it is current again, so nothing is out of order.
      CHECK(heapprof::SetCurrentLabels(suspended) == loop);
      scope.reset();
      CHECK(heapprof::CurrentLabels() == task);
    }
    outer = heapprof::SetCurrentLabels(loop);
    CHECK(outer == task);
    CHECK(heapprof::CurrentLabels() == loop);
  }
  CHECK(heapprof::CurrentLabels().empty());
  CHECK(heapprof::SetCurrentLabels(heapprof::LabelSet()).empty());
  FreeKept(0, 1);
}

TEST_CASE("labels: C++20 coroutines holding a ScopedLabels across co_await, resumed on a loop and a worker") {
#if !defined(HEAPPROF_COROUTINE_LABELS_PROGRAM_PATH)
  MESSAGE("HEAPPROF_COROUTINE_LABELS_PROGRAM_PATH not defined: the compiler has no C++20 coroutines here");
#else
  // tests/hooked/programs/coroutine_labels.cpp at rate 1: requests A (1000 B)
  // and B (2000 B) allocate under {request, tenant} on the loop, on a worker
  // that resumes them inside its own {thread=worker} scope, and on the loop
  // again, then once more after their scope under the creator's {tenant}
  // alone; the loop allocates 50 B per iteration with no labels. Without the
  // promise's SetCurrentLabels swaps, the scopes end out of order (a debug
  // build aborts), the worker's 1000/2000 B lose the request, and the loop's
  // own blocks take a request's labels.
  const std::string profile = heapprof_test::TempPath(".coroutine_labels.pb.gz");
  std::string out;
  const int rc = heapprof_test::RunCommand("env -u HEAPPROF timeout -s KILL 60 " +
                                               std::string(HEAPPROF_COROUTINE_LABELS_PROGRAM_PATH) + " " + profile,
                                           out);
  INFO(out);
  REQUIRE(rc == 0);
  int iterations = 0;
  REQUIRE(std::sscanf(out.c_str() + out.find("loop_iterations="), "loop_iterations=%d", &iterations) == 1);
  CHECK(out.find("out of order") == std::string::npos);
  Profile p;
  REQUIRE(heapprof_test::ReadProfileFile(profile, p));
  std::remove(profile.c_str());
  const int inuse = heapprof_test::SampleTypeIndex(p, "inuse_space");
  std::map<std::string, std::int64_t> by_set;  // "k=v,k=v" (key order) -> bytes
  for (const Sample& s : p.samples) {
    const auto names = heapprof_test::FunctionNames(p, s);
    if (names.empty() || names[0].find("CoroAlloc") == std::string::npos) continue;
    std::map<std::string, std::string> labels;
    for (const auto& l : s.labels) {
      if (!l.str.empty()) labels[l.key] = l.str;
    }
    std::string key;
    for (const auto& kv : labels) key += (key.empty() ? "" : ",") + kv.first + "=" + kv.second;
    by_set[key] += s.values.at(inuse);
  }
  const std::map<std::string, std::int64_t> want = {
      {"request=A,tenant=acme", 4 * 1000},
      {"request=B,tenant=acme", 4 * 2000},
      {"tenant=acme", 1001 + 2001},
      {"thread=worker", 2 * 70},
      {"", 50 * iterations},
  };
  std::string got;
  for (const auto& kv : by_set) got += "{" + kv.first + "}: " + std::to_string(kv.second) + " ";
  INFO("bytes by label set: ", got);
  CHECK(by_set == want);
#endif
}
