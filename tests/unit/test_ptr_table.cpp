// PtrSizeTable: the CPU allocator wrapper's pointer -> size map (profiler/ptr_table.h).
#include "profiler/ptr_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace memplan {
namespace {

const void* P(uintptr_t x) { return reinterpret_cast<const void*>(x); }

TEST(PtrSizeTable, TakeReturnsWhatWasInsertedOnce) {
  PtrSizeTable t(1u << 10);
  ASSERT_TRUE(t.insert(P(0x1000), 123));
  ASSERT_TRUE(t.insert(P(0x2040), 7));
  EXPECT_EQ(t.take(P(0x1000)), 123);
  EXPECT_EQ(t.take(P(0x1000)), -1);  // gone
  EXPECT_EQ(t.take(P(0x2040)), 7);
  EXPECT_EQ(t.take(P(0x3000)), -1);  // never inserted
}

TEST(PtrSizeTable, NullAndTombstoneKeysAreRefused) {
  PtrSizeTable t(1u << 4);
  EXPECT_FALSE(t.insert(nullptr, 1));
  EXPECT_FALSE(t.insert(P(1), 1));
}

TEST(PtrSizeTable, AddressReuseAfterFreeKeepsNewSize) {
  // malloc hands the same address out again and again: tombstones must not cut probe chains.
  PtrSizeTable t(1u << 6);
  for (int round = 0; round < 1000; ++round) {
    for (uintptr_t i = 1; i <= 20; ++i) ASSERT_TRUE(t.insert(P(i * 64), round * 100 + static_cast<int64_t>(i)));
    for (uintptr_t i = 20; i >= 1; --i) ASSERT_EQ(t.take(P(i * 64)), round * 100 + static_cast<int64_t>(i));
  }
}

TEST(PtrSizeTable, NeighbouringBlocksGetNeighbouringSlots) {
  // The slots of a step's blocks lie on as few pages as the blocks do (ptr_table.h, hash): eight
  // consecutive 64-byte blocks take eight different slots of one aligned group of eight.
  PtrSizeTable t(1u << 20);
  const uintptr_t base = (uintptr_t{0x7f3a12345} << 12) & ~uintptr_t{64 * 8 - 1};
  std::vector<size_t> homes;
  for (uintptr_t i = 0; i < 8; ++i) homes.push_back(t.home(P(base + 64 * i)));
  for (size_t i = 0; i < homes.size(); ++i) {
    EXPECT_EQ(homes[i] / 8, homes[0] / 8) << i;
    for (size_t j = 0; j < i; ++j) EXPECT_NE(homes[i], homes[j]) << i << " " << j;
  }
}

TEST(PtrSizeTable, BlocksOneTableSpanApartStartApart) {
  // 1M slots of 64-byte blocks span 64 MiB: blocks that far apart (mmap'd tensors of one size)
  // would all start probing at one slot if the hash kept only the low bits.
  PtrSizeTable t(1u << 20);
  const uintptr_t base = uintptr_t{0x7f3a00000000};
  const uintptr_t span = uintptr_t{64} << 20;
  std::vector<size_t> homes;
  for (uintptr_t i = 0; i < 16; ++i) homes.push_back(t.home(P(base + i * span)));
  for (size_t i = 0; i < homes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) EXPECT_NE(homes[i], homes[j]) << i << " " << j;
  }
  for (uintptr_t i = 0; i < 16; ++i) ASSERT_TRUE(t.insert(P(base + i * span), static_cast<int64_t>(i)));
  for (uintptr_t i = 0; i < 16; ++i) EXPECT_EQ(t.take(P(base + i * span)), static_cast<int64_t>(i));
}

TEST(PtrSizeTable, FullTableGivesUpInsteadOfBlocking) {
  PtrSizeTable t(1u << 4);
  int inserted = 0;
  for (uintptr_t i = 1; i <= 64; ++i) inserted += t.insert(P(i * 64), 1) ? 1 : 0;
  EXPECT_EQ(inserted, 16);
  EXPECT_EQ(t.take(P(65 * 64)), -1);
}

TEST(PtrSizeTable, ConcurrentInsertAndTakeLoseNothing) {
  PtrSizeTable t(1u << 16);
  std::atomic<int64_t> sum{0};
  auto worker = [&](uintptr_t base) {
    for (int round = 0; round < 200; ++round) {
      for (uintptr_t i = 0; i < 100; ++i) ASSERT_TRUE(t.insert(P(base + i * 64), static_cast<int64_t>(i)));
      for (uintptr_t i = 0; i < 100; ++i) sum += t.take(P(base + i * 64));
    }
  };
  std::thread a(worker, uintptr_t{1} << 32), b(worker, uintptr_t{2} << 32);
  a.join();
  b.join();
  EXPECT_EQ(sum.load(), 2 * 200 * (99 * 100 / 2));
}

}  // namespace
}  // namespace memplan
