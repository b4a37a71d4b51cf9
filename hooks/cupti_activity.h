// The CUPTI implementation of ActivityApi (profiler/kernel_times.h). Compiled only with CUDA.
//
// CUPTI's activity buffers and their callbacks are process-wide, so there is one instance,
// never destroyed (CUPTI may hand back a buffer while the process exits). Completed buffers are
// parsed into records in CUPTI's buffer-completed callback (a CUPTI thread, or the thread that
// calls flush), under a mutex: never on the op hot path. Every CUPTI error becomes a false
// return or a no-op plus one log line; nothing throws or aborts.
//
// Sharing CUPTI with the PyTorch profiler (Kineto, also torch 2.x's CUPTI monitor):
// - Kineto registers its own buffer callbacks whenever torch.profiler starts; the last
//   registration wins. We register again on every enable(), and DeviceTimer does not enable us
//   while torch's profiler is active on the thread (it times with CUDA events instead).
// - If torch.profiler starts while we are enabled, records go to Kineto's buffers: our flush()
//   then returns fewer records (cupti_us too small or missing) and Kineto's disable at its stop
//   also stops our kinds. A buffer handed to us that we did not allocate (Kineto's) is left
//   alone: never freed, never parsed; one warning. Nothing crashes; DeviceTimer discards the
//   step's CUPTI times when the profiler was active at its end.
// - External ids are pushed with kind CUSTOM2: Kineto pushes CUSTOM0 (ops) and CUSTOM1 (user
//   annotations), so the two stacks never mix, and we read only our kind's records.
#pragma once

#include "profiler/kernel_times.h"

namespace memplan {

// The process's CUPTI tracer.
ActivityApi* cupti_activity();

}  // namespace memplan
