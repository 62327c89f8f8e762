// heapprof: .eh_frame / .eh_frame_hdr parser for the table unwinder.
//
// Pure: bytes in, compact rows out. Nothing here touches the process (no
// dl_iterate_phdr, no stack reads), so the tests and the fuzzer feed it byte
// arrays. unwind_table.hpp points it at the loaded objects.
//
// What it does: walks every FDE (through the sorted .eh_frame_hdr table when
// there is one, else .eh_frame front to back), runs the CIE's and the FDE's
// call frame program and, at every address where the frame layout changes,
// emits one row saying how to find the caller from that address on:
//
//   CFA = sp + off | fp + off | *(fp + off) | the PLT rule | "outermost frame"
//   saved fp: unchanged | at CFA + off | at fp + off | lost
//   return address: always at CFA - 8 (where it is not, the row is "none")
//
// This is the shape of Linux's ORC entries; a row costs 4 bytes of rule. The
// model is the DWARF 5 spec, section 6.4 (call frame information), and the
// LSB's description of .eh_frame (augmentations, DW_EH_PE encodings).
//
// Robustness: the input is whatever the loader mapped, or random fuzz bytes.
// Every read is bounds-checked against the region it came from, every length
// and offset is checked before use, and every loop advances by at least one
// byte or is bounded by a count that was itself checked against the region
// size. An FDE with anything malformed contributes no rows (its rows are
// rolled back); an unsupported but well-formed rule becomes a row of kind
// "none", which the unwinder treats like a PC without a row.
//
// Invariant 1 applies: this runs inside operator new (the first sample builds
// the tables), so its only memory is the internal arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "heapprof/detail/0_base/arena.hpp"

namespace heapprof {
namespace detail {
namespace eh {

// ---------------------------------------------------------------- constants

// DW_EH_PE_*: pointer encodings (LSB, "DWARF Exception Header Encoding").
constexpr std::uint8_t kPeAbsptr = 0x00;
constexpr std::uint8_t kPeUleb128 = 0x01;
constexpr std::uint8_t kPeUdata2 = 0x02;
constexpr std::uint8_t kPeUdata4 = 0x03;
constexpr std::uint8_t kPeUdata8 = 0x04;
constexpr std::uint8_t kPeSigned = 0x08;
constexpr std::uint8_t kPeSleb128 = 0x09;
constexpr std::uint8_t kPeSdata2 = 0x0a;
constexpr std::uint8_t kPeSdata4 = 0x0b;
constexpr std::uint8_t kPeSdata8 = 0x0c;
constexpr std::uint8_t kPePcrel = 0x10;
constexpr std::uint8_t kPeTextrel = 0x20;
constexpr std::uint8_t kPeDatarel = 0x30;
constexpr std::uint8_t kPeFuncrel = 0x40;
constexpr std::uint8_t kPeAligned = 0x50;
constexpr std::uint8_t kPeIndirect = 0x80;
constexpr std::uint8_t kPeOmit = 0xff;

// DW_CFA_* (DWARF 5, 6.4.2; GNU extensions from binutils' dwarf2.def).
constexpr std::uint8_t kCfaAdvanceLoc = 0x40;  // high two bits; delta in the low six
constexpr std::uint8_t kCfaOffset = 0x80;      // high two bits; register in the low six
constexpr std::uint8_t kCfaRestore = 0xc0;     // high two bits; register in the low six
constexpr std::uint8_t kCfaNop = 0x00;
constexpr std::uint8_t kCfaSetLoc = 0x01;
constexpr std::uint8_t kCfaAdvanceLoc1 = 0x02;
constexpr std::uint8_t kCfaAdvanceLoc2 = 0x03;
constexpr std::uint8_t kCfaAdvanceLoc4 = 0x04;
constexpr std::uint8_t kCfaOffsetExtended = 0x05;
constexpr std::uint8_t kCfaRestoreExtended = 0x06;
constexpr std::uint8_t kCfaUndefined = 0x07;
constexpr std::uint8_t kCfaSameValue = 0x08;
constexpr std::uint8_t kCfaRegister = 0x09;
constexpr std::uint8_t kCfaRememberState = 0x0a;
constexpr std::uint8_t kCfaRestoreState = 0x0b;
constexpr std::uint8_t kCfaDefCfa = 0x0c;
constexpr std::uint8_t kCfaDefCfaRegister = 0x0d;
constexpr std::uint8_t kCfaDefCfaOffset = 0x0e;
constexpr std::uint8_t kCfaDefCfaExpression = 0x0f;
constexpr std::uint8_t kCfaExpression = 0x10;
constexpr std::uint8_t kCfaOffsetExtendedSf = 0x11;
constexpr std::uint8_t kCfaDefCfaSf = 0x12;
constexpr std::uint8_t kCfaDefCfaOffsetSf = 0x13;
constexpr std::uint8_t kCfaValOffset = 0x14;
constexpr std::uint8_t kCfaValOffsetSf = 0x15;
constexpr std::uint8_t kCfaValExpression = 0x16;
constexpr std::uint8_t kCfaGnuWindowSave = 0x2d;  // SPARC; aarch64 reuses it for negate_ra_state
constexpr std::uint8_t kCfaGnuArgsSize = 0x2e;
constexpr std::uint8_t kCfaGnuNegativeOffsetExtended = 0x2f;

// DW_OP_* used by the two expression shapes we recognise.
constexpr std::uint8_t kOpDeref = 0x06;
constexpr std::uint8_t kOpAnd = 0x1a;
constexpr std::uint8_t kOpPlus = 0x22;
constexpr std::uint8_t kOpShl = 0x24;
constexpr std::uint8_t kOpGe = 0x2a;
constexpr std::uint8_t kOpLit0 = 0x30;  // DW_OP_lit0 .. DW_OP_lit31 = 0x30 .. 0x4f
constexpr std::uint8_t kOpBreg0 = 0x70;  // DW_OP_breg0 .. DW_OP_breg31 = 0x70 .. 0x8f

// DWARF register numbers of the three registers the rows describe. x86-64
// psABI, figure 3.36. On other targets the parser still runs (it is pure), but
// CIEs whose return-address column differs produce no rows.
constexpr std::uint64_t kRegFp = 6;   // rbp
constexpr std::uint64_t kRegSp = 7;   // rsp
constexpr std::uint64_t kRegRa = 16;  // return address column

// ---------------------------------------------------------------- the rule

// How to find the caller's frame from a PC range, in 32 bits:
//   bits 0-2   CFA kind
//   bits 3-4   saved-fp kind
//   bits 5-11  saved-fp offset / 8, signed (or, for the PLT rule, the threshold)
//   bits 12-31 CFA offset, signed: +-512 KiB covers every frame we have seen;
//              a larger one makes the row kind "none"
// The return address is always at CFA - 8; rows where it is not are "none".
enum CfaKind : std::uint32_t {
  kCfaNone = 0,     // no usable rule: the unwinder falls back to a frame-pointer step
  kCfaSpRel = 1,    // CFA = sp + off
  kCfaFpRel = 2,    // CFA = fp + off
  kCfaFpDeref = 3,  // CFA = *(fp + off): GCC's stack-realigning prologue (lea/and/push)
  kCfaPlt = 4,      // CFA = sp + off + ((pc & 15) >= threshold ? 8 : 0): lazy-binding PLT
  kCfaEnd = 5,      // the return address is undefined: outermost frame (_start, clone)
  kCfaSignal = 6,   // a signal trampoline ('S', glibc's __restore_rt): the interrupted
                    // registers are in the kernel's signal frame at sp (table.hpp: StepOther)
};
enum FpKind : std::uint32_t {
  kFpSame = 0,   // the caller's fp is this frame's fp
  kFpAtCfa = 1,  // saved at CFA + off
  kFpAtFp = 2,   // saved at fp + off (DW_CFA_expression: DW_OP_breg6 off)
  kFpLost = 3,   // not recoverable (in another register, undefined, ...)
};

struct Rule {
  std::uint32_t bits = 0;

