// The agent: the state machine warm-up -> plan -> replay, fed by hooks/ and the boot shim.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "agent/saved.h"
#include "hooks/device_timer.h"
#include "hooks/op_callbacks.h"
#include "profiler/profile.h"
#include "profiler/recorder.h"

namespace memplan {

enum class Phase { Off, Warmup, Replay, Done };
const char* to_string(Phase p);

class Agent final : public OpSink {
 public:
  static Agent& get();

  // Installs the allocator wrapper and the op callbacks; false if disabled (then inert).
  bool boot();
  // OpSink
  void op_start(const at::RecordFunction& fn) override;
  void op_end(const at::RecordFunction& fn) override;
  void node_start(const at::RecordFunction& fn) override;
  void node_end(const at::RecordFunction& fn) override;
  // Default saved-tensor hooks (called with the GIL held, from the op's autograd kernel).
  Saved pack(const at::Tensor& t);
  at::Tensor unpack(const Saved& s);
  // Step boundaries (wrapped torch.autograd.backward / grad).
  void backward_begin();
  void backward_end();
  // atexit: writes the outputs that are still pending and prints the summary.
  void finish();
  // In a forked child (DataLoader worker): inert from here on.
  void fork_child();

  Phase phase() const { return phase_; }
  int64_t steps_seen() const { return steps_; }
  const std::vector<Profile>& warmup_profiles() const { return profiles_; }
  std::string profile_path() const { return profile_path_; }
  std::string trace_path() const { return trace_path_; }

 private:
  Agent();
  MemoryCounter* memory_for_step();
  void finish_warmup();
  void write_outputs();

  std::mutex mu_;  // guards step transitions against a second training thread; not the hot path
  Phase phase_ = Phase::Off;
  bool inert_ = false;
  bool finished_ = false;
  int64_t steps_ = 0;             // completed steps (backward returned)
  int backward_depth_ = 0;        // nested torch.autograd.backward/grad calls
  Recorder recorder_;
  std::vector<Profile> profiles_; // warm-up steps
  std::string profile_path_, trace_path_;
  std::string step_device_ = "cpu";
  DeviceTimer device_timer_;      // CUPTI + CUDA-event op times of CUDA warm-up steps
  bool timing_device_ = false;    // device_timer_ is timing the current step
  bool outputs_written_ = false;
};

}  // namespace memplan
