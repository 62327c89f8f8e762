// heapprof: from buckets to a gzip'ed pprof profile.
//
// snapshot buckets (lock-free walk) → scale (Go's formula) → ProfileData
// → EncodeProfile (symbolized in process) → GzipCompress → ostream.
// Runs under the reentrancy guard: what the writer allocates is counted in
// Stats but never sampled, and no engine lock is held while it allocates.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <new>
#include <ostream>
#include <string>
#include <vector>
#include <functional>

#include "heapprof/detail/buckets.hpp"
#include "heapprof/detail/elf.hpp"
#include "heapprof/detail/engine.hpp"
#include "heapprof/detail/gzip.hpp"
#include "heapprof/detail/profile_builder.hpp"

namespace heapprof {
namespace detail {

// Go's runtime/pprof scaleHeapSample: an object of size s is sampled with
// probability 1 - exp(-s/R), so each sample stands for 1/(1 - exp(-s/R))
// objects. expm1 keeps precision for s << R. Rate 1 recorded everything.
inline double HeapSampleScale(std::uint64_t size, std::uint64_t rate) noexcept {
  if (rate <= 1 || size == 0) return 1.0;
  return 1.0 / -std::expm1(-static_cast<double>(size) / static_cast<double>(rate));
}

// The sample's label set as pprof string labels, in key order.
inline void FillLabels(const LabelSetData* labels, ProfileSample& sample) {
  if (labels == nullptr) return;
  for (std::uint32_t i = 0; i < labels->count; ++i) {
    sample.labels.emplace_back(std::string(labels->entries()[i].key), std::string(labels->entries()[i].value));
  }
}

inline std::int64_t RealtimeNanos() noexcept {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// Per-bucket counters at one moment: the start of a delta profile
// (/debug/pprof/heap?seconds=N). Buckets are never freed, so a bucket's
// address identifies it for the life of the process.
struct BucketCounts {
  const Bucket* bucket;
  std::uint64_t allocs, frees;
};
struct ProfileBaseline {
  std::vector<BucketCounts> counts;  // sorted by bucket address
  std::int64_t time_nanos = 0;
};

// A bucket's counters as one reading. Frees first: it never exceeds allocs,
// which only grows, so live = allocs - frees is never negative.
inline BucketCounts ReadCounts(const Bucket* b) noexcept {
  const std::uint64_t frees = b->frees.load(std::memory_order_relaxed);
  const std::uint64_t allocs = b->allocs.load(std::memory_order_relaxed);
  return BucketCounts{b, allocs, frees};
}

inline ProfileBaseline TakeBaseline() {
  ReentrancyGuard guard;
  EnsureInit();
  ProfileBaseline base;
  base.time_nanos = RealtimeNanos();
  for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) base.counts.push_back(ReadCounts(b));
  std::sort(base.counts.begin(), base.counts.end(),
            [](const BucketCounts& a, const BucketCounts& b) { return std::less<const Bucket*>()(a.bucket, b.bucket); });
  return base;
}

// The bucket's counters at the baseline; zero for a bucket created after it.
inline BucketCounts BaselineFor(const ProfileBaseline& base, const Bucket* b) noexcept {
  auto it = std::lower_bound(
      base.counts.begin(), base.counts.end(), b,
      [](const BucketCounts& c, const Bucket* key) { return std::less<const Bucket*>()(c.bucket, key); });
  if (it != base.counts.end() && it->bucket == b) return *it;
  return BucketCounts{b, 0, 0};
}

// The sampled heap as estimates. With `since`, a delta profile like Go's
// net/http/pprof ?seconds=N: every value is (now - baseline), so the alloc
// values count only allocations made in the window and the inuse values are
// the change in use (negative where more was freed than allocated); stacks
// with no change are left out; time_nanos is the end of the window and
// duration_nanos its length.
inline ProfileData SnapshotProfile(bool allocs_default, const ProfileBaseline* since = nullptr) {
  ProfileData data;
  data.period = static_cast<std::int64_t>(RateOf(g_rate_state.load(std::memory_order_acquire)));
  data.time_nanos = RealtimeNanos();
  if (since != nullptr) {
    data.duration_nanos = data.time_nanos > since->time_nanos ? data.time_nanos - since->time_nanos : 1;
  }
  data.allocs_default = allocs_default;
  for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) {
    const BucketCounts now = ReadCounts(b);
    const std::uint64_t allocs = now.allocs, frees = now.frees;
    double alloc_count = 0, live_count = 0;
    if (since == nullptr) {
      alloc_count = static_cast<double>(allocs);
      live_count = allocs > frees ? static_cast<double>(allocs - frees) : 0.0;
    } else {
      const BucketCounts before = BaselineFor(*since, b);
      if (allocs == before.allocs && frees == before.frees) continue;
      alloc_count = static_cast<double>(allocs - before.allocs);
      live_count = static_cast<double>(allocs) - static_cast<double>(frees) -
                   (static_cast<double>(before.allocs) - static_cast<double>(before.frees));
    }
    const double scale = HeapSampleScale(b->size, b->rate);
    const double size = static_cast<double>(b->size);
    ProfileSample s;
    s.pcs.assign(b->stack->pcs(), b->stack->pcs() + b->stack->depth);
    s.truncated = b->stack->truncated;
    s.overflow = b->stack->overflow;
    s.alloc_objects = std::llround(alloc_count * scale);
    s.alloc_bytes = std::llround(alloc_count * size * scale);
    s.inuse_objects = std::llround(live_count * scale);
    s.inuse_bytes = std::llround(live_count * size * scale);
    s.object_size = static_cast<std::int64_t>(b->size);
    FillLabels(b->labels, s);
    data.samples.push_back(std::move(s));
  }
  return data;
}

// `data` as a gzip'ed profile.proto message. Throws bad_alloc.
inline std::string EncodeGzipped(const ProfileData& data, const std::vector<LoadedObject>& objects,
                                 Symbolizer& symbolizer) {
  std::string gz;
  GzipCompress(EncodeProfile(data, objects, symbolizer), gz);
  return gz;
}

// Serialised, compressed profile; empty on failure.
// With `since`, the delta profile from that baseline (see SnapshotProfile).
inline bool BuildProfileBytes(bool allocs_default, std::string& gz,
                              const ProfileBaseline* since = nullptr) noexcept {
  ReentrancyGuard guard;
  EnsureInit();
  try {
    const ProfileData data = SnapshotProfile(allocs_default, since);
    const std::vector<LoadedObject> objects = CollectLoadedObjects();
    Symbolizer symbolizer(objects);
    gz = EncodeGzipped(data, objects, symbolizer);
    return true;
  } catch (...) {  // bad_alloc: a profile is never worth the process
    gz.clear();
    return false;
  }
}

// Go's legacy text heap profile (net/http/pprof ?debug=1), which `go tool
// pprof` also parses:
//   heap profile: <inuse objs>: <inuse bytes> [<alloc objs>: <alloc bytes>] @ heap/<2*rate>
//   <inuse objs>: <inuse bytes> [<alloc objs>: <alloc bytes>] @ 0x<ret addr> ...
//   #	0x<ret addr>	<function>+0x<offset>
// then our Stats as comments and MAPPED_LIBRARIES: (the /proc/self/maps lines
// of the executable segments) so pprof can symbolize from the files. The
// counts are raw sample counts that the reader scales with Go's formula at
// the header's rate (2*rate, a quirk pprof expects). One record per bucket, so
// the mean object size the formula needs is exact; a bucket sampled at an
// older rate has its counts converted to the header's rate. At rate 0 or 1
// the counts are the estimates themselves (pprof does not scale those).
inline void AppendFormat(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
inline void AppendFormat(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) out.append(buf, static_cast<std::size_t>(n) < sizeof buf ? static_cast<std::size_t>(n) : sizeof buf - 1);
}

struct TextRecord {
  const Bucket* bucket;
  std::int64_t inuse_objects, alloc_objects;  // raw counts at the header's rate
};

inline bool BuildTextHeapProfile(std::string& out, const std::function<void(std::string&)>& extra_comments = {}) noexcept {
  ReentrancyGuard guard;
  EnsureInit();
  try {
    out.clear();
    const std::uint64_t rate = RateOf(g_rate_state.load(std::memory_order_acquire));
    std::vector<TextRecord> records;
    for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) {
      const BucketCounts now = ReadCounts(b);
      const std::uint64_t allocs = now.allocs, frees = now.frees;
      const std::uint64_t live = allocs > frees ? allocs - frees : 0;
      if (allocs == 0 || b->size == 0) continue;
      // What the reader will multiply by; what the bucket's counts stand for.
      const double reader_scale = rate <= 1 ? 1.0 : HeapSampleScale(b->size, rate);
      const double ratio = HeapSampleScale(b->size, b->rate) / reader_scale;
      TextRecord r{b, static_cast<std::int64_t>(live), static_cast<std::int64_t>(allocs)};
      if (b->rate != rate && !(rate <= 1 && b->rate <= 1)) {
        r.inuse_objects = std::llround(static_cast<double>(live) * ratio);
        r.alloc_objects = std::llround(static_cast<double>(allocs) * ratio);
      }
      records.push_back(r);
    }
    std::sort(records.begin(), records.end(), [](const TextRecord& a, const TextRecord& b) {
      return a.inuse_objects * static_cast<std::int64_t>(a.bucket->size) >
             b.inuse_objects * static_cast<std::int64_t>(b.bucket->size);
    });
    std::int64_t ti = 0, tib = 0, ta = 0, tab = 0;
    for (const TextRecord& r : records) {
      const auto size = static_cast<std::int64_t>(r.bucket->size);
      ti += r.inuse_objects;
      tib += r.inuse_objects * size;
      ta += r.alloc_objects;
      tab += r.alloc_objects * size;
    }
    AppendFormat(out, "heap profile: %lld: %lld [%lld: %lld] @ heap/%llu\n", static_cast<long long>(ti),
                 static_cast<long long>(tib), static_cast<long long>(ta), static_cast<long long>(tab),
                 static_cast<unsigned long long>(2 * rate));
    const std::vector<LoadedObject> objects = CollectLoadedObjects();
    Symbolizer symbolizer(objects);
    std::string name;
    for (const TextRecord& r : records) {
      const auto size = static_cast<std::int64_t>(r.bucket->size);
      AppendFormat(out, "%lld: %lld [%lld: %lld] @", static_cast<long long>(r.inuse_objects),
                   static_cast<long long>(r.inuse_objects * size), static_cast<long long>(r.alloc_objects),
                   static_cast<long long>(r.alloc_objects * size));
      const StackRecord* stack = r.bucket->stack;
      for (std::uint32_t i = 0; i < stack->depth; ++i) {
        AppendFormat(out, " %#llx", static_cast<unsigned long long>(stack->pcs()[i]));
      }
      out += '\n';
      for (std::uint32_t i = 0; i < stack->depth; ++i) {
        const std::uintptr_t pc = stack->pcs()[i];
        std::uintptr_t start = 0;
        if (symbolizer.Lookup(pc - 1, name, start)) {
          AppendFormat(out, "#\t%#llx\t", static_cast<unsigned long long>(pc));
          out += name;
          AppendFormat(out, "+%#llx\n", static_cast<unsigned long long>(pc - start));
        } else {
          AppendFormat(out, "#\t%#llx\n", static_cast<unsigned long long>(pc));
        }
      }
      if (r.bucket->labels != nullptr && r.bucket->labels->count != 0) {
        out += "# labels:";
        for (std::uint32_t i = 0; i < r.bucket->labels->count; ++i) {
          out += ' ';
          out += r.bucket->labels->entries()[i].key;
          out += '=';
          out += r.bucket->labels->entries()[i].value;
        }
        out += '\n';
      }
      out += '\n';
    }
    if (extra_comments) extra_comments(out);
    out += "\nMAPPED_LIBRARIES:\n";
    for (const LoadedObject& o : objects) {
      AppendFormat(out, "%012llx-%012llx r-xp %08llx 00:00 0 ", static_cast<unsigned long long>(o.start),
                   static_cast<unsigned long long>(o.limit), static_cast<unsigned long long>(o.file_offset));
      out += o.path;
      out += '\n';
    }
    return true;
  } catch (...) {
    out.clear();
    return false;
  }
}

