// Device time of each op of a recorded CUDA step, two ways at once:
// - CUPTI: the summed duration of the kernels each op launched (ActivityApi, external ids);
// - CUDA events: elapsed time between an event recorded on the current stream at the op's start
//   and one at its end (includes the gaps between kernels when the CPU runs behind the GPU).
// The planner uses CUPTI where present (Op::time_us), events otherwise; both go in the profile.
//
// Op ids: a forward op's index in the step; a backward node's index plus kBackwardOpBase. CUPTI
// carries them as its external correlation ids.
//
// Not thread-safe: the caller serialises calls (the forward runs on the training thread, the
// backward on the autograd engine's device thread, one after the other). The CUPTI external-id
// stack is per CPU thread: op_begin and op_end of one op must run on the same thread (they do:
// RecordFunction start and end callbacks of one op run on its thread).
// Without CUDA (MEMPLAN_HAVE_CUDA undefined) this is a stub whose begin_step returns false.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/kernel_times.h"

namespace memplan {

inline constexpr uint64_t kBackwardOpBase = uint64_t{1} << 32;
inline constexpr uint64_t forward_op_id(int64_t op) { return static_cast<uint64_t>(op); }
inline constexpr uint64_t backward_op_id(int64_t node) { return kBackwardOpBase + static_cast<uint64_t>(node); }

// The CUPTI tracer when built with CUDA, else nullptr.
ActivityApi* default_activity_api();

class DeviceTimer {
 public:
  // tracer: CUPTI (or a fake in tests); nullptr = CUDA events only. events: time with CUDA
  // events too (when a device is present).
  explicit DeviceTimer(ActivityApi* tracer = default_activity_api(), bool events = true);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  // Starts timing a step whose ops run on CUDA device `device` (-1: the current device);
  // events are recorded on that device's current stream. False if neither way is available
  // (no CUDA, no device and no tracer). CUPTI is left out while torch.profiler is active on
  // this thread.
  bool begin_step(int device = -1);

  // Cost while a step is timed: CUPTI push/pop ~0.1-0.3 µs; with events, the current stream
  // (a TLS read, tens of ns) + one cudaEventRecord (~1-2 µs, a driver call). No lock; no
  // allocation once the event pool and span list have grown in the first step. A no-op when
  // no step is being timed.
  // op_end of an id that is not open is ignored (safe to call for every end callback).
  void op_begin(uint64_t op_id);
  void op_end(uint64_t op_id);

  // Waits for the step's GPU work, then fills per-op times in µs; -1 = not measured. Forward
  // ops index cupti_us / event_us by their id; backward nodes index bwd_* by id -
  // kBackwardOpBase. An op that launched no kernel has CUPTI time 0. Any output may be nullptr.
  // False if nothing was measured.
  bool end_step(std::vector<double>* cupti_us, std::vector<double>* event_us,
                std::vector<double>* bwd_cupti_us = nullptr, std::vector<double>* bwd_event_us = nullptr);

  bool timing() const { return cupti_ || events_; }
  bool cupti_on() const { return cupti_; }
  bool events_on() const { return events_; }

 private:
  struct Span {
    uint64_t id;
    uint32_t start;  // indices into pool_
    uint32_t end;    // kNoEvent while open
  };
  struct Open {
    uint64_t id;
    uint32_t span;   // index into spans_, kNoSpan if not timed with events
    bool pushed;     // its id is on the tracer's stack
  };
  static constexpr uint32_t kNoEvent = 0xffffffffu;
  static constexpr uint32_t kNoSpan = 0xffffffffu;
  uint32_t take_event();
  void finish_cupti(std::vector<double>* fwd, std::vector<double>* bwd);
  void finish_events(std::vector<double>* fwd, std::vector<double>* bwd);

  ActivityApi* tracer_;
  bool want_events_;
  bool cupti_ = false;
  bool events_ = false;
  int device_ = -1;
  std::vector<void*> pool_;      // cudaEvent_t, created on demand, reused every step
  int pool_device_ = -1;         // the device pool_'s events belong to
  uint32_t used_ = 0;            // events of pool_ used this step
  std::vector<Span> spans_;      // events: one per op this step, in start order
  std::vector<Open> open_;       // ops begun and not ended, innermost last
  std::vector<uint64_t> seen_;   // ids begun this step (CUPTI: ops with no kernel get 0)
};

}  // namespace memplan
