// heapprof: the table unwinder. Full stacks through code built without frame
// pointers, at a few ns per frame.
//
// libgcc's _Unwind_Backtrace and libunwind interpret DWARF call frame programs
// at every step. We do what the Linux kernel's ORC and Go's pclntab do: run
// each object's programs once (eh_frame.hpp) into a sorted array of 8-byte
// rows, {pc offset, rule}, plus a coarse index of blocks so that a lookup is
// one index read and a binary search over a handful of rows. In front of the
// tables sits a small lock-free PC -> rule cache, so that a warm step is one
// cache read and two or three bounds-checked stack loads (the walk is bound
// by load latency: return address -> cache -> CFA -> next return address,
// see RuleCache and bench/unwind.cpp).
//
// Objects: the set of loaded ELF objects (dl_iterate_phdr) is an immutable
// snapshot published through one atomic pointer. Each object's table is built
// the first time a PC inside it is unwound, from the internal arena, while
// dl_iterate_phdr holds the loader's lock for that object (so a concurrent
// dlclose cannot unmap .eh_frame under the parser). Lookups take no lock.
//
// dlopen/dlclose: a sample unwinds with the published snapshot and does not
// call into the loader (SampleObjects). It asks the loader for its
// generation (dlpi_adds, dlpi_subs: one dl_iterate_phdr call that stops at
// the first object) only when its walk met a PC in no object of the snapshot
// (a library loaded since), and on every 64th unwind of a thread (to notice
// unloads); when the generation moved it publishes a new snapshot, objects
// still loaded keeping their tables. A dlclose never makes a lookup fault:
// tables are copies in our arena, and nothing reads a library's own memory
// outside the loader's lock. The replaced snapshot, and the objects (with
// their tables) that the new one no longer holds, are retired and freed once
// no unwind can still be reading them: every unwind is a reader section that
// publishes the epoch it entered at in a slot of its own thread, and
// retired memory goes once no slot shows a reader from its epoch or before
// (epoch-based reclamation, never waiting: whoever finds retired memory at
// the end of its section frees what it can). Stale lookups cannot happen: a
// reader only ever reaches objects through a snapshot it loaded inside its
// section.

// Per frame, a PC without a row, or with a rule the rows cannot express
// (RA in a register, general DWARF expressions, CFA in a register other than
// rsp/rbp), falls back to one frame-pointer step when rbp looks like a frame
// record of this frame (aligned, on the stack, above sp) and the return
// address it yields lies in a loaded object; otherwise the stack ends there.
//
// Fork: the engine's fork handlers (engine.hpp) take g_lock right after the
// loader lock, so a child never inherits it locked mid-build.
//
// x86-64 only. Elsewhere UnwindWithTable is the frame-pointer unwinder (which
// is what aarch64's ABI keeps anyway) and the table parts compile but are
// unused.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "heapprof/detail/3_unwinding/loader_lock.hpp"
#include "heapprof/detail/3_unwinding/loaded_objects.hpp"
#include "heapprof/config.hpp"
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/3_unwinding/eh_frame.hpp"
#include "heapprof/detail/0_base/spinlock.hpp"
#include "heapprof/detail/0_base/self_exe.hpp"
#include "heapprof/detail/3_unwinding/frame_pointers.hpp"

// Stack reads below may touch bytes ASan considers poisoned (another frame's
// redzone, when a frame-pointer guess lands there): they are bounds-checked
// reads of our own stack, not bugs, so they are not instrumented. Functions
// with this attribute must not inline instrumented code that has addressable
// locals: GCC would keep that code's scope poisoning but, the function being
// uninstrumented, never clear it at return (stale "use-after-scope" shadow).
// Hence the noinline on the slow paths they call.
#if defined(__clang__) || defined(__GNUC__)
#define HEAPPROF_DETAIL_NO_ASAN __attribute__((__no_sanitize_address__))
#else
#define HEAPPROF_DETAIL_NO_ASAN
#endif

namespace heapprof {
namespace detail {

struct UnwindTableStats {
  std::size_t objects = 0;  // objects with a built table (rows > 0)
  std::size_t rows = 0;     // rows over all built tables
  std::size_t bytes = 0;    // tables, their block indexes, object snapshots, reader slots, the rule cache
  double build_ms = 0;      // total time spent building tables
  std::uint64_t lazy_lookups = 0;  // rules found one FDE at a time instead (before a build)
};

namespace unwind_table {

// One row of a built table: from `pc` (offset from Table::base) to the next
// row, `rule` applies.
struct TableRow {
  std::uint32_t pc;
  std::uint32_t rule;
};

struct Table {
  std::uintptr_t base = 0;      // address of rows[0]
  std::uintptr_t span = 0;      // PCs in [base, base + span) have a row
  const TableRow* rows = nullptr;
  std::uint32_t count = 0;
  std::uint32_t shift = 0;      // block = (pc - base) >> shift
  const std::uint32_t* index = nullptr;  // index[b]: last row with pc <= b << shift; blocks + 1 entries
  std::uint32_t blocks = 0;
  std::size_t bytes = 0;        // this table's arena bytes
  std::uint64_t build_ns = 0;
  std::size_t fdes = 0;
  std::size_t fdes_bad = 0;
};

// The table of objects without one (no PT_GNU_EH_FRAME, unreadable, gone):
// every lookup misses. Constant-initialised, never written.
inline constexpr Table kNoTable{};

// One loaded object. Identity is (bias, lo, hi, hdr, eh_frame, fingerprint):
// a dlopen that lands where a dlclose'd object was gets a new Object unless it
// is byte-for-byte the same .eh_frame_hdr (then the old table is still right).
// An object's lazy budget before its first one-FDE lookup tells its FDE
// count (LazyBudget).
constexpr std::uint32_t kLazyBudgetUnknown = ~std::uint32_t{0};

struct Object {
  std::uintptr_t lo = 0;  // executable PT_LOAD segments, [lo, hi)
  std::uintptr_t hi = 0;
  std::uintptr_t bias = 0;  // dlpi_addr
  std::uintptr_t hdr = 0;   // .eh_frame_hdr in memory; 0 if none
  std::size_t hdr_size = 0;
  std::uintptr_t eh_frame = 0;  // without .eh_frame_hdr: .eh_frame in memory, if found (a static executable)
  std::size_t eh_frame_size = 0;
  std::uint64_t fingerprint = 0;
  std::atomic<const Table*> table{nullptr};  // null until first use
  // Until then, an object answers one FDE at a time (LazyRuleAt), counted,
  // while lazy_lookups < lazy_budget (LazyBudget; unknown before the first).
  std::atomic<std::uint32_t> lazy_lookups{0};
  std::atomic<std::uint32_t> lazy_budget{kLazyBudgetUnknown};
  Object* next_retired = nullptr;              // reclamation (under g_lock)
  std::uint64_t retired_epoch = 0;
};

struct ObjectSet {
  unsigned long long adds = 0;  // the loader's generation this snapshot is of
  unsigned long long subs = 0;
  bool generation_known = false;
  std::uint32_t serial = 0;     // 1, 2, ... in publication order: tags rule-cache entries
  std::size_t count = 0;
  Object** objects = nullptr;  // sorted by lo
  std::size_t bytes = 0;        // this block and the Objects made with it (for Stats)
  std::size_t block_bytes = 0;  // this block alone: what goes back to the arena
  ObjectSet* next_retired = nullptr;
  std::uint64_t retired_epoch = 0;
};

// A direct-mapped cache, PC -> rule, in front of the tables. A table lookup
// is three dependent loads (index, rows, rule) after the return address; a
// hit here is one. Shared by all threads, written only on misses, no lock.
//
// An entry is 16 bytes, one line: the key, and one word holding the CFA
// offset (the high half, sign-extended by one arithmetic shift) and the rule
// bits (the low half). It used to be three arrays (an int32 offset array for
// a plain sign-extending load on the walk's chain), when a warm walk was
// bound by the latency of return address -> CFA offset -> CFA -> next
// return address. Return-address guesses (ReturnAddressAt) and the frame-pointer
// rule's constant path took most frames off that chain, and a sample on a
// stack unlike the last is bound by instructions and by the lines it
// touches: one line a lookup instead of three, and two loads instead of
// three, measured 6-8 ns less a sample at depth 32 (bench_sample_cost, random
// stacks) with warm walks unchanged (bench_unwind).
//
// An entry is valid when key == ra ^ word ^ tag, `tag` derived from the
// snapshot serial (after a dlopen/dlclose every older entry misses); a torn
// read (words from two writers) fails the check unless the words it mixed
// agree (then the rule is right), or a rare coincidence of bits lets a wrong
// rule through: a bad frame, which the bounds checks end, never a fault (the
// multiply that made that rarer still cost more than it bought on every
// frame).
constexpr std::size_t kRuleCacheEntries = 4096;  // 64 KiB of .bss, touched only when used
struct alignas(16) RuleCacheEntry {
  std::atomic<std::uint64_t> key;
  std::atomic<std::uint64_t> word;  // (CFA offset << 32) | rule bits
};
struct RuleCache {
  RuleCacheEntry e[kRuleCacheEntries];
};

inline RuleCache g_rule_cache;

// Per cache slot, a guess, never trusted: the return address found in the
// caller's frame the last time a walk stepped out of a frame whose return
// address has this slot (ReturnAddressAt). 32 KiB of .bss.
struct ReturnAddressGuesses {
  std::atomic<std::uintptr_t> next_ra[kRuleCacheEntries];
};
inline ReturnAddressGuesses g_guesses;

// A snapshot's tag in the cache keys (computed once per walk).
HEAPPROF_ALWAYS_INLINE std::uint64_t CacheTag(std::uint32_t serial) noexcept {
  return static_cast<std::uint64_t>(serial) * 0x9e3779b97f4a7c15ull;
}

// ---- global state: constant-initialised (invariant 2), never destroyed
inline SpinLock g_lock;  // builds, snapshot publication, the reader key; never held across dl_iterate_phdr
inline std::atomic<const ObjectSet*> g_objects{nullptr};
inline std::atomic<std::uint32_t> g_serial{0};
inline std::atomic<std::size_t> g_stat_objects{0};
inline std::atomic<std::size_t> g_stat_rows{0};
inline std::atomic<std::size_t> g_stat_bytes{0};
inline std::atomic<std::uint64_t> g_stat_build_ns{0};
inline std::atomic<std::uint64_t> g_stat_lazy_lookups{0};  // one-FDE lookups (LazyRuleAt)

inline std::uint64_t NowNs() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

// ---------------------------------------------------------------- lookup

// The rule for `pc`, or 0 (kCfaNone) if no row covers it. Lock-free: a table
// is immutable once published.
HEAPPROF_ALWAYS_INLINE std::uint32_t Lookup(const Table& t, std::uintptr_t pc) noexcept {
  const std::uintptr_t off = pc - t.base;  // wraps for pc < base: fails the next test
  if (off >= t.span) return 0;
  const auto off32 = static_cast<std::uint32_t>(off);
  const std::uint32_t b = off32 >> t.shift;
  std::uint32_t lo = t.index[b];
  std::uint32_t hi = t.index[b + 1];
  // Last row in [lo, hi] with pc <= off; rows[lo] qualifies by construction.
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi + 1) / 2;
    if (t.rows[mid].pc <= off32)
      lo = mid;
    else
      hi = mid - 1;
  }
  return t.rows[lo].rule;
}

// The object holding `pc` in a snapshot, or null.
inline Object* FindObject(const ObjectSet& set, std::uintptr_t pc) noexcept {
  std::size_t lo = 0, hi = set.count;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (set.objects[mid]->lo <= pc)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return nullptr;
  Object* o = set.objects[lo - 1];
  return pc < o->hi ? o : nullptr;
}

// ---- reader sections and reclamation
// An unwind reads a snapshot, its objects and their tables without a lock.
// Epoch-based reclamation with one slot per thread (as in RCU's per-thread
// counters and hazard eras): entering a section publishes, in the thread's
// own slot, the global epoch the thread saw; leaving clears it. Retiring
// tags memory with the current epoch and moves the epoch on; memory tagged R
// is freed once no slot shows an active reader that entered at epoch <= R
// (a reader that entered later loaded the snapshot pointer after the
// retirement's epoch move, so after the replacement was published).
//
// A section costs one store with a full fence (the store must be visible
// before the snapshot pointer is read) and one plain release store, both to a
// cache line only this thread writes: two threads sampling never bounce a
// line, and nothing on an unsampled path writes here at all. Slots live in
// the arena on a list that only grows (as many as threads ever unwound at
// once) and are recycled at thread exit through a pthread key.
struct WalkRecords;  // the thread's last walks, replayed when a new one meets them (below)

struct alignas(64) ReaderSlot {
  std::atomic<std::uint64_t> state{0};  // 0: not reading; else (epoch entered << 1) | 1
  std::atomic<bool> in_use{false};     // owned by a live thread
  ReaderSlot* next = nullptr;          // every slot ever made; immutable once pushed
  WalkRecords* walks = nullptr;        // the owner's, made at its first walk; forgotten when recycled
};
inline std::atomic<ReaderSlot*> g_reader_slots{nullptr};
inline thread_local ReaderSlot* tls_reader_slot HEAPPROF_TLS_MODEL = nullptr;
// The slot's key: 0 not created, 2 ready (g_reader_key valid), 3 creation failed.
inline std::atomic<int> g_reader_key_state{0};
inline pthread_key_t g_reader_key;

inline std::atomic<std::uint64_t> g_epoch{1};
inline ObjectSet* g_retired_sets = nullptr;  // under g_lock
inline Object* g_retired_objects = nullptr;  // under g_lock
inline std::atomic<bool> g_have_retired{false};  // either list is not empty

void TryReclaimLocked() noexcept;

void ForgetWalks(WalkRecords* w) noexcept;

inline void ReleaseReaderSlot(void* p) noexcept {
  auto* slot = static_cast<ReaderSlot*>(p);
  if (tls_reader_slot == slot) tls_reader_slot = nullptr;
  slot->state.store(0, std::memory_order_release);
  slot->in_use.store(false, std::memory_order_release);
}

// The calling thread's slot: a free one from the list, else a new one. Once
// per thread (the pthread key hands it back at exit). Null if out of memory.
HEAPPROF_NOINLINE inline ReaderSlot* AcquireReaderSlot() noexcept {
  if (g_reader_key_state.load(std::memory_order_acquire) == 0) {
    // Under g_lock, which the fork handlers take: a child never inherits a
    // creation half done.
    LockGuard hold(g_lock);
    if (g_reader_key_state.load(std::memory_order_relaxed) == 0) {
      g_reader_key_state.store(pthread_key_create(&g_reader_key, &ReleaseReaderSlot) == 0 ? 2 : 3,
                               std::memory_order_release);
    }
  }
  ReaderSlot* slot = nullptr;
  for (ReaderSlot* s = g_reader_slots.load(std::memory_order_acquire); s != nullptr; s = s->next) {
    bool expected = false;
    if (!s->in_use.load(std::memory_order_relaxed) &&
        s->in_use.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      slot = s;
      ForgetWalks(s->walks);  // another thread's stack
      break;
    }
  }
  if (slot == nullptr) {
    void* mem = g_arena.Allocate(sizeof(ReaderSlot));
    if (mem == nullptr) return nullptr;
    slot = new (mem) ReaderSlot{};
    slot->in_use.store(true, std::memory_order_relaxed);
    g_stat_bytes.fetch_add(sizeof(ReaderSlot), std::memory_order_relaxed);
    ReaderSlot* head = g_reader_slots.load(std::memory_order_relaxed);
    do {
      slot->next = head;
    } while (!g_reader_slots.compare_exchange_weak(head, slot, std::memory_order_acq_rel));
  }
  // Without a key (creation failed) the slot stays with this thread forever:
  // correct, one slot leaked per such thread.
  if (g_reader_key_state.load(std::memory_order_acquire) == 2) pthread_setspecific(g_reader_key, slot);
  tls_reader_slot = slot;
  return slot;
}

class ReaderSection {
 public:
  ReaderSection() noexcept {
    ReaderSlot* slot = tls_reader_slot;
    if (HEAPPROF_UNLIKELY(slot == nullptr)) slot = AcquireReaderSlot();
    slot_ = slot;
    if (slot == nullptr) return;  // out of memory: active() is false, the caller must not read tables
    // A full fence: the announcement is globally visible before this thread
    // loads the snapshot pointer (which its caller does next, seq_cst too).
    // An exchange rather than a seq_cst store: one xchg, where GCC emits a
    // store and an mfence.
    const std::uint64_t e = g_epoch.load(std::memory_order_seq_cst);
    slot->state.exchange((e << 1) | 1, std::memory_order_seq_cst);
  }
  // Out of the section, a thread that finds retired memory frees what it
  // can (threads blocked in the loader while a dlopen runs would otherwise
  // hold back every Refresh's attempt).
  ~ReaderSection() {
    if (slot_ == nullptr) return;
    slot_->state.store(0, std::memory_order_release);
    if (HEAPPROF_UNLIKELY(g_have_retired.load(std::memory_order_relaxed)) && g_lock.try_lock()) {
      TryReclaimLocked();
      g_lock.unlock();
    }
  }
  bool active() const noexcept { return slot_ != nullptr; }
  ReaderSlot* slot() const noexcept { return slot_; }
  ReaderSection(const ReaderSection&) = delete;
  ReaderSection& operator=(const ReaderSection&) = delete;

