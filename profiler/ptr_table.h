// Lock-free pointer -> size table for the CPU allocator wrapper: insert on allocate, take on free.
//
// Open addressing with linear probing over a fixed array reserved once (mmap'd lazily by the OS,
// so untouched slots cost nothing). Keys move 0 -> ptr -> tombstone -> ptr' ...; a slot never
// returns to 0, so a probe chain is never cut. A pointer is live at most once, so there are no
// duplicate keys. Probes are bounded: when the table is too full the caller gets `false` and
// leaves that allocation unaccounted (counted as untracked) rather than blocking.
// Cost: one hash, ~1-2 CAS/loads per operation; no locks, no allocation.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace memplan {

class PtrSizeTable {
 public:
  explicit PtrSizeTable(size_t capacity_pow2) : mask_(capacity_pow2 - 1), slots_(new Slot[capacity_pow2]) {}

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
    // Allocations are 64-byte aligned: drop those bits, then Fibonacci hashing.
    return static_cast<size_t>(((key >> 6) * 0x9E3779B97F4A7C15ull) >> 32) & mask_;
  }
  size_t mask_;
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace memplan
