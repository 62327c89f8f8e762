// The .eh_frame parser on byte arrays: hand-assembled CIEs and FDEs with
// known rows, every pointer encoding, the expression shapes we recognise,
// malformed input (truncated, bad lengths, bad encodings, bad programs) and a
// deterministic mutation loop; then the real libc and libstdc++ through both
// the .eh_frame_hdr table and the linear walk.
#include <doctest/doctest.h>

#include <link.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "heapprof/detail/3_unwinding/eh_frame.hpp"
#include "heapprof/detail/3_unwinding/table.hpp"

namespace eh = heapprof::detail::eh;

namespace {

// Where the blobs pretend to live: pcrel pointers are relative to these.
constexpr std::uint64_t kEhAddress = 0x100000;
constexpr std::uint64_t kHdrAddress = 0x200000;

struct Blob {
  std::vector<std::uint8_t> b;

  std::size_t size() const { return b.size(); }
  void u8(std::uint64_t v) { b.push_back(static_cast<std::uint8_t>(v)); }
  void u16(std::uint64_t v) { Fixed(v, 2); }
  void u32(std::uint64_t v) { Fixed(v, 4); }
  void u64(std::uint64_t v) { Fixed(v, 8); }
  void Fixed(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void uleb(std::uint64_t v) {
    do {
      std::uint8_t byte = v & 0x7f;
      v >>= 7;
      if (v != 0) byte |= 0x80;
      b.push_back(byte);
    } while (v != 0);
  }
  void sleb(std::int64_t v) {
    for (;;) {
      std::uint8_t byte = v & 0x7f;
      v >>= 7;
      const bool done = (v == 0 && !(byte & 0x40)) || (v == -1 && (byte & 0x40));
      if (!done) byte |= 0x80;
      b.push_back(byte);
      if (done) return;
    }
  }
  void bytes(std::initializer_list<int> list) {
    for (int x : list) u8(static_cast<std::uint64_t>(x));
  }
  void Patch32(std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
  }
  void Align(std::size_t a) {
    while (b.size() % a) u8(0);  // DW_CFA_nop padding
  }
  // An encoded pointer at the current end (pcrel relative to kEhAddress + offset).
  void Encoded(std::uint8_t enc, std::uint64_t value) {
    const std::uint64_t field = kEhAddress + b.size();
    if ((enc & 0x70) == eh::kPeAligned) {
      while ((kEhAddress + b.size()) % 8) u8(0);
      u64(value);
      return;
    }
    if ((enc & 0x70) == eh::kPePcrel) value -= field;
    switch (enc & 0x0f) {
      case eh::kPeAbsptr:
      case eh::kPeUdata8:
      case eh::kPeSdata8:
      case eh::kPeSigned:
        u64(value);
        break;
      case eh::kPeUdata2:
      case eh::kPeSdata2:
        u16(value);
        break;
      case eh::kPeUdata4:
      case eh::kPeSdata4:
        u32(value);
        break;
      case eh::kPeUleb128:
        uleb(value);
        break;
      case eh::kPeSleb128:
        sleb(static_cast<std::int64_t>(value));
        break;
      default:
        u32(value);  // for invalid formats: some bytes
    }
  }
};

// CIE with augmentation `aug` ("" or starting with 'z'); returns its offset.
struct CieSpec {
  std::string aug = "zR";
  std::uint8_t fde_encoding = 0x1b;  // pcrel | sdata4, what GCC emits
  std::uint8_t version = 1;
  std::uint64_t ra = 16;
  std::vector<int> insns = {0x0c, 7, 8, 0x90, 1};  // def_cfa rsp+8; rip at cfa-8
  std::vector<int> raw_aug_data;                     // overrides the computed augmentation data
};

std::size_t AddCie(Blob& blob, const CieSpec& s) {
  const std::size_t at = blob.size();
  blob.u32(0);  // length, patched
  blob.u32(0);  // CIE id
  blob.u8(s.version);
  for (char c : s.aug) blob.u8(static_cast<std::uint8_t>(c));
  blob.u8(0);
  blob.uleb(1);    // code alignment
  blob.sleb(-8);   // data alignment
  if (s.version == 1)
    blob.u8(s.ra);
  else
    blob.uleb(s.ra);
  if (!s.aug.empty() && s.aug[0] == 'z') {
    Blob data;
    if (!s.raw_aug_data.empty()) {
      for (int x : s.raw_aug_data) data.u8(static_cast<std::uint64_t>(x));
    } else {
      for (char c : s.aug.substr(1)) {
        if (c == 'R') data.u8(s.fde_encoding);
        if (c == 'L') data.u8(0x1b);
        if (c == 'P') {
          data.u8(0x9b);  // indirect | pcrel | sdata4: skipped, never followed
          data.u32(0x1234);
        }
      }
    }
    blob.uleb(data.size());
    blob.b.insert(blob.b.end(), data.b.begin(), data.b.end());
  }
  for (int x : s.insns) blob.u8(static_cast<std::uint64_t>(x));
  blob.Align(8);
  blob.Patch32(at, static_cast<std::uint32_t>(blob.size() - at - 4));
  return at;
}

struct FdeSpec {
  std::uint64_t pc = 0x1000;
  std::uint64_t range = 0x40;
  std::uint8_t encoding = 0x1b;  // must match the CIE's
  bool z = true;                 // CIE has 'z': augmentation length present
  std::vector<int> aug_data;     // e.g. an LSDA pointer
  std::vector<int> insns;
  bool pad = true;  // pad to 8 bytes with DW_CFA_nop, as assemblers do
};

std::size_t AddFde(Blob& blob, std::size_t cie, const FdeSpec& s) {
  const std::size_t at = blob.size();
  blob.u32(0);
  blob.u32(static_cast<std::uint32_t>(blob.size() - cie));  // CIE pointer: back from this field
  blob.Encoded(s.encoding, s.pc);
  const std::uint8_t format = s.encoding & 0x0f;
  blob.Encoded(format, s.range);  // range: the value part only
  if (s.z) {
    blob.uleb(s.aug_data.size());
    for (int x : s.aug_data) blob.u8(static_cast<std::uint64_t>(x));
  }
  for (int x : s.insns) blob.u8(static_cast<std::uint64_t>(x));
  if (s.pad) blob.Align(8);
  blob.Patch32(at, static_cast<std::uint32_t>(blob.size() - at - 4));
  return at;
}

// A .eh_frame_hdr for `fdes` (offset in blob, initial pc), sorted as given.
Blob MakeHdr(const std::vector<std::pair<std::size_t, std::uint64_t>>& fdes) {
  Blob h;
  h.bytes({1, 0x1b, 0x03, 0x3b});
  const std::uint64_t field = kHdrAddress + h.size();
  h.u32(kEhAddress - field);
  h.u32(fdes.size());
  for (const auto& f : fdes) {
    h.u32(f.second - kHdrAddress);
    h.u32(kEhAddress + f.first - kHdrAddress);
  }
  return h;
}

using Rows = std::vector<std::pair<std::uint64_t, std::uint32_t>>;

Rows Parse(const std::vector<std::uint8_t>& eh_bytes, const std::vector<std::uint8_t>* hdr = nullptr,
           eh::ParseStats* stats = nullptr) {
  eh::Source src;
  src.eh_frame.data = eh_bytes.data();
  src.eh_frame.size = eh_bytes.size();
  src.eh_frame.address = kEhAddress;
  if (hdr != nullptr) {
    src.hdr.data = hdr->data();
    src.hdr.size = hdr->size();
    src.hdr.address = kHdrAddress;
  }
  eh::RowBuffer buf;
  eh::ParseStats local;
  REQUIRE(eh::ParseEhFrame(src, buf, stats != nullptr ? stats : &local));
  Rows out;
  for (std::size_t i = 0; i < buf.size(); ++i) out.emplace_back(buf[i].pc, buf[i].rule.bits);
  return out;
}

std::uint32_t SpRel(std::int64_t off, eh::FpKind fp = eh::kFpSame, std::int64_t fp_off = 0) {
  return eh::Rule::Make(eh::kCfaSpRel, off, fp, fp_off).bits;
}
std::uint32_t FpRel(std::int64_t off, eh::FpKind fp, std::int64_t fp_off) {
  return eh::Rule::Make(eh::kCfaFpRel, off, fp, fp_off).bits;
}

// push rbp; mov rsp,rbp; ...; leave; ret — the classic frame.
const std::vector<int> kPrologue = {
    0x41,        // advance_loc 1
    0x0e, 16,    // def_cfa_offset 16
    0x86, 2,     // rbp at cfa-16
    0x43,        // advance_loc 3
    0x0d, 6,     // def_cfa_register rbp
    0x40 | 0x30, // advance_loc 48
    0x0c, 7, 8,  // def_cfa rsp+8
};
const Rows kPrologueRows = {
    {0x1000, SpRel(8)},
    {0x1001, SpRel(16, eh::kFpAtCfa, -16)},
    {0x1004, FpRel(16, eh::kFpAtCfa, -16)},
    {0x1034, SpRel(8, eh::kFpAtCfa, -16)},
    {0x1040, 0},
};

Rows PrologueRowsAt(std::uint64_t pc) {
  Rows rows = kPrologueRows;
  for (auto& r : rows) r.first = r.first - 0x1000 + pc;
  return rows;
}

}  // namespace

TEST_CASE("rule packing round-trips every field") {
  for (std::int64_t off : {std::int64_t{-524288}, std::int64_t{-8}, std::int64_t{0}, std::int64_t{8},
                           std::int64_t{5016}, std::int64_t{524287}}) {
    for (std::int64_t fp_off : {-512, -16, 0, 8, 504}) {
      for (auto fk : {eh::kFpSame, eh::kFpAtCfa, eh::kFpAtFp, eh::kFpLost}) {
        const eh::Rule r = eh::Rule::Make(eh::kCfaFpDeref, off, fk, fp_off);
        CHECK(r.cfa_kind() == eh::kCfaFpDeref);
        CHECK(r.cfa_offset() == off);
        CHECK(r.fp_kind() == fk);
        CHECK(r.fp_offset() == fp_off);
      }
    }
  }
  const eh::Rule plt = eh::Rule::Plt(8, 11);
  CHECK(plt.cfa_kind() == eh::kCfaPlt);
  CHECK(plt.cfa_offset() == 8);
  CHECK(plt.plt_threshold() == 11);
  CHECK_FALSE(eh::Rule::CfaOffsetFits(524288));
  CHECK_FALSE(eh::Rule::FpOffsetFits(-520));
  CHECK_FALSE(eh::Rule::FpOffsetFits(-12));
}

TEST_CASE("a classic prologue gives one row per layout change") {
  Blob blob;
  const std::size_t cie = AddCie(blob, {});
  FdeSpec f;
  f.insns = kPrologue;
  AddFde(blob, cie, f);
  blob.u32(0);  // terminator
  CHECK(Parse(blob.b) == kPrologueRows);
}

TEST_CASE("every DW_EH_PE encoding of the FDE address") {
  struct Case {
    std::uint8_t enc;
    bool ok;
  };
  const Case cases[] = {
      {0x00, true},  {0x01, true},  {0x02, true},  {0x03, true},  {0x04, true},  {0x09, true},
      {0x0a, true},  {0x0b, true},  {0x0c, true},  {0x08, true},  {0x10, true},  {0x11, true},
      {0x12, true},  {0x13, true},  {0x14, true},  {0x19, true},  {0x1a, true},  {0x1b, true},
      {0x1c, true},  {0x50, true},
      {0x20, false},  // textrel: no base known
      {0x3b, false},  // datarel: only meaningful in .eh_frame_hdr
      {0x40, false},  // funcrel
      {0x9b, false},  // indirect FDE address
      {0x05, false},  // undefined formats
      {0x0f, false},  {0x70, false},
  };
  for (const Case& c : cases) {
    CAPTURE(static_cast<int>(c.enc));
    Blob blob;
    CieSpec cs;
    cs.fde_encoding = c.enc;
    const std::size_t cie = AddCie(blob, cs);
    FdeSpec f;
    f.encoding = c.enc;
    // pcrel with a 2-byte or unsigned field: the code must sit just above
    // the record for the difference to fit.
    if ((c.enc & 0x70) == eh::kPePcrel) f.pc = kEhAddress + 0x800;
    f.insns = kPrologue;
    AddFde(blob, cie, f);
    blob.u32(0);
    const Rows rows = Parse(blob.b);
    if (c.ok)
      CHECK(rows == PrologueRowsAt(f.pc));
    else
      CHECK(rows.empty());
  }
}

TEST_CASE("CIE shapes: versions, augmentations, signal frames") {
  SUBCASE("no augmentation: absolute 8-byte addresses") {
    Blob blob;
    CieSpec cs;
    cs.aug = "";
    cs.fde_encoding = 0;
    const std::size_t cie = AddCie(blob, cs);
    FdeSpec f;
    f.encoding = 0;
    f.z = false;
    f.insns = kPrologue;
    AddFde(blob, cie, f);
    CHECK(Parse(blob.b) == kPrologueRows);
  }
  SUBCASE("zPLR with personality and an LSDA pointer in the FDE") {
    Blob blob;
    CieSpec cs;
    cs.aug = "zPLR";
    const std::size_t cie = AddCie(blob, cs);
    FdeSpec f;
    f.aug_data = {0x10, 0x20, 0x30, 0x40};
    f.insns = kPrologue;
    AddFde(blob, cie, f);
    CHECK(Parse(blob.b) == kPrologueRows);
  }
  SUBCASE("version 3: return address column as ULEB128") {
    Blob blob;
    CieSpec cs;
    cs.version = 3;
    const std::size_t cie = AddCie(blob, cs);
    FdeSpec f;
    f.insns = kPrologue;
    AddFde(blob, cie, f);
    CHECK(Parse(blob.b) == kPrologueRows);
  }
  SUBCASE("'S' signal frame: the signal rule, whatever the CFA program says") {
    Blob blob;
    CieSpec cs;
    cs.aug = "zRS";
    const std::size_t cie = AddCie(blob, cs);
    FdeSpec f;
    f.insns = kPrologue;
    AddFde(blob, cie, f);
    const Rows rows = Parse(blob.b);
    REQUIRE(rows.size() == 2);
    CHECK(eh::Rule{rows[0].second}.cfa_kind() == eh::kCfaSignal);
  }
  SUBCASE("rejected: \"eh\", unknown letters, bad versions, bad personality encoding") {
    for (int variant = 0; variant < 5; ++variant) {
      CAPTURE(variant);
      Blob blob;
      CieSpec cs;
      if (variant == 0) cs.aug = "eh";
      if (variant == 1) cs.aug = "zRX";
      if (variant == 2) cs.version = 2;
      if (variant == 3) cs.version = 9;
      if (variant == 4) {
        cs.aug = "zPR";
        cs.raw_aug_data = {0x07, 0, 0, 0, 0, 0x1b};  // personality with an undefined format
      }
      const std::size_t cie = AddCie(blob, cs);
      FdeSpec f;
      f.insns = kPrologue;
      AddFde(blob, cie, f);
      CHECK(Parse(blob.b).empty());
    }
  }
}

TEST_CASE("CFA programs: state stack, restore, expressions, undefined RA") {
  auto one = [](std::vector<int> insns, CieSpec cs = {}) {
    Blob blob;
    const std::size_t cie = AddCie(blob, cs);
    FdeSpec f;
    f.insns = std::move(insns);
    AddFde(blob, cie, f);
    return Parse(blob.b);
  };
  SUBCASE("remember/restore_state around an early return") {
    const Rows rows = one({
        0x41, 0x0e, 16, 0x86, 2,  // push rbp
        0x41, 0x0e, 24, 0x83, 3,  // push rbx
        0x44, 0x0a,               // remember_state
        0x0e, 16, 0xc3,           // pop rbx: cfa 16, restore rbx
        0x41, 0x0e, 8, 0xc6,      // pop rbp: cfa 8, restore rbp
        0x41, 0x0b,               // ret; restore_state
        0x48, 0x0e, 8,            // the other exit
    });
    const Rows want = {
        {0x1000, SpRel(8)},
        {0x1001, SpRel(16, eh::kFpAtCfa, -16)},
        {0x1002, SpRel(24, eh::kFpAtCfa, -16)},
        {0x1006, SpRel(16, eh::kFpAtCfa, -16)},
        {0x1007, SpRel(8)},
        {0x1008, SpRel(24, eh::kFpAtCfa, -16)},
        {0x1010, SpRel(8, eh::kFpAtCfa, -16)},
        {0x1040, 0},
    };
    CHECK(rows == want);
  }
  SUBCASE("GNU_args_size and nops change nothing") {
    const Rows rows = one({0x2e, 16, 0, 0, 0x41, 0x2e, 0, 0x0e, 16});
    const Rows want = {{0x1000, SpRel(8)}, {0x1001, SpRel(16)}, {0x1040, 0}};
    CHECK(rows == want);
  }
  SUBCASE("advance_loc1/2/4 and the _sf forms") {
    const Rows rows = one({0x02, 4, 0x13, 0x7e,              // advance 4; def_cfa_offset_sf -2*-8 = 16
                           0x03, 4, 0, 0x12, 7, 0x7d,        // advance 4; def_cfa_sf rsp, 24
                           0x04, 4, 0, 0, 0, 0x11, 6, 0x7e,  // advance 4; rbp at cfa + (-2 * -8)? no: -2*-8=16
                           0x2f, 6, 3});                     // GNU_negative_offset_extended rbp: cfa - (-3*-8)
    const Rows want = {{0x1000, SpRel(8)},
                       {0x1004, SpRel(16)},
                       {0x1008, SpRel(24)},
                       {0x100c, SpRel(24, eh::kFpAtCfa, 24)},
                       {0x1040, 0}};
    CHECK(rows == want);
  }
  SUBCASE("the PLT expression") {
    const Rows rows = one({0x0e, 16, 0x46, 0x0e, 24, 0x4a, 0x0f, 11, 0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a,
                           0x33, 0x24, 0x22});
    const Rows want = {{0x1000, SpRel(16)},
                       {0x1006, SpRel(24)},
                       {0x1010, eh::Rule::Plt(8, 11).bits},
                       {0x1040, 0}};
    CHECK(rows == want);
  }
  SUBCASE("the stack-realigning prologue: CFA = *(rbp - 8), rbp at [rbp]") {
    const Rows rows = one({0x44, 0x0c, 10, 0,              // def_cfa r10+0
                           0x48, 0x10, 6, 2, 0x76, 0,      // DW_CFA_expression rbp: breg6 0
                           0x41, 0x0f, 3, 0x76, 0x78, 0x06});  // def_cfa_expression breg6 -8; deref
    const Rows want = {{0x1000, SpRel(8)},
                       {0x1004, 0},  // CFA in r10: no row we can use
                       {0x100d, eh::Rule::Make(eh::kCfaFpDeref, -8, eh::kFpAtFp, 0).bits},
                       {0x1040, 0}};
    CHECK(rows == want);
  }
  SUBCASE("other expressions and registers: no usable row") {
    const Rows rows = one({0x41, 0x0f, 2, 0x77, 0x10,          // def_cfa_expression breg7 16 (no deref)
                           0x41, 0x0c, 7, 16, 0x09, 16, 0x05,  // CFA back; RA in rdi
                           0x41, 0x90, 1, 0x16, 6, 1, 0x30,    // RA back; rbp = val_expression
                           0x41, 0x14, 6, 1});                 // rbp val_offset
    const Rows want = {{0x1000, SpRel(8)},
                       {0x1001, 0},
                       {0x1003, SpRel(16, eh::kFpLost, 0)},
                       {0x1040, 0}};
    CHECK(rows == want);
  }
  SUBCASE("undefined return address: the outermost frame") {
    const Rows rows = one({0x07, 16});
    REQUIRE(rows.size() == 2);
    CHECK(eh::Rule{rows[0].second}.cfa_kind() == eh::kCfaEnd);
  }
  SUBCASE("restore and restore_extended go back to the CIE's rule") {
    CieSpec cs;
    cs.insns = {0x0c, 7, 8, 0x90, 1, 0x86, 4};  // the CIE itself saves rbp at cfa-32
    const Rows rows = one({0x41, 0x86, 2, 0x41, 0xc6, 0x41, 0x86, 3, 0x41, 0x06, 6}, cs);
    const Rows want = {{0x1000, SpRel(8, eh::kFpAtCfa, -32)},
                       {0x1001, SpRel(8, eh::kFpAtCfa, -16)},
                       {0x1002, SpRel(8, eh::kFpAtCfa, -32)},
                       {0x1003, SpRel(8, eh::kFpAtCfa, -24)},
                       {0x1004, SpRel(8, eh::kFpAtCfa, -32)},
                       {0x1040, 0}};
    CHECK(rows == want);
  }
  SUBCASE("a frame larger than the rule can hold: no row") {
    const Rows rows = one({0x41, 0x0e, 0x80, 0x80, 0x40});  // def_cfa_offset 1 MiB
    const Rows want = {{0x1000, SpRel(8)}, {0x1001, 0}};  // the terminator merges into the gap
    CHECK(rows == want);
  }
  SUBCASE("advancing past the end is clipped") {
    const Rows rows = one({0x04, 0, 0, 0, 1, 0x0e, 16});
    const Rows want = {{0x1000, SpRel(8)}, {0x1040, 0}};
    CHECK(rows == want);
  }
}

TEST_CASE("malformed FDEs give no rows, their neighbours are unaffected") {
  // Each case: a bad FDE between two good ones. Absolute 4-byte addresses, so
  // a set_loc operand is easy to write.
  struct Bad {
    const char* what;
    std::vector<int> insns;
    bool pad;
  };
  const Bad bad[] = {
      {"restore_state with an empty stack", {0x41, 0x0b}, true},
      {"remember_state 17 deep", std::vector<int>(17, 0x0a), true},
      {"unknown opcode", {0x41, 0x3f}, true},
      {"operand runs off the end", {0x41, 0x0c, 7}, false},
      {"expression longer than the FDE", {0x0f, 0x7f, 0x77}, true},
      {"set_loc backwards", {0x44, 0x01, 0x00, 0x20, 0, 0}, true},
      {"ULEB128 never ends", {0x0e, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, false},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.what);
    Blob blob;
    CieSpec cs;
    cs.fde_encoding = eh::kPeUdata4;
    const std::size_t cie = AddCie(blob, cs);
    FdeSpec good1;
    good1.encoding = eh::kPeUdata4;
    good1.insns = kPrologue;
    AddFde(blob, cie, good1);
    FdeSpec broken;
    broken.encoding = eh::kPeUdata4;
    broken.pc = 0x2000;
    broken.insns = b.insns;
    broken.pad = b.pad;
    AddFde(blob, cie, broken);
    FdeSpec good2;
    good2.encoding = eh::kPeUdata4;
    good2.pc = 0x3000;
    good2.range = 0x10;
    AddFde(blob, cie, good2);
    blob.u32(0);
    eh::ParseStats stats;
    const Rows rows = Parse(blob.b, nullptr, &stats);
    Rows want = kPrologueRows;
    want.push_back({0x3000, SpRel(8)});
    want.push_back({0x3010, 0});
    CHECK(rows == want);
    CHECK(stats.fdes == 2);
    CHECK(stats.fdes_bad == 1);
  }
}

TEST_CASE("bad record headers: lengths, CIE pointers, truncation") {
  Blob blob;
  const std::size_t cie = AddCie(blob, {});
  FdeSpec f;
  f.insns = kPrologue;
  const std::size_t fde = AddFde(blob, cie, f);
  blob.u32(0);
  REQUIRE(Parse(blob.b) == kPrologueRows);

  SUBCASE("every truncation") {
    for (std::size_t n = 0; n < blob.size(); ++n) {
      std::vector<std::uint8_t> cut(blob.b.begin(), blob.b.begin() + static_cast<std::ptrdiff_t>(n));
      const Rows rows = Parse(cut);
      CHECK((rows.empty() || rows == kPrologueRows));
    }
  }
  SUBCASE("FDE length past the end") {
    Blob b2 = blob;
    b2.Patch32(fde, 0x7ffffff0);
    CHECK(Parse(b2.b).empty());
  }
  SUBCASE("64-bit length field past the end") {
    Blob b2;
    b2.u32(0xffffffff);
    b2.u64(0xffffffffffffull);
    b2.u32(0);
    CHECK(Parse(b2.b).empty());
  }
  SUBCASE("length shorter than the id field") {
    Blob b2 = blob;
    b2.Patch32(fde, 2);
    CHECK(Parse(b2.b).empty());
  }
  SUBCASE("CIE pointer out of range, or at an FDE") {
    Blob b2 = blob;
    b2.Patch32(fde + 4, 0x10000);
    CHECK(Parse(b2.b).empty());
    Blob b3 = blob;
    b3.Patch32(fde + 4, 4);  // points at the FDE's own length field
    CHECK(Parse(b3.b).empty());
  }
  SUBCASE("CIE length cuts its augmentation string") {
    Blob b2 = blob;
    b2.Patch32(cie, 6);
    CHECK(Parse(b2.b).empty());
  }
}

TEST_CASE("the .eh_frame_hdr table and the linear walk agree; FDE order does not matter") {
  Blob blob;
  const std::size_t cie = AddCie(blob, {});
  // FDEs stored out of address order, one adjacent to another.
  FdeSpec a;
  a.pc = 0x3000;
  a.range = 0x20;
  a.insns = {0x41, 0x0e, 16};
  FdeSpec b;
  b.pc = 0x1000;
  b.insns = kPrologue;
  FdeSpec c;
  c.pc = 0x1040;  // starts where b ends: b's terminator gives way
  c.range = 0x10;
  c.insns = {0x42, 0x0e, 32};
  const std::size_t fa = AddFde(blob, cie, a);
  const std::size_t fb = AddFde(blob, cie, b);
  const std::size_t fc = AddFde(blob, cie, c);
  blob.u32(0);
  Rows want = kPrologueRows;
  want.pop_back();  // 0x1040 continues with c
  want.push_back({0x1040, SpRel(8)});
  want.push_back({0x1042, SpRel(32)});
  want.push_back({0x1050, 0});
  want.push_back({0x3000, SpRel(8)});
  want.push_back({0x3001, SpRel(16)});
  want.push_back({0x3020, 0});
  eh::ParseStats linear_stats, table_stats;
  CHECK(Parse(blob.b, nullptr, &linear_stats) == want);
  CHECK_FALSE(linear_stats.used_hdr_table);
  const Blob hdr = MakeHdr({{fb, 0x1000}, {fc, 0x1040}, {fa, 0x3000}});
  CHECK(Parse(blob.b, &hdr.b, &table_stats) == want);
  CHECK(table_stats.used_hdr_table);
  // A table entry pointing outside .eh_frame: the table is not trusted, the
  // linear walk still finds everything.
  const Blob bad_hdr = MakeHdr({{fb, 0x1000}, {fc + 0x100000, 0x1040}, {fa, 0x3000}});
  eh::ParseStats fallback_stats;
  CHECK(Parse(blob.b, &bad_hdr.b, &fallback_stats) == want);
  CHECK_FALSE(fallback_stats.used_hdr_table);
  // A truncated table is the same.
  Blob short_hdr = hdr;
  short_hdr.b.resize(short_hdr.b.size() - 3);
  CHECK(Parse(blob.b, &short_hdr.b) == want);
}

TEST_CASE("pc range filter drops FDEs of discarded sections") {
  Blob blob;
  const std::size_t cie = AddCie(blob, {});
  FdeSpec kept;
  kept.insns = kPrologue;
  AddFde(blob, cie, kept);
  FdeSpec empty;
  empty.pc = 0x5000;
  empty.range = 0;
  AddFde(blob, cie, empty);
  eh::Source src;
  src.eh_frame = {blob.b.data(), blob.b.size(), kEhAddress};
  src.pc_lo = 0x1000;
  src.pc_hi = 0x1040;
  eh::RowBuffer buf;
  eh::ParseStats stats;
  REQUIRE(eh::ParseEhFrame(src, buf, &stats));
  CHECK(buf.size() == kPrologueRows.size());
  CHECK(stats.fdes == 1);
  CHECK(stats.fdes_skipped == 1);
  src.pc_hi = 0x103f;  // the FDE does not fit: dropped
  eh::RowBuffer buf2;
  REQUIRE(eh::ParseEhFrame(src, buf2, &stats));
  CHECK(buf2.size() == 0);
}

TEST_CASE("random mutations never crash and never read out of bounds") {
  // A blob with several FDEs, a hdr, then byte flips, insertions, deletions
  // and length tweaks. Run under ASan: every read must stay inside the
  // vectors; the rows must stay sorted and well-formed.
  Blob blob;
  const std::size_t cie = AddCie(blob, {});
  CieSpec cs2;
  cs2.aug = "zPLR";
  const std::size_t cie2 = AddCie(blob, cs2);
  std::vector<std::pair<std::size_t, std::uint64_t>> fdes;
  for (int i = 0; i < 6; ++i) {
    FdeSpec f;
    f.pc = 0x1000 + 0x100 * static_cast<std::uint64_t>(i);
    f.insns = i % 2 ? kPrologue : std::vector<int>{0x41, 0x0a, 0x0e, 16, 0x41, 0x0b, 0x0f, 2, 0x76, 0x00};
    fdes.push_back({AddFde(blob, i % 3 ? cie : cie2, f), f.pc});
  }
  blob.u32(0);
  const Blob hdr = MakeHdr(fdes);
  std::mt19937_64 rng(12345);
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<std::uint8_t> eh_bytes = blob.b;
    std::vector<std::uint8_t> hdr_bytes = hdr.b;
    std::vector<std::uint8_t>& target = rng() % 4 == 0 ? hdr_bytes : eh_bytes;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !target.empty(); ++e) {
      const std::size_t at = rng() % target.size();
      switch (rng() % 5) {
        case 0:
          target[at] = static_cast<std::uint8_t>(rng());
          break;
        case 1:
          target[at] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
          break;
        case 2:
          target.insert(target.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::uint8_t>(rng()));
          break;
        case 3:
          target.erase(target.begin() + static_cast<std::ptrdiff_t>(at));
          break;
        default:
          target.resize(at);
      }
    }
    // Exact-size heap copies so ASan sees any overread.
    std::unique_ptr<std::uint8_t[]> e(new std::uint8_t[eh_bytes.size() + 1]);
    std::unique_ptr<std::uint8_t[]> h(new std::uint8_t[hdr_bytes.size() + 1]);
    std::memcpy(e.get(), eh_bytes.data(), eh_bytes.size());
    std::memcpy(h.get(), hdr_bytes.data(), hdr_bytes.size());
    eh::Source src;
    src.eh_frame = {e.get(), eh_bytes.size(), kEhAddress};
    if (rng() % 2) src.hdr = {h.get(), hdr_bytes.size(), kHdrAddress};
    eh::RowBuffer buf;
    eh::ParseEhFrame(src, buf);
    for (std::size_t i = 1; i < buf.size(); ++i) {
      REQUIRE(buf[i - 1].pc < buf[i].pc);
      REQUIRE(buf[i - 1].rule != buf[i].rule);
    }
    if (buf.size() != 0) {
      REQUIRE(buf[0].rule.cfa_kind() != eh::kCfaNone);
      REQUIRE(buf[buf.size() - 1].rule.cfa_kind() == eh::kCfaNone);
    }
  }
}

