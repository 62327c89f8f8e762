// heapprof: source positions and inline chains of code addresses, from the
// DWARF of one ELF file (.debug_info + .debug_line). Built lazily: the first
// lookup indexes the units by address (their unit DIEs only); a unit's line
// table and inline scopes are decoded the first time an address falls in it.
// Everything decoded lives in debug memory (debug_memory.hpp) and is kept.
// Split DWARF (-gsplit-dwarf): a skeleton unit's functions and inline chains
// are read from the split unit of the .dwo file it names, opened through the
// owner's DwoOpener, with the skeleton's line table and the program's .debug_addr.
#pragma once

#include <cxxabi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "heapprof/detail/4_symbolization/debug_memory.hpp"
#include "heapprof/detail/4_symbolization/dwarf_line.hpp"
#include "heapprof/detail/4_symbolization/dwarf_reader.hpp"
#include "heapprof/detail/4_symbolization/function_names.hpp"

namespace heapprof {
namespace detail {
namespace dwarf {

// A function as pprof's Function message wants it.
struct FunctionInfo {
  const char* name;         // short form: "ns::Class::Method" (pprof's default display)
  const char* system_name;  // the linkage (mangled) name, or the plain name
  const char* full_name;    // demangled with parameters, as addr2line -C prints it
  const char* file;         // where it is declared/defined; may be null
  std::uint32_t start_line; // 0 = unknown
  bool linkage;             // system_name is a linkage name (else a plain, unqualified one)
};

// The frame that stands for the middle of an inline chain too deep for the
// caller's frames (its innermost and outermost frames are kept).
inline constexpr FunctionInfo kInlineCutFunction{"[heapprof: inline frames omitted]",
                                                 "[heapprof: inline frames omitted]",
                                                 "[heapprof: inline frames omitted]", nullptr, 0, true};

// One frame of an inline chain.
struct SourceFrame {
  const FunctionInfo* function;  // null when only the line table knew the address
  const char* file;              // null = unknown
  std::uint32_t line;            // 0 = unknown
};

// The split unit of a .dwo (its .debug_info.dwo) whose id is `dwo_id`: its
// header, and whether there is one. DWARF 5 carries the id in the unit
// header (DW_UT_split_compile), DWARF 4's GNU form as DW_AT_GNU_dwo_id of the
// unit DIE (7.3.2, 3.1.3). A .dwo of another build, or a damaged one, has none.
inline bool FindSplitUnit(const Sections& dwo, std::uint64_t dwo_id, UnitHeader* out) {
  for (std::uint64_t offset = 0; offset < dwo.info.size;) {
    UnitHeader h;
    if (!ParseUnitHeader(dwo.info, offset, &h)) return false;
    offset = h.end;
    if (h.version >= 5) {
      if (h.unit_type == 5 /*split_compile*/ && h.dwo_id == dwo_id) {
        *out = h;
        return true;
      }
      continue;
    }
    AbbrevTable abbrevs;
    if (!abbrevs.Parse(dwo.abbrev, h.abbrev_offset)) continue;
    Cursor c(dwo.info, h.die_offset);
    const Abbrev* a = abbrevs.Find(c.Uleb());
    if (a == nullptr || a->tag != tag::kCompileUnit) continue;
    for (std::uint32_t k = 0; k < a->attr_count; ++k) {
      const AttrSpec& spec = abbrevs.Attr(*a, k);
      AttrValue v;
      if (!ReadAttr(c, h, spec.form, spec.implicit_const, &v)) break;
      if (spec.name == at::kGnuDwoId && v.u == dwo_id) {
        *out = h;
        return true;
      }
    }
  }
  return false;
}

// The sections of the split unit `dwo_id` in a .dwp package (the .dwo files
// of a program packed into one by dwp or llvm-dwp): `dwp` has the package's
// sections (.debug_info.dwo ...), `cu_index` its .debug_cu_index (DWARF 5,
// 7.3.5; GNU's version 2 for DWARF 4 alike). The unit's contributions to
// info, abbrev, str_offsets and rnglists become whole sections of `out`; the
// strings are shared. False when the package does not hold that unit.
inline bool DwpUnitSections(const Sections& dwp, const ByteView& cu_index, std::uint64_t dwo_id, Sections* out) {
  Cursor c(cu_index, 0);
  const std::uint32_t version = c.U32();  // (v5: a 2-byte version, 2 bytes of padding)
  const std::uint32_t columns = c.U32();
  const std::uint32_t rows = c.U32();
  const std::uint32_t slots = c.U32();
  if (!c.ok() || (version != 2 && version != 5) || columns == 0 || columns > 16 || slots == 0 ||
      (slots & (slots - 1)) != 0 || rows > slots) {
    return false;
  }
  const std::uint64_t signatures = 16, indexes = signatures + std::uint64_t{8} * slots;
  const std::uint64_t ids = indexes + std::uint64_t{4} * slots;
  const std::uint64_t offsets = ids + std::uint64_t{4} * columns;
  const std::uint64_t sizes = offsets + std::uint64_t{4} * columns * rows;
  if (!cu_index.Contains(0, sizes + std::uint64_t{4} * columns * rows)) return false;
  // Open addressing: the id's low bits, stepping by its high bits (odd).
  const std::uint64_t mask = slots - 1;
  std::uint64_t slot = dwo_id & mask;
  const std::uint64_t step = ((dwo_id >> 32) & mask) | 1;
  std::uint32_t row = 0;
  for (std::uint32_t probe = 0; probe < slots && row == 0; ++probe, slot = (slot + step) & mask) {
    Cursor at(cu_index, signatures + 8 * slot);
    const std::uint64_t signature = at.U64();
    at.Seek(indexes + 4 * slot);
    const std::uint32_t index = at.U32();
    if (signature == dwo_id && index != 0) row = index;
    else if (signature == 0 && index == 0) break;
  }
  if (row == 0 || row > rows) return false;
  Sections found{};
  found.str = dwp.str;
  for (std::uint32_t k = 0; k < columns; ++k) {
    Cursor at(cu_index, ids + 4 * k);
    const std::uint32_t kind = at.U32();
    at.Seek(offsets + (std::uint64_t{row - 1} * columns + k) * 4);
    const std::uint32_t offset = at.U32();
    at.Seek(sizes + (std::uint64_t{row - 1} * columns + k) * 4);
    const std::uint32_t size = at.U32();
    if (!at.ok()) return false;
    // DW_SECT_INFO 1, ABBREV 3, STR_OFFSETS 6; 8 is RNGLISTS in v5 (MACRO in v2).
    if (kind == 1) found.info = dwp.info.Sub(offset, size);
    else if (kind == 3) found.abbrev = dwp.abbrev.Sub(offset, size);
    else if (kind == 6) found.str_offsets = dwp.str_offsets.Sub(offset, size);
    else if (kind == 8 && version == 5) found.rnglists = dwp.rnglists.Sub(offset, size);
  }
  if (found.info.size == 0 || found.abbrev.size == 0) return false;
  *out = found;
  return true;
}

// Finds and maps the .dwo file a skeleton unit names (DW_AT_dwo_name, and its
// DW_AT_comp_dir: null when it has none) whose split unit has id `dwo_id`
// (FindSplitUnit), and gives its sections (info, abbrev, str, str_offsets,
// rnglists; the .dwo forms of those names). They must stay readable as long
// as the DwarfInfo that asked. False: not found, or not that unit's.
using DwoOpener = bool (*)(void* context, const char* dwo_name, const char* comp_dir, std::uint64_t dwo_id,
                           Sections* out);

class DwarfInfo {
 public:
  explicit DwarfInfo(const Sections& sections) : s_(sections), line_s_(sections) {}
  ~DwarfInfo();
  DwarfInfo(const DwarfInfo&) = delete;
  DwarfInfo& operator=(const DwarfInfo&) = delete;