  static constexpr int kCfaOffsetBits = 20;
  static constexpr std::int64_t kCfaOffsetMin = -(std::int64_t{1} << (kCfaOffsetBits - 1));
  static constexpr std::int64_t kCfaOffsetMax = (std::int64_t{1} << (kCfaOffsetBits - 1)) - 1;
  static constexpr std::int64_t kFpOffsetMin = -64 * 8;
  static constexpr std::int64_t kFpOffsetMax = 63 * 8;

  constexpr CfaKind cfa_kind() const noexcept { return static_cast<CfaKind>(bits & 7u); }
  constexpr FpKind fp_kind() const noexcept { return static_cast<FpKind>((bits >> 3) & 3u); }
  constexpr std::int64_t fp_offset() const noexcept {
    return static_cast<std::int64_t>(static_cast<std::int32_t>(bits << 20) >> 25) * 8;
  }
  constexpr std::uint32_t plt_threshold() const noexcept { return (bits >> 5) & 0x7fu; }
  constexpr std::int64_t cfa_offset() const noexcept {
    return static_cast<std::int64_t>(static_cast<std::int32_t>(bits) >> 12);
  }

  static constexpr Rule None() noexcept { return Rule{}; }
  // `fp_off` must be a multiple of 8 in range for kFpAtCfa/kFpAtFp; callers check.
  static constexpr Rule Make(CfaKind cfa, std::int64_t cfa_off, FpKind fp, std::int64_t fp_off) noexcept {
    return Rule{static_cast<std::uint32_t>(cfa) | (static_cast<std::uint32_t>(fp) << 3) |
                ((static_cast<std::uint32_t>(fp_off / 8) & 0x7fu) << 5) |
                (static_cast<std::uint32_t>(cfa_off) << 12)};
  }
  static constexpr Rule Plt(std::int64_t cfa_off, std::uint32_t threshold) noexcept {
    return Rule{static_cast<std::uint32_t>(kCfaPlt) | ((threshold & 0x7fu) << 5) |
                (static_cast<std::uint32_t>(cfa_off) << 12)};
  }
  static constexpr bool CfaOffsetFits(std::int64_t off) noexcept {
    return off >= kCfaOffsetMin && off <= kCfaOffsetMax;
  }
  static constexpr bool FpOffsetFits(std::int64_t off) noexcept {
    return off % 8 == 0 && off >= kFpOffsetMin && off <= kFpOffsetMax;
  }
  friend constexpr bool operator==(Rule a, Rule b) noexcept { return a.bits == b.bits; }
  friend constexpr bool operator!=(Rule a, Rule b) noexcept { return a.bits != b.bits; }
};

// One output row: from `pc` up to the next row's pc, `rule` applies.
struct Row {
  std::uint64_t pc;
  Rule rule;
};

// ---------------------------------------------------------------- row buffer

// A growable array of rows in the internal arena. Growing copies into a block
// twice the size and frees the old one; a failed allocation sets oom() and
// drops the row (the table is then built from what fitted, or not at all).
class RowBuffer {
 public:
  RowBuffer() noexcept = default;
  RowBuffer(const RowBuffer&) = delete;
  RowBuffer& operator=(const RowBuffer&) = delete;
  ~RowBuffer() { Release(); }

  void Reserve(std::size_t n) noexcept {
    if (n > capacity_) Grow(n);
  }
  bool Push(std::uint64_t pc, Rule rule) noexcept {
    if (size_ == capacity_ && !Grow(capacity_ < 256 ? 256 : capacity_ * 2)) {
      oom_ = true;
      return false;
    }
    rows_[size_].pc = pc;
    rows_[size_].rule = rule;
    ++size_;
    return true;
  }
  void Truncate(std::size_t n) noexcept {
    if (n < size_) size_ = n;
  }
  void Release() noexcept {
    g_arena.Free(rows_, capacity_ * sizeof(Row));
    rows_ = nullptr;
    size_ = capacity_ = 0;
  }

  Row* data() noexcept { return rows_; }
  const Row* data() const noexcept { return rows_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  bool oom() const noexcept { return oom_; }
  const Row& operator[](std::size_t i) const noexcept { return rows_[i]; }
  Row& back() noexcept { return rows_[size_ - 1]; }

 private:
  bool Grow(std::size_t want) noexcept {
    if (want > (std::size_t{1} << 40) / sizeof(Row)) return false;
    Row* fresh = static_cast<Row*>(g_arena.Allocate(want * sizeof(Row)));
    if (fresh == nullptr) return false;
    if (size_ != 0) std::memcpy(static_cast<void*>(fresh), rows_, size_ * sizeof(Row));
    g_arena.Free(rows_, capacity_ * sizeof(Row));
    rows_ = fresh;
    capacity_ = want;
    return true;
  }

  Row* rows_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  bool oom_ = false;
};

// ---------------------------------------------------------------- reading

// A cursor over [pos, end) whose first byte lives at run-time address
// `address` (what DW_EH_PE_pcrel is relative to). Every read checks the bound
// and fails sticky: after one failure every later read fails too.
class Reader {
 public:
  Reader(const std::uint8_t* begin, const std::uint8_t* end, std::uintptr_t address) noexcept
      : begin_(begin), pos_(begin), end_(end), address_(address) {}

  bool ok() const noexcept { return ok_; }
  std::size_t remaining() const noexcept { return ok_ ? static_cast<std::size_t>(end_ - pos_) : 0; }
  const std::uint8_t* pos() const noexcept { return pos_; }
  std::uintptr_t address() const noexcept { return address_ + static_cast<std::uintptr_t>(pos_ - begin_); }
  bool AtEnd() const noexcept { return !ok_ || pos_ >= end_; }

