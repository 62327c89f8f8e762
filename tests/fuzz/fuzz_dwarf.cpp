// libFuzzer target for the DWARF reader (units, abbreviations, line programs,
// inline scopes, names) and the zlib inflater. HEAPPROF_FUZZ_SMOKE_RUNS=50000
// HEAPPROF_FUZZ_CI_RUNS=200000 (4 s in CI's fuzz stage)
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       tests/fuzz/fuzz_dwarf.cpp -o fuzz_dwarf
//   ./fuzz_dwarf -max_total_time=60 [corpus_dir]
//
// Input: byte 0 selects the inflater (odd) or the DWARF reader (even). For the
// reader, 8 two-byte lengths cut the rest into .debug_info, .debug_abbrev,
// .debug_line, .debug_str, .debug_line_str, .debug_str_offsets, .debug_addr
// and .debug_rnglists (.debug_ranges shares the last); a few addresses from
// the input are then looked up. The same sections also stand for the file
// that dwz -m's DW_FORM_GNU_ref_alt / GNU_strp_alt and DWARF 5's ref_sup /
// strp_sup point into, and for the .dwo file a split-DWARF skeleton unit
// names (its split unit found there by dwo_id), and .debug_line_str for
// a .dwp package's unit index, looked up by the first 8 bytes. The check: no crash, no UB, no read outside
// the sections (exact-size buffers: ASan sees any overread), and every frame
// returned points at a NUL-terminated name.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "heapprof/detail/4_symbolization/dwarf_info.hpp"
#include "heapprof/detail/4_symbolization/inflate.hpp"

namespace dw = heapprof::detail::dwarf;

namespace {
// The .dwo of every skeleton unit: the input's own sections.
bool OpenDwo(void* context, const char*, const char*, std::uint64_t, dw::Sections* out) {
  *out = *static_cast<const dw::Sections*>(context);
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  ++data;
  --size;
  if (mode & 1) {
    unsigned char out[4096];
    const std::size_t want = size > 0 ? (data[0] * 16u) % sizeof out + 1 : 1;
    (void)heapprof::detail::inflate::ZlibInflate(data, size, out, want);
    return 0;
  }
  if (size < 16) return 0;
  dw::Sections s;
  heapprof::detail::elf::ByteView* parts[8] = {&s.info, &s.abbrev, &s.line, &s.str,
                                               &s.line_str, &s.str_offsets, &s.addr, &s.rnglists};
  std::size_t at = 16;
  for (int i = 0; i < 8; ++i) {
    std::size_t len = static_cast<std::size_t>(data[2 * i]) | (static_cast<std::size_t>(data[2 * i + 1]) << 8);
    if (at > size) len = 0;
    else if (len > size - at) len = size - at;
    *parts[i] = heapprof::detail::elf::ByteView{data + at, len};
    at += len;
  }
  s.ranges = s.rnglists;
  dw::DwarfInfo sup(s);  // (before info, which points at it)
  s.sup_str = s.str;
  dw::DwarfInfo info(s);
  info.SetSupplementary(&sup);
  dw::Sections dwo = s;
  info.SetDwoOpener(&OpenDwo, &dwo);
  {
    std::uint64_t id = 0;
    std::memcpy(&id, data, 8);
    dw::Sections unit;
    dw::UnitHeader header;
    if (dw::DwpUnitSections(s, s.line_str, id, &unit)) (void)dw::FindSplitUnit(unit, id, &header);
  }
  for (std::size_t k = 0; k < 8 && k * 8 + 8 <= size; ++k) {
    std::uint64_t address = 0;
    std::memcpy(&address, data + k * 8, 8);
    if (k & 1) address &= 0xffff;  // small addresses hit hand-made ranges
    dw::SourceFrame frames[16];
    bool inline_known = false;
    const int n = info.Lookup(address, frames, 16, &inline_known);
    for (int i = 0; i < n; ++i) {
      if (frames[i].function != nullptr) {
        volatile std::size_t sink = std::strlen(frames[i].function->name) + std::strlen(frames[i].function->system_name);
        (void)sink;
      }
      if (frames[i].file != nullptr) {
        volatile std::size_t sink = std::strlen(frames[i].file);
        (void)sink;
      }
    }
  }
  return 0;
}
