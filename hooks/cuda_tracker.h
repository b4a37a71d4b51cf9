// CUDA memory accounting: the caching allocator's trace tracker feeds cuda_memory().
// Compiled to a stub without CUDA. The tracker runs under the allocator's lock: it only updates
// two atomics, never calls into PyTorch or takes the GIL.
#pragma once

namespace memplan {

// Attaches once, and starts cuda_memory() from what the devices hold already. Only once CUDA is
// initialised (a CUDA tensor exists): the caching allocator makes its per-device allocators at
// CUDA's lazy init, each keeps its own trackers, and attaching earlier attaches to none. Never
// initialises CUDA itself (that would break CUDA in forked children). False when torch has no
// CUDA, CUDA is not initialised yet, or the allocator backend takes no tracker
// (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync).
bool attach_cuda_tracker();

}  // namespace memplan
