// heapprof: .debug_line (DWARF 2-5, section 6.2 of DWARF 5): one unit's line
// program run into a table of rows sorted by address, and its file names made
// into full paths.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "heapprof/detail/4_symbolization/debug_memory.hpp"
#include "heapprof/detail/4_symbolization/dwarf_reader.hpp"

namespace heapprof {
namespace detail {
namespace dwarf {

struct LineRow {
  std::uint64_t address;
  std::uint32_t file;  // index into LineTable::files; kEndOfSequence ends a sequence
  std::uint32_t line;
};
constexpr std::uint32_t kEndOfSequence = 0xffffffffu;

class LineTable {
 public:
  // Runs the program at `offset` of .debug_line. `comp_dir` is the unit's
  // DW_AT_comp_dir (relative directories are relative to it).
  bool Parse(const Sections& s, std::uint64_t offset, const char* comp_dir, std::uint8_t address_size,
             DebugStringPool& pool);

  // The file and line of `address`; false when no row covers it.
  bool Find(std::uint64_t address, const char** file, std::uint32_t* line) const {
    const LineRow* rows = rows_.begin();
    const LineRow* it = std::upper_bound(rows, rows_.end(), address,
                                         [](std::uint64_t a, const LineRow& r) { return a < r.address; });
    if (it == rows) return false;
    --it;
    if (it->file == kEndOfSequence) return false;
    *file = FileName(it->file);
    *line = it->line;
    return true;
  }

  // A file index as used by this unit's DW_AT_decl_file / DW_AT_call_file.
  const char* FileName(std::uint64_t index) const {
    if (index < file_base_) return nullptr;
    index -= file_base_;
    return index < files_.size() ? files_[index] : nullptr;
  }

  std::size_t rows() const { return rows_.size(); }

 private:
  struct Sequence {
    std::uint64_t start;
    std::uint32_t first;  // into the scratch rows
    std::uint32_t count;  // rows including the end-of-sequence row
  };
  struct EntryFormat {
    std::uint32_t type;
    std::uint32_t form;
  };

  bool ReadV5Entries(const Sections& s, Cursor& c, const UnitHeader& u, bool directories,
                     DebugArray<const char*>& dirs, DebugStringPool& pool, const char* comp_dir);
  const char* JoinPath(const char* dir, const char* name, const char* comp_dir, DebugStringPool& pool);

