#include "hooks/cuda_tracker.h"

#include "profiler/memory.h"

#if MEMPLAN_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace memplan {

bool attach_cuda_tracker() {
#if MEMPLAN_HAVE_CUDA
  static bool attached = false;
  if (attached) return true;
  try {
    namespace cca = c10::cuda::CUDACachingAllocator;
    cca::CUDAAllocator* allocator = cca::get();
    if (allocator == nullptr || !allocator->initialized()) return false;
    // What the devices hold now (the tracker's sizes are the requested ones, so the requested
    // bytes): read before attaching, so a block allocated in between is missed rather than
    // counted twice.
    int64_t held = 0;
    const c10::DeviceIndex n = c10::cuda::device_count();
    for (c10::DeviceIndex d = 0; d < n; ++d) {
      held += allocator->getDeviceStats(d).requested_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
    }
    // Requested bytes rise at ALLOC and fall at FREE_REQUESTED: a block whose stream uses are
    // pending is reserved, not allocated, from then on.
    allocator->attachAllocatorTraceTracker([](const cca::TraceEntry& e) {
      switch (e.action_) {
        case cca::TraceEntry::ALLOC:
          cuda_memory().on_alloc(static_cast<int64_t>(e.size_));
          break;
        case cca::TraceEntry::FREE_REQUESTED:
          cuda_memory().on_free(static_cast<int64_t>(e.size_));
          break;
        default:
          break;
      }
    });
    cuda_memory().start_from(held);
    cuda_memory().set_active();
    attached = true;
    return true;
  } catch (...) {
    return false;
  }
#else
  return false;
#endif
}

}  // namespace memplan
