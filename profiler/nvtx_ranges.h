// NVTX ranges in the "memplan" domain, for Nsight Systems timelines.
//
// A thin wrapper over NVTX3 (header-only). Without NVTX headers at build time
// (MEMPLAN_HAVE_NVTX undefined) every call is a no-op.
//
// Cost per call: a relaxed load of the enable flag, a branch and a thread-local depth update;
// when enabled, also the domain's static-init guard and NVTX3's own inline check -- with no tool
// attached (no NVTX_INJECTION64_PATH) NVTX3 resolves its function pointers to null on the first
// call, so afterwards each call is a load + branch, a few ns. With a tool attached the cost is the
// tool's (Nsight copies the string and timestamps it).
//
// Pops are balanced per thread: each range_pop() matches this thread's latest open range_push()
// and reaches NVTX exactly when that push did, so flipping the enable flag mid-range cannot
// unbalance the tool's stack; a pop with no open push is ignored.
#pragma once

namespace memplan {

void set_nvtx_enabled(bool on);  // default on; the agent sets it from MEMPLAN_NVTX
bool nvtx_enabled();
// Enabled, built with NVTX, and a tool named by NVTX_INJECTION64_PATH (how Nsight attaches):
// only then is it worth formatting a range's name with numbers in it. Cost: a load and a branch.
bool nvtx_tool_attached();

namespace nvtx {

void range_push(const char* name);  // name: any NUL-terminated text; NVTX copies it
void range_pop();
void mark(const char* name);

class ScopedRange {
 public:
  explicit ScopedRange(const char* name);
  ~ScopedRange();
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;
};

}  // namespace nvtx
}  // namespace memplan
