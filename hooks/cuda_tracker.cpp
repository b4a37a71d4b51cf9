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
    if (c10::cuda::device_count() == 0) return false;
    namespace cca = c10::cuda::CUDACachingAllocator;
    // allocated_bytes (what torch.cuda.memory_allocated reports) rises at ALLOC and falls at
    // FREE_REQUESTED: a block whose stream uses are pending stays reserved, not allocated.
    cca::attachAllocatorTraceTracker([](const cca::TraceEntry& e) {
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
