// heapprof: builds a profile.proto message (github.com/google/pprof/proto/profile.proto)
// from a snapshot of heap samples. The shape follows Go's runtime/pprof heap
// profiles, so tools tuned for those (pprof's -sample_index, flame graphs)
// behave the same on ours.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena_allocator.hpp"
#include "heapprof/detail/4_symbolization/symbolizer.hpp"
#include "heapprof/detail/5_encoding/protobuf.hpp"

namespace heapprof {
namespace detail {

struct ProfileSample {
  ArenaVector<std::uintptr_t> pcs;  // return addresses, [0] = leaf (the caller of operator new)
  bool truncated = false;           // the stack was cut at HEAPPROF_MAX_FRAMES
  bool overflow = false;            // the stack table was full: no pcs, one marker frame
  std::int64_t alloc_objects = 0;   // already scaled to estimates
  std::int64_t alloc_bytes = 0;
  std::int64_t inuse_objects = 0;
  std::int64_t inuse_bytes = 0;
  std::int64_t object_size = 0;     // numeric label "bytes", unit "bytes"
  // Synthetic frames after the pcs, root-most last, each a location of its
  // own with no mapping (the retention profile's "[global] g_cache").
  ArenaVector<ArenaString> markers;
  ArenaVector<std::pair<ArenaString, ArenaString>> labels;  // string labels
};

struct ProfileData {
  ArenaVector<ProfileSample> samples;
  std::int64_t period = 0;          // sample rate in bytes (period_type space/bytes)
  std::int64_t time_nanos = 0;
  std::int64_t duration_nanos = 0;  // 0 = field omitted
  bool allocs_default = false;      // true: default_sample_type = "alloc_space"
  ArenaVector<ArenaString> comments;  // `go tool pprof -comments` prints them
};

// Serialises `data` as one uncompressed profile.proto message.
ArenaString EncodeProfile(const ProfileData& data, const ArenaVector<LoadedObject>& objects,
                          Symbolizer& symbolizer);

// profile.proto field numbers, checked one by one against the .proto: a wrong
// number gives a profile that every reader parses "successfully" into nonsense.
namespace pprof_field {
namespace profile {
constexpr std::uint32_t kSampleType = 1, kSample = 2, kMapping = 3, kLocation = 4, kFunction = 5,
                        kStringTable = 6, kTimeNanos = 9, kDurationNanos = 10, kPeriodType = 11,
                        kPeriod = 12, kComment = 13, kDefaultSampleType = 14;
}
namespace value_type {
constexpr std::uint32_t kType = 1, kUnit = 2;
}
namespace sample {
constexpr std::uint32_t kLocationId = 1, kValue = 2, kLabel = 3;
}
namespace label {
constexpr std::uint32_t kKey = 1, kStr = 2, kNum = 3, kNumUnit = 4;
}
namespace mapping {
constexpr std::uint32_t kId = 1, kMemoryStart = 2, kMemoryLimit = 3, kFileOffset = 4,
                        kFilename = 5, kBuildId = 6, kHasFunctions = 7, kHasFilenames = 8,
                        kHasLineNumbers = 9, kHasInlineFrames = 10;
}
namespace location {
constexpr std::uint32_t kId = 1, kMappingId = 2, kAddress = 3, kLine = 4;
}
namespace line {
constexpr std::uint32_t kFunctionId = 1, kLine = 2;
}
namespace function {
constexpr std::uint32_t kId = 1, kName = 2, kSystemName = 3, kFilename = 4, kStartLine = 5;
}
}  // namespace pprof_field

// The length of the well-formed UTF-8 character at the start of `s` (1-4), or
// 0 if `s` does not start with one (a stray continuation byte, an overlong
// form, a surrogate, past U+10FFFF, a cut sequence), per RFC 3629's table.
inline std::size_t Utf8CharLength(std::string_view s) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// `s` with every byte that starts no well-formed UTF-8 character replaced by
// U+FFFD, or empty with *valid set when `s` is valid already (the usual case:
// no copy).
inline ArenaString RepairedUtf8(std::string_view s, bool* valid) {
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t n = Utf8CharLength(s.substr(i));
    if (n == 0) break;
    i += n;
  }
  *valid = i == s.size();
  ArenaString out;
  if (*valid) return out;
  out.assign(s.data(), i);
  while (i < s.size()) {
    const std::size_t n = Utf8CharLength(s.substr(i));
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

// Strings are stored once in a deque (stable addresses as it grows) and
// indexed by views into it, so lookups of an already-known string never copy.
// profile.proto's strings are proto3 `string`s, which must be UTF-8: strict
// decoders (protobuf's own, in C++, Java or Go) refuse a whole profile over
// one bad byte. A label value or a file name can hold any bytes, so a string
// that is not UTF-8 is stored with U+FFFD for each bad byte (and found again
// under its original bytes through a second index entry).
class PprofStringTable {
 public:
  PprofStringTable() { Intern(std::string_view()); }  // pprof requires string_table[0] == ""

  std::int64_t Intern(std::string_view s) {
    const auto it = index_.find(s);
    if (it != index_.end()) return it->second;
    bool valid = true;
    ArenaString repaired = RepairedUtf8(s, &valid);
    if (!valid) {
      // Keyed by the original bytes too (their copy kept), so the next
      // lookup of them is one probe; the repaired text may be known already.
      originals_.emplace_back(s);
      const std::string_view original(originals_.back());
      const auto known = index_.find(std::string_view(repaired));
      const std::int64_t id = known != index_.end() ? known->second : Add(std::move(repaired));
      index_.emplace(original, id);
      return id;
    }
    return Add(ArenaString(s));
  }

  void Encode(ProtoWriter& w) const {
    for (const ArenaString& s : storage_) w.String(pprof_field::profile::kStringTable, s);
  }

 private:
  std::int64_t Add(ArenaString s) {
    const auto id = static_cast<std::int64_t>(storage_.size());
    storage_.push_back(std::move(s));
    index_.emplace(std::string_view(storage_.back()), id);
    return id;
  }

  ArenaDeque<ArenaString> storage_;
  ArenaDeque<ArenaString> originals_;  // the bytes of strings stored repaired
  ArenaUnorderedMap<std::string_view, std::int64_t> index_;
};

// PC -> location id, probed once per recorded frame: the builder's hot loop.
// Open addressing with linear probing keeps a probe in one cache line, where
// std::unordered_map pays a modulo and a node dereference: 10,000 stacks of 30
// frames encode in 3.5 ms with this table, 5.6 ms with unordered_map. Id 0
// marks an empty slot, which is free because location ids start at 1.
class PcLocationMap {
 public:
  PcLocationMap() { Rehash(64); }

  // 0 when `pc` has no location yet.
  __attribute__((__always_inline__)) std::uint64_t Find(std::uintptr_t pc) const {
    for (std::size_t i = Home(pc);; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.id == 0) return 0;
      if (slot.pc == pc) return slot.id;
    }
  }

  // `pc` must not be present yet.
  void Insert(std::uintptr_t pc, std::uint64_t id) {
    if ((size_ + 1) * 2 > slots_.size()) Rehash(slots_.size() * 2);
    Place(pc, id);
    ++size_;
  }

 private:
  struct Slot {
    std::uintptr_t pc;
    std::uint64_t id;
  };

  // Fibonacci hashing: the top bits of pc * 2^64/phi, so aligned and nearby
  // PCs spread over the whole table.
  std::size_t Home(std::uintptr_t pc) const {
    return static_cast<std::size_t>((std::uint64_t{pc} * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void Place(std::uintptr_t pc, std::uint64_t id) {
    std::size_t i = Home(pc);
    while (slots_[i].id != 0) i = (i + 1) & mask_;
    slots_[i] = Slot{pc, id};
  }

  void Rehash(std::size_t capacity) {  // capacity: a power of two
    ArenaVector<Slot> old(capacity, Slot{0, 0});
    old.swap(slots_);
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(capacity));
    for (const Slot& slot : old)
      if (slot.id != 0) Place(slot.pc, slot.id);
  }

  ArenaVector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
  unsigned shift_ = 64;
};

// "bytes", "label_bytes", "label_label_bytes", ...: the user keys that the
// numeric "bytes" label makes the profile rename (one "label_" more each).
inline bool IsBytesKey(std::string_view key) noexcept {
  while (key.substr(0, 6) == "label_") key.remove_prefix(6);
  return key == "bytes";
}

class PprofProfileBuilder {
 public:
  PprofProfileBuilder(const ArenaVector<LoadedObject>& objects, Symbolizer& symbolizer)
      : objects_(objects), symbolizer_(symbolizer) {
    objects_by_start_.reserve(objects.size());
    quality_.resize(objects.size());
    for (std::size_t i = 0; i < objects.size(); ++i) objects_by_start_.push_back(i);
    std::sort(objects_by_start_.begin(), objects_by_start_.end(),
              [&](std::size_t a, std::size_t b) { return objects[a].start < objects[b].start; });
  }

  ArenaString Encode(const ProfileData& data) {
    std::size_t total_frames = 0;
    for (const ProfileSample& s : data.samples) total_frames += s.pcs.size();
    ArenaString out;
    // Location ids take one or two bytes each; values and labels ~40 more.
    out.reserve(total_frames * 2 + data.samples.size() * 48 + 4096);
    ProtoWriter w(out);

    // Interned first so these indices are small and fixed.
    const std::int64_t alloc_objects = strings_.Intern("alloc_objects");
    const std::int64_t count = strings_.Intern("count");
    const std::int64_t alloc_space = strings_.Intern("alloc_space");
    const std::int64_t bytes = strings_.Intern("bytes");
    const std::int64_t inuse_objects = strings_.Intern("inuse_objects");
    const std::int64_t inuse_space = strings_.Intern("inuse_space");
    const std::int64_t space = strings_.Intern("space");
    ArenaVector<std::int64_t> comments;
    for (const ArenaString& c : data.comments) comments.push_back(strings_.Intern(c));

    // Go's order; pprof's default view is the last type, inuse_space.
    WriteValueType(w, pprof_field::profile::kSampleType, alloc_objects, count);
    WriteValueType(w, pprof_field::profile::kSampleType, alloc_space, bytes);
    WriteValueType(w, pprof_field::profile::kSampleType, inuse_objects, count);
    WriteValueType(w, pprof_field::profile::kSampleType, inuse_space, bytes);

    // The hot loop: a profile has many more frames than distinct PCs, so
    // most frames are one probe of location_by_pc_, inlined here, written
    // into a buffer sized once per sample (push_back was a call per frame).
    ArenaVector<std::uint64_t> location_ids(HEAPPROF_MAX_FRAMES + 2);
    for (const ProfileSample& s : data.samples) {
      const std::size_t frames = s.pcs.size() + (s.truncated ? 1 : 0) + (s.overflow ? 1 : 0) + s.markers.size();
      if (frames > location_ids.size()) location_ids.resize(frames);
      std::uint64_t* const ids = location_ids.data();
      std::size_t k = 0;
      for (const std::uintptr_t pc : s.pcs) {
        const std::uint64_t known = location_by_pc_.Find(pc);
        ids[k++] = known != 0 ? known : LocationForPc(pc);
      }
      if (s.truncated) ids[k++] = TruncationLocation(s.pcs.size());
      if (s.overflow) ids[k++] = OverflowLocation();
      for (const ArenaString& m : s.markers) ids[k++] = NamedMarkerLocation(m);
      const std::int64_t values[4] = {s.alloc_objects, s.alloc_bytes, s.inuse_objects,
                                      s.inuse_bytes};
      const std::size_t sample = w.BeginMessage(pprof_field::profile::kSample);
      if (k <= ProtoWriter::kShortPacked) {
        // The usual sample: ids, values and the numeric label assembled on
        // the stack and appended once (the same bytes as the path below).
        constexpr std::size_t kVarint = kMaxVarintBytes;
        char buf[(ProtoWriter::kShortPacked + 2) * kVarint + (4 + 2) * kVarint + 2 * kVarint + 3 * 2 * kVarint];
        char* p = PutPackedVarints(buf, pprof_field::sample::kLocationId, ids, k);
        p = PutPackedVarints(p, pprof_field::sample::kValue, values, 4);
        p = WriteVarint(p, Tag(pprof_field::sample::kLabel, WireType::kLengthDelimited));
        char* const length = p++;  // the label is at most 3 * 2 * kVarint = 60 bytes: one length byte
        p = PutVarintField(p, pprof_field::label::kKey, static_cast<std::uint64_t>(bytes));
        p = PutVarintField(p, pprof_field::label::kNum, static_cast<std::uint64_t>(s.object_size));
        p = PutVarintField(p, pprof_field::label::kNumUnit, static_cast<std::uint64_t>(bytes));
        *length = static_cast<char>(p - length - 1);
        w.Raw(buf, static_cast<std::size_t>(p - buf));
      } else {
        w.PackedVarints(pprof_field::sample::kLocationId, ids, k);
        w.PackedVarints(pprof_field::sample::kValue, values, 4);
        w.Message(pprof_field::sample::kLabel, [&] {
          w.Int64(pprof_field::label::kKey, bytes);
          // num is written even when zero, so readers that test for its
          // presence still see a numeric label.
          w.Int64(pprof_field::label::kNum, s.object_size);
          w.Int64(pprof_field::label::kNumUnit, bytes);
        });
      }
      for (const auto& label : s.labels) {
        // A user key equal to our numeric label's would be merged with it by
        // pprof (-tags, -tagfocus): written as "label_bytes" instead, and so
        // one more "label_" before any key of the form label_..._bytes, so
        // that a user's own "label_bytes" stays apart from the renamed one.
        const std::int64_t key =
            IsBytesKey(label.first) ? strings_.Intern(ArenaString("label_") + label.first) : strings_.Intern(label.first);
        const std::int64_t str = strings_.Intern(label.second);
        w.Message(pprof_field::sample::kLabel, [&] {
          w.OptInt64(pprof_field::label::kKey, key);
          w.OptInt64(pprof_field::label::kStr, str);
        });
      }
      w.EndMessage(sample);
    }

    for (std::size_t i = 0; i < objects_.size(); ++i) {
      const LoadedObject& o = objects_[i];
      // Each flag says what every location of the mapping got: pprof trusts a
      // set flag and then never symbolizes those locations itself (given the
      // binary, it fills in what a clear flag says is missing). A mapping
      // without locations says whether its object has symbols, and claims no
      // lines (its DWARF is not read for nothing).
      const MappingQuality& q = quality_[i];
      const bool any = q.locations != 0;
      const bool has_functions = any ? q.functions == q.locations : symbolizer_.HasSymbols(i);
      const bool has_lines = any && q.lines == q.locations;
      const bool has_inline = any && q.inline_known == q.locations;
      const std::int64_t filename = strings_.Intern(o.path);
      const std::int64_t build_id = strings_.Intern(o.build_id);
      w.Message(pprof_field::profile::kMapping, [&] {
        w.Uint64(pprof_field::mapping::kId, i + 1);
        w.OptUint64(pprof_field::mapping::kMemoryStart, o.start);
        w.OptUint64(pprof_field::mapping::kMemoryLimit, o.limit);
        w.OptUint64(pprof_field::mapping::kFileOffset, o.file_offset);
        w.OptInt64(pprof_field::mapping::kFilename, filename);
        w.OptInt64(pprof_field::mapping::kBuildId, build_id);
        w.OptBool(pprof_field::mapping::kHasFunctions, has_functions);
        w.OptBool(pprof_field::mapping::kHasFilenames, has_lines);
        w.OptBool(pprof_field::mapping::kHasLineNumbers, has_lines);
        w.OptBool(pprof_field::mapping::kHasInlineFrames, has_inline);
      });
    }

    for (std::size_t i = 0; i < locations_.size(); ++i) {
      const LocationRecord& loc = locations_[i];
      w.Message(pprof_field::profile::kLocation, [&] {
        w.Uint64(pprof_field::location::kId, i + 1);
        w.OptUint64(pprof_field::location::kMappingId, loc.mapping_id);
        w.OptUint64(pprof_field::location::kAddress, loc.address);
        // Innermost first, as pprof expects an inline chain. Line number 0
        // is omitted: we do not know it.
        for (std::uint32_t k = 0; k < loc.line_count; ++k) {
          const LineRecord& line = lines_[loc.first_line + k];
          w.Message(pprof_field::location::kLine, [&] {
            w.Uint64(pprof_field::line::kFunctionId, line.function_id);
            w.OptInt64(pprof_field::line::kLine, line.line);
          });
        }
      });
    }

    for (std::size_t i = 0; i < functions_.size(); ++i) {
      const FunctionKey& f = functions_[i];
      w.Message(pprof_field::profile::kFunction, [&] {
        w.Uint64(pprof_field::function::kId, i + 1);
        // name: the short form pprof would print; system_name: the linkage
        // name. They differ for C++, so pprof keeps our name as it is
        // (it re-demangles only a function whose two names are equal).
        w.OptInt64(pprof_field::function::kName, f.name);
        w.OptInt64(pprof_field::function::kSystemName, f.system_name);
        w.OptInt64(pprof_field::function::kFilename, f.filename);
        w.OptInt64(pprof_field::function::kStartLine, f.start_line);
      });
    }

    // Every string is interned by now, including the ones written below.
    strings_.Encode(w);

    w.OptInt64(pprof_field::profile::kTimeNanos, data.time_nanos);
    w.OptInt64(pprof_field::profile::kDurationNanos, data.duration_nanos);
    WriteValueType(w, pprof_field::profile::kPeriodType, space, bytes);
    w.OptInt64(pprof_field::profile::kPeriod, data.period);
    for (std::int64_t c : comments) w.Int64(pprof_field::profile::kComment, c);
    if (data.allocs_default) w.Int64(pprof_field::profile::kDefaultSampleType, alloc_space);
    return out;
  }

 private:
  struct LocationRecord {
    std::uint64_t mapping_id;
    std::uint64_t address;
    std::uint32_t first_line;  // into lines_
    std::uint32_t line_count;  // 0: unsymbolized, no Line
  };
  struct LineRecord {
    std::uint64_t function_id;
    std::int64_t line;
  };
  struct FunctionKey {
    std::int64_t name, system_name, filename, start_line;
    bool operator==(const FunctionKey& o) const {
      return name == o.name && system_name == o.system_name && filename == o.filename &&
             start_line == o.start_line;
    }
  };
  struct FunctionKeyHash {
    std::size_t operator()(const FunctionKey& k) const {
      std::uint64_t h = static_cast<std::uint64_t>(k.name) * 0x9E3779B97F4A7C15ull;
      h ^= static_cast<std::uint64_t>(k.system_name) + 0x7f4a7c15ull + (h << 6) + (h >> 2);
      h ^= static_cast<std::uint64_t>(k.filename) + 0x7f4a7c15ull + (h << 6) + (h >> 2);
      h ^= static_cast<std::uint64_t>(k.start_line) + 0x7f4a7c15ull + (h << 6) + (h >> 2);
      return h;
    }
  };
  struct MappingQuality {
    std::uint32_t locations = 0, functions = 0, lines = 0, inline_known = 0;
  };

  static void WriteValueType(ProtoWriter& w, std::uint32_t field, std::int64_t type,
                             std::int64_t unit) {
    w.Message(field, [&] {
      w.Int64(pprof_field::value_type::kType, type);
      w.Int64(pprof_field::value_type::kUnit, unit);
    });
  }

  __attribute__((__noinline__)) std::uint64_t LocationForPc(std::uintptr_t pc) {
    const std::uint64_t known = location_by_pc_.Find(pc);
    if (known != 0) return known;
    // Every frame, the leaf included, is a return address: the instruction
    // after a call. One byte back lands inside the call, which is the line
    // that allocated and, for a noreturn call at a function's end, still the
    // right function. The mapping is looked up by that address too, so a
    // call ending a segment still maps to it.
    const std::uintptr_t address = pc != 0 ? pc - 1 : 0;
    const std::uint64_t mapping = MappingFor(address);
    LocationRecord record{mapping, address, static_cast<std::uint32_t>(lines_.size()), 0};
    if (address != 0) {
      SymbolizedFrame frames[kMaxInlineFrames];
      SymbolizedQuality quality;
      const int n = symbolizer_.Symbolize(address, frames, kMaxInlineFrames, &quality);
      for (int i = 0; i < n; ++i) {
        // A Line needs a Function. A frame known by its line but not by name
        // (an inlined function whose DIE is in dwz's shared file) gets "??",
        // as addr2line prints it: dropped, it would take its line with it
        // and give the next frame out the allocation's line.
        if (frames[i].name.empty()) {
          if (frames[i].file.empty() && frames[i].line == 0) continue;
          frames[i].name = "??";
        }
        lines_.push_back(LineRecord{FunctionFor(frames[i]), frames[i].line});
        ++record.line_count;
      }
      if (mapping != 0) {
        MappingQuality& q = quality_[mapping - 1];
        ++q.locations;
        q.functions += quality.function && record.line_count != 0;
        q.lines += quality.line && record.line_count != 0;
        q.inline_known += quality.inline_known;
      }
    }
    const std::uint64_t id = AddLocation(record);
    location_by_pc_.Insert(pc, id);
    return id;
  }

  // A marker frame makes a cut stack visible in every viewer instead of
  // silently misattributing its root-most frame as a root.
  std::uint64_t TruncationLocation(std::size_t frames) {
    const auto found = truncation_location_.find(frames);
    if (found != truncation_location_.end()) return found->second;
    const ArenaString name =
        "[heapprof: stack truncated at " + ArenaDecimal(frames) + " frames]";
    const std::uint64_t id = AddMarkerLocation(name);
    truncation_location_.emplace(frames, id);
    return id;
  }

  // The one frame of samples whose stack did not fit in the stack table
  // (HEAPPROF=max_stacks): their totals are right, their callers unknown.
  std::uint64_t OverflowLocation() {
    if (overflow_location_ == 0) overflow_location_ = AddMarkerLocation("[heapprof: stack table full]");
    return overflow_location_;
  }

  std::uint64_t NamedMarkerLocation(const ArenaString& name) {
    const auto found = marker_location_.find(name);
    if (found != marker_location_.end()) return found->second;
    const std::uint64_t id = AddMarkerLocation(name);
    marker_location_.emplace(name, id);
    return id;
  }

  std::uint64_t AddLocation(const LocationRecord& record) {
    locations_.push_back(record);
    return locations_.size();
  }

  std::uint64_t AddMarkerLocation(std::string_view name) {
    SymbolizedFrame frame;
    frame.name = frame.system_name = name;
    lines_.push_back(LineRecord{FunctionFor(frame), 0});
    return AddLocation({0, 0, static_cast<std::uint32_t>(lines_.size() - 1), 1});
  }

  std::uint64_t FunctionFor(const SymbolizedFrame& frame) {
    FunctionKey key;
    key.name = strings_.Intern(frame.name);
    key.system_name = frame.system_name.empty() ? key.name : strings_.Intern(frame.system_name);
    key.filename = strings_.Intern(!frame.function_file.empty() ? frame.function_file : frame.file);
    key.start_line = frame.start_line;
    const auto found = function_by_key_.find(key);
    if (found != function_by_key_.end()) return found->second;
    functions_.push_back(key);
    const std::uint64_t id = functions_.size();
    function_by_key_.emplace(key, id);
    return id;
  }

  std::uint64_t MappingFor(std::uintptr_t address) const {
    if (address == 0) return 0;
    const auto after = std::upper_bound(
        objects_by_start_.begin(), objects_by_start_.end(), address,
        [&](std::uintptr_t a, std::size_t i) { return a < objects_[i].start; });
    if (after == objects_by_start_.begin()) return 0;
    const std::size_t i = *(after - 1);
    return address < objects_[i].limit ? i + 1 : 0;
  }

  const ArenaVector<LoadedObject>& objects_;
  Symbolizer& symbolizer_;
  ArenaVector<std::size_t> objects_by_start_;
  PprofStringTable strings_;
  // None of these is reserved by frame count: stacks share most of their
  // frames, so distinct PCs are a few percent of all frames, and a table sized
  // for the worst case misses cache on every probe (measured: 2x slower).
  // Doubling as they grow costs less than one oversized clear.
  static constexpr int kMaxInlineFrames = 32;
  ArenaVector<LocationRecord> locations_;      // id = index + 1
  ArenaVector<LineRecord> lines_;              // of all locations, each one's in a row
  ArenaVector<FunctionKey> functions_;         // id = index + 1
  PcLocationMap location_by_pc_;
  ArenaUnorderedMap<std::size_t, std::uint64_t> truncation_location_;
  std::uint64_t overflow_location_ = 0;
  ArenaMap<ArenaString, std::uint64_t> marker_location_;
  ArenaUnorderedMap<FunctionKey, std::uint64_t, FunctionKeyHash> function_by_key_;
  ArenaVector<MappingQuality> quality_;        // per object
};

inline ArenaString EncodeProfile(const ProfileData& data, const ArenaVector<LoadedObject>& objects,
                                 Symbolizer& symbolizer) {
  PprofProfileBuilder builder(objects, symbolizer);
  return builder.Encode(data);
}

}  // namespace detail
}  // namespace heapprof
