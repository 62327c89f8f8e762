// The arena's headroom (0_base/arena.hpp): memory mapped ahead of a profile
// write, carved before the OS is asked again, and the unused rest unmapped;
// and the writers' policy (5_encoding/write_headroom.hpp). Separate Arena
// objects, so the profiler's own g_arena is not involved.
#include <heapprof.hpp>
#include "heapprof/detail/0_base/arena.hpp"
#include "heapprof/detail/5_encoding/write_headroom.hpp"

#include <doctest/doctest.h>

#include <pthread.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>

namespace {

namespace hd = heapprof::detail;

// msync fails with ENOMEM on an address no mapping covers.
bool Mapped(std::uintptr_t address) {
  void* page = reinterpret_cast<void*>(address & ~std::uintptr_t{4095});
  return msync(page, 4096, MS_ASYNC) == 0 || errno != ENOMEM;
}

hd::Arena g_test_arena;  // constant-initialised, like g_arena

}  // namespace

TEST_CASE("arena headroom: chunks and large blocks are carved from it; what is left is unmapped at the end") {
  hd::Arena& a = g_test_arena;
  constexpr std::size_t kRoom = std::size_t{8} << 20;
  const std::size_t drawn_before = a.DrawnBytes();
  const int slot = a.AddHeadroom(kRoom);
  REQUIRE(slot >= 0);
  // The first small block needs a chunk: it is the headroom's first MiB.
  void* small = a.AllocateUninitialized(64);
  REQUIRE(small != nullptr);
  const auto base = reinterpret_cast<std::uintptr_t>(small);  // the lowest block of the first run
  CHECK(base % 4096 == 0);
  // A large block (its own mapping) comes next, right after the chunk.
  constexpr std::size_t kLarge = std::size_t{512} << 10;
  void* large = a.AllocateUninitialized(kLarge);
  REQUIRE(large != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(large) == base + hd::Arena::kChunk);
  CHECK(a.DrawnBytes() - drawn_before == hd::Arena::kChunk + kLarge);
  CHECK(a.MappedBytes() >= hd::Arena::kChunk + kLarge);
  const std::uintptr_t tail = base + hd::Arena::kChunk + kLarge;  // not carved
  CHECK(Mapped(tail));
  a.DropHeadroom(slot);
  CHECK_FALSE(Mapped(tail));                    // given back
  CHECK_FALSE(Mapped(base + kRoom - 4096));     // to its end
  CHECK(Mapped(base));                          // the carved chunk stays the arena's
  CHECK(Mapped(reinterpret_cast<std::uintptr_t>(large)));
  static_cast<char*>(large)[kLarge - 1] = 1;    // and is writable
  a.Free(large, kLarge);                        // a large block's free unmaps it
  CHECK_FALSE(Mapped(reinterpret_cast<std::uintptr_t>(large)));
  a.Free(small, 64);
  a.DropHeadroom(slot);  // twice: nothing left to give back
}

TEST_CASE("arena headroom: refused when the OS refuses the mapping, and every slot can be taken and freed") {
  hd::Arena& a = g_test_arena;
  CHECK(a.AddHeadroom(std::size_t{1} << 50) == -1);  // 1 PiB: more address space than there is
  int slots[hd::Arena::kMaxHeadroom];
  for (int& s : slots) {
    s = a.AddHeadroom(4096);
    CHECK(s >= 0);
  }
  CHECK(a.AddHeadroom(4096) == -1);  // all taken: refused, nothing kept mapped
  for (int s : slots) a.DropHeadroom(s);
  const int again = a.AddHeadroom(4096);
  CHECK(again >= 0);
  a.DropHeadroom(again);
}

TEST_CASE("write headroom: 64 MiB before the first write, then twice the last write's needs, 8 MiB to 1 GiB") {
  hd::WriteNeeds needs;  // a fresh one: no write seen yet
  CHECK(hd::WriteHeadroomBytes(needs) == hd::kFirstWriteHeadroom);
  CHECK(hd::kFirstWriteHeadroom == std::size_t{64} << 20);
  needs.Note(std::size_t{40} << 20);
  CHECK(hd::WriteHeadroomBytes(needs) == std::size_t{80} << 20);
  needs.Note(0);  // a warm write
  CHECK(hd::WriteHeadroomBytes(needs) == std::size_t{8} << 20);
  needs.Note(std::size_t{3} << 20);
  CHECK(hd::WriteHeadroomBytes(needs) == std::size_t{8} << 20);
  needs.Note(std::size_t{900} << 20);
  CHECK(hd::WriteHeadroomBytes(needs) == std::size_t{1} << 30);
}

namespace {
int CancelState() {
  int state = 0;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
  pthread_setcancelstate(state, nullptr);
  return state;
}
}  // namespace

TEST_CASE("write headroom: scopes nest on one region, hold off cancellation, and record the write's needs") {
  static hd::Arena a;
  hd::WriteNeeds needs;
  needs.Note(0);  // the next write maps the minimum, 8 MiB
  REQUIRE(CancelState() == PTHREAD_CANCEL_ENABLE);
  {
    hd::HeadroomScope outer(false, a, needs);  // a trigger check: would not record alone
    REQUIRE(outer.ok());
    CHECK(a.HeadroomHeld() == 1);
    CHECK(CancelState() == PTHREAD_CANCEL_DISABLE);
    {
      hd::HeadroomScope file(true, a, needs);  // a dump's file, then its profile
      hd::HeadroomScope build(true, a, needs);
      CHECK(file.ok());
      CHECK(build.ok());
      CHECK(a.HeadroomHeld() == 1);  // shared, not mapped again
      void* p = a.AllocateUninitialized(100);  // the arena's first chunk: 1 MiB drawn
      REQUIRE(p != nullptr);
      a.Free(p, 100);
    }
    CHECK(a.HeadroomHeld() == 1);  // the outermost gives it back
  }
  CHECK(a.HeadroomHeld() == 0);
  CHECK(CancelState() == PTHREAD_CANCEL_ENABLE);
  // Recorded by the outermost scope, since the inner ones asked.
  CHECK(needs.last.load() == hd::Arena::kChunk);
  {
    // Alone, a scope that does not record leaves the last needs as they were.
    hd::HeadroomScope piece(false, a, needs);
    REQUIRE(piece.ok());
    void* big = a.AllocateUninitialized(std::size_t{512} << 10);
    REQUIRE(big != nullptr);
    a.Free(big, std::size_t{512} << 10);
  }
  CHECK(needs.last.load() == hd::Arena::kChunk);
  {
    // What the write added to the debug-info cache is kept for later writes:
    // not counted in what the next needs.
    hd::HeadroomScope write(true, a, needs);
    REQUIRE(write.ok());
    void* big = a.AllocateUninitialized(std::size_t{512} << 10);
    REQUIRE(big != nullptr);
    hd::g_debug_info_bytes.fetch_add(std::size_t{128} << 10);  // as if 128 KiB of it were the cache's
    a.Free(big, std::size_t{512} << 10);
  }
  hd::g_debug_info_bytes.fetch_sub(std::size_t{128} << 10);
  CHECK(needs.last.load() == (std::size_t{384} << 10));
}
