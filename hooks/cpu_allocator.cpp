#include "hooks/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>

#include "profiler/memory.h"
#include "profiler/ptr_table.h"

namespace memplan {
namespace {

std::atomic<int64_t> g_untracked{0};
c10::Allocator* g_inner = nullptr;
c10::DeleterFnPtr g_inner_deleter = nullptr;

PtrSizeTable& table() {
  // 1M live CPU tensors; 16 MiB. Never destroyed: tensors are freed during exit too.
  static PtrSizeTable* t = new PtrSizeTable(1u << 20);
  return *t;
}

// Runs whenever a tensor allocated through the wrapper dies. Cost: one table probe, one atomic.
void delete_accounted(void* ptr) {
  const int64_t size = table().take(ptr);
  if (size >= 0) cpu_memory().on_free(size);
  g_inner_deleter(ptr);
}

class AccountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = g_inner->allocate(n);
    void* data = inner.get();
    // Only "simple" DataPtrs (context == data, one deleter for all) can be re-wrapped without
    // extra state; anything else passes through unaccounted.
    if (data == nullptr || inner.get_context() != data || inner.get_deleter() != g_inner_deleter ||
        !table().insert(data, static_cast<int64_t>(n))) {
      if (data != nullptr) g_untracked.fetch_add(1, std::memory_order_relaxed);
      return inner;
    }
    cpu_memory().on_alloc(static_cast<int64_t>(n));
    (void)inner.release_context();  // ownership of the block moves to the DataPtr below
    return {data, data, &delete_accounted, inner.device()};
  }

  c10::DeleterFnPtr raw_deleter() const override { return g_inner_deleter ? &delete_accounted : nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    g_inner->copy_data(dest, src, count);
  }
};

}  // namespace

bool install_cpu_allocator() {
  static AccountingAllocator wrapper;
  static bool installed = false;
  if (installed) return true;
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current == nullptr || current == &wrapper) return false;
  // Learn the inner allocator's deleter from one probe allocation.
  c10::DataPtr probe = current->allocate(64);
  if (probe.get() == nullptr || probe.get_context() != probe.get()) return false;
  g_inner_deleter = probe.get_deleter();
  g_inner = current;
  probe.clear();
  c10::SetCPUAllocator(&wrapper, /*priority=*/10);
  installed = c10::GetCPUAllocator() == &wrapper;
  if (installed) cpu_memory().set_active();
  return installed;
}

int64_t cpu_untracked_allocations() { return g_untracked.load(std::memory_order_relaxed); }

}  // namespace memplan