 private:
  ReaderSlot* slot_;
};

// The oldest epoch an active reader entered at; UINT64_MAX if none reads.
inline std::uint64_t OldestReaderEpoch() noexcept {
  std::uint64_t oldest = ~std::uint64_t{0};
  for (ReaderSlot* s = g_reader_slots.load(std::memory_order_acquire); s != nullptr; s = s->next) {
    const std::uint64_t st = s->state.load(std::memory_order_seq_cst);
    if ((st & 1) != 0 && (st >> 1) < oldest) oldest = st >> 1;
  }
  return oldest;
}

inline void FreeRetiredObject(Object* o) noexcept {
  const Table* t = o->table.load(std::memory_order_acquire);
  if (t != nullptr && t != &kNoTable) {
    g_stat_objects.fetch_sub(1, std::memory_order_relaxed);
    g_stat_rows.fetch_sub(t->count, std::memory_order_relaxed);
    g_stat_bytes.fetch_sub(t->bytes, std::memory_order_relaxed);
    g_arena.Free(const_cast<Table*>(t), t->bytes);
  }
  g_stat_bytes.fetch_sub(sizeof(Object), std::memory_order_relaxed);
  o->~Object();
  g_arena.Free(o, sizeof(Object));
}

// Under g_lock: frees what no reader can hold any more. Never waits.
inline void TryReclaimLocked() noexcept {
  // Every reader that entered at an epoch below `oldest` is gone: what was
  // retired at such an epoch is unreachable.
  const std::uint64_t oldest = OldestReaderEpoch();
  ObjectSet** sp = &g_retired_sets;
  while (ObjectSet* set = *sp) {
    if (set->retired_epoch < oldest) {
      *sp = set->next_retired;
      g_stat_bytes.fetch_sub(set->block_bytes, std::memory_order_relaxed);
      const std::size_t block = set->block_bytes;
      set->~ObjectSet();
      g_arena.Free(set, block);
    } else {
      sp = &set->next_retired;
    }
  }
  Object** op = &g_retired_objects;
  while (Object* o = *op) {
    if (o->retired_epoch < oldest) {
      *op = o->next_retired;
      FreeRetiredObject(o);
    } else {
      op = &o->next_retired;
    }
  }
  g_have_retired.store(g_retired_sets != nullptr || g_retired_objects != nullptr, std::memory_order_relaxed);
}

// Under g_lock, once `fresh` is published in place of `old`: retires `old`
// and the objects only it holds, then moves the epoch on (readers entering
// from now on cannot reach them).
inline void RetireLocked(ObjectSet* old, const ObjectSet* fresh) noexcept {
  const std::uint64_t e = g_epoch.load(std::memory_order_seq_cst);
  for (std::size_t i = 0; i < old->count; ++i) {
    Object* o = old->objects[i];
    if (FindObject(*fresh, o->lo) == o) continue;  // carried over
    o->retired_epoch = e;
    o->next_retired = g_retired_objects;
    g_retired_objects = o;
  }
  old->retired_epoch = e;
  old->next_retired = g_retired_sets;
  g_retired_sets = old;
  g_have_retired.store(true, std::memory_order_relaxed);
  g_epoch.store(e + 1, std::memory_order_seq_cst);
}

// After fork, in the child: only the forking thread exists, and it is not
// unwinding; the other threads' slots are free again.
inline void ResetReadersInChild() noexcept {
  for (ReaderSlot* s = g_reader_slots.load(std::memory_order_relaxed); s != nullptr; s = s->next) {
    s->state.store(0, std::memory_order_relaxed);
    if (s != tls_reader_slot) s->in_use.store(false, std::memory_order_relaxed);
  }
}

// ---------------------------------------------------------------- building

// `size` bytes at `vaddr` (file address) lie inside a readable PT_LOAD's file
// bytes: safe to read while the object is loaded.
inline bool MappedReadable(const dl_phdr_info& info, std::uintptr_t vaddr, std::size_t size) noexcept {
  for (std::size_t i = 0; i < info.dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info.dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_R) == 0) continue;
    if (vaddr >= ph.p_vaddr && vaddr - ph.p_vaddr <= ph.p_filesz && size <= ph.p_filesz - (vaddr - ph.p_vaddr))
      return true;
  }
  return false;
}

// The readable PT_LOAD bytes from `vaddr` to the end of its segment.
inline std::size_t MappedBytesFrom(const dl_phdr_info& info, std::uintptr_t vaddr) noexcept {
  for (std::size_t i = 0; i < info.dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info.dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_R) == 0) continue;
    if (vaddr >= ph.p_vaddr && vaddr - ph.p_vaddr < ph.p_filesz) return ph.p_filesz - (vaddr - ph.p_vaddr);
  }
  return 0;
}

// What identifies an object in one dl_iterate_phdr visit.
struct ObjectInfo {
  std::uintptr_t lo = 0, hi = 0, bias = 0, hdr = 0;
  std::size_t hdr_size = 0;
  std::uintptr_t eh_frame = 0;
  std::size_t eh_frame_size = 0;
  std::uint64_t fingerprint = 0;
};

// A static executable has no .eh_frame_hdr (GCC links -static without
// --eh-frame-hdr; libgcc then finds .eh_frame through crtbeginT's frame
// registration, which is not ours to read). Its .eh_frame is found once from
// the section headers of /proc/self/exe, and used only where the mapped
// bytes at that address start as the file's section does.
struct ExeEhFrame {
  std::uintptr_t vaddr = 0;  // file address; 0: none
  std::size_t size = 0;
  unsigned char head[32] = {};  // the section's first bytes in the file
  std::size_t head_size = 0;
};
inline ExeEhFrame g_exe_eh_frame;
inline std::atomic<int> g_exe_eh_frame_state{0};  // 0 not looked for, 1 being looked for, 2 done

inline bool ReadAt(int fd, void* buf, std::size_t n, std::uint64_t offset) noexcept {
  return pread(fd, buf, n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n);
}

