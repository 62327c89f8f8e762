// Test-only decoder for uncompressed profile.proto messages
// (github.com/google/pprof/proto/profile.proto). Written independently of the
// library's encoder so a shared misunderstanding cannot pass unnoticed: it
// reads packed and unpacked repeated fields, skips unknown fields, and answers
// false on any malformed input instead of reading out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace heapprof_test {

// String fields keep their raw string-table index beside the resolved text:
// Validate checks the indices, the tests read the text. An index out of range
// resolves to "".
struct ValueType {
  std::int64_t type_index = 0, unit_index = 0;
  std::string type, unit;
};

struct Label {
  std::int64_t key_index = 0, str_index = 0, num = 0, num_unit_index = 0;
  std::string key, str, num_unit;
};

struct Sample {
  std::vector<std::uint64_t> location_ids;  // leaf first
  std::vector<std::int64_t> values;
  std::vector<Label> labels;
};

struct Mapping {
  std::uint64_t id = 0, memory_start = 0, memory_limit = 0, file_offset = 0;
  std::int64_t filename_index = 0, build_id_index = 0;
  std::string filename, build_id;
  bool has_functions = false, has_filenames = false, has_line_numbers = false,
       has_inline_frames = false;
};

struct Line {
  std::uint64_t function_id = 0;
  std::int64_t line = 0;
};

struct Location {
  std::uint64_t id = 0, mapping_id = 0, address = 0;
  std::vector<Line> lines;  // [0] is the innermost inlined function
  bool is_folded = false;
};

struct Function {
  std::uint64_t id = 0;
  std::int64_t name_index = 0, system_name_index = 0, filename_index = 0, start_line = 0;
  std::string name, system_name, filename;
};

struct Profile {
  std::vector<ValueType> sample_types;
  std::vector<Sample> samples;
  std::vector<Mapping> mappings;
  std::vector<Location> locations;
  std::vector<Function> functions;
  std::vector<std::string> string_table;
  std::int64_t drop_frames_index = 0, keep_frames_index = 0;
  std::int64_t time_nanos = 0, duration_nanos = 0;
  bool has_time_nanos = false, has_duration_nanos = false;  // present on the wire
  ValueType period_type;
  bool has_period_type = false;
  std::int64_t period = 0;
  std::vector<std::int64_t> comment_indices;
  std::int64_t default_sample_type_index = 0;
  std::string default_sample_type;  // "" when unset
};

#ifdef HEAPPROF_TEST_SUPPORT_IMPLEMENTATION  // compiled once: tests/support/support_impl.cpp
namespace decoder_detail {

class Reader {
 public:
  explicit Reader(std::string_view bytes)
      : p_(reinterpret_cast<const std::uint8_t*>(bytes.data())), end_(p_ + bytes.size()) {}

  bool done() const { return p_ == end_; }

  bool Varint(std::uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return false;
      const std::uint8_t b = *p_++;
      v |= std::uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return shift < 63 || b <= 1;  // the 10th byte holds one bit
    }
    return false;  // more than ten bytes
  }

  bool Tag(std::uint32_t& field, std::uint32_t& wire_type) {
    std::uint64_t tag = 0;
    if (!Varint(tag)) return false;
    field = static_cast<std::uint32_t>(tag >> 3);
    wire_type = static_cast<std::uint32_t>(tag & 7);
    return field != 0 && (tag >> 3) <= 0x1fffffff;
  }

  bool Bytes(std::string_view& out) {
    std::uint64_t len = 0;
    if (!Varint(len)) return false;
    if (len > static_cast<std::uint64_t>(end_ - p_)) return false;
    out = std::string_view(reinterpret_cast<const char*>(p_), static_cast<std::size_t>(len));
    p_ += len;
    return true;
  }