  // Frames of file address `address`, innermost first, at most `max`. Returns
  // how many; 0 when the DWARF knows nothing of it. `*inline_known` tells
  // whether .debug_info described the address (so the chain is complete).
  int Lookup(std::uint64_t address, SourceFrame* out, int max, bool* inline_known);

  // The DWARF of the file this one's DW_FORM_GNU_ref_alt / ref_sup4/8 point
  // into (dwz -m's common file, a DWARF 5 supplementary file): names of
  // functions whose DIEs were moved there are read from it. Not owned; it
  // outlives this one, and has no such file of its own.
  void SetSupplementary(DwarfInfo* sup) { sup_ = sup; }

  // How .dwo files are opened. Without one, a split-DWARF skeleton unit
  // gives no frames (names then come from the symbol table), unless it
  // describes its inline chains itself (clang's -fsplit-dwarf-inlining).
  void SetDwoOpener(DwoOpener opener, void* context) {
    dwo_opener_ = opener;
    dwo_context_ = context;
  }

  bool has_lines() const { return s_.line.size != 0; }
  bool has_info() const { return s_.info.size != 0; }

 private:
  struct Scope {
    std::uint64_t lo, hi;
    std::uint64_t function_die;  // the DIE naming the function (abstract origin for inlined); 0 = unknown;
                                 // with kSupDie set, a DIE of the supplementary file
    std::uint32_t depth;
    std::uint32_t call_file;
    std::uint32_t call_line;
    std::uint32_t inlined;
    std::uint32_t parent;  // 1 + index of the innermost scope holding this one; 0 = none
  };
  // A namespace, class, struct or union: what qualifies the names of the
  // functions declared in it when they have no linkage name. Also a function
  // with children: a lambda's closure type is an unnamed struct inside the
  // function that wrote it, and GCC gives an inlined lambda's operator() no
  // linkage name.
  enum ContainerKind : std::uint8_t { kScopeType, kScopeNamespace, kScopeFunction };
  struct Container {
    std::uint64_t offset, end;  // the DIE and one past its subtree
    const char* name;           // null: anonymous (always, for a function: see Qualify)
    std::uint32_t parent;       // 1 + index; 0 = none
    ContainerKind kind;
    std::uint32_t decl_file;  // an unnamed type's declaration (DW_AT_decl_file, _line); 0 = unknown
    std::uint32_t decl_line;
  };
  struct Unit {
    UnitHeader header;
    UnitBases bases;
    std::uint64_t low_pc;
    std::uint64_t stmt_list;
    bool has_stmt_list;
    bool line_failed, scopes_failed;
    const char* comp_dir;
    AbbrevTable* abbrevs;
    LineTable* lines;
    DebugArray<Scope>* scopes;            // sorted by lo, outer before inner
    DebugArray<Container>* containers;    // in DIE order
    // A split-DWARF skeleton: the .dwo it names, the id its split unit must
    // have, the base of that unit's DW_AT_ranges (DWARF 4 GNU form), and
    // the .dwo's DWARF once read (`split`).
    bool skeleton, skeleton_inlines, split_failed, has_dwo_id;
    const char* dwo_name;
    std::uint64_t dwo_id;
    std::uint64_t gnu_ranges_base;
    DwarfInfo* split;
  };
  struct UnitRange {
    std::uint64_t lo, hi;
    std::uint32_t unit;
  };
  struct FunctionSlot {
    std::uint64_t die;  // 0 = empty
    FunctionInfo* info;
  };

  bool IndexUnits();
  DwarfInfo* Split(Unit& skeleton);
  bool AdoptSplitUnit(const Unit& skeleton, const UnitHeader& header, const Sections& program,
                      DebugStringPool* strings);
  int LookupIn(Unit& u, std::uint64_t address, SourceFrame* out, int max, bool* inline_known);
  AbbrevTable* Abbrevs(Unit& u);
  LineTable* Lines(Unit& u);
  DebugArray<Scope>* Scopes(Unit& u);
  Unit* UnitOfAddress(std::uint64_t address);
  Unit* UnitOfOffset(std::uint64_t die_offset);
  const FunctionInfo* Function(std::uint64_t die);
  std::size_t Qualify(Unit& u, std::uint64_t die, const char* name, char* out, std::size_t cap);
  FunctionInfo* MakeFunction(std::uint64_t die);
  bool DieRanges(Unit& u, const AttrValue* low, const AttrValue* high, const AttrValue* ranges,
                 DebugArray<Scope>& out, const Scope& proto);