inline void FindExeEhFrame(ExeEhFrame& out) noexcept {
  const char* exe = SelfExeFile();  // (without /proc, the name it was started by: its bytes are checked below)
  const int fd = exe != nullptr ? open(exe, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
  if (fd < 0) return;
  ElfW(Ehdr) eh;
  ElfW(Shdr) names;
  if (ReadAt(fd, &eh, sizeof eh, 0) && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
      eh.e_shentsize == sizeof(ElfW(Shdr)) && eh.e_shstrndx < eh.e_shnum &&
      ReadAt(fd, &names, sizeof names, eh.e_shoff + std::uint64_t{eh.e_shstrndx} * sizeof(ElfW(Shdr)))) {
    static constexpr char kName[] = ".eh_frame";  // with its NUL: not .eh_frame_hdr
    for (unsigned i = 0; i < eh.e_shnum; ++i) {
      ElfW(Shdr) sh;
      char name[sizeof kName];
      if (!ReadAt(fd, &sh, sizeof sh, eh.e_shoff + std::uint64_t{i} * sizeof(ElfW(Shdr)))) break;
      if (sh.sh_type != SHT_PROGBITS || sh.sh_addr == 0 || sh.sh_size == 0 ||
          sh.sh_name + sizeof kName > names.sh_size ||
          !ReadAt(fd, name, sizeof name, names.sh_offset + sh.sh_name) || std::memcmp(name, kName, sizeof kName) != 0)
        continue;
      const std::size_t head = sh.sh_size < sizeof out.head ? sh.sh_size : sizeof out.head;
      if (!ReadAt(fd, out.head, head, sh.sh_offset)) break;
      out.head_size = head;
      out.size = sh.sh_size;
      out.vaddr = sh.sh_addr;
      break;
    }
  }
  close(fd);
}

// The executable's .eh_frame as found in its file (vaddr 0: none, or another
// thread is still looking: this object then has no table in this snapshot,
// and a later one, seeing .eh_frame, is a new object with a table).
inline const ExeEhFrame* ExecutableEhFrame() noexcept {
  int state = g_exe_eh_frame_state.load(std::memory_order_acquire);
  if (state == 0 && g_exe_eh_frame_state.compare_exchange_strong(state, 1, std::memory_order_acq_rel)) {
    FindExeEhFrame(g_exe_eh_frame);
    g_exe_eh_frame_state.store(2, std::memory_order_release);
    return &g_exe_eh_frame;
  }
  return state == 2 ? &g_exe_eh_frame : nullptr;
}

// False for objects with nothing executable (nothing to unwind through).
inline bool DescribeObject(const dl_phdr_info& info, ObjectInfo& out) noexcept {
  out = ObjectInfo{};
  out.bias = info.dlpi_addr;
  bool exec = false;
  for (std::size_t i = 0; i < info.dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info.dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) && ph.p_memsz != 0) {
      const std::uintptr_t lo = info.dlpi_addr + ph.p_vaddr;
      const std::uintptr_t hi = lo + ph.p_memsz;
      if (!exec || lo < out.lo) out.lo = lo;
      if (!exec || hi > out.hi) out.hi = hi;
      exec = true;
    } else if (ph.p_type == PT_GNU_EH_FRAME && ph.p_memsz != 0 && MappedReadable(info, ph.p_vaddr, ph.p_memsz)) {
      out.hdr = info.dlpi_addr + ph.p_vaddr;
      out.hdr_size = ph.p_memsz;
    }
  }
  if (!exec) return false;
  if (out.hdr == 0 && (info.dlpi_name == nullptr || info.dlpi_name[0] == '\0')) {
    // The executable (the first object, unnamed) without .eh_frame_hdr.
    const ExeEhFrame* e = ExecutableEhFrame();
    if (e != nullptr && e->vaddr != 0 && MappedReadable(info, e->vaddr, e->size) &&
        std::memcmp(reinterpret_cast<const void*>(info.dlpi_addr + e->vaddr), e->head, e->head_size) == 0) {
      out.eh_frame = info.dlpi_addr + e->vaddr;
      out.eh_frame_size = e->size;
    }
  }
  const std::uintptr_t print = out.hdr != 0 ? out.hdr : out.eh_frame;
  const std::size_t print_size = out.hdr != 0 ? out.hdr_size : out.eh_frame_size;
  if (print != 0) {
    // FNV-1a's step, a word at a time, over the start of .eh_frame_hdr (or
    // .eh_frame): its table holds PC and FDE offsets, so different code at
    // the same address differs here. (A byte at a time, the 512 bytes were
    // most of a one-FDE lookup, which describes its object each time.)
    std::uint64_t h = 1469598103934665603ull ^ print_size;
    const auto* p = reinterpret_cast<const unsigned char*>(print);
    const std::size_t n = print_size < 512 ? print_size : 512;
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t word;
      std::memcpy(&word, p + i, sizeof word);
      h = (h ^ word) * 1099511628211ull;
      h ^= h >> 32;  // (a multiply carries only upwards: the words' high halves reach the low half too)
    }
    for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    out.fingerprint = h;
  }
  return true;
}

inline bool SameObject(const Object& o, const ObjectInfo& i) noexcept {
  return o.lo == i.lo && o.hi == i.hi && o.bias == i.bias && o.hdr == i.hdr && o.hdr_size == i.hdr_size &&
         o.eh_frame == i.eh_frame && o.eh_frame_size == i.eh_frame_size && o.fingerprint == i.fingerprint;
}

// Compacts finished parser rows into a Table in one arena block:
// [Table][rows][index]. Null if out of memory or no rows.
inline Table* CompactTable(const eh::RowBuffer& rows) noexcept {
  std::size_t n = rows.size();
  if (n == 0) return nullptr;
  const std::uint64_t base = rows[0].pc;
  // Offsets are 32-bit: an object's code spans less than 4 GiB; cut the rest.
  while (n > 1 && rows[n - 1].pc - base > 0xffffffffull) --n;
  if (n > 0xfffffffeull) n = 0xfffffffeull;
  const std::uint64_t span = rows[n - 1].pc - base;  // the last row ends coverage
  if (span == 0) return nullptr;
  // Aim for about two rows per block: the search is then over 2-4 rows and
  // the index costs ~2 bytes per row.
  std::uint32_t shift = 4;
  const std::uint64_t want_blocks = n / 2 > 1 ? n / 2 : 1;
  while (shift < 31 && (span >> shift) + 1 > want_blocks) ++shift;
  const std::uint64_t blocks = (span >> shift) + 1;
  const std::size_t bytes = sizeof(Table) + n * sizeof(TableRow) + (blocks + 1) * sizeof(std::uint32_t);
  void* mem = g_arena.Allocate(bytes);
  if (mem == nullptr) return nullptr;
  auto* rows_out = reinterpret_cast<TableRow*>(static_cast<char*>(mem) + sizeof(Table));
  auto* index = reinterpret_cast<std::uint32_t*>(rows_out + n);
  for (std::size_t i = 0; i < n; ++i) {
    rows_out[i].pc = static_cast<std::uint32_t>(rows[i].pc - base);
    rows_out[i].rule = rows[i].rule.bits;
  }
  std::uint32_t r = 0;
  for (std::uint64_t b = 0; b <= blocks; ++b) {
    const std::uint64_t start = b << shift;
    while (r + 1 < n && rows_out[r + 1].pc <= start) ++r;
    index[b] = r;
  }
  Table* t = new (mem) Table{};
  t->base = static_cast<std::uintptr_t>(base);
  t->span = static_cast<std::uintptr_t>(span);
  t->rows = rows_out;
  t->count = static_cast<std::uint32_t>(n);
  t->shift = shift;
  t->index = index;
  t->blocks = static_cast<std::uint32_t>(blocks);
  t->bytes = bytes;
  return t;
}

// What the parser reads of one object (it is mapped: we are inside
// dl_iterate_phdr's callback for it, under the loader's lock). False if it
// has nothing we can use.
inline bool SourceOf(const dl_phdr_info& info, const Object& o, eh::Source& src) noexcept {
  if (o.hdr != 0) {
    src.hdr.data = reinterpret_cast<const std::uint8_t*>(o.hdr);
    src.hdr.size = o.hdr_size;
    src.hdr.address = o.hdr;
    eh::Hdr hdr;
    if (!eh::ParseHdr(src.hdr, hdr)) return false;
    const std::uintptr_t eh_frame = hdr.eh_frame;
    if (eh_frame < info.dlpi_addr) return false;
    const std::size_t avail = MappedBytesFrom(info, eh_frame - info.dlpi_addr);
    if (avail == 0) return false;
    src.eh_frame.data = reinterpret_cast<const std::uint8_t*>(eh_frame);
    src.eh_frame.size = avail;
    src.eh_frame.address = eh_frame;
  } else if (o.eh_frame != 0) {
    // No index: the parser walks the section's records (DescribeObject
    // checked that it is mapped).
    src.eh_frame.data = reinterpret_cast<const std::uint8_t*>(o.eh_frame);
    src.eh_frame.size = o.eh_frame_size;
    src.eh_frame.address = o.eh_frame;
  } else {
    return false;
  }
  src.pc_lo = o.lo;
  src.pc_hi = o.hi;
  return true;
}

// Parses one object's .eh_frame (under the loader's lock, see SourceOf).
// Null if it has none we can use.
inline Table* BuildTable(const dl_phdr_info& info, const Object& o) noexcept {
  const std::uint64_t t0 = NowNs();
  eh::Source src;
  if (!SourceOf(info, o, src)) return nullptr;
  eh::RowBuffer rows;
  eh::ParseStats stats;
  eh::ParseEhFrame(src, rows, &stats);  // out of memory: whatever fitted
  Table* t = CompactTable(rows);
  rows.Release();
  if (t == nullptr) return nullptr;
  t->fdes = stats.fdes;
  t->fdes_bad = stats.fdes_bad;
  t->build_ns = NowNs() - t0;
  return t;
}

struct BuildRequest {
  Object* object;
  bool found;
};

// Whether the loader's `info` is `o` (a callback's test: the load address
// first, which skips the others without DescribeObject's fingerprint).
inline bool IsObject(const dl_phdr_info& info, const Object& o) noexcept {
  if (info.dlpi_addr != o.bias) return false;
  ObjectInfo oi;
  return DescribeObject(info, oi) && SameObject(o, oi);
}

inline int BuildCallback(dl_phdr_info* info, std::size_t, void* data) noexcept {
  auto& req = *static_cast<BuildRequest*>(data);
  if (!IsObject(*info, *req.object)) return 0;
  req.found = true;
  // Lock order: loader lock (held by dl_iterate_phdr), then g_lock, then the
  // arena's. g_lock is never held while calling into the loader.
  LockGuard hold(g_lock);
  if (req.object->table.load(std::memory_order_acquire) != nullptr) return 1;  // another thread won
  const Table* t = BuildTable(*info, *req.object);
  if (t != nullptr) {
    g_stat_objects.fetch_add(1, std::memory_order_relaxed);
    g_stat_rows.fetch_add(t->count, std::memory_order_relaxed);
    g_stat_bytes.fetch_add(t->bytes, std::memory_order_relaxed);
    g_stat_build_ns.fetch_add(t->build_ns, std::memory_order_relaxed);
  } else {
    t = &kNoTable;
  }
  req.object->table.store(t, std::memory_order_release);
  return 1;
}

// The object's table, built on first use.
inline const Table* EnsureTable(Object* o) noexcept {
  const Table* t = o->table.load(std::memory_order_acquire);
  if (HEAPPROF_LIKELY(t != nullptr)) return t;
  BuildRequest req{o, false};
  IterateLoadedObjects(&BuildCallback, &req);
  t = o->table.load(std::memory_order_acquire);
  if (t == nullptr) {
    // Unloaded since the snapshot: nothing to read any more.
    LockGuard hold(g_lock);
    const Table* expected = nullptr;
    o->table.compare_exchange_strong(expected, &kNoTable, std::memory_order_acq_rel);
    t = o->table.load(std::memory_order_acquire);
  }
  return t;
}

// ---------------------------------------------------------------- one FDE at a time