  bool Skip(std::uint32_t wire_type) {
    std::uint64_t v = 0;
    std::string_view s;
    switch (wire_type) {
      case 0: return Varint(v);
      case 1: return Advance(8);
      case 2: return Bytes(s);
      case 5: return Advance(4);
      default: return false;  // groups (3, 4) are not used by profile.proto
    }
  }

 private:
  bool Advance(std::size_t n) {
    if (n > static_cast<std::size_t>(end_ - p_)) return false;
    p_ += n;
    return true;
  }

  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

// A scalar field must arrive as a varint.
inline bool Scalar(Reader& r, std::uint32_t wire_type, std::uint64_t& v) {
  return wire_type == 0 && r.Varint(v);
}
template <typename T>
bool ScalarAs(Reader& r, std::uint32_t wire_type, T& out) {
  std::uint64_t v = 0;
  if (!Scalar(r, wire_type, v)) return false;
  out = static_cast<T>(v);
  return true;
}

// Repeated varints: a parser must accept both the packed and the unpacked form.
template <typename T>
bool Repeated(Reader& r, std::uint32_t wire_type, std::vector<T>& out) {
  std::uint64_t v = 0;
  if (wire_type == 0) {
    if (!r.Varint(v)) return false;
    out.push_back(static_cast<T>(v));
    return true;
  }
  std::string_view packed;
  if (wire_type != 2 || !r.Bytes(packed)) return false;
  Reader inner(packed);
  while (!inner.done()) {
    if (!inner.Varint(v)) return false;
    out.push_back(static_cast<T>(v));
  }
  return true;
}

inline bool Submessage(Reader& r, std::uint32_t wire_type, std::string_view& body) {
  return wire_type == 2 && r.Bytes(body);
}

// Runs `on_field(field, wire_type, reader)` for each field of `bytes`;
// on_field returns false to reject, or skips fields it does not know.
template <typename OnField>
bool ForEachField(std::string_view bytes, OnField&& on_field) {
  Reader r(bytes);
  while (!r.done()) {
    std::uint32_t field = 0, wire_type = 0;
    if (!r.Tag(field, wire_type)) return false;
    if (!on_field(field, wire_type, r)) return false;
  }
  return true;
}

inline bool ParseValueType(std::string_view bytes, ValueType& vt) {
  return ForEachField(bytes, [&](std::uint32_t f, std::uint32_t wt, Reader& r) {
    switch (f) {
      case 1: return ScalarAs(r, wt, vt.type_index);
      case 2: return ScalarAs(r, wt, vt.unit_index);
      default: return r.Skip(wt);
    }
  });
}

inline bool ParseLabel(std::string_view bytes, Label& l) {
  return ForEachField(bytes, [&](std::uint32_t f, std::uint32_t wt, Reader& r) {
    switch (f) {
      case 1: return ScalarAs(r, wt, l.key_index);
      case 2: return ScalarAs(r, wt, l.str_index);
      case 3: return ScalarAs(r, wt, l.num);
      case 4: return ScalarAs(r, wt, l.num_unit_index);
      default: return r.Skip(wt);
    }
  });
}

inline bool ParseSample(std::string_view bytes, Sample& s) {
  return ForEachField(bytes, [&](std::uint32_t f, std::uint32_t wt, Reader& r) {
    std::string_view body;
    switch (f) {
      case 1: return Repeated(r, wt, s.location_ids);
      case 2: return Repeated(r, wt, s.values);
      case 3:
        s.labels.emplace_back();
        return Submessage(r, wt, body) && ParseLabel(body, s.labels.back());
      default: return r.Skip(wt);
    }
  });
}

inline bool ParseMapping(std::string_view bytes, Mapping& m) {
  return ForEachField(bytes, [&](std::uint32_t f, std::uint32_t wt, Reader& r) {
    switch (f) {
      case 1: return ScalarAs(r, wt, m.id);
      case 2: return ScalarAs(r, wt, m.memory_start);
      case 3: return ScalarAs(r, wt, m.memory_limit);
      case 4: return ScalarAs(r, wt, m.file_offset);
      case 5: return ScalarAs(r, wt, m.filename_index);
      case 6: return ScalarAs(r, wt, m.build_id_index);
      case 7: return ScalarAs(r, wt, m.has_functions);
      case 8: return ScalarAs(r, wt, m.has_filenames);
      case 9: return ScalarAs(r, wt, m.has_line_numbers);
      case 10: return ScalarAs(r, wt, m.has_inline_frames);
      default: return r.Skip(wt);
    }
  });
}

inline bool ParseLine(std::string_view bytes, Line& l) {
  return ForEachField(bytes, [&](std::uint32_t f, std::uint32_t wt, Reader& r) {
    switch (f) {
      case 1: return ScalarAs(r, wt, l.function_id);
      case 2: return ScalarAs(r, wt, l.line);
      default: return r.Skip(wt);
    }
  });
}

inline bool ParseLocation(std::string_view bytes, Location& loc) {
  return ForEachField(bytes, [&](std::uint32_t f, std::uint32_t wt, Reader& r) {
    std::string_view body;
    switch (f) {
      case 1: return ScalarAs(r, wt, loc.id);
      case 2: return ScalarAs(r, wt, loc.mapping_id);
      case 3: return ScalarAs(r, wt, loc.address);
      case 4:
        loc.lines.emplace_back();
        return Submessage(r, wt, body) && ParseLine(body, loc.lines.back());
      case 5: return ScalarAs(r, wt, loc.is_folded);
      default: return r.Skip(wt);
    }
  });
}

inline bool ParseFunction(std::string_view bytes, Function& fn) {
  return ForEachField(bytes, [&](std::uint32_t f, std::uint32_t wt, Reader& r) {
    switch (f) {
      case 1: return ScalarAs(r, wt, fn.id);
      case 2: return ScalarAs(r, wt, fn.name_index);
      case 3: return ScalarAs(r, wt, fn.system_name_index);
      case 4: return ScalarAs(r, wt, fn.filename_index);
      case 5: return ScalarAs(r, wt, fn.start_line);
      default: return r.Skip(wt);
    }
  });
}

inline std::string Resolve(const std::vector<std::string>& table, std::int64_t index) {
  if (index < 0 || static_cast<std::uint64_t>(index) >= table.size()) return std::string();
  return table[static_cast<std::size_t>(index)];
}

inline bool Fail(std::string* why, const std::string& message) {
  if (why != nullptr) *why = message;
  return false;
}

}  // namespace decoder_detail
#endif  // HEAPPROF_TEST_SUPPORT_IMPLEMENTATION