// ---- the real thing: every object loaded in this process

namespace {

struct ObjectParse {
  std::string name;
  Rows via_table, via_walk;
  eh::ParseStats table_stats, walk_stats;
};

int ParseLoaded(dl_phdr_info* info, std::size_t, void* data) {
  auto& out = *static_cast<std::vector<ObjectParse>*>(data);
  heapprof::detail::unwind_table::ObjectInfo oi;
  if (!heapprof::detail::unwind_table::DescribeObject(*info, oi) || oi.hdr == 0) return 0;
  eh::Source src;
  src.hdr = {reinterpret_cast<const std::uint8_t*>(oi.hdr), oi.hdr_size, oi.hdr};
  eh::Hdr hdr;
  if (!eh::ParseHdr(src.hdr, hdr)) return 0;
  const std::size_t avail = heapprof::detail::unwind_table::MappedBytesFrom(*info, hdr.eh_frame - info->dlpi_addr);
  src.eh_frame = {reinterpret_cast<const std::uint8_t*>(hdr.eh_frame), avail, hdr.eh_frame};
  src.pc_lo = oi.lo;
  src.pc_hi = oi.hi;
  ObjectParse p;
  p.name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  for (int pass = 0; pass < 2; ++pass) {
    eh::RowBuffer buf;
    eh::ParseStats& st = pass == 0 ? p.table_stats : p.walk_stats;
    eh::Source s = src;
    if (pass == 1) s.hdr = eh::Region{};
    eh::ParseEhFrame(s, buf, &st);
    Rows& rows = pass == 0 ? p.via_table : p.via_walk;
    for (std::size_t i = 0; i < buf.size(); ++i) rows.emplace_back(buf[i].pc, buf[i].rule.bits);
  }
  out.push_back(std::move(p));
  return 0;
}

}  // namespace

TEST_CASE("libc and libstdc++: both paths give the same rows, nothing malformed") {
  std::vector<ObjectParse> parsed;
  dl_iterate_phdr(&ParseLoaded, &parsed);
  int seen = 0;
  for (const ObjectParse& p : parsed) {
    CAPTURE(p.name);
    CHECK(p.table_stats.used_hdr_table);
    CHECK(p.table_stats.fdes_bad == 0);
    CHECK(p.via_table == p.via_walk);
    if (p.name.find("libc.so") != std::string::npos || p.name.find("libstdc++.so") != std::string::npos) {
      ++seen;
      CHECK(p.via_table.size() > 5000);
      std::size_t none = 0;
      for (const auto& r : p.via_table) none += eh::Rule{r.second}.cfa_kind() == eh::kCfaNone;
      MESSAGE(p.name << ": " << p.table_stats.fdes << " FDEs, " << p.via_table.size() << " rows, " << none
                     << " of them gaps or unsupported");
    }
  }
  CHECK(seen == 2);
}
