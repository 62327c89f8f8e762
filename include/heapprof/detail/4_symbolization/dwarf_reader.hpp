// heapprof: the encoding layer of DWARF (versions 2 to 5): a bounds-checked
// cursor, unit headers, abbreviation tables and attribute values.
// Numbers and layouts are those of the DWARF 5 standard (sections 7.4-7.5,
// 7.22 for .debug_line forms); every read is checked, so a corrupt section
// ends a parse with "no information", never with a fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "heapprof/detail/4_symbolization/debug_memory.hpp"
#include "heapprof/detail/4_symbolization/elf_file.hpp"

namespace heapprof {
namespace detail {
namespace dwarf {

using elf::ByteView;

// Tags, attributes and forms used here (DWARF 5, 7.5.3-7.5.6).
namespace tag {
constexpr std::uint32_t kClassType = 0x02, kStructureType = 0x13, kUnionType = 0x17, kNamespace = 0x39,
                        kLexicalBlock = 0x0b, kCompileUnit = 0x11, kInlinedSubroutine = 0x1d,
                        kSubprogram = 0x2e, kPartialUnit = 0x3c, kSkeletonUnit = 0x4a;
}
namespace at {
constexpr std::uint32_t kName = 0x03, kStmtList = 0x10, kLowPc = 0x11, kHighPc = 0x12,
                        kCompDir = 0x1b, kAbstractOrigin = 0x31, kDeclFile = 0x3a,
                        kDeclLine = 0x3b, kSpecification = 0x47, kRanges = 0x55,
                        kCallFile = 0x58, kCallLine = 0x59, kLinkageName = 0x6e,
                        kStrOffsetsBase = 0x72, kAddrBase = 0x73, kRnglistsBase = 0x74,
                        kDwoName = 0x76, kMipsLinkageName = 0x2007, kGnuDwoName = 0x2130,
                        kGnuDwoId = 0x2131, kGnuRangesBase = 0x2132, kGnuAddrBase = 0x2133;
}
namespace form {
constexpr std::uint32_t kAddr = 0x01, kBlock2 = 0x03, kBlock4 = 0x04, kData2 = 0x05, kData4 = 0x06,
                        kData8 = 0x07, kString = 0x08, kBlock = 0x09, kBlock1 = 0x0a,
                        kData1 = 0x0b, kFlag = 0x0c, kSdata = 0x0d, kStrp = 0x0e, kUdata = 0x0f,
                        kRefAddr = 0x10, kRef1 = 0x11, kRef2 = 0x12, kRef4 = 0x13, kRef8 = 0x14,
                        kRefUdata = 0x15, kIndirect = 0x16, kSecOffset = 0x17, kExprloc = 0x18,
                        kFlagPresent = 0x19, kStrx = 0x1a, kAddrx = 0x1b, kRefSup4 = 0x1c,
                        kStrpSup = 0x1d, kData16 = 0x1e, kLineStrp = 0x1f, kRefSig8 = 0x20,
                        kImplicitConst = 0x21, kLoclistx = 0x22, kRnglistx = 0x23,
                        kRefSup8 = 0x24, kStrx1 = 0x25, kStrx2 = 0x26, kStrx3 = 0x27,
                        kStrx4 = 0x28, kAddrx1 = 0x29, kAddrx2 = 0x2a, kAddrx3 = 0x2b,
                        kAddrx4 = 0x2c, kGnuAddrIndex = 0x1f01, kGnuStrIndex = 0x1f02,
                        kGnuRefAlt = 0x1f20, kGnuStrpAlt = 0x1f21;
}

// The debug sections of one file, as bytes (mapped, or inflated into debug
// memory). `sup_str`: the .debug_str of the file its DW_FORM_GNU_strp_alt and
// DW_FORM_strp_sup point into (.gnu_debugaltlink, .debug_sup), if found.
struct Sections {
  ByteView info, abbrev, line, str, line_str, str_offsets, addr, ranges, rnglists;
  ByteView sup_str;
};

class Cursor {
 public:
  Cursor() = default;
  Cursor(ByteView view, std::uint64_t at) : view_(view), pos_(at) { ok_ = at <= view.size; }

  bool ok() const { return ok_; }
  std::uint64_t pos() const { return pos_; }
  bool AtEnd() const { return !ok_ || pos_ >= view_.size; }
  void Fail() { ok_ = false; }