// A table costs ~0.2 us an FDE to build, all at the object's first lookup:
// 0.7 ms for libc (3,713 FDEs), 1 ms for libstdc++ (4,867), 10-25 ms for a
// compiler's cc1 (45,201), which each of a build's many short compiler
// processes paid at its first sample (make -j4 of 40 files under the preload
// library: 3.7x the CPU), and a C++ program's first sample paid for libc and
// libstdc++ (1.5 ms, most of the first sample). An object answers its first
// lookups one FDE at a time instead: a binary search of .eh_frame_hdr's
// table and that FDE's program run on its own (~0.5 us; the rule cache keeps
// the answer). It builds its table once those lookups have cost about what
// the build would: 2 lookups per 5 FDEs (the rent-or-buy rule: never more
// than twice the cheaper of the two). A short-lived process then never
// builds a table; a long-lived one builds those it keeps using. An object of
// at most g_lazy_min_fdes FDEs builds at once (tests set 0, and
// g_lazy_budget_min to keep every object one FDE at a time).
constexpr std::uint64_t kLazyMinFdes = 256;
inline std::atomic<std::uint64_t> g_lazy_min_fdes{kLazyMinFdes};
inline std::atomic<std::uint32_t> g_lazy_budget_min{0};

inline std::uint32_t LazyBudget(std::uint64_t fdes) noexcept {
  std::uint64_t budget = fdes * 2 / 5;  // (fdes: at most a quarter of .eh_frame_hdr's size)
  const std::uint64_t min = g_lazy_budget_min.load(std::memory_order_relaxed);
  if (budget < min) budget = min;
  return budget < kLazyBudgetUnknown ? static_cast<std::uint32_t>(budget) : kLazyBudgetUnknown - 1;
}

struct LazyRequest {
  Object* object;
  std::uintptr_t pc;
  std::uint32_t rule;
  bool found;
  bool build;  // small, or its table cannot be searched: build it
};

inline int LazyCallback(dl_phdr_info* info, std::size_t, void* data) noexcept {
  auto& req = *static_cast<LazyRequest*>(data);
  if (!IsObject(*info, *req.object)) return 0;
  req.found = true;
  eh::Source src;
  if (!SourceOf(*info, *req.object, src)) {
    req.build = true;  // (no table either: the build says so once)
    return 1;
  }
  eh::RowBuffer rows;
  eh::Parser parser(src, rows);
  eh::Hdr hdr;
  const std::uint64_t fdes = parser.SearchableFdes(hdr);
  if (fdes == 0 || fdes <= g_lazy_min_fdes.load(std::memory_order_relaxed)) {
    req.build = true;
    return 1;
  }
  req.object->lazy_budget.store(LazyBudget(fdes), std::memory_order_relaxed);
  req.rule = parser.RuleOfOneFde(hdr, req.pc).bits;
  return 1;
}

// Asks the loader for `o` (still loaded?) and, under its lock, `pc`'s rule
// from one FDE, or whether `o` must build its table instead.
inline LazyRequest AskOneFde(Object* o, std::uintptr_t pc) noexcept {
  LazyRequest req{o, pc, 0, false, false};
  IterateLoadedObjects(&LazyCallback, &req);
  return req;
}

// The object's table, or null while it answers one FDE at a time. (An object
// sent to EnsureTable once, small or unsearchable, has a table from then on:
// its own, or kNoTable.)
inline const Table* TableOrLazy(Object* o) noexcept {
  const Table* t = o->table.load(std::memory_order_acquire);
  if (HEAPPROF_LIKELY(t != nullptr)) return t;
  if (o->lazy_lookups.load(std::memory_order_relaxed) < o->lazy_budget.load(std::memory_order_relaxed)) return nullptr;
  return EnsureTable(o);
}

// ---------------------------------------------------------------- snapshots

struct Generation {
  unsigned long long adds = 0, subs = 0;
  bool known = false;
};

inline int GenerationCallback(dl_phdr_info* info, std::size_t size, void* data) noexcept {
  auto& g = *static_cast<Generation*>(data);
  if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
    g.adds = info->dlpi_adds;
    g.subs = info->dlpi_subs;
    g.known = true;
  }
  return 1;  // the counters are the same in every entry: one is enough
}

// Scratch list of the objects one dl_iterate_phdr pass saw.
struct Collect {
  ObjectInfo* items = nullptr;
  std::size_t count = 0;
  std::size_t capacity = 0;
  Generation gen;
  bool oom = false;
};

inline int CollectCallback(dl_phdr_info* info, std::size_t size, void* data) noexcept {
  auto& c = *static_cast<Collect*>(data);
  if (!c.gen.known) GenerationCallback(info, size, &c.gen);
  ObjectInfo oi;
  if (!DescribeObject(*info, oi)) return 0;
  // Remembered for profiles written after it is unloaded (a stack through it
  // may be sampled now: that is often why this snapshot is taken).
  elf::NoteLoadedObject(*info);
  if (c.count == c.capacity) {
    const std::size_t cap = c.capacity == 0 ? 64 : c.capacity * 2;
    auto* fresh = static_cast<ObjectInfo*>(g_arena.Allocate(cap * sizeof(ObjectInfo)));
    if (fresh == nullptr) {
      c.oom = true;
      return 1;
    }
    if (c.count != 0) std::memcpy(static_cast<void*>(fresh), c.items, c.count * sizeof(ObjectInfo));
    g_arena.Free(c.items, c.capacity * sizeof(ObjectInfo));
    c.items = fresh;
    c.capacity = cap;
  }
  c.items[c.count++] = oi;
  return 0;
}

// Takes a fresh snapshot of the loaded objects and publishes it (unless a
// newer one appeared meanwhile). Returns the current snapshot.
inline const ObjectSet* Refresh() noexcept {
  Collect c;
  IterateLoadedObjects(&CollectCallback, &c);  // the loader lock, without g_lock
  const ObjectSet* result = nullptr;
  if (!c.oom) {
    LockGuard hold(g_lock);
    const ObjectSet* cur = g_objects.load(std::memory_order_acquire);
    if (cur != nullptr && c.gen.known && cur->generation_known &&
        (cur->adds > c.gen.adds || cur->subs > c.gen.subs || (cur->adds == c.gen.adds && cur->subs == c.gen.subs))) {
      result = cur;  // someone published this generation or a newer one
    } else {
      const std::size_t bytes = sizeof(ObjectSet) + c.count * sizeof(Object*);
      void* mem = g_arena.Allocate(bytes);
      if (mem != nullptr) {
        auto* set = new (mem) ObjectSet{};
        set->adds = c.gen.adds;
        set->subs = c.gen.subs;
        set->generation_known = c.gen.known;
        set->objects = reinterpret_cast<Object**>(static_cast<char*>(mem) + sizeof(ObjectSet));
        set->bytes = bytes;
        set->block_bytes = bytes;
        std::size_t n = 0;
        for (std::size_t i = 0; i < c.count; ++i) {
          const ObjectInfo& oi = c.items[i];
          Object* o = nullptr;
          if (cur != nullptr) {
            Object* old = FindObject(*cur, oi.lo);
            // Keeps its table; but not a failed build (kNoTable) of an object
            // with .eh_frame_hdr: it may have failed because the library was
            // unloaded under a stale snapshot, and this one is loaded again.
            if (old != nullptr && SameObject(*old, oi) &&
                ((old->hdr == 0 && old->eh_frame == 0) || old->table.load(std::memory_order_acquire) != &kNoTable))
              o = old;
          }
          if (o == nullptr) {
            void* om = g_arena.Allocate(sizeof(Object));
            if (om == nullptr) continue;
            o = new (om) Object{};
            o->lo = oi.lo;
            o->hi = oi.hi;
            o->bias = oi.bias;
            o->hdr = oi.hdr;
            o->hdr_size = oi.hdr_size;
            o->eh_frame = oi.eh_frame;
            o->eh_frame_size = oi.eh_frame_size;
            o->fingerprint = oi.fingerprint;
            set->bytes += sizeof(Object);
          }
          // Insertion sort by lo: a few dozen objects, usually in order already.
          std::size_t at = n;
          while (at > 0 && set->objects[at - 1]->lo > o->lo) {
            set->objects[at] = set->objects[at - 1];
            --at;
          }
          set->objects[at] = o;
          ++n;
        }
        set->count = n;
        set->serial = g_serial.fetch_add(1, std::memory_order_relaxed) + 1;
        g_stat_bytes.fetch_add(set->bytes, std::memory_order_relaxed);
        g_objects.store(set, std::memory_order_seq_cst);
        // The old snapshot goes once no reader can hold it.
        if (cur != nullptr) RetireLocked(const_cast<ObjectSet*>(cur), set);
        TryReclaimLocked();
        result = set;
      } else {
        result = cur;
      }
    }
  } else {
    result = g_objects.load(std::memory_order_acquire);
  }
  g_arena.Free(c.items, c.capacity * sizeof(ObjectInfo));
  return result;
}

// The snapshot for this unwind: the published one if the loader's generation
// has not moved, else a fresh one. One dl_iterate_phdr call that visits one
// object: the loader's (recursive) lock, ~20-30 ns.
inline const ObjectSet* CurrentObjects() noexcept {
  Generation g;
  IterateLoadedObjects(&GenerationCallback, &g);
  const ObjectSet* s = g_objects.load(std::memory_order_seq_cst);  // after the section's entry
  if (s != nullptr && g.known && s->generation_known && g.adds == s->adds && g.subs == s->subs) return s;
  return Refresh();
}

// What a sample unwinds with: the published snapshot, without asking the
// loader (that call, ~175 instructions and the loader's lock, was on every
// sample). The snapshot goes stale in two ways, and each is caught:
//  - a library loaded since: its PCs are in no object of the snapshot; the
//    walk notes the first such PC and UnwindWithTable asks the loader then
//    (and unwinds again on a fresh snapshot);
//  - a library unloaded since: its Object and table stay readable (they are
//    our arena's, never the library's memory: nothing reads code or
//    .eh_frame outside the loader's lock), so no lookup can fault; what is
//    lost is only freshness (a different library mapped at the same
//    addresses would be unwound with the old rules, a bad frame ending the
//    stack early) and the retirement of the old table. So every
//    kGenerationCheckEvery-th unwind of a thread still asks the loader.
constexpr std::uint32_t kGenerationCheckEvery = 64;
// Per thread: unwinds since the last generation check; the page and snapshot
// of the last PC found in no object that was checked (a JIT's code, or a
// garbage return address at the top of some stack, would otherwise send
// every sample to the loader).
struct UnknownPcMemo {
  std::uint32_t unchecked = 0;
  std::uint32_t serial = 0;
  std::uintptr_t page = 0;
};
inline thread_local UnknownPcMemo tls_unknown_pc HEAPPROF_TLS_MODEL;

inline const ObjectSet* SampleObjects() noexcept {
  const ObjectSet* s = g_objects.load(std::memory_order_seq_cst);  // after the section's entry
  UnknownPcMemo& m = tls_unknown_pc;
  if (HEAPPROF_LIKELY(s != nullptr) && HEAPPROF_LIKELY(++m.unchecked < kGenerationCheckEvery)) return s;
  m.unchecked = 0;
  return CurrentObjects();
}

// After a walk on `set` met `pc` in no object: a fresh snapshot if the
// loader's generation moved, else null (and the PC's page is remembered).
inline const ObjectSet* ObjectsAfterUnknownPc(const ObjectSet* set, std::uintptr_t pc) noexcept {
  UnknownPcMemo& m = tls_unknown_pc;
  if (m.serial == set->serial && m.page == (pc >> 12)) return nullptr;
  m.unchecked = 0;
  const ObjectSet* fresh = CurrentObjects();
  if (fresh != nullptr && fresh != set) return fresh;
  m.serial = set->serial;
  m.page = pc >> 12;
  return nullptr;
}

// For the frame-pointer unwinder, which reads no loaded objects: the PCs of a
// stack a sample has just made a record for are looked up in the published
// snapshot, and one in no object refreshes it if the loader's generation
// moved (a library loaded since; the refresh remembers it for profiles written
// after its dlclose, elf::NoteLoadedObject). A stack seen before was checked
// when it was new, so this runs only on a sample's first sight of a stack.
inline void NoteStackObjects(const std::uintptr_t* pcs, std::uint32_t depth) noexcept {
  ReaderSection reading;
  if (!reading.active()) return;
  const ObjectSet* set = g_objects.load(std::memory_order_seq_cst);  // after the section's entry
  if (set == nullptr) {
    (void)CurrentObjects();  // the first snapshot notes every object loaded now
    return;
  }
  for (std::uint32_t i = 0; i < depth; ++i) {
    if (FindObject(*set, pcs[i]) == nullptr) {
      (void)ObjectsAfterUnknownPc(set, pcs[i]);
      return;
    }
  }
}