  bool Skip(std::uint64_t n) noexcept {
    if (!ok_ || n > static_cast<std::uint64_t>(end_ - pos_)) return Fail();
    pos_ += n;
    return true;
  }
  bool U8(std::uint8_t& v) noexcept { return Fixed(&v, 1); }
  bool U16(std::uint16_t& v) noexcept { return Fixed(&v, 2); }
  bool U32(std::uint32_t& v) noexcept { return Fixed(&v, 4); }
  bool U64(std::uint64_t& v) noexcept { return Fixed(&v, 8); }

  // LEB128 may carry redundant high bytes; bits past 64 are dropped, the bytes
  // are still consumed so the next field starts where the producer meant.
  bool Uleb(std::uint64_t& v) noexcept {
    v = 0;
    unsigned shift = 0;
    for (;;) {
      std::uint8_t b;
      if (!U8(b)) return false;
      if (shift < 64) v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if ((b & 0x80) == 0) return true;
    }
  }
  bool Sleb(std::int64_t& v) noexcept {
    std::uint64_t u = 0;
    unsigned shift = 0;
    std::uint8_t b;
    do {
      if (!U8(b)) return false;
      if (shift < 64) u |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) u |= ~std::uint64_t{0} << shift;  // sign-extend
    v = static_cast<std::int64_t>(u);
    return true;
  }

  // A DW_EH_PE-encoded pointer. `data_base` is the DW_EH_PE_datarel base (the
  // .eh_frame_hdr start), 0 where datarel is not allowed. An indirect pointer
  // is only accepted when the caller says so (personality routines: we skip
  // them and never dereference); FDE addresses must be direct.
  bool Encoded(std::uint8_t enc, std::uintptr_t data_base, bool allow_indirect, std::uint64_t& out) noexcept {
    if (enc == kPeOmit) return Fail();
    if ((enc & kPeIndirect) && !allow_indirect) return Fail();
    const std::uintptr_t field = address();
    std::uint64_t value = 0;
    if ((enc & 0x70) == kPeAligned) {
      // Aligned: skip to the next 8-byte boundary, then a plain 8-byte pointer.
      if ((enc & 0x0f) != kPeAbsptr) return Fail();
      const std::uintptr_t pad = (8 - (field & 7)) & 7;
      std::uint64_t raw;
      if (!Skip(pad) || !U64(raw)) return false;
      out = raw;
      return true;
    }
    if (!Value(enc & 0x0f, value)) return false;
    switch (enc & 0x70) {
      case kPeAbsptr:
        break;
      case kPePcrel:
        value += field;
        break;
      case kPeDatarel:
        if (data_base == 0) return Fail();
        value += data_base;
        break;
      default:  // textrel/funcrel: no base we could know; never used on Linux targets
        return Fail();
    }
    out = value;
    return true;
  }

  // The value part of an encoding (low four bits), no base applied: pc_range.
  bool Value(std::uint8_t format, std::uint64_t& out) noexcept {
    switch (format) {
      case kPeAbsptr:
      case kPeUdata8:
      case kPeSdata8:
      case kPeSigned:  // DW_EH_PE_signed alone: a signed pointer-sized value
        return U64(out);
      case kPeUleb128:
        return Uleb(out);
      case kPeUdata2: {
        std::uint16_t v;
        if (!U16(v)) return false;
        out = v;
        return true;
      }
      case kPeUdata4: {
        std::uint32_t v;
        if (!U32(v)) return false;
        out = v;
        return true;
      }
      case kPeSleb128: {
        std::int64_t v;
        if (!Sleb(v)) return false;
        out = static_cast<std::uint64_t>(v);
        return true;
      }
      case kPeSdata2: {
        std::uint16_t v;
        if (!U16(v)) return false;
        out = static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int16_t>(v)));
        return true;
      }
      case kPeSdata4: {
        std::uint32_t v;
        if (!U32(v)) return false;
        out = static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(v)));
        return true;
      }
      default:
        return Fail();
    }
  }

 private:
  bool Fail() noexcept {
    ok_ = false;
    return false;
  }
  bool Fixed(void* out, std::size_t n) noexcept {
    if (!ok_ || n > static_cast<std::size_t>(end_ - pos_)) return Fail();
    std::memcpy(out, pos_, n);  // .eh_frame is target-endian and unaligned
    pos_ += n;
    return true;
  }

  const std::uint8_t* begin_;
  const std::uint8_t* pos_;
  const std::uint8_t* end_;
  std::uintptr_t address_;
  bool ok_ = true;
};

// ---------------------------------------------------------------- CIE / FDE

// One length-prefixed record of .eh_frame: [offset, end) in region bytes.
struct Entry {
  std::size_t offset = 0;       // of the length field
  std::size_t id_offset = 0;    // of the CIE id / CIE pointer field
  std::size_t body_offset = 0;  // first byte after the id field
  std::size_t end = 0;          // one past the record
  std::uint32_t id = 0;         // 0 for a CIE, else the FDE's CIE pointer
  bool terminator = false;      // a zero length: the end of .eh_frame
};

// Reads the record header at `offset` of [data, data + size). False if it does
// not fit; `terminator` set for the zero-length end marker.
inline bool ReadEntry(const std::uint8_t* data, std::size_t size, std::size_t offset, Entry& e) noexcept {
  if (offset > size) return false;
  Reader r(data + offset, data + size, 0);
  std::uint32_t len32;
  if (!r.U32(len32)) return false;
  e.offset = offset;
  if (len32 == 0) {
    e.terminator = true;
    e.end = offset + 4;
    return true;
  }
  e.terminator = false;
  std::uint64_t len = len32;
  std::size_t header = 4;
  if (len32 == 0xffffffffu) {  // 64-bit DWARF: the real length follows
    if (!r.U64(len)) return false;
    header = 12;
  }
  const std::size_t after_len = offset + header;
  if (len < 4 || len > size - after_len) return false;  // must hold at least the id
  e.id_offset = after_len;
  e.body_offset = after_len + 4;
  e.end = after_len + len;
  // The id/pointer field is 4 bytes in .eh_frame even in the 64-bit format.
  if (!r.U32(e.id)) return false;
  return true;
}

// A parsed CIE: what its FDEs need.
struct Cie {
  std::size_t offset = 0;
  std::uint64_t code_align = 1;
  std::int64_t data_align = 1;
  std::uint64_t ra_reg = 0;
  std::uint8_t fde_encoding = kPeAbsptr;
  bool has_augmentation_data = false;  // 'z': FDEs carry an augmentation length
  bool signal_frame = false;           // 'S'
  std::size_t insns = 0;               // [insns, insns_end): initial instructions
  std::size_t insns_end = 0;
};

struct Region {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  std::uintptr_t address = 0;  // run-time address of data[0]
};

