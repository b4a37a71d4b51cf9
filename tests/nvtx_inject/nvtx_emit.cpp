// Emits a fixed sequence of memplan NVTX ranges; check_nvtx.cmake compares what the recorder saw.
// Covers: push/pop, nesting, ScopedRange, mark, the enable flag (nothing while disabled), and
// that each pop matches its own push across flag flips (no lost, no extra pops); and that
// nvtx_tool_attached says whether a tool was named (exit 2 if not), never while disabled (exit 3).
#include "profiler/nvtx_ranges.h"

#include <cstdlib>

int main() {
  using namespace memplan;
  if (nvtx_tool_attached() != (std::getenv("NVTX_INJECTION64_PATH") != nullptr)) return 2;
  nvtx::range_push("step");
  nvtx::mark("begin");
  {
    nvtx::ScopedRange fwd("forward");
    nvtx::ScopedRange op("aten::add_ \"x\"");
  }
  set_nvtx_enabled(false);
  if (nvtx_tool_attached()) return 3;
  nvtx::range_push("hidden");  // dropped
  nvtx::mark("hidden");        // dropped
  nvtx::range_pop();           // matches "hidden": nothing (must not close "step")
  set_nvtx_enabled(true);
  nvtx::range_push("backward");
  set_nvtx_enabled(false);
  nvtx::range_pop();           // still pops "backward": it was opened while enabled
  set_nvtx_enabled(true);
  nvtx::range_pop();           // "step"
  nvtx::range_pop();           // unbalanced: ignored
  return 0;
}