// ---------------------------------------------------------------- stepping

struct Regs {
  std::uintptr_t pc;  // a return address (the frame's "current" pc is pc - 1)
  std::uintptr_t sp;  // the frame's stack pointer: its callee's CFA
  std::uintptr_t fp;  // rbp as this frame sees it; 0 when unknown
  // The stack word the step to this frame read `fp` from (0: none, it was
  // kept or lost; kNotReplayable: the step read a word the replay does not
  // check). The return address always comes from sp - 8. See WalkRecords.
  std::uintptr_t fp_at = 0;
};

constexpr std::uintptr_t kNotReplayable = 1;  // never an aligned stack address

struct Cursor {
  const ObjectSet* set;
  std::uintptr_t stack_lo;
  std::uintptr_t stack_hi;
  std::uint64_t tag = CacheTag(set->serial);  // a copy: stores to the cache may alias set->serial
  const Object* object = nullptr;  // the last object a lookup hit: frames cluster
  const Table* table = nullptr;
  std::uintptr_t unknown_pc = 0;   // the first PC found in no object of `set`, if any
  int guesses_left = 0;            // wrong guesses this walk may still make (ReturnAddressAt)
  // Set by SignalFrameStep when the interrupted code's sp is outside these
  // bounds (a handler on its sigaltstack): its registers, for a walk of its
  // own stack (UnwindFrom). pc 0: none.
  std::uintptr_t interrupted_pc = 0, interrupted_sp = 0, interrupted_fp = 0;
  // Not null on a stack whose top is not known (ForeignStackBounds: the
  // probe's limit): Walk sets it to the CFA its last step needed when that
  // lay above stack_hi (see CfaBeyondTop), else 0.
  std::uintptr_t* beyond = nullptr;
};

// One aligned word of the stack, if it lies in [lo, hi).
HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE bool LoadWord(std::uintptr_t addr, const Cursor& c,
                                                             std::uintptr_t& out) noexcept {
  if ((addr & 7) != 0 || addr < c.stack_lo || addr >= c.stack_hi || c.stack_hi - addr < 8) return false;
  out = *reinterpret_cast<const std::uintptr_t*>(addr);
  return true;
}

// The rule at `pc` in `o`, whose table is not built: one FDE's, or, once
// `o` is known to need its table (small, or unsearchable), the table's (then
// `table` is set).
inline std::uint32_t OneFdeRule(Object* o, std::uintptr_t pc, const Table*& table) noexcept {
  const LazyRequest req = AskOneFde(o, pc);
  if (!req.found) return 0;  // unloaded since the snapshot: nothing to read
  if (req.build) {
    table = EnsureTable(o);
    return Lookup(*table, pc);
  }
  o->lazy_lookups.fetch_add(1, std::memory_order_relaxed);
  g_stat_lazy_lookups.fetch_add(1, std::memory_order_relaxed);
  return req.rule;
}

// The rule at `pc` of an object whose table is not built (OneFdeRule).
__attribute__((__noinline__)) inline std::uint32_t LazyRuleAt(Cursor& c, std::uintptr_t pc) noexcept {
  Object* o = FindObject(*c.set, pc);
  return o != nullptr ? OneFdeRule(o, pc, c.table) : 0;
}

// The rule for the instruction at `pc` from the tables (0 if none). Out of
// line: it is the cache-miss path, and see HEAPPROF_DETAIL_NO_ASAN.
__attribute__((__noinline__)) inline std::uint32_t TableRuleAt(Cursor& c, std::uintptr_t pc) noexcept {
  if (c.object == nullptr || pc - c.object->lo >= c.object->hi - c.object->lo) {
    Object* o = FindObject(*c.set, pc);
    if (o == nullptr) {
      if (c.unknown_pc == 0) c.unknown_pc = pc;
      return 0;
    }
    c.object = o;
    c.table = TableOrLazy(o);
  }
  if (HEAPPROF_UNLIKELY(c.table == nullptr)) return LazyRuleAt(c, pc);
  return Lookup(*c.table, pc);
}

// The low bits of return addresses are close to uniform; anything more
// (a multiply, a shift-xor) sits on the critical path of every frame.
HEAPPROF_ALWAYS_INLINE std::size_t CacheSlot(std::uintptr_t ra) noexcept {
  return ra & (kRuleCacheEntries - 1);
}

struct CachedRule {
  std::uintptr_t cfa_offset;  // sign-extended, ready to add
  std::uint32_t bits;         // the eh::Rule
};

HEAPPROF_ALWAYS_INLINE std::uint64_t CacheKey(std::uintptr_t ra, std::uint64_t word, std::uint64_t tag) noexcept {
  return ra ^ word ^ tag;
}

// The rule as the cache holds it. A CFA of sp + off with off < 8 or not a
// multiple of 8 fails CfaValid from any frame (sp is 8-aligned), so such a
// rule is cached as the end of the stack: the same step. Every cached
// sp-relative rule then has a CFA above sp and aligned, and Step's frameless
// path checks only the stack's top.
constexpr eh::Rule CacheableRule(eh::Rule rule) noexcept {
  if (rule.cfa_kind() == eh::kCfaSpRel && (rule.cfa_offset() < 8 || rule.cfa_offset() % 8 != 0)) {
    return eh::Rule::Make(eh::kCfaEnd, 0, eh::kFpSame, 0);
  }
  return rule;
}

// Slot `slot`'s word, and whether the slot holds `ra`'s rule (that word) for
// the snapshot tagged `tag`.
HEAPPROF_ALWAYS_INLINE std::uint64_t CacheWord(std::size_t slot) noexcept {
  return g_rule_cache.e[slot].word.load(std::memory_order_relaxed);
}
HEAPPROF_ALWAYS_INLINE bool CacheHolds(std::size_t slot, std::uintptr_t ra, std::uint64_t tag,
                                       std::uint64_t word) noexcept {
  return g_rule_cache.e[slot].key.load(std::memory_order_relaxed) == CacheKey(ra, word, tag);
}

HEAPPROF_ALWAYS_INLINE CachedRule Unpack(std::uint64_t word) noexcept {
  return CachedRule{static_cast<std::uintptr_t>(static_cast<std::int64_t>(word) >> 32),
                    static_cast<std::uint32_t>(word)};
}

// The cache-miss path: the slot's neighbour, then the tables and a cache
// entry. Out of line, and see HEAPPROF_DETAIL_NO_ASAN.
//
// Two hot return addresses that share their low 12 bits would evict each
// other at every walk (a table lookup, ~13 ns, each time: seen in
// bench_sample_cost when a change elsewhere moved the code). So a miss
// looks in slot i ^ 1 too, and a rule whose slot holds a live entry of
// another return address (its key, word and tag give that address back, and
// it maps to the slot) goes to the neighbour. The hit path is unchanged.
__attribute__((__noinline__)) inline CachedRule RuleMiss(Cursor& c, std::uintptr_t ra, std::size_t i) noexcept {
  const std::size_t j = i ^ 1;
  {
    const std::uint64_t word = CacheWord(j);
    if (CacheHolds(j, ra, c.tag, word)) return Unpack(word);
  }
  const eh::Rule rule = CacheableRule(eh::Rule{TableRuleAt(c, ra - 1)});
  const auto off = static_cast<std::int32_t>(rule.cfa_offset());
  const std::uint64_t word = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(off)) << 32) | rule.bits;
  const std::uintptr_t other = g_rule_cache.e[i].key.load(std::memory_order_relaxed) ^
                               g_rule_cache.e[i].word.load(std::memory_order_relaxed) ^ c.tag;
  const std::size_t at = other != ra && CacheSlot(other) == i ? j : i;
  g_rule_cache.e[at].word.store(word, std::memory_order_relaxed);
  g_rule_cache.e[at].key.store(CacheKey(ra, word, c.tag), std::memory_order_relaxed);
  return Unpack(word);
}

// The rule for the frame whose return address is `ra` (the instruction
// looked up is ra - 1, inside the call): the cache, else the tables.
HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE CachedRule RuleAt(Cursor& c, std::uintptr_t ra) noexcept {
  const std::size_t i = CacheSlot(ra);
  const std::uint64_t word = CacheWord(i);
  if (HEAPPROF_LIKELY(CacheHolds(i, ra, c.tag, word))) return Unpack(word);
  return RuleMiss(c, ra, i);
}

// One frame-pointer step, taken only when rbp plausibly is this frame's
// record: aligned, inside the stack, at or above sp; and the return address
// it holds lies in a loaded object.
HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE bool FramePointerStep(Cursor& c, Regs& r) noexcept {
  const std::uintptr_t fp = r.fp;
  if (fp < r.sp) return false;
  std::uintptr_t saved_fp, ra;
  if (!LoadWord(fp, c, saved_fp) || !LoadWord(fp + 8, c, ra)) return false;
  if (ra == 0) return false;
  if (FindObject(*c.set, ra) == nullptr) {
    if (c.unknown_pc == 0) c.unknown_pc = ra;
    return false;
  }
  r.pc = ra;
  r.sp = fp + 16;
  r.fp = saved_fp;
  r.fp_at = fp;
  return true;
}

// Completes a step once the CFA is known: the return address at CFA - 8 and
// the caller's fp. `cfa` must be checked by the caller to be 8-aligned and in
// [r.sp + 8, stack_hi]: then CFA - 8 lies in [sp, hi) (sp >= stack_lo holds
// for every frame, by induction from the first) and needs no further check.
// `ra` is the word at cfa - 8 (read by the caller).
HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE bool FinishStepAt(const Cursor& c, Regs& r, std::uint32_t bits,
                                                                 std::uintptr_t cfa, std::uintptr_t ra) noexcept {
  if (ra == 0) return false;
  const eh::Rule rule{bits};
  std::uintptr_t fp = r.fp;
  std::uintptr_t fp_at = 0;
  const eh::FpKind fp_kind = rule.fp_kind();
  if (fp_kind == eh::kFpAtCfa) {  // the common one first: a frame that pushed rbp
    // cfa is 8-aligned and the offset a multiple of 8: one range check.
    fp_at = cfa + static_cast<std::uintptr_t>(rule.fp_offset());
    if (fp_at - c.stack_lo > c.stack_hi - c.stack_lo - 8) return false;
    fp = *reinterpret_cast<const std::uintptr_t*>(fp_at);
  } else if (HEAPPROF_UNLIKELY(fp_kind != eh::kFpSame)) {  // kFpSame: code without frame pointers
    if (fp_kind == eh::kFpAtFp) {
      fp_at = r.fp + static_cast<std::uintptr_t>(rule.fp_offset());
      if (!LoadWord(fp_at, c, fp)) return false;
    } else {
      fp = 0;  // kFpLost: any later rule that needs it fails its bounds check
    }
  }
  r.pc = ra;
  r.sp = cfa;
  r.fp = fp;
  r.fp_at = fp_at;
  return true;
}
HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE bool FinishStep(const Cursor& c, Regs& r, std::uint32_t bits,
                                                               std::uintptr_t cfa) noexcept {
  return FinishStepAt(c, r, bits, cfa, *reinterpret_cast<const std::uintptr_t*>(cfa - 8));
}

// The return address at cfa - 8 of a frame whose CFA is sp + offset, through
// the guess of its slot. Such a walk is one dependent chain a frame: return
// address -> its slot's CFA offset -> CFA -> the next return address, two
// loads. The guess (the word found there the last time a walk stepped out of
// a frame with this slot) is read beside the offset, so while guesses are
// right the chain is one load a frame: the compare below is a predicted
// branch and the next frame's lookup starts from the guess without waiting
// for the stack word. The word still decides: a wrong guess is replaced, and
// costs a mispredicted branch (~15-20 cycles, more than the two loads it
// would save), so a walk stops guessing after kWrongGuesses of them and
// steps its remaining frames from the words, recording them for the next
// walk (a store to a shared line, on the sample path only). A recursion
// takes two a walk: its way out (a return address into the recursion, then
// one into its caller) overwrites the guess its way in needs, and back. A
// thread whose walks keep making all three stops guessing for a while
// (kWastedGuessWalks, below).
constexpr int kWrongGuesses = 3;
// Off: no walk guesses (the benchmark's comparison; tests).
inline std::atomic<bool> g_guess_walks{true};

HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE std::uintptr_t ReturnAddressAt(Cursor& c, std::uintptr_t cfa,
                                                                              std::size_t slot) noexcept {
  const std::uintptr_t ra = *reinterpret_cast<const std::uintptr_t*>(cfa - 8);
#if defined(__x86_64__)
  // Opaque to the compiler, so the guess's address comes from the slot alone:
  // with the cache as three arrays it derived it from the key's, (slot +
  // 0x1000) * 8, three more instructions on the chain. (With one array of
  // entries the code is the same either way; kept against that.)
  asm("" : "+r"(slot));
  std::atomic<std::uintptr_t>& next = g_guesses.next_ra[slot];
  if (c.guesses_left > 0) {
    const std::uintptr_t guess = next.load(std::memory_order_relaxed);
    // The compare in asm: in C++ the compiler would know the two equal after
    // it and use `ra`, the stack word, for what follows: the chain this
    // avoids. Here it knows only the branch.
    asm goto("cmpq %0, %1\n\tjne %l[wrong]" : : "r"(ra), "r"(guess) : "cc" : wrong);
    return guess;
  wrong:
    --c.guesses_left;
  }
  next.store(ra, std::memory_order_relaxed);
#else
  (void)c, (void)slot;
#endif
  return ra;
}

// The caller's frame lies strictly above ours (so the walk terminates) and
// below the stack's top; words are aligned: cfa is 8-aligned and in
// [sp + 8, hi]. sp is 8-aligned (by induction from the first frame), so with
// d = cfa - sp - 8 that is: d % 8 == 0 and d <= hi - sp - 8, which is one
// unsigned compare of d rotated right by 3 (a misaligned d turns into a
// number >= 2^61, a negative one too) against (hi - sp) / 8, the count of
// valid d / 8 values (0 when fewer than 8 bytes are left). Three compares
// before; this runs every frame.
HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE bool CfaValid(const Cursor& c, const Regs& r,
                                                             std::uintptr_t cfa) noexcept {
  const std::uintptr_t d = cfa - r.sp - 8;
  return ((d >> 3) | (d << 61)) < ((c.stack_hi - r.sp) >> 3);
}

// Out of a signal trampoline (glibc's __restore_rt, its CIE marked 'S') into
// the code the signal interrupted. The handler returned into the trampoline
// with the kernel's rt_sigframe above it: `r.sp`, the handler's CFA, is that
// frame's ucontext_t, whose uc_mcontext.gregs hold the interrupted registers
// (x86-64 Linux ABI; glibc's own CFI for __restore_rt reads the same slots).
// The interrupted PC is not a return address: the instruction at it had not
// run, so the frame's pc is taken as PC + 1 (the lookup, like symbolization,
// takes pc - 1 as the instruction of a frame). Its sp must lie above this
// frame inside the same stack bounds (a handler on its sigaltstack
// interrupted code on another stack: this walk ends here, and UnwindFrom
// walks that stack on its own), and the step read words the replay does not
// check (kNotReplayable).
#if defined(__x86_64__)
constexpr std::uintptr_t kSigFrameGregs = 40;  // offsetof(ucontext_t, uc_mcontext.gregs)
constexpr std::uintptr_t kSigFrameRbp = kSigFrameGregs + 10 * 8;  // REG_RBP
constexpr std::uintptr_t kSigFrameRsp = kSigFrameGregs + 15 * 8;  // REG_RSP
constexpr std::uintptr_t kSigFrameRip = kSigFrameGregs + 16 * 8;  // REG_RIP
static_assert(offsetof(ucontext_t, uc_mcontext) == kSigFrameGregs, "the kernel's ucontext layout");
#endif
HEAPPROF_DETAIL_NO_ASAN __attribute__((__noinline__)) inline bool SignalFrameStep(Cursor& c, Regs& r) noexcept {
#if defined(__x86_64__)
  std::uintptr_t pc, sp, fp;
  if (!LoadWord(r.sp + kSigFrameRip, c, pc) || !LoadWord(r.sp + kSigFrameRsp, c, sp) ||
      !LoadWord(r.sp + kSigFrameRbp, c, fp)) {
    return false;
  }
  if (pc == 0 || pc == ~std::uintptr_t{0}) return false;
  if (!CfaValid(c, r, sp)) {
    c.interrupted_pc = pc + 1;
    c.interrupted_sp = sp;
    c.interrupted_fp = fp;
    return false;
  }
  r.pc = pc + 1;
  r.sp = sp;
  r.fp = fp;
  r.fp_at = kNotReplayable;
  return true;
#else
  (void)c, (void)r;
  return false;
#endif
}

// The rare rule kinds, out of line.
HEAPPROF_DETAIL_NO_ASAN __attribute__((__noinline__)) inline bool StepOther(Cursor& c, Regs& r, std::uint32_t bits,
                                                                        std::uintptr_t off) noexcept {
  const eh::Rule rule{bits};
  std::uintptr_t cfa;
  switch (rule.cfa_kind()) {
    case eh::kCfaFpDeref:
      if (!LoadWord(r.fp + off, c, cfa)) return false;
      if (!CfaValid(c, r, cfa) || !FinishStep(c, r, bits, cfa)) return false;
      r.fp_at = kNotReplayable;  // the CFA itself came from the stack
      return true;
    case eh::kCfaPlt:
      // The expression reads rip; like the lookup we take the instruction
      // inside the call, pc - 1 (only synthetic frames get here: code never
      // returns into a PLT entry).
      cfa = r.sp + off + (((r.pc - 1) & 15) >= rule.plt_threshold() ? 8 : 0);
      break;
    case eh::kCfaEnd:
      return false;
    case eh::kCfaSignal:
      return SignalFrameStep(c, r);
    case eh::kCfaNone:
      return FramePointerStep(c, r);
    default:
      return false;
  }
  if (!CfaValid(c, r, cfa)) return false;
  return FinishStep(c, r, bits, cfa);
}

// Moves `r` from a frame to its caller. False at the end of the stack or when
// the caller cannot be found safely. The common rules (CFA = sp/fp + offset)
// stay inline: this loop is bound by the latency of return address -> cache
// entry -> return address, so the fewer instructions between, the better.
//
// A frame with the standard frame-pointer rule (CFA = rbp + 16, the caller's
// rbp saved at CFA - 16: `push %rbp; mov %rsp,%rbp` code) goes first, with
// its offsets as constants: the branch on the rule is predicted, so the next
// frame's registers need only this frame's rbp and the word it points to,
// not the cache entry. The chain is then one load a frame, as in a
// frame-pointer walk; every step is still checked against the table's rule.
constexpr std::uint32_t kFramePointerRule = eh::Rule::Make(eh::kCfaFpRel, 16, eh::kFpAtCfa, -16).bits;
constexpr std::uint32_t kFramelessMask = 0x1fu;  // the CFA's kind and the fp's
constexpr std::uint32_t kFramelessBits = eh::kCfaSpRel | (eh::kFpSame << 3);
HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE bool Step(Cursor& c, Regs& r) noexcept {
  const CachedRule cached = RuleAt(c, r.pc);
  const std::uint32_t bits = cached.bits;
  if (HEAPPROF_LIKELY(bits == kFramePointerRule)) {
    const std::uintptr_t cfa = r.fp + 16;
    if (!CfaValid(c, r, cfa)) return false;
    return FinishStep(c, r, kFramePointerRule, cfa);
  }
  const std::uintptr_t off = cached.cfa_offset;
  // Code without frame pointers that leaves rbp alone: CFA = sp + off, the
  // caller's fp is this frame's. One compare for both kinds, and the CFA
  // needs only its upper bound (RuleMiss: off >= 8, a multiple of 8), so the
  // frame costs ~10 instructions fewer than through the general path below,
  // whose every check it still makes. A torn or coincidental cache read still
  // yields a word some RuleMiss wrote (each word is one atomic load), so that
  // holds for it too: cfa - 8 stays in [sp, stack_hi).
  if (HEAPPROF_LIKELY((bits & kFramelessMask) == kFramelessBits)) {
    const std::uintptr_t cfa = r.sp + off;
    if (cfa > c.stack_hi) return false;
    const std::uintptr_t ra = ReturnAddressAt(c, cfa, CacheSlot(r.pc));
    if (ra == 0) return false;
    r.pc = ra;
    r.sp = cfa;
    r.fp_at = 0;
    return true;
  }
  const std::uint32_t kind = bits & 7u;
  // Separate paths rather than a select: a conditional move would wait for
  // the cache entry's kind bits; a predicted branch does not. The common
  // kind first (code without frame pointers).
  if (HEAPPROF_LIKELY(kind == eh::kCfaSpRel)) {
    const std::uintptr_t cfa = r.sp + off;
    if (!CfaValid(c, r, cfa)) return false;
    return FinishStepAt(c, r, bits, cfa, ReturnAddressAt(c, cfa, CacheSlot(r.pc)));
  }
  if (kind == eh::kCfaFpRel) {
    const std::uintptr_t cfa = r.fp + off;
    if (!CfaValid(c, r, cfa)) return false;
    return FinishStep(c, r, bits, cfa);
  }
  // Through a copy: were `r` itself passed to an out-of-line call, the
  // compiler would keep it in memory for the whole walk.
  Regs copy = r;
  const bool ok = StepOther(c, copy, bits, off);
  r = copy;
  return ok;
}

// ---------------------------------------------------------------- replay
// Consecutive samples of a thread share their outer frames (main, the event
// loop, the request handler), and re-deriving those frames is most of a
// walk: one dependent chain of loads per frame (return address -> cache
// entry -> CFA -> next return address). So each thread keeps its last walk:
// every frame's registers and the address its fp came from. When a new walk
// reaches a frame with the same sp, pc and fp as a recorded one, the rest of
// the old walk is checked instead of re-derived: from there on a walk is a
// function of the snapshot's rules and the stack words it reads, and every
// word is compared with the value read last time (the return address at
// sp - 8 of each frame, the saved fp where it came from memory). The loads
// are independent, so the check runs at the loads' throughput rather than
// the chain's latency. At the first difference (or a step that read another
// word: a DW_CFA_def_cfa_expression) the walk goes on step by step from the
// last frame that matched, and may meet the old walk again further out. The
// result is always the step-by-step walk's.
struct WalkRecord {
  std::uint64_t tag = 0;         // the snapshot's CacheTag
  std::uintptr_t stack_hi = 0;   // the stack's top (CfaValid's bound)
  int n = 0;                     // frames recorded; 0: nothing to replay
  bool truncated = false;
  // What the profiler interned for this walk's stack (the engine's
  // StackRecord, never freed), handed on while walks repeat it exactly: a
  // repeated stack is not hashed and looked up again.
  const void* interned = nullptr;
  Regs frames[HEAPPROF_MAX_FRAMES];  // sp strictly increasing
};
// Two: the walk being made is written beside the one it may replay.
struct WalkRecords {
  WalkRecord rec[2];
  unsigned last = 0;       // rec[last]: the thread's last complete walk
  int replayed = 0;        // frames the last walk took from its predecessor (tests, benchmarks)
  int poor_walks = 0;      // walks in a row that replayed little (kPoorWalks)
  int stepped_walks = 0;   // walks left that look for no meeting
  int wasted_guess_walks = 0;  // walks in a row that made all their wrong guesses (kWastedGuessWalks)
  int unguessed_walks = 0;     // walks left that make no guess
  int guess_budget = 0;        // the wrong guesses the walk being made started with
  int last_wrong_guesses = 0;  // the last walk's wrong guesses (tests)
};

