// Lock-free pointer -> size table for the CPU allocator wrapper: insert on allocate, take on free.
//
// Open addressing with linear probing over a fixed array made once (16 bytes a slot, on huge
// pages where the kernel allows: see map_slots). Keys move 0 -> ptr -> tombstone -> ptr' ...;
// a slot never returns to 0, so a probe chain is never cut. A pointer is live at most once, so
// there are no duplicate keys. Probes are bounded: when the table is too full the caller gets
// `false` and leaves that allocation unaccounted (counted as untracked) rather than blocking.
// Cost: two shifts and a xor, ~1-2 CAS/loads per operation, usually one cache miss (the slot's
// line); no locks, no allocation.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include <sys/mman.h>

namespace memplan {

class PtrSizeTable {
 public:
  explicit PtrSizeTable(size_t capacity_pow2)
      : mask_(capacity_pow2 - 1),
        span_bits_(std::countr_zero(capacity_pow2)),
        slots_(map_slots(capacity_pow2)) {}

  // The slot where `ptr`'s probe starts (tests: neighbouring blocks, neighbouring slots).
  size_t home(const void* ptr) const { return hash(reinterpret_cast<uintptr_t>(ptr)); }

  bool insert(const void* ptr, int64_t size) {
    const uintptr_t key = reinterpret_cast<uintptr_t>(ptr);
    if (key <= kTombstone) return false;
    size_t i = hash(key);
    for (int probe = 0; probe < kMaxProbe; ++probe, i = (i + 1) & mask_) {
      uintptr_t cur = slots_[i].key.load(std::memory_order_acquire);
      if (cur == kEmpty || cur == kTombstone) {
        // Size first: a reader can only look for this key after the allocation returned.
        if (slots_[i].key.compare_exchange_strong(cur, key, std::memory_order_acq_rel)) {
          slots_[i].size.store(size, std::memory_order_release);
          return true;
        }
      }
    }
    return false;
  }

  // Removes ptr and returns its size, or -1 if it was never inserted (allocated before install,
  // or the insert gave up).
  int64_t take(const void* ptr) {
    const uintptr_t key = reinterpret_cast<uintptr_t>(ptr);
    size_t i = hash(key);
    for (int probe = 0; probe < kMaxProbe; ++probe, i = (i + 1) & mask_) {
      uintptr_t cur = slots_[i].key.load(std::memory_order_acquire);
      if (cur == key) {
        const int64_t size = slots_[i].size.load(std::memory_order_acquire);
        slots_[i].key.store(kTombstone, std::memory_order_release);
        return size;
      }
      if (cur == kEmpty) return -1;
    }
    return -1;
  }

 private:
  static constexpr uintptr_t kEmpty = 0;
  static constexpr uintptr_t kTombstone = 1;
  static constexpr int kMaxProbe = 128;
  struct Slot {
    std::atomic<uintptr_t> key{kEmpty};
    std::atomic<int64_t> size{0};
  };
  size_t hash(uintptr_t key) const {
    // Allocations are 64-byte aligned: drop those bits. Nearby blocks get nearby slots (16 bytes
    // of table per 64 of heap), so the slots a step touches lie on few pages, as its blocks do.
    // With a scattering hash (Fibonacci) the slot's load was 86% of the wrapper's time on a
    // dispatch-bound CPU step (a TLB and cache miss); with this one and huge pages the wrapper's
    // samples fell by 40% (README, "Measurements"). The bits above the table's span are folded in,
    // so blocks 64 MiB apart (the span of 1M slots) do not share their home slots.
    const uintptr_t block = key >> 6;
    return static_cast<size_t>(block ^ (block >> span_bits_)) & mask_;
  }
  // The slots on transparent huge pages where the kernel allows it (madvise mode): a 16 MiB
  // table on 4 KiB pages costs a TLB miss on most inserts. Falls back to plain memory.
  struct Unmap {
    size_t bytes = 0;
    void operator()(Slot* p) const {
      if (bytes != 0) {
        munmap(p, bytes);
      } else {
        delete[] p;
      }
    }
  };
  static std::unique_ptr<Slot[], Unmap> map_slots(size_t n) {
    const size_t bytes = n * sizeof(Slot);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return std::unique_ptr<Slot[], Unmap>(new Slot[n], Unmap{});
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    Slot* slots = static_cast<Slot*>(p);
    for (size_t i = 0; i < n; ++i) new (&slots[i]) Slot();
    return std::unique_ptr<Slot[], Unmap>(slots, Unmap{bytes});
  }
  size_t mask_;
  int span_bits_;  // log2 of the capacity
  std::unique_ptr<Slot[], Unmap> slots_;
};

}  // namespace memplan
