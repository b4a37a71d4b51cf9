// The agent: the state machine warm-up -> plan -> replay, fed by hooks/ and the boot shim. Each
// kind of step (op sequence, step_kinds.h) is profiled and planned on its own; every step either
// is recorded whole or replays the plan of the kind predicted for it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/replay.h"
#include "agent/saved.h"
#include "agent/step_kinds.h"
#include "hooks/device_timer.h"
#include "hooks/op_callbacks.h"
#include "profiler/kind_profile.h"
#include "profiler/op_sequence.h"
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
  void untracked_op(const at::RecordFunction& fn) override;
  void node_start(const at::RecordFunction& fn) override;
  void node_end(const at::RecordFunction& fn) override;
  void quiet_stretch_unwound() override;
  void callback_failed(const std::exception& e) override;
  // Default saved-tensor hooks (called with the GIL held, from the op's autograd kernel).
  Saved pack(const at::Tensor& t);
  // The shim pushed our hooks (again): remember which stack entry is ours.
  void hooks_pushed();
  at::Tensor unpack(const Saved& s);
  // Called by the shim's backward wrapper before backward_begin, with the GIL held. Under
  // MEMPLAN_TRAIN_THREAD=backward the first thread to get here becomes the training thread, once
  // for the process: true on that call only (the shim then pushes our saved-tensor hooks on it).
  bool claim_thread();
  // The calling thread is the training thread (the shim pushes our hooks on it at boot).
  bool owns_thread() const { return on_owner_thread(); }
  // Step boundaries (wrapped torch.autograd.backward / grad). `keeps_graph`: the call retains
  // its graph for another backward (retain_graph, or create_graph by default).
  void backward_begin(bool keeps_graph = false);
  // False once the agent needs the saved-tensor hooks no more (the shim then removes them).
  bool backward_end();
  // Around torch.optim's optimizer steps (global step pre/post hooks): no op of an optimizer step
  // is recorded (no grad mode), so RecordFunction is off meanwhile (hooks/op_callbacks.h). Not
  // for a step whose ops are to be seen (`observed`): a differentiable optimizer's, which runs
  // under grad mode, or one given a closure (LBFGS: the closure's forward and backward, each a
  // training step, run inside the optimizer's step).
  void optimizer_step_begin(bool observed);
  void optimizer_step_end();
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
  // What the summary says about the plan in use.
  struct PlanInfo {
    std::string source;
    int64_t budget = 0, baseline = 0, unplanned_peak = 0, predicted_peak = 0, min_feasible = 0;
    double predicted_time_us = 0, unplanned_time_us = 0, planning_s = 0;
    bool feasible = true;
    int64_t evictions = 0, recomputes = 0;
    int64_t rerun_ops = 0;  // forward ops its recomputes re-run, per step
    // Bytes the plan was made to leave under the budget for a kind whose sizes follow from data
    // (check_sizes); counted in predicted_peak.
    int64_t headroom = 0;
  };

  // One plan, for one kind of step (StepKinds): its summary facts and, if it has actions, the
  // Replayer that runs them. A kind whose plan went stale keeps its old record (for the report).
  struct PlanRecord {
    uint64_t kind = 0;
    PlanInfo info;
    std::unique_ptr<Replayer> replayer;  // null: nothing to do for this kind (or no plan made)
    std::vector<double> iteration_us;    // wall time of each iteration that replayed it
    uint64_t structure = 0;              // its profile's structure_signature
    bool data_dependent = false;         // its profile has an op whose output shape follows from data
    OpSequence ops;                      // its profile's forward ops (narrow_kinds)
    // What it knows of its steps' gradients (kind_profile.h; fresh_gradients.cpp), carried over
    // to a plan that replaces it for a step's gap (check_gap).
    struct Gradients {
      // Gradient accumulation: the plan counts `fresh_bytes` of gradients that another record of
      // the kind allocated; `uncredited` is the kind's own record without them. Whether its steps
      // do allocate them is watched (check_gradient_credit).
      std::shared_ptr<const Profile> uncredited;
      int64_t fresh_bytes = 0;
      int64_t fresh_from = -1;     // the step that allocated them
      int64_t rounds_at_plan = 0;  // optimizer rounds (opt_rounds_) when the plan was made
      int fresh_free = 0;          // its replayed steps since then, none of which allocated them
      int64_t free_peak = 0;       // the highest of their peaks, above their baselines
      bool credit_settled = false; // a step of it allocated them, or the plan without them replaced it
      int credited = -1;           // a plan made without them: the index of the one that counts them
      // A parameter its steps save for backward (Agent::pack): a step that begins while its
      // gradient is unset allocates it.
      c10::weak_intrusive_ptr<c10::TensorImpl> param{c10::intrusive_ptr<c10::TensorImpl>()};
      // Its record began with the gradients set; a step that begins without them replays the
      // plan at `without_grads` (made from a record of the kind that began so; -1: not yet, -2:
      // none).
      bool began_with_grads = false;
      int without_grads = -1;
      int variant_of = -1;  // that plan: the index of the plan it stands in for
    } grads;
    int64_t record_step = -1;  // the step of the record it was made from
    // The record it was planned from, as the planner got it (check_gap plans it again).
    std::shared_ptr<const Profile> planned;
    int remade_from = -1;  // the plan of its kind it replaced for what steps freed there (check_gap)
    int remakes = 0;       // how many plans of its kind came before it so
    // Its latest replayed steps in a row that freed more there and peaked under (check_gap), and
    // the least any of them freed beyond the record.
    int more_freed_steps = 0;
    int64_t more_freed = 0;
  };

  Agent();
  bool recording() const;
  std::optional<planner::Plan> obtain_plan(const Profile& profile, PlanInfo* out, const std::string& variant = "");
  std::string replay_summary(const PlanRecord& rec, const std::string& title) const;
  void write_report(const std::string& path) const;
  MemoryCounter* memory_for_step();
  void begin_step(const at::RecordFunction& first);
  void end_step(Profile p);
  void keep_record(Profile p);
  bool covers(const PlanRecord& by, const PlanRecord& kind) const;
  bool cover_kind(const Profile& p, bool* plan_now);
  size_t widest_backward(size_t i) const;
  void plan_record(size_t i);
  void plan_covering_record(uint64_t kind);
  // `began_without`: record `p` is not known to have begun with gradients (its began_ entry:
  // kWithoutGrads or kUnknown), so no step of its kind is told apart by beginning without.
  void plan_kind(const Profile& p, std::shared_ptr<const Profile> uncredited, const FreshGradients& fresh,
                 bool began_without);
  PlanRecord make_plan(const Profile& p, const std::string& variant = "");
  void check_gradient_credit(const Profile& p);
  void check_gap(const Profile& p, bool gapped = false);
  void check_sizes(const Profile& p);
  bool replannable_for_sizes(const PlanRecord& rec) const;
  void note_size(uint64_t kind, const Profile& p);
  bool sizes_settled(const PlanRecord& rec) const;
  void remake_for_gap(size_t index, int64_t bytes, const char* source, bool in_gap = true);
  void remake(size_t index, const Profile& profile, const std::string& variant, const char* source);
  bool backward_excess_of(const Profile& p, const PlanRecord& rec, std::vector<int64_t>* live,
                          std::vector<int64_t>* peak) const;
  static uint64_t excess_key(const std::vector<int64_t>& live, const std::vector<int64_t>& peak);
  static int64_t remake_margin(int64_t predicted);
  bool may_remake(const PlanRecord& rec) const;
  bool refuse_remake(const PlanRecord& rec, int64_t step, int64_t over);
  void said_graph_kept();
  void credit_at_begin();
  bool lacks_gradient(const c10::weak_intrusive_ptr<c10::TensorImpl>& param) const;
  int plan_without_gradients(size_t index);
  void watch_param(const at::Tensor& t);
  void narrow_kinds(int64_t op, uint64_t hash, uint64_t structure);
  void decide_kind(int plan);
  void log_family();
  // Calls f on the running step's replayer, or while its kind is undecided on each candidate's.
  template <typename F>
  void each_replayer(F f) {
    if (undecided_.empty()) {
      if (replayer_) f(*replayer_);
      return;
    }
    for (int plan : undecided_) {
      if (Replayer* r = plans_[static_cast<size_t>(plan)].replayer.get()) f(*r);
    }
  }
  // Nothing left to do (profile only, no action needed, or given up): the op callbacks go.
  void stop_observing();
  bool nothing_to_do() const;
  void write_outputs();

  // The training thread (MEMPLAN_TRAIN_THREAD): the one that imported torch, set in boot()
  // before the script starts any thread; or the first one to call backward (claim_thread),
  // 0 until then. Set once, never changed. Only its ops, its backward calls and the backward
  // nodes of graphs it built are observed, and only it has our saved-tensor hooks on its stack:
  // a step recorded from two threads at once (a prefetch thread normalizing the next batch while
  // the main thread trains) raced in the recorder and crashed the process. Read with relaxed
  // loads: a thread compares it with its own id, which only it could have stored.
  std::atomic<uint64_t> owner_{0};
  bool on_owner_thread() const;   // cost: a TLS read
  void foreign_op(const at::RecordFunction& fn);
  bool foreign_node(const at::RecordFunction& fn) const;
  Phase phase_ = Phase::Off;
  bool inert_ = false;
  // A callback threw (callback_failed): nothing more is recorded or planned; the step ends as
  // plain PyTorch and observing stops at its backward's end (stop_after_failure).
  std::atomic<bool> failed_{false};
  void stop_after_failure();
  bool finished_ = false;
  int64_t steps_ = 0;             // completed steps (backward returned)
  bool cuda_unmeasured_ = false;  // a step on a GPU whose memory cannot be measured: stop
  // The thread running this backward's nodes (the first one seen; on_node_thread), and whether a
  // node ran on another thread meanwhile (stop at the step's end).
  std::atomic<uint64_t> node_thread_{0};
  std::atomic<bool> split_backward_{false};
  bool on_node_thread();
  bool on_training_thread() const;  // cost: a TLS read and two relaxed loads
  int backward_depth_ = 0;        // nested torch.autograd.backward/grad calls
  Recorder recorder_;
  std::vector<Profile> profiles_; // steps recorded whole (warm-up, and each new kind's)
  bool planning_ = false;         // a budget or a plan file: kinds get plans (else profile only)
  StepKinds kinds_{2};
  StepKinds::FirstOp first_op_;   // the running step's first op
  StepKinds::Choice choice_;      // the running step's: profile it, or replay plans_[choice_.plan]
  std::string profile_path_, trace_path_;
  std::string step_device_ = "cpu";
  DeviceTimer device_timer_;      // CUPTI + CUDA-event op times of CUDA warm-up steps
  bool timing_device_ = false;    // device_timer_ is timing the current step
  bool outputs_written_ = false;
  bool unrebuildable_said_ = false;  // planner::unrebuildable_note warned (once per run)
  // How often a kind of step is planned again after its replayed steps ran over or under their
  // plan's prediction (check_gap, check_sizes), at most.
  static constexpr int kMaxRemakes = 2;
  std::vector<PlanRecord> plans_;  // in the order they were made
  // Per kind of step whose sizes follow from data: what its steps ran over their plan's prediction
  // by, all told (check_sizes); every plan made for the kind leaves that much under the budget.
  std::unordered_map<uint64_t, int64_t> headroom_;
  // Per kind of step: the least and most its steps run plainly (its records, and steps under a plan
  // without actions) peaked above their baselines. Kept for every kind (whether its sizes follow
  // from data is known only once it is planned); read for those whose do (sizes_settled).
  struct SizeRange {
    int64_t low = INT64_MAX, high = INT64_MIN;
    int steps = 0;
  };
  std::unordered_map<uint64_t, SizeRange> sizes_;
  Replayer* replayer_ = nullptr;   // the running step's, while it replays a plan with actions
  // While the running step's kind is undecided (narrow_kinds): the plans it may still replay,
  // the predicted one (choice_.plan) first; else empty.
  std::vector<int> undecided_;
  int64_t op_numel_ = 0;  // the running op's input elements, while the kind is undecided
  bool profile_next_ = false;  // record the next step whole (narrow_kinds found no plan large enough)
  bool replay_range_ = false;      // the "memplan/replay" NVTX range is open
  std::chrono::steady_clock::time_point last_backward_end_;
  std::vector<double> iteration_us_[2];  // iterations that recorded, ran plainly (replayed: per plan)
  std::unique_ptr<Profile> replay_profile_;  // the first replayed step, for the trace
  int64_t opt_live_before_ = -1;    // bytes allocated when the running optimizer step began
  // Training iterations in which an optimizer step ended (several param-wise steps in one
  // backward count once): between two of them a script zeroes its gradients.
  int64_t opt_rounds_ = 0;
  int64_t opt_round_step_ = -1;     // steps_ when opt_rounds_ last grew
  // A parameter the steps recorded whole save for backward (watch_param; PlanRecord::param).
  c10::weak_intrusive_ptr<c10::TensorImpl> step_param_{c10::intrusive_ptr<c10::TensorImpl>()};
  // Whether the running step began with no gradients (Began); Unknown when the leaf watched for it
  // had died: a leaf input that requires grad (the input of an adversarial attack) saved first.
  enum Began : char { kWithGrads = 0, kWithoutGrads = 1, kUnknown = 2 };
  Began step_began_ = kWithGrads;
  bool graph_kept_ = false;             // the running step's backward keeps its graph
  // step_began_ of each record in profiles_ (Began values; char: with_fresh_gradients, in
  // profiler/, compares them and knows no Began).
  std::vector<char> began_;
  bool packs_off_ = false;          // the running op's packs bypass our hooks (see op_start)
  bool packs_prev_tracing_ = false;
  bool our_hooks_on_top() const;
  void restore_pack_hooks();  // ends a bypass set in op_start
  std::vector<TraceAction> replay_actions_;
};

}  // namespace memplan