inline bool ParseCie(const Region& eh, const Entry& e, Cie& cie) noexcept {
  if (e.terminator || e.id != 0) return false;
  Reader r(eh.data + e.body_offset, eh.data + e.end, eh.address + e.body_offset);
  cie.offset = e.offset;
  std::uint8_t version;
  if (!r.U8(version)) return false;
  if (version != 1 && version != 3 && version != 4) return false;
  // Augmentation string: NUL-terminated, inside the record.
  const std::uint8_t* aug = r.pos();
  std::size_t aug_len = 0;
  for (;;) {
    std::uint8_t c;
    if (!r.U8(c)) return false;
    if (c == 0) break;
    ++aug_len;
  }
  if (version == 4) {  // DWARF 4 CIE: address size, segment selector size
    std::uint8_t address_size, segment_size;
    if (!r.U8(address_size) || !r.U8(segment_size)) return false;
    if (address_size != 8 || segment_size != 0) return false;
  }
  std::int64_t data_align;
  if (!r.Uleb(cie.code_align) || !r.Sleb(data_align)) return false;
  cie.data_align = data_align;
  if (version == 1) {
    std::uint8_t ra;
    if (!r.U8(ra)) return false;
    cie.ra_reg = ra;
  } else if (!r.Uleb(cie.ra_reg)) {
    return false;
  }
  cie.fde_encoding = kPeAbsptr;
  cie.has_augmentation_data = false;
  cie.signal_frame = false;
  if (aug_len != 0) {
    // Without a leading 'z' the augmentation data has no length we could skip
    // ("eh" from GCC 2.x); such CIEs are not supported.
    if (aug[0] != 'z') return false;
    cie.has_augmentation_data = true;
    std::uint64_t data_len;
    if (!r.Uleb(data_len)) return false;
    if (data_len > r.remaining()) return false;
    Reader a(r.pos(), r.pos() + data_len, r.address());
    for (std::size_t i = 1; i < aug_len; ++i) {
      switch (aug[i]) {
        case 'R':
          if (!a.U8(cie.fde_encoding)) return false;
          break;
        case 'L': {
          std::uint8_t lsda_encoding;
          if (!a.U8(lsda_encoding)) return false;
          break;
        }
        case 'P': {
          std::uint8_t personality_encoding;
          std::uint64_t ignored;
          if (!a.U8(personality_encoding)) return false;
          if (!a.Encoded(personality_encoding, 0, true, ignored)) return false;
          break;
        }
        case 'S':
          cie.signal_frame = true;
          break;
        case 'B':  // aarch64 pointer authentication with the B key
        case 'G':  // aarch64 memory-tagged stack frames
          break;
        default:
          // An unknown letter may change how FDEs read; 'z' tells us the data
          // size but not what the letter means, so be safe and drop the CIE.
          return false;
      }
    }
    if (!r.Skip(data_len)) return false;
  }
  if (cie.fde_encoding == kPeOmit || (cie.fde_encoding & kPeIndirect)) return false;
  cie.insns = e.end - r.remaining();
  cie.insns_end = e.end;
  return r.ok();
}

// A parsed FDE: the PC range and where its instructions are.
struct Fde {
  std::uint64_t pc_begin = 0;
  std::uint64_t pc_end = 0;
  std::size_t insns = 0;
  std::size_t insns_end = 0;
  std::size_t cie_offset = 0;
};

// `cie` must be the CIE this FDE points at (see FdeCieOffset).
inline bool ParseFde(const Region& eh, const Entry& e, const Cie& cie, Fde& fde) noexcept {
  Reader r(eh.data + e.body_offset, eh.data + e.end, eh.address + e.body_offset);
  std::uint64_t begin, range;
  if (!r.Encoded(cie.fde_encoding, 0, false, begin)) return false;
  if (!r.Value(cie.fde_encoding & 0x0f, range)) return false;
  if (begin + range < begin) return false;  // wraps
  if (cie.has_augmentation_data) {
    std::uint64_t data_len;
    if (!r.Uleb(data_len) || !r.Skip(data_len)) return false;  // the LSDA pointer lives here
  }
  fde.pc_begin = begin;
  fde.pc_end = begin + range;
  fde.insns = e.end - r.remaining();
  fde.insns_end = e.end;
  return r.ok();
}

// The CIE an FDE record refers to: its CIE pointer counts back from the
// pointer field itself.
inline bool FdeCieOffset(const Entry& e, std::size_t& cie_offset) noexcept {
  if (e.terminator || e.id == 0 || e.id > e.id_offset) return false;
  cie_offset = e.id_offset - e.id;
  return true;
}

// ---------------------------------------------------------------- CFA program

// The register rules we track. Everything else a program says is parsed and
// ignored: only the CFA, the frame pointer and the return address matter for
// walking the stack.
enum class RegRule : std::uint8_t {
  kSame,       // same value (the default for callee-saved registers in .eh_frame)
  kUndefined,  // DW_CFA_undefined
  kAtCfa,      // saved at CFA + off
  kAtFp,       // saved at fp + off (DW_CFA_expression DW_OP_bregFP off)
  kOther,      // anything else: another register, val_offset, general expressions
};
enum class CfaRule : std::uint8_t {
  kRegOffset,  // reg + off
  kFpDeref,    // *(fp + off)
  kPlt,        // the PLT expression (see MatchPltExpression)
  kOther,      // an expression we do not evaluate
};

struct FrameState {
  CfaRule cfa = CfaRule::kRegOffset;
  std::uint64_t cfa_reg = kRegSp;
  std::int64_t cfa_off = 8;
  std::uint32_t plt_threshold = 0;
  RegRule fp = RegRule::kSame;
  std::int64_t fp_off = 0;
  RegRule ra = RegRule::kSame;
  std::int64_t ra_off = 0;
};

// The state as a row rule.
inline Rule EncodeRule(const FrameState& s, bool signal_frame) noexcept {
  // A signal trampoline's caller is the interrupted PC, not a return address,
  // and its registers come from the kernel's ucontext, whose layout is the
  // kernel's ABI rather than the CFA program's: the walk reads them from
  // there (table.hpp: StepOther), whatever expressions the program holds.
  if (signal_frame) return Rule::Make(kCfaSignal, 0, kFpSame, 0);
  if (s.ra == RegRule::kUndefined) return Rule::Make(kCfaEnd, 0, kFpSame, 0);
  if (s.ra != RegRule::kAtCfa || s.ra_off != -8) return Rule::None();
  FpKind fp = kFpLost;
  std::int64_t fp_off = 0;
  switch (s.fp) {
    case RegRule::kSame:
      fp = kFpSame;
      break;
    case RegRule::kAtCfa:
    case RegRule::kAtFp:
      if (Rule::FpOffsetFits(s.fp_off)) {
        fp = s.fp == RegRule::kAtCfa ? kFpAtCfa : kFpAtFp;
        fp_off = s.fp_off;
      }
      break;
    default:
      break;
  }
  if (!Rule::CfaOffsetFits(s.cfa_off)) return Rule::None();
  switch (s.cfa) {
    case CfaRule::kRegOffset:
      if (s.cfa_reg == kRegSp) return Rule::Make(kCfaSpRel, s.cfa_off, fp, fp_off);
      if (s.cfa_reg == kRegFp) return Rule::Make(kCfaFpRel, s.cfa_off, fp, fp_off);
      return Rule::None();  // CFA in another register (r10 in realigning prologues, rdi in __longjmp)
    case CfaRule::kFpDeref:
      return Rule::Make(kCfaFpDeref, s.cfa_off, fp, fp_off);
    case CfaRule::kPlt:
      if (fp != kFpSame) return Rule::None();
      return Rule::Plt(s.cfa_off, s.plt_threshold);
    default:
      return Rule::None();
  }
}