// Parses `bytes` into `out` (overwritten). False on malformed wire data; the
// profile's own consistency is Validate's job.
bool DecodeProfile(std::string_view bytes, Profile& out, std::string* why = nullptr);

// Ids are usually 1..N in order (ours are): try that slot first, then search.
template <class T>
const T* FindById(const std::vector<T>& items, std::uint64_t id) {
  if (id >= 1 && id <= items.size() && items[id - 1].id == id) return &items[id - 1];
  for (const T& item : items)
    if (item.id == id) return &item;
  return nullptr;
}
inline const Location* FindLocation(const Profile& p, std::uint64_t id) { return FindById(p.locations, id); }
inline const Function* FindFunction(const Profile& p, std::uint64_t id) { return FindById(p.functions, id); }
inline const Mapping* FindMapping(const Profile& p, std::uint64_t id) { return FindById(p.mappings, id); }

// Function names of a sample's stack, leaf first; inlined frames of one
// location expand innermost first. A location without lines shows as its
// address in hex, a missing id as "?".
std::vector<std::string> FunctionNames(const Profile& p, const Sample& s);

// pprof's structural invariants (what its CheckValid and every viewer rely on).
bool Validate(const Profile& p, std::string* why = nullptr);

#ifdef HEAPPROF_TEST_SUPPORT_IMPLEMENTATION  // compiled once: tests/support/support_impl.cpp

