// One accounting interface for allocated bytes, two sources: the CPU allocator wrapper
// (hooks/cpu_allocator.cpp) and the CUDA caching allocator's trace tracker (hooks/cuda_tracker.cpp).
// Both only call on_alloc/on_free; readers (the recorder, the agent) see the same counters.
#pragma once

#include <atomic>
#include <cstdint>

namespace memplan {

class MemoryCounter {
 public:
  // Hot path (allocator callbacks): one fetch_add and two CAS-max loops that almost always
  // succeed first try; ~10 ns, no locks, no allocation.
  void on_alloc(int64_t bytes) {
    const int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise(peak_, now);
    raise(window_peak_, now);
    allocs_.fetch_add(1, std::memory_order_relaxed);
  }
  void on_free(int64_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Bytes already allocated when the source attached, which reports only later events.
  void start_from(int64_t bytes) {
    const int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise(peak_, now);
    raise(window_peak_, now);
  }

  int64_t live() const { return live_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  int64_t allocs() const { return allocs_.load(std::memory_order_relaxed); }
  // The "window" is the span of one op: reset at its start, read at its end.
  int64_t window_peak() const { return window_peak_.load(std::memory_order_relaxed); }
  void reset_window() { window_peak_.store(live(), std::memory_order_relaxed); }
  void reset_peak() { peak_.store(live(), std::memory_order_relaxed); }
  // Set by the source when it is attached and seeing events (a counter nobody feeds reads 0).
  bool active() const { return active_.load(std::memory_order_relaxed); }
  void set_active() { active_.store(true, std::memory_order_relaxed); }

 private:
  static void raise(std::atomic<int64_t>& a, int64_t v) {
    int64_t cur = a.load(std::memory_order_relaxed);
    while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> window_peak_{0};
  std::atomic<int64_t> allocs_{0};
  std::atomic<bool> active_{false};
};

MemoryCounter& cpu_memory();
MemoryCounter& cuda_memory();

}  // namespace memplan