  static constexpr std::uint64_t kSupDie = std::uint64_t{1} << 63;

  Sections s_;
  Sections line_s_;  // where line tables are: s_, or for a .dwo's DWARF the program's sections
  DwarfInfo* sup_ = nullptr;
  DwoOpener dwo_opener_ = nullptr;
  void* dwo_context_ = nullptr;
  bool indexed_ = false;
  DebugArray<Unit> units_;             // by offset
  DebugArray<UnitRange> unit_ranges_;  // by lo
  DebugArray<std::uint64_t> unit_max_hi_;
  DebugArray<FunctionSlot> functions_;  // open addressing by DIE offset
  std::size_t function_count_ = 0;
  int qualify_depth_ = 0;  // Qualify -> Function -> Qualify: a lambda in a lambda in ...
  DebugStringPool pool_;
  DebugStringPool* strings_ = &pool_;  // a .dwo's DWARF keeps its strings in its program's pool
};

inline DwarfInfo::~DwarfInfo() {
  for (Unit& u : units_) {
    DebugDelete(u.abbrevs);
    DebugDelete(u.lines);
    DebugDelete(u.scopes);
    DebugDelete(u.containers);
    DebugDelete(u.split);
  }
  for (FunctionSlot& f : functions_) DebugDelete(f.info);
}

// Each unit's DIE gives its address ranges; units without any (type-only
// units, or an incomplete description) are not indexed by address.
inline bool DwarfInfo::IndexUnits() {
  indexed_ = true;
  for (std::uint64_t offset = 0; offset < s_.info.size;) {
    Unit u{};
    if (!ParseUnitHeader(s_.info, offset, &u.header)) break;
    offset = u.header.end;
    // Compile, partial and skeleton units only.
    if (u.header.unit_type != 1 && u.header.unit_type != 3 && u.header.unit_type != 4) continue;
    if (!units_.Push(u)) return false;
  }
  for (std::uint32_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    AbbrevTable* abbrevs = Abbrevs(u);
    if (abbrevs == nullptr) continue;
    Cursor c(s_.info, u.header.die_offset);
    const Abbrev* a = abbrevs->Find(c.Uleb());
    if (a == nullptr || (a->tag != tag::kCompileUnit && a->tag != tag::kPartialUnit && a->tag != tag::kSkeletonUnit))
      continue;
    AttrValue low, high, ranges, comp_dir, dwo_name;
    bool has_low = false, has_high = false, has_ranges = false, has_comp_dir = false, skeleton = false;
    if (u.header.unit_type == 4) {
      u.dwo_id = u.header.dwo_id;
      u.has_dwo_id = true;
    }
    for (std::uint32_t k = 0; k < a->attr_count; ++k) {
      const AttrSpec& spec = abbrevs->Attr(*a, k);
      AttrValue v;
      if (!ReadAttr(c, u.header, spec.form, spec.implicit_const, &v)) break;
      switch (spec.name) {
        case at::kLowPc: low = v; has_low = true; break;
        case at::kHighPc: high = v; has_high = true; break;
        case at::kRanges: ranges = v; has_ranges = true; break;
        case at::kCompDir: comp_dir = v; has_comp_dir = true; break;
        case at::kStmtList: u.stmt_list = v.u; u.has_stmt_list = true; break;
        case at::kStrOffsetsBase: u.bases.str_offsets = v.u; break;
        case at::kAddrBase: case at::kGnuAddrBase: u.bases.addr = v.u; break;
        case at::kRnglistsBase: u.bases.rnglists = v.u; u.bases.has_rnglists = true; break;
        case at::kDwoName: case at::kGnuDwoName: skeleton = true; dwo_name = v; break;
        case at::kGnuDwoId: u.dwo_id = v.u; u.has_dwo_id = true; break;
        case at::kGnuRangesBase: u.gnu_ranges_base = v.u; break;
        default: break;
      }
    }
    if (!c.ok()) continue;
    // A split-DWARF skeleton (DWARF 4's GNU form: a compile unit naming its
    // .dwo; DWARF 5's skeleton unit) has the line table but its functions
    // and inlined calls are in the .dwo, read on first use (Split). Without
    // the .dwo, its line table alone would put the lines of inlined code in
    // the function it was inlined into ("_M_run" at basic_string.h:1571; 131
    // of 150 call sites of a g++ -O2 program): no frames then, names only. A
    // skeleton with children (clang's -fsplit-dwarf-inlining) describes its
    // inline chains and is read as any unit when the .dwo is not there.
    if (skeleton || u.header.unit_type == 4) {
      u.skeleton = true;
      u.skeleton_inlines = a->has_children && c.Uleb() != 0;
      u.dwo_name = skeleton ? ResolveString(s_, u.header, u.bases, dwo_name) : nullptr;
    }
    if (has_comp_dir) u.comp_dir = ResolveString(s_, u.header, u.bases, comp_dir);
    if (has_low) ResolveAddress(s_, u.header, u.bases, low, &u.low_pc);
    DebugArray<Scope> found;
    Scope proto{};
    if (!DieRanges(u, has_low ? &low : nullptr, has_high ? &high : nullptr, has_ranges ? &ranges : nullptr,
                   found, proto)) {
      return false;
    }
    for (const Scope& r : found) {
      if (!unit_ranges_.Push(UnitRange{r.lo, r.hi, i})) return false;
    }
  }
  std::sort(unit_ranges_.begin(), unit_ranges_.end(),
            [](const UnitRange& a, const UnitRange& b) { return a.lo < b.lo; });
  if (!unit_max_hi_.Resize(unit_ranges_.size())) return false;
  std::uint64_t reach = 0;
  for (std::size_t i = 0; i < unit_ranges_.size(); ++i) {
    reach = std::max(reach, unit_ranges_[i].hi);
    unit_max_hi_[i] = reach;
  }
  return true;
}

inline AbbrevTable* DwarfInfo::Abbrevs(Unit& u) {
  if (u.abbrevs != nullptr) return u.abbrevs;
  AbbrevTable* t = DebugNew<AbbrevTable>();
  if (t == nullptr) return nullptr;
  if (!t->Parse(s_.abbrev, u.header.abbrev_offset)) {
    DebugDelete(t);
    return nullptr;
  }
  u.abbrevs = t;
  return t;
}

inline LineTable* DwarfInfo::Lines(Unit& u) {
  if (u.lines != nullptr || u.line_failed) return u.lines;
  u.line_failed = true;
  if (!u.has_stmt_list || line_s_.line.size == 0) return nullptr;
  LineTable* t = DebugNew<LineTable>();
  if (t == nullptr) return nullptr;
  if (!t->Parse(line_s_, u.stmt_list, u.comp_dir, u.header.address_size, *strings_)) {
    DebugDelete(t);
    return nullptr;
  }
  u.line_failed = false;
  u.lines = t;
  return t;
}

inline bool DwarfInfo::DieRanges(Unit& u, const AttrValue* low, const AttrValue* high, const AttrValue* ranges,
                                 DebugArray<Scope>& out, const Scope& proto) {
  if (ranges != nullptr) {
    bool ok = true;
    ForEachRange(s_, u.header, u.bases, *ranges, u.low_pc, [&](std::uint64_t lo, std::uint64_t hi) {
      Scope r = proto;
      r.lo = lo;
      r.hi = hi;
      if (lo != 0 && !out.Push(r)) ok = false;
    });
    return ok;
  }
  if (low == nullptr || high == nullptr) return true;
  std::uint64_t lo = 0, hi = 0;
  if (!ResolveAddress(s_, u.header, u.bases, *low, &lo)) return true;
  if (IsConstantForm(high->form)) {
    hi = lo + high->u;
  } else if (!ResolveAddress(s_, u.header, u.bases, *high, &hi)) {
    return true;
  }
  // Address 0: code the linker discarded (its DIEs stay behind).
  if (lo == 0 || lo >= hi) return true;
  Scope r = proto;
  r.lo = lo;
  r.hi = hi;
  return out.Push(r);
}

// Every subprogram and inlined subroutine with code in the unit, with its
// depth in the DIE tree, so the scopes holding one address sort innermost first.
inline DebugArray<DwarfInfo::Scope>* DwarfInfo::Scopes(Unit& u) {
  if (u.scopes != nullptr || u.scopes_failed) return u.scopes;
  u.scopes_failed = true;
  AbbrevTable* abbrevs = Abbrevs(u);
  if (abbrevs == nullptr) return nullptr;
  DebugArray<Scope>* scopes = DebugNew<DebugArray<Scope>>();
  DebugArray<Container>* containers = DebugNew<DebugArray<Container>>();
  DebugArray<std::uint32_t> open_containers;  // per open DIE with children: 1 + container index, or 0
  if (scopes == nullptr || containers == nullptr) {
    DebugDelete(scopes);
    DebugDelete(containers);
    return nullptr;
  }
  Cursor c(s_.info, u.header.die_offset);
  std::uint32_t depth = 0;
  bool ok = true;
  while (ok && c.ok() && c.pos() < u.header.end) {
    const std::uint64_t die = c.pos();
    const std::uint64_t code = c.Uleb();
    if (code == 0) {
      if (depth == 0) break;
      --depth;
      if (!open_containers.empty()) {
        const std::uint32_t k = open_containers.back();
        open_containers.Pop();
        if (k != 0) {
          (*containers)[k - 1].end = c.pos();
          // A function that holds no type is no one's scope: dropped (most are).
          if ((*containers)[k - 1].kind == kScopeFunction && k == containers->size()) containers->Pop();
        }
      }
      continue;
    }
    const Abbrev* a = abbrevs->Find(code);
    if (a == nullptr) break;
    const bool wanted = a->tag == tag::kSubprogram || a->tag == tag::kInlinedSubroutine;
    const bool named_container = a->tag == tag::kNamespace || a->tag == tag::kClassType ||
                                 a->tag == tag::kStructureType || a->tag == tag::kUnionType;
    const bool container = named_container || (a->tag == tag::kSubprogram && a->has_children);
    const char* container_name = nullptr;
    std::uint32_t decl_file = 0, decl_line = 0;
    AttrValue low, high, ranges;
    bool has_low = false, has_high = false, has_ranges = false;
    Scope proto{};
    proto.function_die = die;
    proto.depth = depth;
    proto.inlined = a->tag == tag::kInlinedSubroutine;
    for (std::uint32_t k = 0; k < a->attr_count; ++k) {
      const AttrSpec& spec = abbrevs->Attr(*a, k);
      if (named_container && (spec.name == at::kName || spec.name == at::kDeclFile || spec.name == at::kDeclLine)) {
        AttrValue v;
        if (!ReadAttr(c, u.header, spec.form, spec.implicit_const, &v)) break;
        if (spec.name == at::kName) container_name = ResolveString(s_, u.header, u.bases, v);
        else if (spec.name == at::kDeclFile) decl_file = static_cast<std::uint32_t>(v.u);
        else decl_line = static_cast<std::uint32_t>(v.u);
        continue;
      }
      if (!wanted) {
        ReadAttr(c, u.header, spec.form, spec.implicit_const, nullptr);
        continue;
      }
      AttrValue v;
      if (!ReadAttr(c, u.header, spec.form, spec.implicit_const, &v)) break;
      switch (spec.name) {
        case at::kLowPc: low = v; has_low = true; break;
        case at::kHighPc: high = v; has_high = true; break;
        case at::kRanges: ranges = v; has_ranges = true; break;
        case at::kAbstractOrigin:
          // An origin in another file (dwz -m's shared one) is named from
          // that file; without it, the frame stays with its lines but no
          // function (0).
          if (proto.inlined) {
            proto.function_die = IsLocalReference(v.form)                                      ? v.u
                                 : IsSupReference(v.form) && sup_ != nullptr && v.u < kSupDie ? v.u | kSupDie
                                                                                              : 0;
          }
          break;
        case at::kCallFile: proto.call_file = static_cast<std::uint32_t>(v.u); break;
        case at::kCallLine: proto.call_line = static_cast<std::uint32_t>(v.u); break;
        default: break;
      }
    }
    if (!c.ok()) break;
    if (wanted && !DieRanges(u, has_low ? &low : nullptr, has_high ? &high : nullptr,
                             has_ranges ? &ranges : nullptr, *scopes, proto)) {
      ok = false;
    }
    if (a->has_children) {
      ++depth;
      std::uint32_t k = 0;
      if (container) {
        // The innermost open container is the parent.
        std::uint32_t parent = 0;
        for (std::size_t j = open_containers.size(); j > 0 && parent == 0; --j) parent = open_containers[j - 1];
        const ContainerKind kind = a->tag == tag::kNamespace    ? kScopeNamespace
                                   : a->tag == tag::kSubprogram ? kScopeFunction
                                                                : kScopeType;
        if (containers->Push(Container{die, u.header.end, container_name, parent, kind, decl_file, decl_line}))
          k = static_cast<std::uint32_t>(containers->size());
      }
      if (!open_containers.Push(k)) ok = false;
    }
  }
  if (!ok) {
    DebugDelete(scopes);
    DebugDelete(containers);
    return nullptr;
  }
  std::sort(scopes->begin(), scopes->end(), [](const Scope& a, const Scope& b) {
    return a.lo != b.lo ? a.lo < b.lo : a.depth < b.depth;
  });
  // Ranges nest (a callee's code lies inside its caller's), so one pass with a
  // stack of the scopes still open gives each its innermost holder. A lookup
  // then walks from the last scope starting at or below the address up
  // through its holders: O(log n + depth) where scanning would be O(n).
  DebugArray<std::uint32_t> open;
  for (std::uint32_t i = 0; i < scopes->size(); ++i) {
    Scope& sc = (*scopes)[i];
    while (!open.empty() && (*scopes)[open.back()].hi <= sc.lo) open.Pop();
    sc.parent = open.empty() ? 0 : open.back() + 1;
    if (!open.Push(i)) {
      DebugDelete(scopes);
      DebugDelete(containers);
      return nullptr;
    }
  }
  u.scopes_failed = false;
  u.scopes = scopes;
  u.containers = containers;
  return scopes;
}

inline DwarfInfo::Unit* DwarfInfo::UnitOfAddress(std::uint64_t address) {
  // An index cut short by the debug-info budget or an mmap refused (RLIMIT_AS:
  // HEAPPROF=oom_dump, dump_near_oom) has ranges without their reach: no
  // unit is found rather than a read past unit_max_hi_.
  if (unit_max_hi_.size() != unit_ranges_.size()) return nullptr;
  const UnitRange* it = std::upper_bound(unit_ranges_.begin(), unit_ranges_.end(), address,
                                         [](std::uint64_t a, const UnitRange& r) { return a < r.lo; });
  for (std::size_t i = static_cast<std::size_t>(it - unit_ranges_.begin()); i > 0 && unit_max_hi_[i - 1] > address;
       --i) {
    const UnitRange& r = unit_ranges_[i - 1];
    if (address < r.hi) return &units_[r.unit];
  }
  return nullptr;
}

inline DwarfInfo::Unit* DwarfInfo::UnitOfOffset(std::uint64_t die_offset) {
  const Unit* it = std::upper_bound(units_.begin(), units_.end(), die_offset,
                                    [](std::uint64_t a, const Unit& u) { return a < u.header.offset; });
  if (it == units_.begin()) return nullptr;
  Unit* u = &units_[static_cast<std::size_t>(it - units_.begin()) - 1];
  return die_offset >= u->header.die_offset && die_offset < u->header.end ? u : nullptr;
}

// Follows DW_AT_abstract_origin and DW_AT_specification from `die` to collect
// the linkage name, name and declaration position.
inline FunctionInfo* DwarfInfo::MakeFunction(std::uint64_t die) {
  const char* linkage = nullptr;
  const char* plain = nullptr;
  std::uint64_t plain_die = 0;
  DwarfInfo* plain_in = this;
  const char* decl_file = nullptr;
  std::uint32_t decl_line = 0;
  std::uint64_t at = die;
  DwarfInfo* in = this;  // the file whose .debug_info `at` is an offset in: this one or sup_
  for (int hop = 0; hop < 8 && at != 0; ++hop) {
    if (!in->indexed_ && !in->IndexUnits()) break;  // the supplementary file's, on first use
    Unit* u = in->UnitOfOffset(at);
    if (u == nullptr) break;
    AbbrevTable* abbrevs = in->Abbrevs(*u);
    if (abbrevs == nullptr) break;
    Cursor c(in->s_.info, at);
    const Abbrev* a = abbrevs->Find(c.Uleb());
    if (a == nullptr) break;
    std::uint64_t next = 0;
    DwarfInfo* next_in = in;
    bool has_decl_file = false;
    std::uint64_t file_index = 0;
    for (std::uint32_t k = 0; k < a->attr_count; ++k) {
      const AttrSpec& spec = abbrevs->Attr(*a, k);
      AttrValue v;
      if (!ReadAttr(c, u->header, spec.form, spec.implicit_const, &v)) break;
      switch (spec.name) {
        case at::kLinkageName: case at::kMipsLinkageName:
          if (linkage == nullptr) linkage = ResolveString(in->s_, u->header, u->bases, v);
          break;
        case at::kName:
          if (plain == nullptr) {
            plain = ResolveString(in->s_, u->header, u->bases, v);
            plain_die = at;
            plain_in = in;
          }
          break;
        case at::kDeclFile: file_index = v.u; has_decl_file = true; break;
        case at::kDeclLine:
          if (decl_line == 0) decl_line = static_cast<std::uint32_t>(v.u);
          break;
        case at::kAbstractOrigin: case at::kSpecification:
          if (IsLocalReference(v.form)) {
            next = v.u;
            next_in = in;
          } else if (IsSupReference(v.form) && in->sup_ != nullptr) {
            next = v.u;
            next_in = in->sup_;
          }
          break;
        default: break;
      }
    }
    if (has_decl_file && decl_file == nullptr) {
      if (LineTable* lines = in->Lines(*u)) decl_file = lines->FileName(file_index);
    }
    // The linkage name is enough to name the function, but its declaration
    // may still be one hop on: clang puts a method defined in its class, and
    // both compilers a lambda's operator(), at a DIE with the linkage name and
    // a DW_AT_specification whose DIE alone has decl_file/decl_line.
    if (linkage != nullptr && decl_line != 0 && decl_file != nullptr) break;
    at = next;
    in = next_in;
  }
  const char* system = linkage != nullptr ? linkage : plain;
  if (system == nullptr) return nullptr;
  FunctionInfo* f = DebugNew<FunctionInfo>();
  if (f == nullptr) return nullptr;
  f->system_name = system;  // points into the mapped (or inflated) .debug_str
  f->full_name = system;
  f->name = system;
  f->file = decl_file;
  f->start_line = decl_line;
  f->linkage = linkage != nullptr;
  if (linkage != nullptr) {
    // Demangling runs under the profiler's reentrancy guard: its malloc is
    // transient and invisible to the profile; only the result is kept.
    int status = -1;
    char* demangled = abi::__cxa_demangle(linkage, nullptr, nullptr, &status);
    if (status == 0 && demangled != nullptr) {
      const char* full = strings_->Add(demangled);
      if (full != nullptr) f->full_name = full;
    }
    std::free(demangled);
  }
  if (linkage == nullptr && plain_die != 0) {
    // full_name stays the DWARF name, as addr2line prints it; the name in
    // profiles is qualified, as it would be from a linkage name. system_name
    // stays the DWARF name too: pprof takes a name equal to its system name
    // for one not yet demangled, and its simplifier would cut the
    // "(anonymous namespace)" of "(anonymous namespace)::Pool::Grow".
    // (Qualified in the file that holds the DIE: its namespaces and classes.)
    Unit* owner = plain_in->UnitOfOffset(plain_die);
    char qualified[1024];
    const std::size_t n =
        owner != nullptr ? plain_in->Qualify(*owner, plain_die, plain, qualified, sizeof qualified) : 0;
    const char* kept = n != 0 ? strings_->Add(qualified, n) : nullptr;
    if (kept != nullptr) f->name = kept;
    return f;
  }
  char shortened[1024];
  const std::size_t n = ShortFunctionName(f->full_name, shortened, sizeof shortened);
  if (n != 0) {
    const char* kept = strings_->Add(shortened, n);
    if (kept != nullptr) f->name = kept;
  }
  return f;
}

// "ns::Class::name" for a function DIE without a linkage name (GCC writes none
// for functions with internal linkage, which includes every member of a
// template instantiated with a type of an anonymous namespace, nor for a
// lambda's operator() that is only inlined), from the namespaces and classes
// around the DIE that carries the name. Inside a function: that function's
// name, then its unnamed types as "{lambda at file.cpp:12}" (the closure types
// of lambdas; Clang's diagnostics name them alike), so that pprof tells apart
// lambdas that GCC would all call "operator()". In pprof's short form, as a
// linkage name's is: without template arguments, whose DWARF names
// ("__new_allocator<std::_Rb_tree_node<...> >", "Fill<short>") would otherwise
// make one function two in a profile (beside the same function named from
// another instantiation's linkage name).
inline std::size_t DwarfInfo::Qualify(Unit& u, std::uint64_t die, const char* name, char* out, std::size_t cap) {
  const char* parts[16];
  char places[4][160];  // the "{lambda at ...}" parts
  int count = 0, placed = 0;
  const char* function = nullptr;  // the enclosing function's qualified name, which ends the walk
  if (Scopes(u) != nullptr && u.containers != nullptr) {
    const DebugArray<Container>& cs = *u.containers;
    const Container* it = std::lower_bound(cs.begin(), cs.end(), die,
                                           [](const Container& k, std::uint64_t d) { return k.offset < d; });
    std::uint32_t k = static_cast<std::uint32_t>(it - cs.begin());  // 1 + index of the last one before die
    while (k != 0 && !(die < cs[k - 1].end)) k = cs[k - 1].parent;
    for (; k != 0 && count < 16 && function == nullptr; k = cs[k - 1].parent) {
      const Container& c = cs[k - 1];
      if (c.kind == kScopeFunction) {
        // (Function() of a DIE already being made answers null: malformed
        // DWARF whose specification leads back here ends, as does depth.)
        const FunctionInfo* f = nullptr;
        if (qualify_depth_ < 4) {
          ++qualify_depth_;
          f = Function(c.offset);
          --qualify_depth_;
        }
        if (f != nullptr && f->name != nullptr && f->name[0] != '\0') function = f->name;
        continue;
      }
      if (c.name != nullptr) {
        parts[count++] = c.name;
      } else if (c.kind == kScopeNamespace) {
        parts[count++] = "(anonymous namespace)";
      } else if (placed < 4 && c.parent != 0 && cs[c.parent - 1].kind == kScopeFunction) {
        const char* file = nullptr;
        if (c.decl_file != 0) {
          if (LineTable* lines = Lines(u)) file = lines->FileName(c.decl_file);
        }
        if (file != nullptr) {
          const char* slash = std::strrchr(file, '/');
          if (slash != nullptr) file = slash + 1;
        }
        char* place = places[placed++];
        if (file != nullptr && c.decl_line != 0) {
          std::snprintf(place, sizeof places[0], "{lambda at %s:%u}", file, static_cast<unsigned>(c.decl_line));
        } else if (c.decl_line != 0) {
          std::snprintf(place, sizeof places[0], "{lambda at line %u}", static_cast<unsigned>(c.decl_line));
        } else {
          std::snprintf(place, sizeof places[0], "{lambda}");
        }
        parts[count++] = place;
      }
    }
  }
  std::size_t n = 0;
  auto append = [&](const char* text, std::size_t len) {
    if (n + len + 1 > cap) return false;
    std::memcpy(out + n, text, len);
    n += len;
    return true;
  };
  if (function != nullptr && (!append(function, std::strlen(function)) || !append("::", 2))) return 0;
  for (int i = count - 1; i >= 0; --i) {
    // A class template's arguments go; a name that is nothing but angle
    // brackets (GCC's "<lambda(int)>") stays whole.
    const char* part = parts[i];
    const char* args = part[0] == '<' ? nullptr : std::strchr(part, '<');
    const std::size_t len = args != nullptr ? static_cast<std::size_t>(args - part) : std::strlen(part);
    if (!append(part, len) || !append("::", 2)) return 0;
  }
  // The function's own name through the same shortening as a demangled one:
  // template arguments go, an operator keeps its symbol ("operator<< <char>"
  // is "operator<<").
  char short_name[512];
  std::size_t len = ShortFunctionName(name, short_name, sizeof short_name);
  const char* base = short_name;
  if (len == 0) {
    base = name;
    len = std::strlen(name);
  }
  if (!append(base, len)) return 0;
  out[n] = '\0';
  return n;
}

inline const FunctionInfo* DwarfInfo::Function(std::uint64_t die) {
  if ((die & kSupDie) != 0) {
    // Made and kept by the supplementary file's DwarfInfo.
    const std::uint64_t offset = die & ~kSupDie;
    return sup_ != nullptr && offset != 0 ? sup_->Function(offset) : nullptr;
  }
  if ((function_count_ + 1) * 2 > functions_.size()) {
    DebugArray<FunctionSlot> bigger;
    if (!bigger.Resize(functions_.size() < 64 ? 128 : functions_.size() * 2)) return nullptr;
    const std::size_t mask = bigger.size() - 1;
    for (const FunctionSlot& f : functions_) {
      if (f.die == 0) continue;
      std::size_t i = static_cast<std::size_t>((f.die * 0x9E3779B97F4A7C15ull) >> 20) & mask;
      while (bigger[i].die != 0) i = (i + 1) & mask;
      bigger[i] = f;
    }
    functions_ = static_cast<DebugArray<FunctionSlot>&&>(bigger);
  }
  const std::size_t mask = functions_.size() - 1;
  std::size_t i = static_cast<std::size_t>((die * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  for (; functions_[i].die != 0; i = (i + 1) & mask) {
    if (functions_[i].die == die) return functions_[i].info;
  }
  // Remembered even when it failed (info null): a bad DIE is read once. The
  // slot is taken first: MakeFunction may look up the function enclosing
  // this one (Qualify), which then finds it, not yet made (null), and the
  // table may grow meanwhile, so the slot is found again after.
  functions_[i].die = die;
  functions_[i].info = nullptr;
  ++function_count_;
  FunctionInfo* const info = MakeFunction(die);
  const std::size_t grown = functions_.size() - 1;
  for (i = static_cast<std::size_t>((die * 0x9E3779B97F4A7C15ull) >> 20) & grown; functions_[i].die != die;
       i = (i + 1) & grown) {
  }
  functions_[i].info = info;
  return info;
}

// The DWARF of the .dwo a skeleton unit names, read the first time an
// address falls in the unit; null when it cannot be had (no opener, no such
// file, another build's, damaged, or memory short), and then not tried again.
inline DwarfInfo* DwarfInfo::Split(Unit& skeleton) {
  if (skeleton.split != nullptr || skeleton.split_failed) return skeleton.split;
  // Not under a reserve sized for names (the oom dump): opening the .dwo is
  // reading DWARF cold. Not given up on either: later profiles read it (a
  // failure there, for want of memory, lost the unit's lines for good).
  if (tls_symbolize_cached_debug_only) return nullptr;
  skeleton.split_failed = true;
  if (dwo_opener_ == nullptr || skeleton.dwo_name == nullptr || skeleton.dwo_name[0] == '\0' ||
      !skeleton.has_dwo_id) {
    return nullptr;
  }
  Sections dwo{};
  if (!dwo_opener_(dwo_context_, skeleton.dwo_name, skeleton.comp_dir, skeleton.dwo_id, &dwo)) return nullptr;
  UnitHeader header;
  if (!FindSplitUnit(dwo, skeleton.dwo_id, &header)) return nullptr;
  // What the split unit's forms point into: its own strings, string offsets
  // and (DWARF 5) range lists; the program's addresses and (DWARF 4) ranges.
  Sections merged{};
  merged.info = dwo.info;
  merged.abbrev = dwo.abbrev;
  merged.str = dwo.str;
  merged.str_offsets = dwo.str_offsets;
  merged.rnglists = dwo.rnglists;
  merged.addr = s_.addr;
  merged.ranges = s_.ranges;
  DwarfInfo* split = DebugNew<DwarfInfo>(merged);
  if (split == nullptr) return nullptr;
  if (!split->AdoptSplitUnit(skeleton, header, s_, strings_)) {
    DebugDelete(split);
    return nullptr;
  }
  skeleton.split = split;
  skeleton.split_failed = false;
  return split;
}

// Makes the split unit `header` of this (a .dwo's) DWARF its one unit, with
// what it inherits from its skeleton (3.1.3): the line table, comp_dir, base
// address and address base, and the skeleton's DW_AT_GNU_ranges_base.
inline bool DwarfInfo::AdoptSplitUnit(const Unit& skeleton, const UnitHeader& header, const Sections& program,
                                      DebugStringPool* strings) {
  indexed_ = true;  // no address index: Lookup goes to LookupIn
  line_s_ = program;
  strings_ = strings;
  Unit u{};
  u.header = header;
  u.bases.addr = skeleton.bases.addr;
  u.bases.ranges = skeleton.gnu_ranges_base;
  u.low_pc = skeleton.low_pc;
  u.stmt_list = skeleton.stmt_list;
  u.has_stmt_list = skeleton.has_stmt_list;
  u.comp_dir = skeleton.comp_dir;  // (in the program's sections, which outlive this)
  if (!units_.Push(u)) return false;
  Unit& mine = units_[0];
  AbbrevTable* abbrevs = Abbrevs(mine);
  if (abbrevs == nullptr) return false;
  // Bases the split unit DIE may set itself (none is required to).
  Cursor c(s_.info, mine.header.die_offset);
  const Abbrev* a = abbrevs->Find(c.Uleb());
  if (a == nullptr) return false;
  for (std::uint32_t k = 0; k < a->attr_count; ++k) {
    const AttrSpec& spec = abbrevs->Attr(*a, k);
    AttrValue v;
    if (!ReadAttr(c, mine.header, spec.form, spec.implicit_const, &v)) return false;
    if (spec.name == at::kStrOffsetsBase) mine.bases.str_offsets = v.u;
    if (spec.name == at::kRnglistsBase) {
      mine.bases.rnglists = v.u;
      mine.bases.has_rnglists = true;
    }
  }
  return true;
}

inline int DwarfInfo::Lookup(std::uint64_t address, SourceFrame* out, int max, bool* inline_known) {
  *inline_known = false;
  if (max <= 0) return 0;
  if (!indexed_ && !IndexUnits()) return 0;
  Unit* u = UnitOfAddress(address);
  if (u == nullptr) return 0;
  if (u->skeleton) {
    if (DwarfInfo* split = Split(*u)) return split->LookupIn(split->units_[0], address, out, max, inline_known);
    if (!u->skeleton_inlines) return 0;
  }
  return LookupIn(*u, address, out, max, inline_known);
}

inline int DwarfInfo::LookupIn(Unit& unit, std::uint64_t address, SourceFrame* out, int max, bool* inline_known) {
  Unit* u = &unit;
  SourceFrame leaf{nullptr, nullptr, 0};
  if (LineTable* lines = Lines(*u)) lines->Find(address, &leaf.file, &leaf.line);
  DebugArray<Scope>* scopes = Scopes(*u);
  if (scopes == nullptr) {
    if (leaf.file == nullptr) return 0;
    out[0] = leaf;
    return 1;
  }
  // The scopes holding `address`, innermost (deepest) first, up to the
  // subprogram that holds them. A chain longer than kMaxChain (recursive
  // always_inline templates) keeps its innermost kMaxChain in `chain` and its
  // outermost kMaxChain in `tail` (a ring): the subprogram, the function the
  // address is really in, is at the outer end and must not be the one lost.
  constexpr int kMaxChain = 64;
  const Scope* chain[kMaxChain];
  const Scope* tail[kMaxChain];
  int found = 0, total = 0;
  const Scope* it = std::upper_bound(scopes->begin(), scopes->end(), address,
                                     [](std::uint64_t a, const Scope& s) { return a < s.lo; });
  for (std::uint32_t i = static_cast<std::uint32_t>(it - scopes->begin()); i != 0;) {
    const Scope& s = (*scopes)[i - 1];
    i = s.parent;
    if (address >= s.hi) continue;
    if (found < kMaxChain) {
      chain[found++] = &s;
    } else {
      tail[(total - kMaxChain) % kMaxChain] = &s;
      // Past the first kMaxChain, what lies beyond the subprogram is of no use.
      if (!s.inlined) {
        ++total;
        break;
      }
    }
    ++total;
  }
  auto deeper = [](const Scope* a, const Scope* b) { return a->depth > b->depth; };
  std::sort(chain, chain + found, deeper);
  // The tail in walk order, then by depth like the head.
  const int tail_count = total - found < kMaxChain ? total - found : kMaxChain;
  const int ring_start = total - found > kMaxChain ? (total - found) % kMaxChain : 0;
  std::rotate(tail, tail + ring_start, tail + tail_count);
  std::sort(tail, tail + tail_count, deeper);
  // k-th scope of the chain as kept: the head, then the tail (the first tail
  // entry stands for the scopes dropped between; only its call site is used).
  const int kept = found + tail_count;
  auto at = [&](int k) { return k < found ? chain[k] : tail[k - found]; };
  int outermost = -1;
  for (int i = 0; i < kept; ++i) {
    if (!at(i)->inlined) {
      outermost = i;
      break;
    }
  }
  if (outermost < 0) {
    // No subprogram holds it: the line alone.
    if (leaf.file == nullptr) return 0;
    out[0] = leaf;
    return 1;
  }
  *inline_known = true;
  // Kept scope i is at position i of the whole chain in the head, i + dropped
  // in the tail.
  const int dropped = total - kept;
  auto position = [&](int i) { return i < found ? i : i + dropped; };
  const int frames = position(outermost) + 1;
  // When the frames do not fit in `max`, the innermost and the outermost are
  // kept (the allocating line, and the function the address is really in
  // with the line it was called from) and a marker frame stands for the
  // middle, as a cut stack ends in one. With no room for a frame each side of
  // the marker, the innermost only. The outer part is at most 15 frames: the
  // tail always holds them and the call site before them.
  int inner = frames, outer = 0;
  if (frames > max) {
    inner = max;
    if (max >= 3) {
      outer = (max - 1) / 4;
      inner = max - 1 - outer;
    }
  }
  LineTable* lines = Lines(*u);
  int n = 0;
  const char* file = leaf.file;
  std::uint32_t line = leaf.line;
  for (int i = 0; i <= outermost && n < max; ++i) {
    const int p = position(i);
    // The tail's first scope follows dropped ones: its own line is unknown.
    const bool known = !(i == found && dropped > 0);
    if (known && (p < inner || p >= frames - outer)) {
      out[n].function = at(i)->function_die != 0 ? Function(at(i)->function_die) : nullptr;
      out[n].file = file;
      out[n].line = line;
      ++n;
      if (outer > 0 && p == inner - 1) out[n++] = SourceFrame{&kInlineCutFunction, nullptr, 0};
    }
    // The caller's position is where this inlined call sits.
    file = lines != nullptr ? lines->FileName(at(i)->call_file) : nullptr;
    line = at(i)->call_line;
  }
  return n;
}

}  // namespace dwarf
}  // namespace detail
}  // namespace heapprof