bool DecodeProfile(std::string_view bytes, Profile& out, std::string* why) {
  using namespace decoder_detail;
  out = Profile();
  std::uint32_t bad_field = 0;
  const bool ok = ForEachField(bytes, [&](std::uint32_t f, std::uint32_t wt, Reader& r) {
    bad_field = f;
    std::string_view body;
    switch (f) {
      case 1:
        out.sample_types.emplace_back();
        return Submessage(r, wt, body) && ParseValueType(body, out.sample_types.back());
      case 2:
        out.samples.emplace_back();
        return Submessage(r, wt, body) && ParseSample(body, out.samples.back());
      case 3:
        out.mappings.emplace_back();
        return Submessage(r, wt, body) && ParseMapping(body, out.mappings.back());
      case 4:
        out.locations.emplace_back();
        return Submessage(r, wt, body) && ParseLocation(body, out.locations.back());
      case 5:
        out.functions.emplace_back();
        return Submessage(r, wt, body) && ParseFunction(body, out.functions.back());
      case 6:
        if (!Submessage(r, wt, body)) return false;
        out.string_table.emplace_back(body);
        return true;
      case 7: return ScalarAs(r, wt, out.drop_frames_index);
      case 8: return ScalarAs(r, wt, out.keep_frames_index);
      case 9: return out.has_time_nanos = ScalarAs(r, wt, out.time_nanos);
      case 10: return out.has_duration_nanos = ScalarAs(r, wt, out.duration_nanos);
      case 11:
        return out.has_period_type =
                   Submessage(r, wt, body) && ParseValueType(body, out.period_type);
      case 12: return ScalarAs(r, wt, out.period);
      case 13: return Repeated(r, wt, out.comment_indices);
      case 14: return ScalarAs(r, wt, out.default_sample_type_index);
      default: return r.Skip(wt);
    }
  });
  if (!ok) return Fail(why, "malformed wire data in or after field " + std::to_string(bad_field));

  const std::vector<std::string>& t = out.string_table;
  auto resolve_vt = [&](ValueType& vt) {
    vt.type = Resolve(t, vt.type_index);
    vt.unit = Resolve(t, vt.unit_index);
  };
  for (ValueType& vt : out.sample_types) resolve_vt(vt);
  resolve_vt(out.period_type);
  for (Sample& s : out.samples) {
    for (Label& l : s.labels) {
      l.key = Resolve(t, l.key_index);
      l.str = Resolve(t, l.str_index);
      l.num_unit = Resolve(t, l.num_unit_index);
    }
  }
  for (Mapping& m : out.mappings) {
    m.filename = Resolve(t, m.filename_index);
    m.build_id = Resolve(t, m.build_id_index);
  }
  for (Function& fn : out.functions) {
    fn.name = Resolve(t, fn.name_index);
    fn.system_name = Resolve(t, fn.system_name_index);
    fn.filename = Resolve(t, fn.filename_index);
  }
  out.default_sample_type = Resolve(t, out.default_sample_type_index);
  return true;
}

std::vector<std::string> FunctionNames(const Profile& p, const Sample& s) {
  std::vector<std::string> names;
  for (const std::uint64_t id : s.location_ids) {
    const Location* loc = FindLocation(p, id);
    if (loc == nullptr) {
      names.emplace_back("?");
      continue;
    }
    if (loc->lines.empty()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(loc->address));
      names.emplace_back(buf);
    }
    for (const Line& line : loc->lines) {
      const Function* fn = FindFunction(p, line.function_id);
      names.push_back(fn != nullptr ? fn->name : "?");
    }
  }
  return names;
}

