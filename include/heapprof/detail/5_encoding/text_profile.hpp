// heapprof: Go's legacy text heap profile (net/http/pprof ?debug=1).
#pragma once

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "heapprof/detail/0_base/errors.hpp"
#include "heapprof/detail/2_sampling/buckets.hpp"
#include "heapprof/detail/2_sampling/engine.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "heapprof/detail/5_encoding/snapshot.hpp"

namespace heapprof {
namespace detail {

// Go's legacy text heap profile (net/http/pprof ?debug=1), which `go tool
// pprof` also parses:
//   heap profile: <inuse objs>: <inuse bytes> [<alloc objs>: <alloc bytes>] @ heap/<2*rate>
//   <inuse objs>: <inuse bytes> [<alloc objs>: <alloc bytes>] @ 0x<ret addr> ...
//   #	0x<ret addr>	<function>+0x<offset>
// then our Stats as comments and MAPPED_LIBRARIES: (the /proc/self/maps lines
// of the executable segments) so pprof can symbolize from the files. The
// counts are raw sample counts that the reader scales with Go's formula at
// the header's rate (2*rate, a quirk pprof expects). One record per bucket, so
// the mean object size the formula needs is exact. The header's rate is the
// lowest rate of the records (the current rate when there are none); a bucket
// sampled at a higher one has its counts converted to it. At rate 0 or 1 the
// counts are the estimates themselves (pprof does not scale those).
inline void AppendFormat(ArenaString& out, const char* fmt, ...) __attribute__((__format__(__printf__, 2, 3)));
inline void AppendFormat(ArenaString& out, const char* fmt, ...) {
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

// User text (label keys and values) in the text format: bytes that could end
// a line, split a `key=value` pair or confuse a terminal are written as
// \xNN, so a label cannot forge records (a value holding "\nheap profile:
// ..." once made `go tool pprof` read terabytes from a 100-byte heap).
inline void AppendEscaped(ArenaString& out, std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c > 0x20 && c < 0x7f && c != '=' && c != '\\') {
      out += ch;
    } else {
      out += '\\';
      out += 'x';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
}

// The text profile produced piece by piece: Begin() takes the snapshot and
// writes the header; each Next() appends whole records up to about `budget`
// bytes, then the trailer; false once done. The HTTP server streams it so a
// connection holds one piece, never the whole text (which reached 659 MB for
// 16,384 stacks 130 frames deep).
class TextProfileStream {
 public:
  // False (nothing to write) if the snapshot failed. With `counts`, those
  // (the peak snapshot) instead of the buckets' counters now; `more_comments`
  // (whole "# ..." lines) follow what `extra_comments` writes.
  bool Begin(ArenaString& out, void (*extra_comments)(ArenaString&) = nullptr,
             const ArenaVector<BucketCounts>* counts = nullptr, std::string_view more_comments = {}) noexcept {
    ReentrancyGuard guard;
    EnsureInit();
    WarnIfNoAllocationSeen();
    WriteHeadroom headroom;  // built without exceptions: the memory first, or no profile
    if (!headroom.ok()) return false;
    HEAPPROF_TRY {
      extra_comments_ = extra_comments;
      more_comments_.assign(more_comments.data(), more_comments.size());
      ArenaVector<BucketCounts> all;
      if (counts == nullptr) {
        for (const Bucket* b = g_buckets.Head(); b != nullptr; b = b->next) all.push_back(ReadCounts(b));
        counts = &all;
      }
      // The header's rate: the lowest any record was sampled at (the current
      // rate when there are none). Each record then stands for at least as
      // many objects as its raw count at the header's rate, so converting
      // never rounds a record away: at the current rate, 1000 objects of 48 B
      // recorded at rate 1 were 0.09 raw samples of the default 512 KiB,
      // written as 0. When every record shares one rate (the usual case) it
      // is that rate and the counts are Go's raw sample counts.
      std::uint64_t rate = 0;
      bool any = false;
      for (const BucketCounts& now : *counts) {
        if (now.allocs == 0) continue;
        const std::uint64_t r = now.bucket->rate <= 1 ? 1 : now.bucket->rate;
        if (!any || r < rate) rate = r;
        any = true;
      }
      if (!any) rate = RateOf(g_rate_state.load(std::memory_order_acquire));
      for (const BucketCounts& now : *counts) {
        const Bucket* b = now.bucket;
        const std::uint64_t allocs = now.allocs, frees = now.frees;
        const std::uint64_t live = allocs > frees ? allocs - frees : 0;
        // Zero-size objects too, as the heap profile counts them (pprof's
        // legacy parser reads their counts as 0: it scales by the size).
        if (allocs == 0) continue;
        // What the reader will multiply by; what the bucket's counts stand for.
        const double reader_scale = rate <= 1 ? 1.0 : HeapSampleScale(b->size, rate);
        const double ratio = HeapSampleScale(b->size, b->rate) / reader_scale;
        TextRecord r{b, static_cast<std::int64_t>(live), static_cast<std::int64_t>(allocs)};
        if (b->rate != rate && !(rate <= 1 && b->rate <= 1)) {
          r.inuse_objects = std::llround(static_cast<double>(live) * ratio);
          r.alloc_objects = std::llround(static_cast<double>(allocs) * ratio);
        }
        records_.push_back(r);
      }
      std::sort(records_.begin(), records_.end(), [](const TextRecord& a, const TextRecord& b) {
        return a.inuse_objects * static_cast<std::int64_t>(a.bucket->size) >
               b.inuse_objects * static_cast<std::int64_t>(b.bucket->size);
      });
      std::int64_t ti = 0, tib = 0, ta = 0, tab = 0;
      for (const TextRecord& r : records_) {
        const auto size = static_cast<std::int64_t>(r.bucket->size);
        ti += r.inuse_objects;
        tib += r.inuse_objects * size;
        ta += r.alloc_objects;
        tab += r.alloc_objects * size;
      }
      AppendFormat(out, "heap profile: %lld: %lld [%lld: %lld] @ heap/%llu\n", static_cast<long long>(ti),
                   static_cast<long long>(tib), static_cast<long long>(ta), static_cast<long long>(tab),
                   static_cast<unsigned long long>(2 * rate));
      objects_ = CollectProfileObjects();
      symbolizer_ = MakeArena<Symbolizer>(objects_);
      return true;
    }
    HEAPPROF_CATCH_ALL_NOEXCEPT { return false; }
  }

  // Appends the next records (at least one) until `out` has grown by about
  // `budget`, or the trailer; false once everything is written (or on failure).
  bool Next(ArenaString& out, std::size_t budget) noexcept {
    if (done_ || symbolizer_ == nullptr) return false;
    ReentrancyGuard guard;
    WriteHeadroom headroom(false);  // built without exceptions: the memory first, or the stream ends
    if (!headroom.ok()) return false;
    HEAPPROF_TRY {
      const std::size_t start = out.size();
      while (next_ < records_.size() && out.size() - start < budget) AppendRecord(out, records_[next_++]);
      if (next_ == records_.size()) {
        if (extra_comments_ != nullptr) extra_comments_(out);
        out += more_comments_;
        out += "\nMAPPED_LIBRARIES:\n";
        for (const LoadedObject& o : objects_) {
          AppendFormat(out, "%012llx-%012llx r-xp %08llx 00:00 0 ", static_cast<unsigned long long>(o.start),
                       static_cast<unsigned long long>(o.limit), static_cast<unsigned long long>(o.file_offset));
          out += o.path;
          out += '\n';
        }
        done_ = true;
      }
      return true;
    }
    HEAPPROF_CATCH_ALL_NOEXCEPT {
      done_ = true;
      return false;
    }
  }

  bool done() const noexcept { return done_; }

 private:
  void AppendRecord(ArenaString& out, const TextRecord& r) {
    Symbolizer& symbolizer = *symbolizer_;
    ArenaString& name = name_;
    const auto size = static_cast<std::int64_t>(r.bucket->size);
    AppendFormat(out, "%lld: %lld [%lld: %lld] @", static_cast<long long>(r.inuse_objects),
                 static_cast<long long>(r.inuse_objects * size), static_cast<long long>(r.alloc_objects),
                 static_cast<long long>(r.alloc_objects * size));
    const StackRecord* stack = r.bucket->stack;
    for (std::uint32_t i = 0; i < stack->depth; ++i) {
      AppendFormat(out, " %#llx", static_cast<unsigned long long>(stack->pcs()[i]));
    }
    out += '\n';
    constexpr int kTextInlineFrames = 32;
    SymbolizedFrame frames[kTextInlineFrames];
    for (std::uint32_t i = 0; i < stack->depth; ++i) {
      // As Go writes it: one line per frame, inlined frames expanded
      // (innermost first, all at the same PC), "function+offset file:line".
      const std::uintptr_t pc = stack->pcs()[i];
      std::uintptr_t start = 0;
      const bool have_symbol = symbolizer.Lookup(pc - 1, name, start);
      SymbolizedQuality quality;
      const int n = symbolizer.Symbolize(pc - 1, frames, kTextInlineFrames, &quality);
      if (n == 0) {
        AppendFormat(out, "#\t%#llx\n", static_cast<unsigned long long>(pc));
        continue;
      }
      for (int k = 0; k < n; ++k) {
        AppendFormat(out, "#\t%#llx\t", static_cast<unsigned long long>(pc));
        out += frames[k].full_name.empty() ? frames[k].name : frames[k].full_name;
        if (k == n - 1 && have_symbol) AppendFormat(out, "+%#llx", static_cast<unsigned long long>(pc - start));
        if (!frames[k].file.empty() && frames[k].line != 0) {
          out += '\t';
          out += frames[k].file;
          AppendFormat(out, ":%u", frames[k].line);
        }
        out += '\n';
      }
    }
    if (r.bucket->labels != nullptr && r.bucket->labels->count != 0) {
      out += "# labels:";
      for (std::uint32_t i = 0; i < r.bucket->labels->count; ++i) {
        out += ' ';
        AppendEscaped(out, r.bucket->labels->entries()[i].key);
        out += '=';
        AppendEscaped(out, r.bucket->labels->entries()[i].value);
      }
      out += '\n';
    }
    out += '\n';
  }

  ArenaVector<TextRecord> records_;
  std::size_t next_ = 0;
  ArenaVector<LoadedObject> objects_;
  ArenaPtr<Symbolizer> symbolizer_;
  void (*extra_comments_)(ArenaString&) = nullptr;
  ArenaString more_comments_;
  ArenaString name_;
  bool done_ = false;
};

inline bool BuildTextHeapProfile(ArenaString& out, void (*extra_comments)(ArenaString&) = nullptr,
                                 const ArenaVector<BucketCounts>* counts = nullptr,
                                 std::string_view more_comments = {}) noexcept {
  out.clear();
  TextProfileStream stream;
  if (!stream.Begin(out, extra_comments, counts, more_comments)) {
    out.clear();
    return false;
  }
  while (!stream.done()) {
    if (!stream.Next(out, static_cast<std::size_t>(-1))) {
      out.clear();
      return false;
    }
  }
  return true;
}

}  // namespace detail
}  // namespace heapprof