  DebugArray<LineRow> rows_;  // sequences in address order, each closed by kEndOfSequence
  DebugArray<const char*> files_;
  std::uint32_t file_base_ = 1;  // 1 before DWARF 5, 0 from 5 on
};

inline const char* LineTable::JoinPath(const char* dir, const char* name, const char* comp_dir,
                                       DebugStringPool& pool) {
  if (name == nullptr) return nullptr;
  if (name[0] == '/' || ((dir == nullptr || dir[0] == '\0') && (comp_dir == nullptr || comp_dir[0] == '\0')))
    return pool.Add(name);
  char buf[4096];
  std::size_t n = 0;
  auto append = [&](const char* part) {
    const std::size_t len = std::strlen(part);
    if (n != 0 && n < sizeof buf && buf[n - 1] != '/') buf[n++] = '/';
    const std::size_t take = std::min(len, sizeof buf - 1 - std::min(n, sizeof buf - 1));
    std::memcpy(buf + n, part, take);
    n += take;
  };
  if ((dir == nullptr || dir[0] != '/') && comp_dir != nullptr && comp_dir[0] != '\0') append(comp_dir);
  if (dir != nullptr && dir[0] != '\0') append(dir);
  append(name);
  return pool.Add(buf, n);
}

inline bool LineTable::ReadV5Entries(const Sections& s, Cursor& c, const UnitHeader& u, bool directories,
                                     DebugArray<const char*>& dirs, DebugStringPool& pool,
                                     const char* comp_dir) {
  EntryFormat formats[16];
  const std::uint8_t format_count = c.U8();
  if (format_count > 16) return false;
  for (std::uint8_t i = 0; i < format_count; ++i) {
    formats[i].type = static_cast<std::uint32_t>(c.Uleb());
    formats[i].form = static_cast<std::uint32_t>(c.Uleb());
  }
  const std::uint64_t count = c.Uleb();
  if (!c.ok() || count > (1u << 24)) return false;
  const UnitBases no_bases;
  for (std::uint64_t i = 0; i < count; ++i) {
    const char* path = nullptr;
    std::uint64_t dir_index = 0;
    for (std::uint8_t k = 0; k < format_count; ++k) {
      AttrValue v;
      if (!ReadAttr(c, u, formats[k].form, 0, &v)) return false;
      if (formats[k].type == 1 /*DW_LNCT_path*/) path = ResolveString(s, u, no_bases, v);
      else if (formats[k].type == 2 /*DW_LNCT_directory_index*/) dir_index = v.u;
    }
    if (directories) {
      if (!dirs.Push(path != nullptr ? path : "")) return false;
    } else {
      const char* dir = dir_index < dirs.size() ? dirs[dir_index] : nullptr;
      if (!files_.Push(JoinPath(dir, path, comp_dir, pool))) return false;
    }
  }
  return true;
}

inline bool LineTable::Parse(const Sections& s, std::uint64_t offset, const char* comp_dir,
                             std::uint8_t address_size, DebugStringPool& pool) {
  Cursor c(s.line, offset);
  UnitHeader u;  // the forms of v5 entry formats read through the unit machinery
  u.end = c.UnitLength(&u.dwarf64);
  const std::uint64_t end = u.end;
  u.version = c.U16();
  if (!c.ok() || u.version < 2 || u.version > 5) return false;
  u.address_size = address_size;
  if (u.version >= 5) {
    u.address_size = c.U8();
    c.U8();  // segment_selector_size
  }
  const std::uint64_t header_length = c.Offset(u.dwarf64);
  const std::uint64_t program = c.pos() + header_length;
  const std::uint8_t min_inst_length = c.U8();
  if (u.version >= 4) c.U8();  // maximum_operations_per_instruction: VLIW only
  const bool default_is_stmt = c.U8() != 0;
  (void)default_is_stmt;
  const std::int8_t line_base = static_cast<std::int8_t>(c.U8());
  const std::uint8_t line_range = c.U8();
  const std::uint8_t opcode_base = c.U8();
  std::uint8_t standard_lengths[256] = {};
  for (unsigned i = 1; i < opcode_base; ++i) standard_lengths[i] = c.U8();
  if (!c.ok() || line_range == 0 || program > end || opcode_base == 0) return false;

  DebugArray<const char*> dirs;
  if (u.version >= 5) {
    file_base_ = 0;
    if (!ReadV5Entries(s, c, u, true, dirs, pool, comp_dir)) return false;
    if (!ReadV5Entries(s, c, u, false, dirs, pool, comp_dir)) return false;
  } else {
    file_base_ = 1;
    // Directory 0 is the unit's own directory (DW_AT_comp_dir).
    if (!dirs.Push(comp_dir != nullptr ? comp_dir : "")) return false;
    for (;;) {
      const char* d = c.CString();
      if (d == nullptr) return false;
      if (d[0] == '\0') break;
      if (!dirs.Push(d)) return false;
    }
    for (;;) {
      const char* name = c.CString();
      if (name == nullptr) return false;
      if (name[0] == '\0') break;
      const std::uint64_t dir = c.Uleb();
      c.Uleb();  // modification time
      c.Uleb();  // length
      if (!files_.Push(JoinPath(dir < dirs.size() ? dirs[dir] : nullptr, name, comp_dir, pool))) return false;
    }
  }
  if (!c.ok()) return false;

  // The state machine (6.2.2), keeping what a lookup needs: address, file, line.
  DebugArray<LineRow> scratch;
  DebugArray<Sequence> sequences;
  c.Seek(program);
  std::uint64_t address = 0;
  std::uint32_t file = 1, line = 1;
  std::uint32_t sequence_first = 0;
  auto emit = [&](bool end_sequence) -> bool {
    LineRow row{address, end_sequence ? kEndOfSequence : file, line};
    // Rows at one address: the last one stands (as binutils keeps it), except
    // that an end of sequence is always kept.
    if (scratch.size() > sequence_first && scratch.back().address == address && !end_sequence &&
        scratch.back().file != kEndOfSequence) {
      scratch.back() = row;
      return true;
    }
    return scratch.Push(row);
  };
  while (c.ok() && c.pos() < end) {
    const std::uint8_t op = c.U8();
    if (op >= opcode_base) {
      const std::uint8_t adjusted = static_cast<std::uint8_t>(op - opcode_base);
      address += static_cast<std::uint64_t>(adjusted / line_range) * min_inst_length;
      line = static_cast<std::uint32_t>(static_cast<std::int64_t>(line) + line_base + adjusted % line_range);
      if (!emit(false)) return false;
      continue;
    }
    switch (op) {
      case 0: {  // extended
        const std::uint64_t len = c.Uleb();
        const std::uint64_t next = c.pos() + len;
        if (!c.ok() || len == 0 || next > end) return false;
        const std::uint8_t sub = c.U8();
        if (sub == 1) {  // end_sequence
          if (!emit(true)) return false;
          const std::uint32_t count = static_cast<std::uint32_t>(scratch.size() - sequence_first);
          const std::uint64_t start = scratch[sequence_first].address;
          // A sequence at 0 (or a linker's tombstone) is code the linker threw
          // away; it would shadow real code if kept.
          if (count > 1 && start != 0 && start < 0xfffffffffffffff0ull) {
            if (!sequences.Push(Sequence{start, sequence_first, count})) return false;
          } else {
            scratch.Resize(sequence_first);
          }
          sequence_first = static_cast<std::uint32_t>(scratch.size());
          address = 0;
          file = 1;
          line = 1;
        } else if (sub == 2) {  // set_address
          address = c.Fixed(static_cast<unsigned>(len - 1 <= 8 ? len - 1 : 8));
        } else if (sub == 3 && u.version <= 4) {  // define_file
          const char* name = c.CString();
          const std::uint64_t dir = c.Uleb();
          if (!files_.Push(JoinPath(dir < dirs.size() ? dirs[dir] : nullptr, name, comp_dir, pool)))
            return false;
        }
        c.Seek(next);
        break;
      }
      case 1: if (!emit(false)) return false; break;  // copy
      case 2: address += c.Uleb() * min_inst_length; break;
      case 3: line = static_cast<std::uint32_t>(static_cast<std::int64_t>(line) + c.Sleb()); break;
      case 4: file = static_cast<std::uint32_t>(c.Uleb()); break;
      case 8: address += static_cast<std::uint64_t>((255 - opcode_base) / line_range) * min_inst_length; break;
      case 9: address += c.U16(); break;
      default:
        // set_column, negate_stmt, basic_block, prologue_end, epilogue_begin,
        // isa, and opcodes of later versions: skip their operands.
        for (unsigned i = 0; i < standard_lengths[op]; ++i) c.Uleb();
        break;
    }
  }
  if (!c.ok()) return false;

  // Sequences in address order, concatenated: a binary search over rows then
  // lands in the right sequence, and its closing row ends the covered range.
  std::sort(sequences.begin(), sequences.end(),
            [](const Sequence& a, const Sequence& b) { return a.start < b.start; });
  if (!rows_.Reserve(scratch.size())) return false;
  for (const Sequence& q : sequences) {
    for (std::uint32_t i = 0; i < q.count; ++i) rows_.Push(scratch[q.first + i]);
  }
  return true;
}

}  // namespace dwarf
}  // namespace detail
}  // namespace heapprof