// A thread whose samples come from many call paths of same-sized frames (a
// recursion, a tree walk) replays little: its walks meet their predecessor by
// chance (same sp, pc and fp), replay a few frames and part, and those
// meetings cost more than they save (bench_sample_cost, random stacks at
// depth 32: 406 ns a sample replaying, 303 stepping). A walk of kScoredDepth
// frames or more is poor when it had such a short meeting and replayed under
// half its frames; one that replayed half or more is good. After kPoorWalks
// poor walks with no good one between, the thread's next kSteppedWalks walks
// step every frame (their frames are still recorded); then one walk looks
// for meetings again, and if it is poor another stepped run starts at once.
// Walks that only met where they went on to share the old walk's frames
// (different inner frames, the same outer ones: the usual case) are neither.
// Short walks cost little either way and count for nothing.
constexpr int kPoorWalks = 8;
constexpr int kSteppedWalks = 64;
constexpr int kScoredDepth = 8;

// A walk that looked for meetings, scored (see above).
__attribute__((__noinline__)) inline void ScoreWalk(WalkRecords& w, int depth, int replayed, int short_meetings) noexcept {
  if (depth < kScoredDepth) return;
  if (replayed * 2 >= depth) {
    w.poor_walks = 0;
  } else if (short_meetings > 0 && ++w.poor_walks >= kPoorWalks) {
    w.stepped_walks = kSteppedWalks;
    w.poor_walks = kPoorWalks - 1;  // the walk after the run decides alone
  }
}

// The guesses' counterpart of the stepped runs. A walk that made all
// kWrongGuesses wrong guesses paid for up to three mispredicted branches
// (~15-20 cycles each) and saved little: on stacks unlike each other (many
// call paths through the same functions) the word at a slot is its last
// caller's, right about as often as wrong, and each right guess saves one
// load's latency. A recursion takes two wrong guesses a walk and many right
// ones, so it never gets here. After kWastedGuessWalks such walks in a row,
// the thread's next kUnguessedWalks walks make no guess (the words still
// teach the guesses); then one walk guesses again, and if it too makes all
// its wrong guesses another run starts at once. Measured on random stacks at
// depth 32 (bench_sample_cost): 256-263 ns a sample guessing, 242-253
// without.
constexpr int kWastedGuessWalks = 4;
constexpr int kUnguessedWalks = 64;

// The guesses the thread's next walk may get wrong (0: it makes none).
// Kept in `w` across the walk, not in a register: the walk's loop has none
// to spare (a local measured 6 ns slower a stepped walk, bench_unwind).
HEAPPROF_ALWAYS_INLINE int GuessesForWalk(WalkRecords* w) noexcept {
  int budget = g_guess_walks.load(std::memory_order_relaxed) ? kWrongGuesses : 0;
  if (w == nullptr) return budget;
  if (HEAPPROF_UNLIKELY(w->unguessed_walks > 0)) {
    --w->unguessed_walks;
    budget = 0;
  }
  w->guess_budget = budget;
  return budget;
}

// After the walk, which ended with `left` wrong guesses to spare.
HEAPPROF_ALWAYS_INLINE void ScoreGuesses(WalkRecords* w, int left) noexcept {
  if (w == nullptr) return;
  const int budget = w->guess_budget;
  w->last_wrong_guesses = budget - left;
  if (budget == 0) return;  // a walk of an unguessed run (or guesses off) tells nothing
  if (left > 0) {
    w->wasted_guess_walks = 0;
  } else if (++w->wasted_guess_walks >= kWastedGuessWalks) {
    w->unguessed_walks = kUnguessedWalks;
    w->wasted_guess_walks = kWastedGuessWalks - 1;  // the walk after the run decides alone
  }
}

inline void ForgetWalks(WalkRecords* w) noexcept {
  if (w == nullptr) return;
  w->wasted_guess_walks = 0;
  w->unguessed_walks = 0;
  w->last_wrong_guesses = 0;
  w->rec[0].n = 0;
  w->rec[1].n = 0;
  w->rec[0].interned = nullptr;
  w->rec[1].interned = nullptr;
  w->replayed = 0;
  w->poor_walks = 0;
  w->stepped_walks = 0;
}

// Off: every walk steps every frame (the benchmark's comparison; tests).
inline std::atomic<bool> g_replay_walks{true};


// Checks prev's frames j+1, j+2, ... against the stack, as long as they
// match, up to the end of prev or to `end` (exclusive: the frame at `end`,
// if it matches, only says the stack goes on past the cap). Appends each
// match's pc to `pcs` (at its index + shift) and, if kCopy, its registers to
// `to`. Returns the index of the first frame not taken.
template <bool kCopy>
HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE int ReplayFrames(const Cursor& c, const Regs* __restrict from, int j,
                                                                int n, int end, int shift, Regs* __restrict to,
                                                                std::uintptr_t* __restrict pcs,
                                                                bool& truncated) noexcept {
  // Locals: the stores must not make the compiler reload the bounds.
  const std::uintptr_t lo = c.stack_lo;
  const std::uintptr_t span = c.stack_hi - c.stack_lo - 8;
  int m = j + 1;
  for (; m < n; ++m) {
    const Regs f = from[m];
    // sp > sp[j] = r.sp >= stack_lo and sp <= stack_hi: sp - 8 is inside
    // the stack, aligned.
    if (*reinterpret_cast<const std::uintptr_t*>(f.sp - 8) != f.pc) break;
    if (f.fp_at != 0) {
      // The step's own bounds (this walk's stack_lo may be higher; the
      // kNotReplayable mark fails them too; recorded addresses are aligned),
      // then the word.
      if (f.fp_at - lo > span || *reinterpret_cast<const std::uintptr_t*>(f.fp_at) != f.fp) break;
    }
    if (m == end) {  // the step to frame m succeeds: the stack is deeper than the cap
      truncated = true;
      break;
    }
    if (kCopy) to[m + shift] = f;
    pcs[m + shift] = f.pc;
  }
  return m;
}

// The walk met `prev`'s frame j (same registers) at index depth - 1: checks
// prev's frames j+1.. against the stack, in order, and appends each that
// matches to `out` (and the record) from `depth` on, up to the first that
// does not (or the cap: then `truncated`). Returns the index in `prev` of the
// frame the walk is now at (whose registers are that frame of prev), and `depth`
// as if each frame had been stepped. `in_place`: the frames matched are at
// the same index in `prev` as in this walk, and prev's frames all matched:
// prev's record already holds them, so they were not copied to `next` (the
// caller moves its own frames into prev instead, usually far fewer).
// Results by value: a walk variable whose address reached this out-of-line
// call would live in memory for the whole walk, and every step would then
// store and reload the registers (measured: 3.4 ns a frame, a 16-byte copy
// of two 8-byte stores defeating store forwarding).
struct ReplayResult {
  int j;
  int depth;
  bool truncated;
  bool in_place;
};
HEAPPROF_DETAIL_NO_ASAN __attribute__((__noinline__)) inline ReplayResult Replay(const Cursor& c, const WalkRecord& prev,
                                                                             int j, WalkRecord& next,
                                                                             CapturedStack& out, int depth) noexcept {
  const int n = prev.n;
  const int room = HEAPPROF_MAX_FRAMES - depth;  // frames that fit
  const int end = n - (j + 1) > room ? j + 1 + room : n;
  const int shift = depth - (j + 1);  // prev's frame m goes to index m + shift
  int m;
  bool truncated = false;
  bool in_place = false;
  if (shift == 0) {
    // (end == n here: prev's frames fit where they are.)
    m = ReplayFrames<false>(c, prev.frames, j, n, end, 0, nullptr, out.pcs, truncated);
    if (m == n) {
      in_place = true;
    } else {
      std::memcpy(next.frames + j + 1, prev.frames + j + 1, sizeof(Regs) * static_cast<std::size_t>(m - j - 1));
    }
  } else {
    m = ReplayFrames<true>(c, prev.frames, j, n, end, shift, next.frames, out.pcs, truncated);
  }
  const int last = m - 1;
  return ReplayResult{last, depth + last - j, truncated, in_place};
}

// The CFA the step out of frame `r` would need when that lies above
// stack_hi (aligned): the walk stopped at the bound, not at the end of the
// stack or at a frame it cannot step. 0 otherwise. Only asked on a stack
// whose top the profiler did not know (Cursor::beyond), once a walk. The
// registers by value: were `r` passed by reference, the walk would keep it in
// memory throughout (2x slower stepped walks, bench_unwind).
HEAPPROF_DETAIL_NO_ASAN __attribute__((__noinline__)) inline std::uintptr_t CfaBeyondTop(Cursor& c, std::uintptr_t pc,
                                                                                  std::uintptr_t sp,
                                                                                  std::uintptr_t fp) noexcept {
  const CachedRule cached = RuleAt(c, pc);
  const std::uint32_t kind = cached.bits & 7u;
  std::uintptr_t cfa = 0;
  if (kind == eh::kCfaSpRel) {
    cfa = sp + cached.cfa_offset;
  } else if (kind == eh::kCfaFpRel) {
    cfa = fp + cached.cfa_offset;
  } else if (kind == eh::kCfaNone && fp >= sp) {
    cfa = fp + 16;  // FramePointerStep's record
  }
  return (cfa & 7) == 0 && cfa > c.stack_hi ? cfa : 0;
}