bool Validate(const Profile& p, std::string* why) {
  using decoder_detail::Fail;
  const std::size_t strings = p.string_table.size();
  if (strings == 0 || !p.string_table[0].empty())
    return Fail(why, "string_table[0] must exist and be empty");
  auto in_range = [&](std::int64_t index) {
    return index >= 0 && static_cast<std::uint64_t>(index) < strings;
  };
  auto check_string = [&](std::int64_t index, const char* what) {
    return in_range(index) ||
           Fail(why, std::string(what) + " string index " + std::to_string(index) +
                         " out of range (" + std::to_string(strings) + " strings)");
  };

  for (const ValueType& vt : p.sample_types)
    if (!check_string(vt.type_index, "sample_type.type") ||
        !check_string(vt.unit_index, "sample_type.unit"))
      return false;
  if (!check_string(p.period_type.type_index, "period_type.type") ||
      !check_string(p.period_type.unit_index, "period_type.unit") ||
      !check_string(p.drop_frames_index, "drop_frames") ||
      !check_string(p.keep_frames_index, "keep_frames") ||
      !check_string(p.default_sample_type_index, "default_sample_type"))
    return false;
  for (const std::int64_t c : p.comment_indices)
    if (!check_string(c, "comment")) return false;
  if (p.default_sample_type_index != 0) {
    bool found = false;
    for (const ValueType& vt : p.sample_types) found = found || vt.type == p.default_sample_type;
    if (!found) return Fail(why, "default_sample_type names no sample type");
  }

  std::unordered_map<std::uint64_t, const Mapping*> mappings;
  for (const Mapping& m : p.mappings) {
    if (m.id == 0) return Fail(why, "mapping with id 0");
    if (!mappings.emplace(m.id, &m).second)
      return Fail(why, "duplicate mapping id " + std::to_string(m.id));
    if (!check_string(m.filename_index, "mapping.filename") ||
        !check_string(m.build_id_index, "mapping.build_id"))
      return false;
    if (m.memory_limit < m.memory_start)
      return Fail(why, "mapping " + std::to_string(m.id) + " ends before it starts");
  }

  std::unordered_set<std::uint64_t> functions;
  for (const Function& f : p.functions) {
    if (f.id == 0) return Fail(why, "function with id 0");
    if (!functions.insert(f.id).second)
      return Fail(why, "duplicate function id " + std::to_string(f.id));
    if (!check_string(f.name_index, "function.name") ||
        !check_string(f.system_name_index, "function.system_name") ||
        !check_string(f.filename_index, "function.filename"))
      return false;
  }

  std::unordered_set<std::uint64_t> locations;
  for (const Location& l : p.locations) {
    if (l.id == 0) return Fail(why, "location with id 0");
    if (!locations.insert(l.id).second)
      return Fail(why, "duplicate location id " + std::to_string(l.id));
    if (l.mapping_id != 0 && mappings.count(l.mapping_id) == 0)
      return Fail(why, "location " + std::to_string(l.id) + " references missing mapping " +
                           std::to_string(l.mapping_id));
    for (const Line& line : l.lines)
      if (line.function_id == 0 || functions.count(line.function_id) == 0)
        return Fail(why, "location " + std::to_string(l.id) + " references missing function " +
                             std::to_string(line.function_id));
  }

  for (std::size_t i = 0; i < p.samples.size(); ++i) {
    const Sample& s = p.samples[i];
    const std::string which = "sample " + std::to_string(i);
    if (s.values.size() != p.sample_types.size())
      return Fail(why, which + " has " + std::to_string(s.values.size()) + " values for " +
                           std::to_string(p.sample_types.size()) + " sample types");
    for (const std::uint64_t id : s.location_ids)
      if (id == 0 || locations.count(id) == 0)
        return Fail(why, which + " references missing location " + std::to_string(id));
    for (const Label& l : s.labels)
      if (!check_string(l.key_index, "label.key") || !check_string(l.str_index, "label.str") ||
          !check_string(l.num_unit_index, "label.num_unit"))
        return false;
  }
  return true;
}

#endif  // HEAPPROF_TEST_SUPPORT_IMPLEMENTATION

}  // namespace heapprof_test