// Writes `bytes` to `path` so that no reader ever sees part of it: a temporary
// file in the same directory, fsync, rename over `path`. On failure the
// temporary is removed, `path` is untouched, and `error` says why.
inline bool WriteFileAtomic(const std::string& path, const std::string& bytes, std::string* error = nullptr) noexcept {
  ReentrancyGuard guard;
  static std::atomic<std::uint32_t> counter{0};
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%u", static_cast<long>(getpid()),
                counter.fetch_add(1, std::memory_order_relaxed));
  try {
    const std::string tmp = path + suffix;
    auto fail = [&](const char* what, int err, bool unlink_tmp) {
      if (unlink_tmp) ::unlink(tmp.c_str());
      if (error != nullptr) *error = std::string(what) + " " + (unlink_tmp ? tmp : path) + ": " + std::strerror(err);
      return false;
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return fail("cannot create", errno, false);
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        ::close(fd);
        return fail("cannot write", err, true);
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
      const int err = errno;
      ::close(fd);
      return fail("cannot fsync", err, true);
    }
    if (::close(fd) != 0) return fail("cannot close", errno, true);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      if (error != nullptr) *error = "cannot rename " + tmp + " to " + path + ": " + std::strerror(err);
      return false;
    }
    return true;
  } catch (...) {
    if (error != nullptr) error->clear();
    return false;
  }
}

// The profile, gzip'ed, written atomically to `path`.
inline bool WriteProfileFile(const std::string& path, bool allocs_default, std::string* error = nullptr) noexcept {
  ReentrancyGuard guard;
  std::string gz;
  if (!BuildProfileBytes(allocs_default, gz)) {
    if (error != nullptr) *error = "out of memory building the profile";
    return false;
  }
  return WriteFileAtomic(path, gz, error);
}

inline bool WriteProfile(std::ostream& out, bool allocs_default) noexcept {
  ReentrancyGuard guard;
  std::string gz;
  if (!BuildProfileBytes(allocs_default, gz)) return false;
  try {
    out.write(gz.data(), static_cast<std::streamsize>(gz.size()));
    out.flush();
    return !out.fail();
  } catch (...) {  // a stream with exceptions() enabled
    return false;
  }
}

}  // namespace detail
}  // namespace heapprof
