// libFuzzer target for the .eh_frame parser and the table built from it.
// HEAPPROF_FUZZ_CI_RUNS=600000 (6 s in CI's fuzz stage)
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       tests/fuzz/fuzz_eh_frame.cpp -o fuzz_eh_frame
//   ./fuzz_eh_frame -max_total_time=60 [corpus_dir]
//
// Input: byte 0 = flags, then (if flags & 1) a 2-byte length and that many
// bytes of .eh_frame_hdr, then the rest as .eh_frame. Both are parsed where
// libFuzzer put them (exact-size heap buffers: ASan sees any overread). The
// checks: no crash, no UB, and the output invariants the unwinder relies on:
// rows strictly increasing, no equal neighbours, first row real, last row a
// terminator; the compact table answers every lookup like a plain binary
// search over the rows.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "heapprof/detail/3_unwinding/eh_frame.hpp"
#include "heapprof/detail/3_unwinding/table.hpp"

namespace eh = heapprof::detail::eh;
namespace ut = heapprof::detail::unwind_table;

namespace {

constexpr std::uint64_t kEhAddress = 0x100000;
constexpr std::uint64_t kHdrAddress = 0x200000;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t flags = data[0];
  ++data;
  --size;
  eh::Source src;
  if (flags & 1) {
    if (size < 2) return 0;
    std::size_t hdr_len = static_cast<std::size_t>(data[0]) | (static_cast<std::size_t>(data[1]) << 8);
    data += 2;
    size -= 2;
    if (hdr_len > size) hdr_len = size;
    src.hdr = {data, hdr_len, kHdrAddress};
    data += hdr_len;
    size -= hdr_len;
  }
  src.eh_frame = {data, size, kEhAddress};
  if (flags & 2) {  // a narrow PC window, as for a real object
    src.pc_lo = 0x1000;
    src.pc_hi = 0x100000;
  }
  eh::RowBuffer rows;
  eh::ParseStats stats;
  eh::ParseEhFrame(src, rows, &stats);
  const std::size_t n = rows.size();
  for (std::size_t i = 1; i < n; ++i) {
    Check(rows[i - 1].pc < rows[i].pc);
    Check(rows[i - 1].rule != rows[i].rule);
  }
  if (n != 0) {
    Check(rows[0].rule.cfa_kind() != eh::kCfaNone);
    Check(rows[n - 1].rule.cfa_kind() == eh::kCfaNone);
    Check(rows[0].pc >= src.pc_lo && rows[n - 1].pc <= src.pc_hi);
  }
  // The compact table and its block index agree with the rows everywhere
  // near a row boundary and in between.
  if (const ut::Table* t = ut::CompactTable(rows)) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t pcs[] = {rows[i].pc - 1, rows[i].pc, rows[i].pc + 1,
                                   i + 1 < n ? (rows[i].pc + rows[i + 1].pc) / 2 : rows[i].pc + 100};
      for (std::uint64_t pc : pcs) {
        const std::uint32_t want = t->base <= pc && pc - t->base < t->span ? eh::FindRule(rows.data(), n, pc).bits : 0;
        Check(ut::Lookup(*t, static_cast<std::uintptr_t>(pc)) == want);
      }
    }
    heapprof::detail::g_arena.Free(const_cast<ut::Table*>(t), t->bytes);
  }
  return 0;
}