// The lazy-binding PLT's CFA, as GNU ld writes it for x86-64:
//   DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
//   DW_OP_litT; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus
// i.e. CFA = rsp + N + (((rip & 15) >= T) << 3): the second half of each
// 16-byte entry runs after `push $index`, one word deeper.
inline bool MatchPltExpression(const std::uint8_t* p, std::size_t n, std::int64_t& off,
                               std::uint32_t& threshold) noexcept {
  Reader r(p, p + n, 0);
  std::uint8_t op;
  std::int64_t rip_off;
  if (!r.U8(op) || op != kOpBreg0 + kRegSp || !r.Sleb(off)) return false;
  if (!r.U8(op) || op != kOpBreg0 + kRegRa || !r.Sleb(rip_off) || rip_off != 0) return false;
  std::uint8_t t[7];
  for (std::uint8_t& b : t)
    if (!r.U8(b)) return false;
  if (t[0] != kOpLit0 + 15 || t[1] != kOpAnd || t[2] < kOpLit0 || t[2] > kOpLit0 + 15 || t[3] != kOpGe ||
      t[4] != kOpLit0 + 3 || t[5] != kOpShl || t[6] != kOpPlus)
    return false;
  threshold = static_cast<std::uint32_t>(t[2] - kOpLit0);
  return r.AtEnd();
}

// `DW_OP_bregFP off [; DW_OP_deref]`, nothing else.
inline bool MatchFpExpression(const std::uint8_t* p, std::size_t n, bool deref, std::int64_t& off) noexcept {
  Reader r(p, p + n, 0);
  std::uint8_t op;
  if (!r.U8(op) || op != kOpBreg0 + kRegFp || !r.Sleb(off)) return false;
  if (deref && (!r.U8(op) || op != kOpDeref)) return false;
  return r.AtEnd();
}

// remember_state nests this deep at most; GCC never goes past 2. Deeper is
// treated as malformed (the FDE gets no rows) rather than allocating.
constexpr int kStateStackDepth = 16;

