// CUDA memory accounting: the caching allocator's trace tracker feeds cuda_memory().
// Compiled to a stub without CUDA. The tracker runs under the allocator's lock: it only updates
// two atomics, never calls into PyTorch or takes the GIL.
#pragma once

namespace memplan {

// Attaches once; false when torch has no CUDA or no device is present.
bool attach_cuda_tracker();

}  // namespace memplan