HEAPPROF_DETAIL_NO_ASAN HEAPPROF_ALWAYS_INLINE bool Walk(Cursor& c, std::uintptr_t frame, std::uintptr_t leaf,
                                                         CapturedStack& out, WalkRecords* w) noexcept {
  // The slow path's frame record: [frame] = the hook's rbp, [frame + 8] =
  // return address into the hook; the hook's sp is just above.
  std::uintptr_t hook_fp, hook_pc;
  if (!LoadWord(frame, c, hook_fp) || !LoadWord(frame + 8, c, hook_pc)) return false;
  Regs r{hook_pc, frame + 16, hook_fp};
  // Step out of the hook: its caller's pc must be the leaf we were given. One
  // more step when it is not: the slow path was called by a hook's cold
  // function (block_hooks.hpp) that its hook did not reach with a tail call.
  if (!Step(c, r)) return false;
  if (HEAPPROF_UNLIKELY(r.pc != leaf) && (!Step(c, r) || r.pc != leaf)) return false;
  // The depth in a local, not out.depth: stores to out.pcs could alias it
  // and force a reload every frame.
  int depth = 0;
  bool truncated = false;
  if (w == nullptr) {
    out.pcs[depth++] = leaf;
    while (Step(c, r)) {
      if (depth == HEAPPROF_MAX_FRAMES) {
        truncated = true;
        break;
      }
      out.pcs[depth++] = r.pc;
    }
    if (HEAPPROF_UNLIKELY(c.beyond != nullptr) && !truncated) *c.beyond = CfaBeyondTop(c, r.pc, r.sp, r.fp);
    out.depth = depth;
    out.truncated = truncated;
    return true;
  }
  WalkRecord& prev = w->rec[w->last];
  WalkRecord& next = w->rec[w->last ^ 1u];
  WalkRecord* rec = &next;  // where this walk's frames go
  // Where the previous walk can be met: frames at or above this sp.
  int j = 0;
  bool look = g_replay_walks.load(std::memory_order_relaxed);
  if (HEAPPROF_UNLIKELY(w->stepped_walks > 0)) {  // a stepped run (kPoorWalks)
    --w->stepped_walks;
    look = false;
  }
  int meet_end = look && prev.tag == c.tag && prev.stack_hi == c.stack_hi ? prev.n : 0;
  const bool looked = meet_end != 0;
  int replayed = 0;
  bool met_first = false;  // met prev's first frame with our first
  int short_meetings = 0;
  for (;;) {
    out.pcs[depth] = r.pc;
    rec->frames[depth] = r;
    ++depth;
    if (j < meet_end) {
      while (j < meet_end && prev.frames[j].sp < r.sp) ++j;
      // A meeting: the same registers, and (unless prev ends here) the
      // stack still holds prev's next return address. Without the last test
      // a stack matching prev's frames at random (same frame sizes, same
      // call sites) called Replay to check one word and return, several
      // times a walk (bench/unwind.cpp, random stacks: 6.6 ns a frame, now
      // 6.05; stepping every frame 4.2). Replay would have stopped at that
      // word, so the walk is the same. (The same tests joined with & into one
      // branch measured slower.)
      if (j < meet_end && prev.frames[j].sp == r.sp && prev.frames[j].pc == r.pc && prev.frames[j].fp == r.fp &&
          (j + 1 == prev.n ||
           *reinterpret_cast<const std::uintptr_t*>(prev.frames[j + 1].sp - 8) == prev.frames[j + 1].pc)) {
        const int before = depth;
        met_first |= j == 0 && depth == 1;
        const ReplayResult met = Replay(c, prev, j, next, out, depth);
        j = met.j;
        depth = met.depth;
        truncated = met.truncated;
        r = prev.frames[j];
        replayed += depth - before;
        if (met.in_place) {
          // prev holds every frame from the meeting on (j + 1 == meet_end
          // now: no more meetings); this walk's own frames before it move
          // over, and prev becomes this walk's record.
          std::memcpy(prev.frames, next.frames, sizeof(Regs) * static_cast<std::size_t>(before));
          rec = &prev;
        }
        if (truncated) break;
        // A meeting that replayed fewer than 4 frames cost more than it
        // saved (an out-of-line call, for a few frames at load throughput);
        // after two, the walk stops looking for meetings and steps the rest
        // (bench/unwind.cpp, random stacks: 6.05 -> 5.8 ns a frame; after one,
        // 5.0-5.2, but a stack that meets its predecessor by chance at a shared
        // helper and for good further out would lose the replay).
        if (depth - before < 4 && ++short_meetings == 2) meet_end = 0;
        ++j;  // the frame that differed (if any) is stepped, and may meet again
      }
    }
    if (!Step(c, r)) {
      if (HEAPPROF_UNLIKELY(c.beyond != nullptr)) *c.beyond = CfaBeyondTop(c, r.pc, r.sp, r.fp);
      break;
    }
    if (depth == HEAPPROF_MAX_FRAMES) {
      truncated = true;
      break;
    }
  }
  out.depth = depth;
  out.truncated = truncated;
  // The same stack as prev, frame for frame: met at the first frame, every
  // later one replayed, no frame more or less. (Read before `rec`, which may
  // be prev, is written.)
  const bool repeat = met_first && depth == prev.n && replayed == depth - 1 && truncated == prev.truncated;
  const void* const prev_interned = prev.interned;
  // A walk that found a PC in no known object is walked again on a fresh
  // snapshot; it is not a base for the next one.
  rec->n = c.unknown_pc == 0 ? depth : 0;
  rec->tag = c.tag;
  rec->stack_hi = c.stack_hi;
  rec->truncated = truncated;
  rec->interned = repeat && rec->n != 0 ? prev_interned : nullptr;
  out.interned = rec->n != 0 ? &rec->interned : nullptr;
  if (rec == &next) w->last ^= 1u;
  w->replayed = replayed;
  // Nothing to do for a walk without short meetings on a thread with no
  // poor walks (a repeated stack: one test).
  if (HEAPPROF_UNLIKELY((short_meetings | w->poor_walks) != 0) && looked) ScoreWalk(*w, depth, replayed, short_meetings);
  return true;
}

// The frames of the code a signal interrupted on another stack than its
// handler's: from the registers the handler's walk found in the signal frame,
// within that stack's bounds [lo, hi), appended to `out`. Every frame
// stepped (no replay: the thread's walk record holds the handler's stack).
// Returns the first PC found in no object of the set (0 if none).
HEAPPROF_DETAIL_NO_ASAN __attribute__((__noinline__)) inline std::uintptr_t AppendInterrupted(const Cursor& from,
                                                                                       std::uintptr_t lo,
                                                                                       std::uintptr_t hi,
                                                                                       CapturedStack& out) noexcept {
  // A stack ending here is not the one the walk record may hand on: the
  // record holds only the handler's frames.
  if (out.interned != nullptr) {
    *out.interned = nullptr;
    out.interned = nullptr;
  }
  const std::uintptr_t sp = from.interrupted_sp;
  if (out.truncated || hi == 0 || (sp & 7) != 0 || sp < lo || sp >= hi) return 0;
  Cursor c{from.set, sp, hi};
  Regs r{from.interrupted_pc, sp, from.interrupted_fp};
  int depth = out.depth;
  if (depth == HEAPPROF_MAX_FRAMES) {
    out.truncated = true;
    return 0;
  }
  out.pcs[depth++] = r.pc;
  while (Step(c, r)) {
    if (depth == HEAPPROF_MAX_FRAMES) {
      out.truncated = true;
      break;
    }
    out.pcs[depth++] = r.pc;
  }
  out.depth = depth;
  return c.unknown_pc;
}

// The unwind itself, on a snapshot. Separate from UnwindWithTable so tests
// can run it on a hand-built stack. `unknown_pc`, if given, receives the
// first PC the walk found in no object of `set` (0 if none).
// `own_lo`/`own_hi`: the thread's own stack when `stack_lo`/`stack_hi` are
// another one's (a handler on its sigaltstack): past the signal frame, the
// interrupted code's frames are walked there.
HEAPPROF_DETAIL_NO_ASAN inline bool UnwindFrom(const ObjectSet* set, std::uintptr_t frame, std::uintptr_t leaf,
                                               std::uintptr_t stack_lo, std::uintptr_t stack_hi,
                                               CapturedStack& out, std::uintptr_t* unknown_pc = nullptr,
                                               WalkRecords* walks = nullptr, std::uintptr_t own_lo = 0,
                                               std::uintptr_t own_hi = 0, std::uintptr_t* beyond = nullptr) noexcept {
  Cursor c{set, stack_lo, stack_hi};
  c.beyond = beyond;
  if (beyond != nullptr) *beyond = 0;
  c.guesses_left = GuessesForWalk(walks);
  const bool ok = Walk(c, frame, leaf, out, walks);
  ScoreGuesses(walks, c.guesses_left);
  if (HEAPPROF_UNLIKELY(c.interrupted_pc != 0) && ok) {
    const std::uintptr_t unknown = AppendInterrupted(c, own_lo, own_hi, out);
    if (c.unknown_pc == 0) c.unknown_pc = unknown;
  }
  if (unknown_pc != nullptr) *unknown_pc = c.unknown_pc;  // the walk's first PC outside `set`
  return ok;
}

// The calling thread's walk records, made in the arena at its first walk
// (null if out of memory: walks then step every frame).
inline WalkRecords* ThreadWalks(ReaderSlot& slot) noexcept {
  if (HEAPPROF_LIKELY(slot.walks != nullptr)) return slot.walks;
  void* mem = g_arena.Allocate(sizeof(WalkRecords));
  if (mem == nullptr) return nullptr;
  slot.walks = new (mem) WalkRecords{};
  g_stat_bytes.fetch_add(sizeof(WalkRecords), std::memory_order_relaxed);
  return slot.walks;
}

// Frames the calling thread's last table walk took from its previous walk
// (tests, benchmarks).
inline int LastWalkReplayed() noexcept {
  ReaderSlot* slot = tls_reader_slot;
  return slot != nullptr && slot->walks != nullptr ? slot->walks->replayed : 0;
}

// The table of `pc`'s object, built if need be: for tests and the benchmark.
// False if `pc` is in no loaded object or that object has no table.
inline bool TableFor(const void* pc, const Table*& out) noexcept {
  ReaderSection reading;  // (the table itself stays valid while its object is loaded)
  if (!reading.active()) return false;
  const ObjectSet* set = CurrentObjects();
  if (set == nullptr) return false;
  Object* o = FindObject(*set, reinterpret_cast<std::uintptr_t>(pc));
  if (o == nullptr) return false;
  out = EnsureTable(o);
  return out != &kNoTable;
}

// The rule covering `pc` (0 if none): for tests.
inline std::uint32_t RuleForPc(const void* pc) noexcept {
  const Table* t = nullptr;
  if (!TableFor(pc, t)) return 0;
  return Lookup(*t, reinterpret_cast<std::uintptr_t>(pc));
}

// The rule covering `pc` from its one FDE (0 if none; `lazy` false when the
// object would build its table instead: small or unsearchable): for tests.
inline std::uint32_t LazyRuleForPc(const void* pc, bool& lazy) noexcept {
  lazy = false;
  ReaderSection reading;
  if (!reading.active()) return 0;
  const ObjectSet* set = CurrentObjects();
  if (set == nullptr) return 0;
  Object* o = FindObject(*set, reinterpret_cast<std::uintptr_t>(pc));
  if (o == nullptr) return 0;
  const LazyRequest req = AskOneFde(o, reinterpret_cast<std::uintptr_t>(pc));
  lazy = req.found && !req.build;
  return req.rule;
}

}  // namespace unwind_table

// Unwinds from the slow-path frame record `frame` (see unwind_fp.hpp for the
// contract: leaf = hook_return, the hook's own frame skipped, capped at
// HEAPPROF_MAX_FRAMES with truncated set). Falls back to the frame-pointer
// walk when the hook's own frame cannot be stepped with the table.
// `own_lo`/`own_hi`: see UnwindFrom (0: the bounds given are the thread's own).
// `beyond`: see UnwindFramePointers (the CFA the last step needed, above
// `stack_hi`; asked only on a stack whose top is not known).
inline void UnwindWithTable(const void* frame, const void* hook_return, std::uintptr_t stack_lo,
                            std::uintptr_t stack_hi, CapturedStack& out, std::uintptr_t own_lo = 0,
                            std::uintptr_t own_hi = 0, std::uintptr_t* beyond = nullptr) noexcept {
#if defined(HEAPPROF_ARCH_X86_64)
  out.depth = 0;
  out.truncated = false;
  out.interned = nullptr;
  if (hook_return == nullptr) return;
  {
    namespace ut = unwind_table;
    ut::ReaderSection reading;
    const ut::ObjectSet* set = reading.active() ? ut::SampleObjects() : nullptr;
    const auto fp = reinterpret_cast<std::uintptr_t>(frame);
    const auto leaf = reinterpret_cast<std::uintptr_t>(hook_return);
    std::uintptr_t unknown = 0;
    ut::WalkRecords* walks = set != nullptr ? ut::ThreadWalks(*reading.slot()) : nullptr;
    if (set != nullptr &&
        ut::UnwindFrom(set, fp, leaf, stack_lo, stack_hi, out, &unknown, walks, own_lo, own_hi, beyond)) {
      if (HEAPPROF_LIKELY(unknown == 0)) return;
      // A PC in no known object: a library loaded since the snapshot? Then
      // once more on a fresh one; else this stack stands.
      const ut::ObjectSet* fresh = ut::ObjectsAfterUnknownPc(set, unknown);
      if (fresh == nullptr ||
          ut::UnwindFrom(fresh, fp, leaf, stack_lo, stack_hi, out, nullptr, walks, own_lo, own_hi, beyond))
        return;
    }
  }
#endif
  UnwindFramePointers(frame, hook_return, stack_lo, stack_hi, out, own_lo, own_hi, beyond);
}

inline UnwindTableStats GetUnwindTableStats() noexcept {
  UnwindTableStats s;
  s.objects = unwind_table::g_stat_objects.load(std::memory_order_relaxed);
  s.rows = unwind_table::g_stat_rows.load(std::memory_order_relaxed);
  s.bytes = unwind_table::g_stat_bytes.load(std::memory_order_relaxed);
  if (s.bytes != 0) s.bytes += sizeof(unwind_table::g_rule_cache);  // .bss, touched once tables exist
  s.build_ms = static_cast<double>(unwind_table::g_stat_build_ns.load(std::memory_order_relaxed)) / 1e6;
  s.lazy_lookups = unwind_table::g_stat_lazy_lookups.load(std::memory_order_relaxed);
  return s;
}

}  // namespace detail
}  // namespace heapprof