// Runs one call frame program over `st`. `initial` is the state after the
// CIE's instructions (DW_CFA_restore goes back to it); null while running the
// CIE itself. For an FDE, `emit(pc, state)` is called for every address range
// with its state, in increasing pc order, each range ending where the next
// starts; the caller adds the terminator at pc_end. Returns false on malformed
// input (unknown opcode, read past the end, bad state stack).
template <class Emit>
inline bool RunProgram(const Region& eh, std::size_t begin, std::size_t end, const Cie& cie, FrameState& st,
                const FrameState* initial, std::uint64_t pc_begin, std::uint64_t pc_end, Emit&& emit) noexcept {
  Reader r(eh.data + begin, eh.data + end, eh.address + begin);
  // The remember_state stack, left uninitialised: a FrameState is built in a
  // slot only when pushed (initialising all 16, 896 bytes per FDE, was 5% of
  // a table build).
  union Slot {
    Slot() noexcept {}
    FrameState state;
  };
  Slot stack[kStateStackDepth];
  int depth = 0;
  std::uint64_t loc = pc_begin;
  const FrameState defaults{};

  // Moves the location to `next`; the state so far covers [loc, next).
  auto move_to = [&](std::uint64_t next) {
    if (next > pc_end) next = pc_end;  // past the end: the rest is unused
    if (next > loc) {
      emit(loc, st);
      loc = next;
    }
  };
  auto advance = [&](std::uint64_t delta) -> bool {
    if (initial == nullptr) return true;  // in a CIE: locations mean nothing
    if (cie.code_align != 0 && delta > (~std::uint64_t{0}) / cie.code_align) return false;
    delta *= cie.code_align;
    move_to(loc + delta < loc ? pc_end : loc + delta);
    return true;
  };
  auto set_reg = [&](std::uint64_t reg, RegRule rule, std::int64_t off) {
    if (reg == kRegFp) {
      st.fp = rule;
      st.fp_off = off;
    } else if (reg == cie.ra_reg) {
      st.ra = rule;
      st.ra_off = off;
    }
  };
  auto restore_reg = [&](std::uint64_t reg) {
    const FrameState& from = initial != nullptr ? *initial : defaults;
    if (reg == kRegFp) {
      st.fp = from.fp;
      st.fp_off = from.fp_off;
    } else if (reg == cie.ra_reg) {
      st.ra = from.ra;
      st.ra_off = from.ra_off;
    }
  };
  // Factored offsets: multiply with overflow check (a huge one is just "other").
  auto factored = [&](std::int64_t n, std::int64_t& out) -> bool {
    return !__builtin_mul_overflow(n, cie.data_align, &out);
  };

  while (!r.AtEnd()) {
    if (initial != nullptr && loc >= pc_end) break;  // nothing after the end can matter
    std::uint8_t op;
    if (!r.U8(op)) return false;
    const std::uint8_t high = op & 0xc0;
    const std::uint8_t low = op & 0x3f;
    if (high == kCfaAdvanceLoc) {
      if (!advance(low)) return false;
      continue;
    }
    if (high == kCfaOffset) {
      std::uint64_t n;
      std::int64_t off = 0;
      if (!r.Uleb(n)) return false;
      const bool fits = factored(static_cast<std::int64_t>(n), off);  // sets off: call before set_reg
      set_reg(low, fits ? RegRule::kAtCfa : RegRule::kOther, off);
      continue;
    }
    if (high == kCfaRestore) {
      restore_reg(low);
      continue;
    }
    switch (op) {
      case kCfaNop:
        break;
      case kCfaSetLoc: {
        std::uint64_t to;
        if (!r.Encoded(cie.fde_encoding, 0, false, to)) return false;
        if (initial != nullptr) {
          if (to < loc) return false;  // locations only move forward
          move_to(to);
        }
        break;
      }
      case kCfaAdvanceLoc1: {
        std::uint8_t d;
        if (!r.U8(d) || !advance(d)) return false;
        break;
      }
      case kCfaAdvanceLoc2: {
        std::uint16_t d;
        if (!r.U16(d) || !advance(d)) return false;
        break;
      }
      case kCfaAdvanceLoc4: {
        std::uint32_t d;
        if (!r.U32(d) || !advance(d)) return false;
        break;
      }
      case kCfaOffsetExtended: {
        std::uint64_t reg, n;
        std::int64_t off = 0;
        if (!r.Uleb(reg) || !r.Uleb(n)) return false;
        const bool fits = factored(static_cast<std::int64_t>(n), off);
        set_reg(reg, fits ? RegRule::kAtCfa : RegRule::kOther, off);
        break;
      }
      case kCfaOffsetExtendedSf: {
        std::uint64_t reg;
        std::int64_t n, off = 0;
        if (!r.Uleb(reg) || !r.Sleb(n)) return false;
        const bool fits = factored(n, off);
        set_reg(reg, fits ? RegRule::kAtCfa : RegRule::kOther, off);
        break;
      }
      case kCfaGnuNegativeOffsetExtended: {
        std::uint64_t reg, n;
        std::int64_t off = 0;
        if (!r.Uleb(reg) || !r.Uleb(n)) return false;
        const bool fits = n <= static_cast<std::uint64_t>(INT64_MAX) &&
                          factored(-static_cast<std::int64_t>(n), off);
        set_reg(reg, fits ? RegRule::kAtCfa : RegRule::kOther, off);
        break;
      }
      case kCfaRestoreExtended: {
        std::uint64_t reg;
        if (!r.Uleb(reg)) return false;
        restore_reg(reg);
        break;
      }
      case kCfaUndefined: {
        std::uint64_t reg;
        if (!r.Uleb(reg)) return false;
        set_reg(reg, RegRule::kUndefined, 0);
        break;
      }
      case kCfaSameValue: {
        std::uint64_t reg;
        if (!r.Uleb(reg)) return false;
        set_reg(reg, RegRule::kSame, 0);
        break;
      }
      case kCfaRegister: {
        std::uint64_t reg, other;
        if (!r.Uleb(reg) || !r.Uleb(other)) return false;
        set_reg(reg, reg == other ? RegRule::kSame : RegRule::kOther, 0);
        break;
      }
      case kCfaRememberState:
        if (depth == kStateStackDepth) return false;
        new (&stack[depth++].state) FrameState(st);  // CFA included, as GCC and LLVM both do
        break;
      case kCfaRestoreState:
        if (depth == 0) return false;
        st = stack[--depth].state;
        break;
      case kCfaDefCfa: {
        std::uint64_t reg, off;
        if (!r.Uleb(reg) || !r.Uleb(off)) return false;
        st.cfa = off <= static_cast<std::uint64_t>(INT64_MAX) ? CfaRule::kRegOffset : CfaRule::kOther;
        st.cfa_reg = reg;
        st.cfa_off = static_cast<std::int64_t>(off);
        break;
      }
      case kCfaDefCfaSf: {
        std::uint64_t reg;
        std::int64_t n, off = 0;
        if (!r.Uleb(reg) || !r.Sleb(n)) return false;
        st.cfa = factored(n, off) ? CfaRule::kRegOffset : CfaRule::kOther;
        st.cfa_reg = reg;
        st.cfa_off = off;
        break;
      }
      case kCfaDefCfaRegister: {
        std::uint64_t reg;
        if (!r.Uleb(reg)) return false;
        // Only meaningful on a register rule; after an expression it is invalid.
        if (st.cfa != CfaRule::kRegOffset) st.cfa = CfaRule::kOther;
        st.cfa_reg = reg;
        break;
      }
      case kCfaDefCfaOffset: {
        std::uint64_t off;
        if (!r.Uleb(off)) return false;
        if (st.cfa != CfaRule::kRegOffset || off > static_cast<std::uint64_t>(INT64_MAX)) st.cfa = CfaRule::kOther;
        st.cfa_off = static_cast<std::int64_t>(off);
        break;
      }
      case kCfaDefCfaOffsetSf: {
        std::int64_t n, off = 0;
        if (!r.Sleb(n)) return false;
        if (st.cfa != CfaRule::kRegOffset || !factored(n, off)) st.cfa = CfaRule::kOther;
        st.cfa_off = off;
        break;
      }
      case kCfaDefCfaExpression: {
        std::uint64_t len;
        if (!r.Uleb(len) || len > r.remaining()) return false;
        const std::uint8_t* expr = r.pos();
        std::int64_t off = 0;
        std::uint32_t threshold = 0;
        if (MatchPltExpression(expr, len, off, threshold)) {
          st.cfa = CfaRule::kPlt;
          st.cfa_off = off;
          st.plt_threshold = threshold;
        } else if (MatchFpExpression(expr, len, true, off)) {
          st.cfa = CfaRule::kFpDeref;
          st.cfa_off = off;
        } else {
          st.cfa = CfaRule::kOther;
        }
        if (!r.Skip(len)) return false;
        break;
      }
      case kCfaExpression: {
        std::uint64_t reg, len;
        if (!r.Uleb(reg) || !r.Uleb(len) || len > r.remaining()) return false;
        std::int64_t off = 0;
        if (MatchFpExpression(r.pos(), len, false, off))
          set_reg(reg, RegRule::kAtFp, off);
        else
          set_reg(reg, RegRule::kOther, 0);
        if (!r.Skip(len)) return false;
        break;
      }
      case kCfaValExpression: {
        std::uint64_t reg, len;
        if (!r.Uleb(reg) || !r.Uleb(len) || !r.Skip(len)) return false;
        set_reg(reg, RegRule::kOther, 0);
        break;
      }
      case kCfaValOffset: {
        std::uint64_t reg, n;
        if (!r.Uleb(reg) || !r.Uleb(n)) return false;
        set_reg(reg, RegRule::kOther, 0);
        break;
      }
      case kCfaValOffsetSf: {
        std::uint64_t reg;
        std::int64_t n;
        if (!r.Uleb(reg) || !r.Sleb(n)) return false;
        set_reg(reg, RegRule::kOther, 0);
        break;
      }
      case kCfaGnuArgsSize: {
        // Bytes of outgoing arguments pushed at a call: the landing-pad
        // adjustment for exceptions. The CFA rule already accounts for them.
        std::uint64_t size;
        if (!r.Uleb(size)) return false;
        break;
      }
      case kCfaGnuWindowSave:
        break;  // no operands; no effect on the registers we track on x86-64
      default:
        return false;  // unknown opcode: its operand length is unknown, stop
    }
  }
  if (!r.ok()) return false;
  if (initial != nullptr && loc < pc_end) emit(loc, st);
  return true;
}

// ---------------------------------------------------------------- driver

// What to parse. `eh_frame` may extend past the section (to the end of the
// segment holding it): records are walked until the zero terminator or the
// region end. `hdr` is optional; with it, FDEs come from its sorted table.
struct Source {
  Region eh_frame;
  Region hdr;                                   // data == nullptr: none
  std::uint64_t pc_lo = 0;                      // FDEs not inside [pc_lo, pc_hi)
  std::uint64_t pc_hi = ~std::uint64_t{0};      // are dropped (discarded sections)
};

struct ParseStats {
  std::size_t fdes = 0;          // FDEs that produced rows
  std::size_t fdes_skipped = 0;  // outside [pc_lo, pc_hi) or empty
  std::size_t fdes_bad = 0;      // malformed: no rows
  bool used_hdr_table = false;
};

