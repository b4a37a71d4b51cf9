// Device time per op from GPU activity records: the vendor-neutral model (no torch, no CUDA).
//
// While a step is recorded, the agent tags every op with an external id (its op id, see
// hooks/device_timer.h) pushed onto the activity API's per-thread stack; the GPU tracer then
// emits, for each kernel launch, a kernel record (launch correlation id, device start/end) and
// an external-correlation record (launch correlation id -> the external id on top of the stack).
// Joining the two gives each op's kernels. This is how Kineto attributes kernels to ops.
//
// ActivityApi is the seam: the CUPTI implementation lives in hooks/cupti_activity.h; tests feed
// synthetic records through a fake (the way kineto's CuptiActivityProfilerTest mocks
// CuptiActivityApi).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "profiler/profile.h"

namespace memplan {

// One kernel execution as the tracer saw it. Timestamps are the device's (ns), only their
// differences are used.
struct KernelRecord {
  uint32_t correlation = 0;  // the launch's correlation id (0 = none)
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint32_t stream = 0;
  std::string name;
};

// "The launch with this correlation id happened while external id X was on top of the stack."
struct ExternalCorrelation {
  uint32_t correlation = 0;
  uint64_t external_id = 0;
};

// A process-wide GPU activity tracer. Not thread-safe except push/pop, which act on the calling
// thread's stack (the tracer keeps one per CPU thread).
class ActivityApi {
 public:
  virtual ~ActivityApi() = default;
  // Starts collecting kernel and external-correlation records; false if the tracer is unusable.
  virtual bool enable() = 0;
  virtual void disable() = 0;
  // Hot path (once per op start/end while recording): no allocation, no lock on our side.
  virtual void push_external_id(uint64_t id) = 0;
  virtual void pop_external_id() = 0;
  // Hands over (appends) every record collected since the last flush. The caller makes sure the
  // kernels it cares about have finished (synchronises) first. False if records may be missing.
  virtual bool flush(std::vector<KernelRecord>* kernels, std::vector<ExternalCorrelation>* corr) = 0;
};

// What device_us_by_op could not attribute; for a log line and for tests.
struct KernelJoinStats {
  int64_t kernels = 0;         // kernel records counted into some op
  int64_t unmatched = 0;       // kernels whose correlation has no external id (launched outside
                               // any op, e.g. by the optimizer or the agent itself)
  int64_t duplicates = 0;      // identical kernel records seen again (dropped)
  int64_t conflicts = 0;       // correlations mapped to two different external ids
  int64_t bad_times = 0;       // end < start (dropped)
};

// Sums the durations (µs) of each external id's kernels. Order-independent: records may come in
// any order, kernels before or after their correlations. A kernel with no correlation record is
// left out; exact duplicate kernel records count once; a correlation mapped to two ids takes the
// smaller id (deterministic whatever the order). Kernels of one op on several streams may
// overlap: the sum is device busy time, not the op's wall span on the device.
std::unordered_map<uint64_t, double> device_us_by_op(const std::vector<KernelRecord>& kernels,
                                                     const std::vector<ExternalCorrelation>& corr,
                                                     KernelJoinStats* stats = nullptr);

// Sets each op's planner cost (Op::time_us) from its device times, index for index: the op's
// device time is its CUPTI kernel time when measured (>= 0), else its CUDA-event time, else
// unknown (the op keeps its CPU time). Its cost is the longer of its device time and its CPU time
// (Op::cpu_us): a re-run goes no faster than the host can launch it nor than the device can run
// it. Kernel time alone would price a launch-bound step's re-runs at a fraction of what they take
// (a few microseconds of kernel behind tens of dispatch), and steer the planner to re-run many
// small ops; where the device is the bottleneck, its kernels are the longer part anyway. Ops past
// the vectors' ends are left as they are.
void apply_device_times(std::vector<Op>* ops, const std::vector<double>& cupti, const std::vector<double>& events);

}  // namespace memplan