  std::uint64_t Fixed(unsigned bytes) {
    if (!ok_ || !view_.Contains(pos_, bytes)) {
      ok_ = false;
      return 0;
    }
    std::uint64_t v = 0;
    for (unsigned i = 0; i < bytes; ++i) v |= std::uint64_t{view_.data[pos_ + i]} << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::uint8_t U8() { return static_cast<std::uint8_t>(Fixed(1)); }
  std::uint16_t U16() { return static_cast<std::uint16_t>(Fixed(2)); }
  std::uint32_t U32() { return static_cast<std::uint32_t>(Fixed(4)); }
  std::uint64_t U64() { return Fixed(8); }
  std::uint64_t Offset(bool dwarf64) { return Fixed(dwarf64 ? 8 : 4); }

  std::uint64_t Uleb() {
    std::uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      if (!ok_ || pos_ >= view_.size) {
        ok_ = false;
        return 0;
      }
      const std::uint8_t b = view_.data[pos_++];
      if (shift < 64) v |= std::uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
  }
  std::int64_t Sleb() {
    std::uint64_t v = 0;
    unsigned shift = 0;
    std::uint8_t b = 0;
    do {
      if (!ok_ || pos_ >= view_.size) {
        ok_ = false;
        return 0;
      }
      b = view_.data[pos_++];
      if (shift < 64) v |= std::uint64_t{b & 0x7fu} << shift;
      shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= ~std::uint64_t{0} << shift;
    return static_cast<std::int64_t>(v);
  }
  const char* CString() {
    std::size_t length = 0;
    const char* s = ok_ ? view_.CString(pos_, &length) : nullptr;
    if (s == nullptr) {
      ok_ = false;
      return nullptr;
    }
    pos_ += length + 1;
    return s;
  }
  void Skip(std::uint64_t n) {
    if (!ok_ || !view_.Contains(pos_, n)) {
      ok_ = false;
      return;
    }
    pos_ += n;
  }
  void Seek(std::uint64_t at) {
    if (at > view_.size) ok_ = false;
    pos_ = at;
  }

  // An initial length (7.4): 32-bit, or 0xffffffff then 64-bit. Returns the
  // offset one past the unit, 0 on failure.
  std::uint64_t UnitLength(bool* dwarf64) {
    std::uint64_t length = U32();
    *dwarf64 = false;
    if (length == 0xffffffffu) {
      *dwarf64 = true;
      length = U64();
    } else if (length >= 0xfffffff0u) {
      ok_ = false;
    }
    if (!ok_ || length > view_.size - pos_) {
      ok_ = false;
      return 0;
    }
    return pos_ + length;
  }

 private:
  ByteView view_;
  std::uint64_t pos_ = 0;
  bool ok_ = false;
};

inline const char* StringAt(const ByteView& section, std::uint64_t offset) {
  std::size_t length = 0;
  return section.CString(offset, &length);
}

struct AttrSpec {
  std::uint32_t name;
  std::uint32_t form;
  std::int64_t implicit_const;
};

struct Abbrev {
  std::uint64_t code;
  std::uint32_t tag;
  std::uint32_t has_children;
  std::uint32_t first_attr;  // into AbbrevTable::attrs
  std::uint32_t attr_count;
};

// One unit's abbreviation table. Codes are almost always 1..n in order; those
// index directly, others are found by binary search after sorting.
class AbbrevTable {
 public:
  bool Parse(const ByteView& section, std::uint64_t offset) {
    Cursor c(section, offset);
    for (;;) {
      const std::uint64_t code = c.Uleb();
      if (!c.ok()) return false;
      if (code == 0) break;
      Abbrev a;
      a.code = code;
      a.tag = static_cast<std::uint32_t>(c.Uleb());
      a.has_children = c.U8();
      a.first_attr = static_cast<std::uint32_t>(attrs_.size());
      a.attr_count = 0;
      for (;;) {
        AttrSpec s;
        s.name = static_cast<std::uint32_t>(c.Uleb());
        s.form = static_cast<std::uint32_t>(c.Uleb());
        s.implicit_const = s.form == form::kImplicitConst ? c.Sleb() : 0;
        if (!c.ok()) return false;
        if (s.name == 0 && s.form == 0) break;
        if (!attrs_.Push(s)) return false;
        ++a.attr_count;
      }
      if (a.code != abbrevs_.size() + 1) dense_ = false;
      if (!abbrevs_.Push(a)) return false;
    }
    if (!dense_) {
      // Insertion sort: non-dense tables are rare and small.
      for (std::size_t i = 1; i < abbrevs_.size(); ++i) {
        const Abbrev a = abbrevs_[i];
        std::size_t j = i;
        for (; j > 0 && abbrevs_[j - 1].code > a.code; --j) abbrevs_[j] = abbrevs_[j - 1];
        abbrevs_[j] = a;
      }
    }
    return true;
  }

  const Abbrev* Find(std::uint64_t code) const {
    if (dense_) return code >= 1 && code <= abbrevs_.size() ? &abbrevs_[code - 1] : nullptr;
    std::size_t lo = 0, hi = abbrevs_.size();
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (abbrevs_[mid].code < code) lo = mid + 1;
      else hi = mid;
    }
    return lo < abbrevs_.size() && abbrevs_[lo].code == code ? &abbrevs_[lo] : nullptr;
  }
  const AttrSpec& Attr(const Abbrev& a, std::uint32_t i) const { return attrs_[a.first_attr + i]; }

 private:
  DebugArray<Abbrev> abbrevs_;
  DebugArray<AttrSpec> attrs_;
  bool dense_ = true;
};

// The header of one unit of .debug_info and what its unit DIE says about the
// rest of it (bases for indexed forms, where its line program is).
struct UnitHeader {
  std::uint64_t offset = 0;      // of the header
  std::uint64_t die_offset = 0;  // of the unit DIE
  std::uint64_t end = 0;         // one past the unit
  std::uint64_t abbrev_offset = 0;
  std::uint16_t version = 0;
  std::uint8_t address_size = 8;
  std::uint8_t unit_type = 0;
  bool dwarf64 = false;
  std::uint64_t dwo_id = 0;  // DWARF 5 skeleton and split units: the id pairing them
};

// 7.5.1: the v2-v4 and v5 layouts. Type units are skipped by the caller; a
// skeleton unit leads to its split unit in a .dwo file (DwarfInfo::Split).
inline bool ParseUnitHeader(const ByteView& info, std::uint64_t offset, UnitHeader* u) {
  Cursor c(info, offset);
  u->offset = offset;
  u->end = c.UnitLength(&u->dwarf64);
  u->version = c.U16();
  if (!c.ok() || u->version < 2 || u->version > 5) return false;
  if (u->version >= 5) {
    u->unit_type = c.U8();
    u->address_size = c.U8();
    u->abbrev_offset = c.Offset(u->dwarf64);
    if (u->unit_type == 4 /*skeleton*/ || u->unit_type == 5 /*split_compile*/) u->dwo_id = c.U64();
    else if (u->unit_type == 2 /*type*/ || u->unit_type == 6 /*split_type*/) {
      c.Skip(8);
      c.Offset(u->dwarf64);
    }
  } else {
    u->unit_type = 1;  // DW_UT_compile
    u->abbrev_offset = c.Offset(u->dwarf64);
    u->address_size = c.U8();
  }
  u->die_offset = c.pos();
  return c.ok() && u->die_offset <= u->end && (u->address_size == 4 || u->address_size == 8);
}

// One attribute value, undecoded: what it means depends on the form's class
// and, for indexed forms, on the unit's bases.
struct AttrValue {
  std::uint32_t form = 0;
  std::uint64_t u = 0;         // constant, address, offset, index or reference
  const char* str = nullptr;   // DW_FORM_string only
};

inline bool IsConstantForm(std::uint32_t f) {
  return f == form::kData1 || f == form::kData2 || f == form::kData4 || f == form::kData8 ||
         f == form::kUdata || f == form::kSdata || f == form::kImplicitConst;
}

// A reference to a DIE of this file's .debug_info. The others point
// elsewhere: DW_FORM_GNU_ref_alt into the file dwz -m shares between
// binaries (.gnu_debugaltlink), ref_sup4/8 into a DWARF 5 supplementary
// file (both: IsSupReference, an offset into that file's .debug_info),
// ref_sig8 to a type unit by its signature.
inline bool IsLocalReference(std::uint32_t f) {
  return f == form::kRef1 || f == form::kRef2 || f == form::kRef4 || f == form::kRef8 || f == form::kRefUdata ||
         f == form::kRefAddr;
}
inline bool IsSupReference(std::uint32_t f) {
  return f == form::kGnuRefAlt || f == form::kRefSup4 || f == form::kRefSup8;
}

// Reads (or, with out == nullptr, skips) one value. References within the
// unit (ref1..ref_udata) come back as .debug_info offsets.
inline bool ReadAttr(Cursor& c, const UnitHeader& u, std::uint32_t f, std::int64_t implicit_const,
                     AttrValue* out) {
  AttrValue v;
  v.form = f;
  for (int indirections = 0; f == form::kIndirect && indirections < 4; ++indirections) {
    f = static_cast<std::uint32_t>(c.Uleb());
    v.form = f;
  }
  switch (f) {
    case form::kAddr: v.u = c.Fixed(u.address_size); break;
    case form::kData1: case form::kFlag: case form::kStrx1: case form::kAddrx1: v.u = c.U8(); break;
    case form::kRef1: v.u = u.offset + c.U8(); break;
    case form::kData2: case form::kStrx2: case form::kAddrx2: v.u = c.U16(); break;
    case form::kRef2: v.u = u.offset + c.U16(); break;
    case form::kStrx3: case form::kAddrx3: v.u = c.Fixed(3); break;
    case form::kData4: case form::kStrx4: case form::kAddrx4: case form::kRefSup4: v.u = c.U32(); break;
    case form::kRef4: v.u = u.offset + c.U32(); break;
    case form::kData8: case form::kRefSig8: case form::kRefSup8: v.u = c.U64(); break;
    case form::kRef8: v.u = u.offset + c.U64(); break;
    case form::kData16: c.Skip(16); break;
    case form::kSdata: v.u = static_cast<std::uint64_t>(c.Sleb()); break;
    case form::kUdata: case form::kStrx: case form::kAddrx: case form::kLoclistx:
    case form::kRnglistx: case form::kGnuAddrIndex: case form::kGnuStrIndex:
      v.u = c.Uleb();
      break;
    case form::kRefUdata: v.u = u.offset + c.Uleb(); break;
    case form::kString: v.str = c.CString(); break;
    case form::kStrp: case form::kLineStrp: case form::kSecOffset: case form::kStrpSup:
    case form::kGnuRefAlt: case form::kGnuStrpAlt:
      v.u = c.Offset(u.dwarf64);
      break;
    case form::kRefAddr: v.u = u.version <= 2 ? c.Fixed(u.address_size) : c.Offset(u.dwarf64); break;
    case form::kBlock1: c.Skip(c.U8()); break;
    case form::kBlock2: c.Skip(c.U16()); break;
    case form::kBlock4: c.Skip(c.U32()); break;
    case form::kBlock: case form::kExprloc: c.Skip(c.Uleb()); break;
    case form::kFlagPresent: v.u = 1; break;
    case form::kImplicitConst: v.u = static_cast<std::uint64_t>(implicit_const); break;
    default: c.Fail(); break;  // an unknown form has an unknown size: the unit ends here
  }
  if (out != nullptr) *out = v;
  return c.ok();
}

// The bases a unit DIE sets for the indexed forms of its unit (DWARF 5).
// A split unit of a .dwo (3.1.3) takes its address base from its skeleton
// (the .debug_addr is the program's), and in DWARF 4's GNU form also the base
// its DW_AT_ranges offsets into the program's .debug_ranges add to
// (DW_AT_GNU_ranges_base, `ranges`).
struct UnitBases {
  std::uint64_t str_offsets = 0;
  std::uint64_t addr = 0;
  std::uint64_t rnglists = 0;
  std::uint64_t ranges = 0;
  bool has_rnglists = false;
};

inline const char* ResolveString(const Sections& s, const UnitHeader& u, const UnitBases& b,
                                 const AttrValue& v) {
  switch (v.form) {
    case form::kString: return v.str;
    case form::kStrp: return StringAt(s.str, v.u);
    case form::kLineStrp: return StringAt(s.line_str, v.u);
    case form::kGnuStrpAlt: case form::kStrpSup: return StringAt(s.sup_str, v.u);
    case form::kStrx: case form::kStrx1: case form::kStrx2: case form::kStrx3: case form::kStrx4:
    case form::kGnuStrIndex: {
      // A v5 unit without DW_AT_str_offsets_base (a .dwo's split unit among
      // them) points past the section header; DWARF 4's GNU split units'
      // .debug_str_offsets.dwo has no header.
      const std::uint64_t base = b.str_offsets != 0 ? b.str_offsets : u.version < 5 ? 0 : (u.dwarf64 ? 16 : 8);
      Cursor c(s.str_offsets, base + v.u * (u.dwarf64 ? 8 : 4));
      const std::uint64_t off = c.Offset(u.dwarf64);
      return c.ok() ? StringAt(s.str, off) : nullptr;
    }
    default: return nullptr;
  }
}

inline bool ResolveAddress(const Sections& s, const UnitHeader& u, const UnitBases& b,
                           const AttrValue& v, std::uint64_t* out) {
  switch (v.form) {
    case form::kAddr: *out = v.u; return true;
    case form::kAddrx: case form::kAddrx1: case form::kAddrx2: case form::kAddrx3:
    case form::kAddrx4: case form::kGnuAddrIndex: {
      Cursor c(s.addr, b.addr + v.u * u.address_size);
      *out = c.Fixed(u.address_size);
      return c.ok();
    }
    default: return false;
  }
}

// Calls f(lo, hi) for each address range of a DW_AT_ranges value:
// .debug_ranges (v2-4) or .debug_rnglists (v5), 2.17.3 and 7.25.
template <class F>
bool ForEachRange(const Sections& s, const UnitHeader& u, const UnitBases& b, const AttrValue& v,
                  std::uint64_t base, F&& f) {
  const std::uint64_t all_ones = u.address_size == 4 ? 0xffffffffull : ~std::uint64_t{0};
  // Code the linker threw away (--gc-sections, COMDAT duplicates) keeps its
  // DIEs, its addresses set to 0 (ld.bfd) or to the tombstones -1 and -2
  // (lld; -2 where -1 would be a base entry). The offset pairs after such a
  // base are small ranges over live code: kept, they would put live code
  // inside a function that is not in the program. They are dropped. The
  // unit's own base (its low_pc, often 0) is no base entry, and is trusted.
  auto dead = [&](std::uint64_t a) { return a == 0 || a >= all_ones - 1; };
  bool dead_base = false;
  if (u.version < 5) {
    if (v.u > ~std::uint64_t{0} - b.ranges) return false;
    Cursor c(s.ranges, v.u + b.ranges);
    for (int guard = 0; guard < (1 << 20); ++guard) {
      const std::uint64_t lo = c.Fixed(u.address_size);
      const std::uint64_t hi = c.Fixed(u.address_size);
      if (!c.ok()) return false;
      if (lo == 0 && hi == 0) return true;
      if (lo == all_ones) {
        base = hi;
        dead_base = dead(hi);
        continue;
      }
      if (lo < hi && !dead_base) f(base + lo, base + hi);
    }
    return false;
  }
  std::uint64_t offset = v.u;
  if (v.form == form::kRnglistx) {
    // The base points just past the offsets array's header; entries are
    // offsets from the base.
    const std::uint64_t list_base = b.has_rnglists ? b.rnglists : (u.dwarf64 ? 20 : 12);
    Cursor c(s.rnglists, list_base + v.u * (u.dwarf64 ? 8 : 4));
    offset = list_base + c.Offset(u.dwarf64);
    if (!c.ok()) return false;
  }
  Cursor c(s.rnglists, offset);
  auto addrx = [&](std::uint64_t index, std::uint64_t* out) {
    AttrValue a;
    a.form = form::kAddrx;
    a.u = index;
    return ResolveAddress(s, u, b, a, out);
  };
  for (int guard = 0; guard < (1 << 20); ++guard) {
    const std::uint8_t kind = c.U8();
    if (!c.ok()) return false;
    std::uint64_t lo = 0, hi = 0;
    switch (kind) {
      case 0: return true;  // end_of_list
      case 1:               // base_addressx
        if (!addrx(c.Uleb(), &base)) return false;
        dead_base = dead(base);
        continue;
      case 2:  // startx_endx
        if (!addrx(c.Uleb(), &lo) || !addrx(c.Uleb(), &hi)) return false;
        break;
      case 3:  // startx_length
        if (!addrx(c.Uleb(), &lo)) return false;
        hi = lo + c.Uleb();
        break;
      case 4:  // offset_pair
        lo = base + c.Uleb();
        hi = base + c.Uleb();
        if (dead_base) continue;
        break;
      case 5:  // base_address
        base = c.Fixed(u.address_size);
        dead_base = dead(base);
        continue;
      case 6:                                              // start_end
        lo = c.Fixed(u.address_size);
        hi = c.Fixed(u.address_size);
        break;
      case 7:  // start_length
        lo = c.Fixed(u.address_size);
        hi = lo + c.Uleb();
        break;
      default: return false;
    }
    if (!c.ok()) return false;
    if (lo < hi && !dead(lo)) f(lo, hi);
  }
  return false;
}

}  // namespace dwarf
}  // namespace detail
}  // namespace heapprof