// The .eh_frame_hdr fields (LSB "eh_frame_hdr" section).
struct Hdr {
  std::uint64_t eh_frame = 0;  // address of .eh_frame
  std::uint64_t fde_count = 0;
  std::uint8_t table_encoding = kPeOmit;
  std::size_t table_offset = 0;  // of the first table entry, in hdr bytes
  bool has_table = false;
};

inline bool ParseHdr(const Region& hdr, Hdr& out) noexcept {
  if (hdr.data == nullptr) return false;
  Reader r(hdr.data, hdr.data + hdr.size, hdr.address);
  std::uint8_t version, eh_frame_enc, count_enc, table_enc;
  if (!r.U8(version) || !r.U8(eh_frame_enc) || !r.U8(count_enc) || !r.U8(table_enc)) return false;
  if (version != 1) return false;
  if (!r.Encoded(eh_frame_enc, hdr.address, false, out.eh_frame)) return false;
  out.has_table = false;
  if (count_enc != kPeOmit && table_enc != kPeOmit) {
    if (!r.Encoded(count_enc, hdr.address, false, out.fde_count)) return false;
    out.table_encoding = table_enc;
    out.table_offset = hdr.size - r.remaining();
    out.has_table = true;
  }
  return true;
}

// Parses FDEs into `out`, rows per FDE in increasing pc order, each FDE's
// rows ending with a kCfaNone row at its pc_end. Finish() turns that into the
// final sorted, merged table. Returns false only when memory ran out.
inline void FinishRows(RowBuffer& buf) noexcept;
inline Rule FindRule(const Row* rows, std::size_t n, std::uint64_t pc) noexcept;

class Parser {
 public:
  Parser(const Source& src, RowBuffer& out) noexcept : src_(src), eh_(src.eh_frame), out_(out) {}

  // The FDEs in .eh_frame_hdr's sorted table, if it can be searched: a
  // fixed-size encoding (lazy lookups, RuleOfOneFde). 0: none or not.
  std::uint64_t SearchableFdes(Hdr& hdr) const noexcept {
    if (src_.hdr.data == nullptr || !ParseHdr(src_.hdr, hdr) || !hdr.has_table) return 0;
    const std::size_t width = EntryWidth(hdr.table_encoding);
    const std::size_t avail = src_.hdr.size - hdr.table_offset;
    if (width == 0 || hdr.fde_count == 0 || hdr.fde_count > avail / (2 * width)) return 0;
    return hdr.fde_count;
  }

  // The rule at `pc` from the one FDE that .eh_frame_hdr's table gives for
  // it (binary search), run on its own: what the whole table would say for
  // `pc`, without building it. Rows go to the parser's buffer (a few).
  Rule RuleOfOneFde(const Hdr& hdr, std::uint64_t pc) noexcept {
    const std::size_t width = EntryWidth(hdr.table_encoding);
    const std::uint8_t* table = src_.hdr.data + hdr.table_offset;
    const std::uint64_t table_address = src_.hdr.address + hdr.table_offset;
    // The last entry whose initial location is <= pc.
    std::uint64_t lo = 0, hi = hdr.fde_count;
    while (lo < hi) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      const std::size_t at = static_cast<std::size_t>(mid) * 2 * width;
      Reader r(table + at, table + at + width, table_address + at);
      std::uint64_t initial_loc = 0;
      if (!r.Encoded(hdr.table_encoding, src_.hdr.address, false, initial_loc)) return Rule::None();
      if (initial_loc <= pc)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo == 0) return Rule::None();
    const std::uint64_t entry = lo - 1;
    const std::size_t at = static_cast<std::size_t>(entry) * 2 * width + width;
    Reader r(table + at, table + at + width, table_address + at);
    std::uint64_t fde_address = 0;
    if (!r.Encoded(hdr.table_encoding, src_.hdr.address, false, fde_address) || fde_address < eh_.address ||
        fde_address - eh_.address >= eh_.size) {
      return Rule::None();
    }
    ParseStats st;
    out_.Truncate(0);
    const std::uint64_t off = fde_address - eh_.address;
    DoFde(static_cast<std::size_t>(off), st);
    FinishRows(out_);
    return FindRule(out_.data(), out_.size(), pc);
  }

  bool Run(ParseStats* stats) noexcept {
    ParseStats local;
    ParseStats& st = stats != nullptr ? *stats : local;
    st = ParseStats{};
    Hdr hdr;
    if (src_.hdr.data != nullptr && ParseHdr(src_.hdr, hdr) && hdr.has_table && ValidateTable(hdr)) {
      st.used_hdr_table = true;
      out_.Reserve(hdr.fde_count * 4 + 16);
      Reader r(src_.hdr.data + hdr.table_offset, src_.hdr.data + src_.hdr.size,
               src_.hdr.address + hdr.table_offset);
      for (std::uint64_t i = 0; i < hdr.fde_count; ++i) {
        std::uint64_t initial_loc = 0, fde_address = 0;
        r.Encoded(hdr.table_encoding, src_.hdr.address, false, initial_loc);
        r.Encoded(hdr.table_encoding, src_.hdr.address, false, fde_address);
        const std::uint64_t off = fde_address - eh_.address;  // ValidateTable checked the range
        DoFde(static_cast<std::size_t>(off), st);
        if (out_.oom()) return false;
      }
      return true;
    }
    // No usable table: every record of .eh_frame, front to back.
    std::size_t off = 0;
    while (off < eh_.size) {
      Entry e;
      if (!ReadEntry(eh_.data, eh_.size, off, e) || e.terminator) break;
      if (e.id != 0) DoFde(off, st);
      if (out_.oom()) return false;
      off = e.end;
    }
    return true;
  }

 private:
  // Every entry decodes and points into .eh_frame: otherwise fall back to the
  // linear walk (which does not need the table at all).
  bool ValidateTable(const Hdr& hdr) const noexcept {
    const std::size_t avail = src_.hdr.size - hdr.table_offset;
    if (hdr.fde_count > avail / 2) return false;  // each entry is at least two bytes
    Reader r(src_.hdr.data + hdr.table_offset, src_.hdr.data + src_.hdr.size,
             src_.hdr.address + hdr.table_offset);
    for (std::uint64_t i = 0; i < hdr.fde_count; ++i) {
      std::uint64_t initial_loc, fde_address;
      if (!r.Encoded(hdr.table_encoding, src_.hdr.address, false, initial_loc)) return false;
      if (!r.Encoded(hdr.table_encoding, src_.hdr.address, false, fde_address)) return false;
      if (fde_address < eh_.address || fde_address - eh_.address >= eh_.size) return false;
    }
    return true;
  }

  // Bytes of one value of a .eh_frame_hdr table encoding; 0 for LEB128 or
  // an unknown one (no random access).
  static std::size_t EntryWidth(std::uint8_t encoding) noexcept {
    switch (encoding & 0x0f) {
      case kPeUdata2:
      case kPeSdata2:
        return 2;
      case kPeUdata4:
      case kPeSdata4:
        return 4;
      case kPeAbsptr:
      case kPeUdata8:
      case kPeSdata8:
        return 8;
      default:
        return 0;
    }
  }

  const Cie* FindCie(std::size_t offset) noexcept {
    for (CacheSlot& s : cache_)
      if (s.used && s.cie.offset == offset) return s.ok ? &s.cie : nullptr;
    CacheSlot& s = cache_[next_slot_];
    next_slot_ = (next_slot_ + 1) % kCacheSlots;
    s.used = true;
    s.ok = false;
    s.cie.offset = offset;
    Entry e;
    Cie cie;
    if (!ReadEntry(eh_.data, eh_.size, offset, e) || !ParseCie(eh_, e, cie)) return nullptr;
    cie.offset = offset;
    FrameState st;
    auto no_emit = [](std::uint64_t, const FrameState&) {};
    if (!RunProgram(eh_, cie.insns, cie.insns_end, cie, st, nullptr, 0, 0, no_emit)) return nullptr;
    s.cie = cie;
    s.initial = st;
    s.ok = true;
    return &s.cie;
  }
  const FrameState& InitialState(const Cie* cie) const noexcept {
    for (const CacheSlot& s : cache_)
      if (&s.cie == cie) return s.initial;
    return cache_[0].initial;  // unreachable: `cie` came from the cache
  }

  void DoFde(std::size_t offset, ParseStats& st) noexcept {
    Entry e;
    std::size_t cie_offset;
    if (!ReadEntry(eh_.data, eh_.size, offset, e) || e.terminator || !FdeCieOffset(e, cie_offset)) {
      ++st.fdes_bad;
      return;
    }
    const Cie* cie = FindCie(cie_offset);
    Fde fde;
    if (cie == nullptr || !ParseFde(eh_, e, *cie, fde)) {
      ++st.fdes_bad;
      return;
    }
    if (fde.pc_end == fde.pc_begin || fde.pc_begin < src_.pc_lo || fde.pc_end > src_.pc_hi) {
      ++st.fdes_skipped;  // a discarded function (GC'ed, relocated to 0) or an empty range
      return;
    }
    const std::size_t mark = out_.size();
    FrameState state = InitialState(cie);
    const bool signal_frame = cie->signal_frame;
    bool oom = false;
    auto emit = [&](std::uint64_t pc, const FrameState& s) {
      const Rule rule = EncodeRule(s, signal_frame);
      if (out_.size() > mark && out_.back().rule == rule) return;  // same layout continues
      if (!out_.Push(pc, rule)) oom = true;
    };
    const FrameState initial = state;
    if (!RunProgram(eh_, fde.insns, fde.insns_end, *cie, state, &initial, fde.pc_begin, fde.pc_end, emit) ||
        oom || out_.size() == mark) {
      out_.Truncate(mark);
      if (!oom) ++st.fdes_bad;
      return;
    }
    if (!out_.Push(fde.pc_end, Rule::None())) {
      out_.Truncate(mark);
      return;
    }
    ++st.fdes;
  }

  static constexpr int kCacheSlots = 8;  // objects have 1-3 CIEs; a few more for odd ones
  struct CacheSlot {
    bool used = false;
    bool ok = false;
    Cie cie;
    FrameState initial;
  };

  const Source& src_;
  const Region& eh_;
  RowBuffer& out_;
  CacheSlot cache_[kCacheSlots];
  int next_slot_ = 0;
};

