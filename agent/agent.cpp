#include "agent/agent.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <stdexcept>

#include "agent/log.h"
#include "agent/options.h"
#include "hooks/cpu_allocator.h"
#include "hooks/cuda_tracker.h"
#include "profiler/nvtx_ranges.h"
#include "profiler/profile_io.h"
#include "profiler/summary.h"
#include "profiler/trace_export.h"

namespace memplan {

const char* to_string(Phase p) {
  switch (p) {
    case Phase::Off: return "off";
    case Phase::Warmup: return "warmup";
    case Phase::Replay: return "replay";
    case Phase::Done: return "done";
  }
  return "?";
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Measures the time spent in one callback into the recorder's overhead account.
class OverheadTimer {
 public:
  explicit OverheadTimer(Recorder* r) : r_(r), t0_(now_ns()) {}
  ~OverheadTimer() { r_->add_overhead_ns(now_ns() - t0_); }

 private:
  Recorder* r_;
  int64_t t0_;
};

// autograd's own wording (torch/csrc/autograd/saved_variable.cpp), so scripts and tests that
// match on it see no difference: "[torch.FloatTensor [32, 10]], which is output 0 of Exp, ...".
std::string inplace_error_message(const Saved& s, uint32_t now) {
  std::ostringstream m;
  m << "one of the variables needed for gradient computation has been modified by an inplace "
       "operation: [torch."
    << (s.tensor.is_cuda() ? "cuda." : "") << c10::toString(s.tensor.scalar_type()) << "Tensor "
    << s.tensor.sizes() << "]";
  if (auto fn = s.grad_fn.lock()) {
    std::string name = fn->name();
    const auto pos = name.rfind("Backward");
    if (pos != std::string::npos && name.find_first_not_of("0123456789", pos + 8) == std::string::npos) {
      name.resize(pos);
    }
    m << ", which is output " << s.output_nr << " of " << name << ",";
  }
  m << " is at version " << now << "; expected version " << s.version
    << " instead. Hint: enable anomaly detection to find the operation that failed to compute its "
       "gradient, with torch.autograd.set_detect_anomaly(True, check_nan=False).";
  return m.str();
}

// CUPTI kernel time is the op's cost when measured, else the CUDA-event time, else CPU time.
void apply_device_times(std::vector<Op>* ops, const std::vector<double>& cupti, const std::vector<double>& events) {
  for (size_t i = 0; i < ops->size(); ++i) {
    Op& op = (*ops)[i];
    if (i < cupti.size()) op.cupti_us = cupti[i];
    if (i < events.size()) op.event_us = events[i];
    if (op.cupti_us >= 0) op.time_us = op.cupti_us;
    else if (op.event_us >= 0) op.time_us = op.event_us;
  }
}

bool first_tensor_on_cuda(const at::RecordFunction& fn) {
  for (const c10::IValue& iv : fn.inputs()) {
    if (iv.isTensor() && iv.toTensor().defined()) return iv.toTensor().device().is_cuda();
  }
  return false;
}
}  // namespace

Agent& Agent::get() {
  static Agent* agent = new Agent();  // never destroyed: callbacks may fire during exit
  return *agent;
}

Agent::Agent() : recorder_(&cpu_memory()) {}

bool Agent::boot() {
  const Options& opt = options();
  if (opt.disable) {
    inert_ = true;
    return false;
  }
  if (phase_ != Phase::Off) return true;
  set_nvtx_enabled(opt.nvtx);
  if (!install_cpu_allocator()) warn("CPU allocator wrapper not installed; CPU memory is not accounted");
  attach_cuda_tracker();
  const int rank = env_rank(), world = env_world_size();
  profile_path_ = opt.profile_out.empty() ? "" : rank_path(opt.profile_out, rank, world);
  trace_path_ = opt.trace.empty() ? "" : rank_path(opt.trace, rank, world);
  install_op_callbacks(this, CallbackNeeds{true, true});
  phase_ = Phase::Warmup;
  nvtx::range_push("memplan/warmup");
  debug("profiling {} warm-up step(s)", opt.warmup);
  return true;
}

void Agent::op_start(const at::RecordFunction& fn) {
  if (inert_ || phase_ != Phase::Warmup || backward_depth_ > 0 || !at::GradMode::is_enabled()) return;
  OverheadTimer timer(&recorder_);
  if (!recorder_.in_step()) {
    const bool cuda = first_tensor_on_cuda(fn) && cuda_memory().active();
    recorder_.set_memory(cuda ? &cuda_memory() : &cpu_memory());
    step_device_ = cuda ? "cuda" : "cpu";
    recorder_.begin_step(steps_);
    timing_device_ = cuda && device_timer_.begin_step();
  }
  nvtx::range_push(fn.name());
  recorder_.op_start(fn);
  // Last thing in the start callback: the op's device time should not include our recording.
  if (timing_device_ && recorder_.current_op() >= 0) device_timer_.op_begin(forward_op_id(recorder_.current_op()));
}

void Agent::op_end(const at::RecordFunction& fn) {
  if (inert_ || recorder_.current_op() < 0) return;
  OverheadTimer timer(&recorder_);
  if (timing_device_) device_timer_.op_end(forward_op_id(recorder_.current_op()));  // first thing
  recorder_.op_end(fn);
  nvtx::range_pop();
}

void Agent::node_start(const at::RecordFunction& fn) {
  if (inert_ || phase_ != Phase::Warmup || !recorder_.in_step() || backward_depth_ == 0) return;
  OverheadTimer timer(&recorder_);
  const int64_t before = recorder_.current_node();
  recorder_.node_start(fn);
  // The engine's "autograd::engine::evaluate_function: X" wrapper makes no node: only time nodes.
  if (timing_device_ && recorder_.current_node() != before) device_timer_.op_begin(backward_op_id(recorder_.current_node()));
}

void Agent::node_end(const at::RecordFunction& fn) {
  if (inert_ || phase_ != Phase::Warmup || !recorder_.in_step() || backward_depth_ == 0) return;
  OverheadTimer timer(&recorder_);
  // Ignored when that node is not open (the engine wrapper's end comes after the node's).
  if (timing_device_ && recorder_.current_node() >= 0) device_timer_.op_end(backward_op_id(recorder_.current_node()));
  recorder_.node_end(fn);
}

Saved Agent::pack(const at::Tensor& t) {
  Saved s;
  s.tensor = t.tensor_data();
  s.version = t.unsafeGetTensorImpl()->version_counter().current_version();
  s.grad_fn = t.grad_fn();
  s.output_nr = t.output_nr();
  if (!inert_ && phase_ == Phase::Warmup && recorder_.in_step() && backward_depth_ == 0) {
    OverheadTimer timer(&recorder_);
    s.value = recorder_.on_pack(t);
    s.step = steps_;
  }
  return s;
}

at::Tensor Agent::unpack(const Saved& s) {
  // With default hooks set, autograd skips its own "modified by an inplace operation" check;
  // re-do it with autograd's exact message (design.md 3b.11).
  const uint32_t now = s.tensor.unsafeGetTensorImpl()->version_counter().current_version();
  if (now != s.version) {
    throw std::runtime_error(inplace_error_message(s, now));
  }
  if (s.value >= 0 && s.step == steps_ && phase_ == Phase::Warmup && recorder_.in_step()) {
    OverheadTimer timer(&recorder_);
    recorder_.on_unpack(s.value);
  }
  return s.tensor;
}

void Agent::backward_begin() {
  if (inert_) return;
  if (backward_depth_++ == 0 && recorder_.in_step()) {
    OverheadTimer timer(&recorder_);
    recorder_.begin_backward();
  }
}

void Agent::backward_end() {
  if (inert_ || backward_depth_ == 0) return;
  if (--backward_depth_ > 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ == Phase::Warmup && recorder_.in_step()) {
    Profile p = recorder_.end_step();
    if (timing_device_) {
      timing_device_ = false;
      std::vector<double> fc, fe, bc, be;
      device_timer_.end_step(&fc, &fe, &bc, &be);
      apply_device_times(&p.forward, fc, fe);
      apply_device_times(&p.backward, bc, be);
    }
    p.rank = env_rank();
    p.device = step_device_;
    profiles_.push_back(std::move(p));
    if (static_cast<int>(profiles_.size()) >= options().warmup) finish_warmup();
  }
  ++steps_;
}

void Agent::finish_warmup() {
  nvtx::range_pop();  // memplan/warmup
  const Profile& last = profiles_.back();
  for (size_t i = 0; i + 1 < profiles_.size(); ++i) {
    if (profiles_[i].op_hash != last.op_hash) {
      info("warm-up step {} ran a different op sequence than step {} ({} vs {} ops); the profile "
           "is of step {}",
           profiles_[i].step, last.step, profiles_[i].forward.size(), last.forward.size(), last.step);
    }
  }
  write_outputs();
  // Profile only (no budget yet wired to replay): stop observing ops, zero cost from here on.
  remove_op_callbacks();
  phase_ = Phase::Done;
}

void Agent::write_outputs() {
  if (outputs_written_ || profiles_.empty()) return;
  outputs_written_ = true;
  std::string error;
  if (!profile_path_.empty() && !write_profile_file(profile_path_, profiles_.back(), &error)) {
    warn("profile not written: {}", error);
    profile_path_.clear();
  }
  if (!trace_path_.empty() && !write_trace_file(trace_path_, profiles_, &error)) {
    warn("trace not written: {}", error);
    trace_path_.clear();
  }
}

void Agent::finish() {
  if (inert_ || finished_) return;
  finished_ = true;
  if (phase_ == Phase::Warmup) {
    remove_op_callbacks();
    write_outputs();
  }
  if (options().summary && !profiles_.empty()) {
    SummaryInputs in;
    in.profile_path = profile_path_;
    in.trace_path = trace_path_;
    in.warmup_steps = static_cast<int>(profiles_.size());
    std::fputs(format_summary(profiles_.back(), in).c_str(), stderr);
  }
}

void Agent::fork_child() {
  // A DataLoader worker or any forked child: never record, never write files.
  inert_ = true;
  finished_ = true;
  remove_op_callbacks();
}

}  // namespace memplan
