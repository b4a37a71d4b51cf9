// A wrapping c10::Allocator for CPU memory accounting: delegates every allocation to the
// allocator that was installed before it and reports sizes to cpu_memory().
#pragma once

#include <cstdint>

namespace memplan {

// Installs the wrapper (idempotent). Only allocations made after this call are seen.
bool install_cpu_allocator();
// Allocations the wrapper could not account for (table full, or a non-simple DataPtr).
int64_t cpu_untracked_allocations();

}  // namespace memplan