// Orders rows by pc; at equal pcs a real rule sorts before kCfaNone, so an FDE
// starting exactly where the previous one ends wins over its terminator.
inline bool RowLess(const Row& a, const Row& b) noexcept {
  if (a.pc != b.pc) return a.pc < b.pc;
  return a.rule.cfa_kind() != kCfaNone && b.rule.cfa_kind() == kCfaNone;
}

// In-place heapsort: no allocation, O(n log n) worst case. Only needed when
// FDEs are not in address order (no .eh_frame_hdr, or odd linkers).
inline void SortRows(Row* rows, std::size_t n) noexcept {
  auto sift = [rows](std::size_t root, std::size_t end) {
    for (;;) {
      std::size_t child = 2 * root + 1;
      if (child >= end) return;
      if (child + 1 < end && RowLess(rows[child], rows[child + 1])) ++child;
      if (!RowLess(rows[root], rows[child])) return;
      const Row t = rows[root];
      rows[root] = rows[child];
      rows[child] = t;
      root = child;
    }
  };
  if (n < 2) return;
  for (std::size_t i = n / 2; i-- > 0;) sift(i, n);
  for (std::size_t end = n - 1; end > 0; --end) {
    const Row t = rows[0];
    rows[0] = rows[end];
    rows[end] = t;
    sift(0, end);
  }
}

// Sorted, one row per pc, no two neighbours with the same rule, no leading
// kCfaNone rows. Afterwards the last row (if any) is a kCfaNone terminator.
// Rows with equal pcs are common and need no sort: the previous FDE's
// terminator sits exactly where the next FDE starts. Of such a group the first
// real rule wins.
inline void FinishRows(RowBuffer& buf) noexcept {
  Row* rows = buf.data();
  const std::size_t n = buf.size();
  bool sorted = true;
  for (std::size_t i = 1; i < n && sorted; ++i) sorted = rows[i - 1].pc <= rows[i].pc;
  if (!sorted) SortRows(rows, n);
  std::size_t out = 0;
  for (std::size_t i = 0; i < n;) {
    const std::uint64_t pc = rows[i].pc;
    Rule rule = rows[i].rule;
    for (++i; i < n && rows[i].pc == pc; ++i)
      if (rule.cfa_kind() == kCfaNone) rule = rows[i].rule;
    if (out == 0 && rule.cfa_kind() == kCfaNone) continue;
    if (out != 0 && rows[out - 1].rule == rule) continue;
    rows[out].pc = pc;  // out < i: never overwrites a row still to be read
    rows[out].rule = rule;
    ++out;
  }
  buf.Truncate(out);
}

// Everything: parse, then finish. False only on out-of-memory.
inline bool ParseEhFrame(const Source& src, RowBuffer& out, ParseStats* stats = nullptr) noexcept {
  Parser parser(src, out);
  const bool ok = parser.Run(stats);
  FinishRows(out);
  return ok;
}

// The rule for `pc` in finished rows (binary search), kCfaNone if none covers
// it. The unwinder has its own compact table; this is for tests and tools.
inline Rule FindRule(const Row* rows, std::size_t n, std::uint64_t pc) noexcept {
  std::size_t lo = 0, hi = n;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (rows[mid].pc <= pc)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo == 0 ? Rule::None() : rows[lo - 1].rule;
}

}  // namespace eh
}  // namespace detail
}  // namespace heapprof
