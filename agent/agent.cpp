#include "agent/agent.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <chrono>
#include <sstream>
#include <stdexcept>

#include "agent/log.h"
#include "agent/options.h"
#include "agent/pack_hooks.h"
#include "planner/budget.h"
#include "hooks/cpu_allocator.h"
#include "hooks/cuda_tracker.h"
#include "profiler/bytes.h"
#include "profiler/kernel_times.h"
#include "profiler/kind_profile.h"
#include "profiler/nvtx_ranges.h"
#include "profiler/profile_io.h"
#include "profiler/summary.h"
#include "profiler/tensor_args.h"

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
std::string inplace_error_message(const SavedState& s, uint32_t now) {
  std::ostringstream m;
  const bool cuda = s.tensor.defined() ? s.tensor.is_cuda() : s.meta_cuda;
  const auto dtype = s.tensor.defined() ? s.tensor.scalar_type() : s.meta_dtype;
  const c10::IntArrayRef sizes = s.tensor.defined() ? s.tensor.sizes() : c10::IntArrayRef(s.meta_sizes);
  m << "one of the variables needed for gradient computation has been modified by an inplace "
       "operation: [torch."
    << (cuda ? "cuda." : "") << c10::toString(dtype) << "Tensor " << sizes << "]";
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

// What one snapshot of the CPU generator takes (Replayer::op_start keeps one per random op it
// may re-run, to the step's end): the size of its get_state() tensor, asked once (under the
// generator's lock, as every get_state must be).
int64_t cpu_rng_state_bytes() {
  static const int64_t bytes = [] {
    at::Generator g = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(g.mutex());
    return static_cast<int64_t>(g.get_state().nbytes());
  }();
  return bytes;
}

// Whether any tensor argument of the op (lists included) satisfies `pred`. Cost: one scan of the
// inputs (boxed for us anyway).
template <typename Pred>
bool any_input(const at::RecordFunction& fn, Pred pred) {
  bool any = false;
  for (const c10::IValue& iv : fn.inputs()) {
    for_each_tensor(iv, [&](const at::Tensor& t) { any = any || pred(t); });
  }
  return any;
}

// The device index of the step's first op's first CUDA input, or -1: which allocator accounts the
// step (CUDA's if that op reads any CUDA tensor: an op mixing devices reads a CPU scalar or index
// beside CUDA tensors, never the other way round), and the device its kernels are timed on.
int first_cuda_device(const at::RecordFunction& fn) {
  int device = -1;
  any_input(fn, [&](const at::Tensor& t) {
    if (t.device().is_cuda()) device = t.device().index();
    return t.device().is_cuda();
  });
  return device;
}

// Whether the op reads a tensor that requires grad: only such an op can make an autograd node or
// save anything.
bool reads_grad(const at::RecordFunction& fn) {
  return any_input(fn, [](const at::Tensor& t) { return t.requires_grad(); });
}

// An op torch.compile runs while it traces a graph: under FakeTensorMode or AOTAutograd's proxy
// and functional modes, or a fake tensor's kernel on meta tensors. Not the step's computation:
// its tensors hold no memory and their sizes may be symbolic (StorageImpl::nbytes throws). Seen
// as the step's ops, a recompile inside a step (a new sequence length for a compiled module)
// crashed the process. Cost: a TLS read (no mode: the common case), else three, and a pass over
// the inputs.
bool traced(const at::RecordFunction& fn) {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  if (TorchDispatchModeTLS::stack_len() > 0 &&
      (TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE) ||
       TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY) ||
       TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FUNCTIONAL))) {
    return true;
  }
  if (any_input(fn, [](const at::Tensor& t) { return t.is_meta(); })) return true;
  // A factory (no tensor to tell by) that a fake tensor's kernel calls with its mode popped: made
  // on the meta device, or of symbolic sizes. Cost: a pass over its few arguments.
  if (fn.seqNr() >= 0) return false;
  for (const c10::IValue& iv : fn.inputs()) {
    if (iv.isDevice() && iv.toDevice().is_meta()) return true;
    if (iv.isSymInt() && iv.toSymInt().is_heap_allocated()) return true;
    if (iv.isList())
      for (const c10::IValue& e : iv.toListRef())
        if (e.isSymInt() && e.toSymInt().is_heap_allocated()) return true;
  }
  return false;
}

// An op's input elements, as OpSequence::numel counts them from a profile.
int64_t input_numel(const at::RecordFunction& fn) {
  int64_t n = 0;
  for (const c10::IValue& iv : fn.inputs()) for_each_tensor(iv, [&](const at::Tensor& t) { n += t.numel(); });
  return n;
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
  if (opt.train_thread == TrainThread::Import) owner_.store(at::RecordFunction::currentThreadId());
  set_nvtx_enabled(opt.nvtx);
  if (!install_cpu_allocator()) warn("CPU allocator wrapper not installed; CPU memory is not accounted");
  // The CUDA tracker attaches at the first step on a GPU (begin of op_start's step): CUDA is not
  // initialised yet here, and must not be (forked children could not use it).
  const int rank = env_rank(), world = env_world_size();
  profile_path_ = opt.profile_out.empty() ? "" : rank_path(opt.profile_out, rank, world);
  trace_path_ = opt.trace.empty() ? "" : rank_path(opt.trace, rank, world);
  install_op_callbacks(this, CallbackNeeds{true, true});
  planning_ = opt.budget.kind != Budget::Kind::None || !opt.plan.empty();
  kinds_ = StepKinds(opt.warmup);
  phase_ = Phase::Warmup;
  nvtx::range_push("memplan/warmup");
  debug("profiling {} warm-up step(s)", opt.warmup);
  return true;
}

bool Agent::recording() const {
  return (phase_ == Phase::Warmup || phase_ == Phase::Replay) && !failed_.load(std::memory_order_relaxed);
}

// One of our op or node callbacks threw: a tensor the recorder cannot describe (a strided nested
// tensor, whose sizes() throws), or a fault of ours. Torch would print the exception with a stack
// trace for every op, and the step's record is half made (a later callback on it could crash the
// process). Once: one message; recording() is false from here, the replay's evictions stop (what
// it evicted is rebuilt as backward reads it, or put back at the backward's end), and observing
// stops at that end: plain PyTorch from there. Any thread (node callbacks run on the engine's;
// on the CPU it is the training thread).
void Agent::callback_failed(const std::exception& e) {
  if (failed_.exchange(true)) return;
  warn("could not follow an op of this step ({}): memplan stops planning and runs plain PyTorch from here", brief(e));
  each_replayer([](Replayer& r) { r.give_up(); });
}

// After callback_failed, at the end of a backward: the step's record is dropped, what the replay
// evicted is put back (Replayer::end_step rebuilds what backward left evicted), nothing is
// observed any more.
void Agent::stop_after_failure() {
  if (replayer_) {
    try {
      replayer_->end_step();
    } catch (const std::exception& e) {
      warn("could not restore a saved tensor after that: {}", brief(e));
    }
  }
  replayer_ = nullptr;
  stop_observing();
}

bool Agent::on_owner_thread() const {
  return at::RecordFunction::currentThreadId() == owner_.load(std::memory_order_relaxed);
}

// Under MEMPLAN_TRAIN_THREAD=backward: the first thread to call backward trains. Its forward ran
// unobserved (no thread was yet), so this step is none of ours; recording starts with its next.
// Not while that thread has saved-tensor hooks of its own (a user's context it will leave): ours
// go at the bottom of its stack, as on the import thread at boot.
bool Agent::claim_thread() {
  if (inert_ || options().train_thread != TrainThread::FirstBackward) return false;
  if (owner_.load(std::memory_order_relaxed) != 0 || !at::SavedTensorDefaultHooks::get_tls_state().stack.empty()) {
    return false;
  }
  uint64_t none = 0;
  if (!owner_.compare_exchange_strong(none, at::RecordFunction::currentThreadId())) return false;
  debug("the training thread is the first one that called backward (MEMPLAN_TRAIN_THREAD=backward); its first "
        "step runs unobserved");
  return true;
}

// Another thread's op: never part of the step. Said once if it looks like training (an input
// that requires grad), since memplan then plans nothing on that thread. No agent state touched.
void Agent::foreign_op(const at::RecordFunction& fn) {
  static std::atomic<bool> said{false};
  if (owner_.load(std::memory_order_relaxed) == 0) return;  // no training thread yet (claim_thread)
  if (inert_ || said.load(std::memory_order_relaxed) || !at::GradMode::is_enabled()) return;
  if (reads_grad(fn)) {
    said.store(true, std::memory_order_relaxed);  // spares later ops the scan; log_once says it once
    log_once("foreign-thread", LogLevel::Info,
             options().train_thread == TrainThread::Import
                 ? "ops with gradients run on a thread other than the one that imported torch: memplan "
                   "observes and plans only that thread's training steps; the other thread's run as "
                   "plain PyTorch (MEMPLAN_TRAIN_THREAD=backward observes the first thread that calls "
                   "backward instead)"
                 : "ops with gradients run on a thread other than the first one that called backward: "
                   "memplan observes and plans only that thread's training steps; the other thread's "
                   "run as plain PyTorch");
  }
}

void Agent::op_start(const at::RecordFunction& fn) {
  if (fn.threadId() != owner_.load(std::memory_order_relaxed)) {
    foreign_op(fn);
    return;
  }
  if (inert_ || !recording() || backward_depth_ > 0 || !at::GradMode::is_enabled() || traced(fn)) return;
  // A step begins at its first op that reads a tensor requiring grad. The ops before it (the
  // batch moved to the device, normalized, or rebuilt from a DataLoader worker's shared memory,
  // whose count depends on the order the workers' batches arrived in) make no autograd node and
  // save nothing: not part of the step, so the step's ops, and so its kind, do not depend on them.
  if (!recorder_.in_step() && !reads_grad(fn)) return;
  OverheadTimer timer(&recorder_);
  if (!recorder_.in_step()) {
    const int cuda_device = first_cuda_device(fn);
    const bool cuda = cuda_device >= 0;
    if (cuda && !cuda_memory().active()) {
      // The step's memory is on a GPU whose allocator tells us nothing: no plan could be
      // checked. Plain PyTorch from this step's end (backward_end). Tried once: the step's
      // later ops come here too, and a failed attach throws inside.
      if (!cuda_unmeasured_ && !attach_cuda_tracker()) {
        cuda_unmeasured_ = true;
        warn("the CUDA allocator takes no trace tracker (PYTORCH_CUDA_ALLOC_CONF backend:cudaMallocAsync?), so "
             "GPU memory cannot be measured: memplan runs plain PyTorch");
      }
      if (cuda_unmeasured_) return;
    }
    recorder_.set_memory(cuda ? &cuda_memory() : &cpu_memory());
    step_device_ = cuda ? "cuda" : "cpu";
    begin_step(fn);
    timing_device_ = choice_.profile && cuda && device_timer_.begin_step(cuda_device);
  }
  if (choice_.profile) nvtx::range_push(fn.name());
  recorder_.op_start(fn);
  const int64_t op = recorder_.current_op();
  if (!choice_.profile && op >= 0) {
    // Its size, while the step's kind is undecided (narrow_kinds): the inputs are gone at the end.
    if (!undecided_.empty()) op_numel_ = input_numel(fn);
    bool wants_packs = false;
    uint64_t structure = 0;
    const uint64_t hash = recorder_.current_identity(fn, &structure);
    each_replayer([&](Replayer& r) {
      r.op_start(fn, op, recorder_.current_random(), hash, structure);
      wants_packs = wants_packs || r.wants_packs(op);
    });
    // An op that saves nothing the plan evicts (every op, in a step of a kind whose plan has no
    // actions) keeps its saved tensors with autograd, exactly as without memplan: no Python
    // pack/unpack call for them (measured: the hooks were ~4-5% of a GPT-2 demo step). Only while
    // our hooks are the innermost: a user's saved_tensors_hooks or checkpoint above ours stay
    // untouched.
    const bool bypass = !wants_packs && our_hooks_on_top();
    if (bypass) {
      packs_prev_tracing_ = at::SavedTensorDefaultHooks::set_tracing(true);
      packs_off_ = true;  // until restore_pack_hooks()
    }
    if (replayer_) ++(bypass ? replayer_->stats().ops_unhooked : replayer_->stats().ops_hooked);
  }
  // Last thing in the start callback: the op's device time should not include our recording.
  if (timing_device_ && op >= 0) device_timer_.op_begin(forward_op_id(op));
}

// Not part of the step, but it may write a buffer a rebuild reads (under no_grad, in the forward,
// after the op that read it): the replayer copies it first. Cost while replaying: a few flag
// checks, then Replayer::before_write's.
void Agent::untracked_op(const at::RecordFunction& fn) {
  if (fn.threadId() != owner_.load(std::memory_order_relaxed) || inert_ || phase_ != Phase::Replay ||
      !recording() || backward_depth_ > 0 || choice_.profile || traced(fn)) {
    return;
  }
  each_replayer([&](Replayer& r) { r.before_write(fn); });
}

void Agent::op_end(const at::RecordFunction& fn) {
  if (fn.threadId() != owner_.load(std::memory_order_relaxed)) return;
  restore_pack_hooks();
  if (inert_ || !recording() || recorder_.current_op() < 0) return;
  OverheadTimer timer(&recorder_);
  const int64_t op = recorder_.current_op();
  if (timing_device_) device_timer_.op_end(forward_op_id(op));  // first thing
  const int64_t before = recorder_.op_count();
  recorder_.op_end(fn);
  if (!choice_.profile) {
    const bool dropped = recorder_.op_count() < before;
    const uint64_t hash = dropped ? 0 : recorder_.op_hash(op);
    const uint64_t structure = dropped ? 0 : recorder_.op_structure_hash(op);
    if (!undecided_.empty() && !dropped) narrow_kinds(op, hash, structure);
    const bool drew = recorder_.drew_unmarked();
    each_replayer([&](Replayer& r) {
      if (drew) r.forget_recipe(op);
      r.op_end(fn, op, dropped, hash, structure);
    });
  }
  if (choice_.profile) nvtx::range_pop();
}

// Kinds of step that start with the same op (a model that first slices its position table, or a
// step whose window opens at the last one's `loss.detach()`: the same for every sequence length)
// are told apart by the first op where their sequences differ: until then every candidate's
// replayer follows the step (recipes, packs), none acts. At op `op`'s end (before any candidate
// acts at it), the candidates whose profile ran another op here are ruled out; the step is
// decided when one is left, or when one of them would act at this op (then the prediction's
// order decides among the rest). With none left: past StepKinds::kOwnPlans kinds, a candidate
// that ran this op with at least as many elements (the smallest such) covers the step, which
// replays its plan matched by structure from here (as StepKinds::Choice::family); with none that
// large, the largest one does, and the next step is recorded whole; with no candidate of the
// same structure, the predicted kind goes on and diverges, as before. Cost: one
// OpSequence::match per candidate per op, only until the step is decided (a few ops).
void Agent::narrow_kinds(int64_t op, uint64_t hash, uint64_t structure) {
  std::vector<int> left;
  bool acts = false;
  for (int plan : undecided_) {
    const PlanRecord& rec = plans_[static_cast<size_t>(plan)];
    if (rec.ops.match(op, hash, structure) == OpSequence::Match::Other) continue;
    left.push_back(plan);
    acts = acts || (rec.replayer && rec.replayer->first_action_op() >= 0 && rec.replayer->first_action_op() <= op);
  }
  if (left.empty()) {
    // Past kOwnPlans kinds: the smallest candidate at least as large here covers the step; with
    // none, the largest one is the best there is (the step may pass its budget: the next step is
    // recorded whole and planned, as a larger step whose first op tells its size would be).
    int cover = -1, largest = -1;
    if (kinds_.kinds() >= StepKinds::kOwnPlans) {
      for (int plan : undecided_) {
        const OpSequence& ops = plans_[static_cast<size_t>(plan)].ops;
        if (ops.match(op, hash, structure, /*any_size=*/true) == OpSequence::Match::Other) continue;
        const int64_t n = ops.numel(op);
        if (n >= op_numel_ && (cover < 0 || n < plans_[static_cast<size_t>(cover)].ops.numel(op))) cover = plan;
        if (largest < 0 || n > plans_[static_cast<size_t>(largest)].ops.numel(op)) largest = plan;
      }
    }
    if (cover < 0 && largest >= 0) {
      cover = largest;
      profile_next_ = true;
      log_once("family-larger", LogLevel::Info,
               "a step larger than every planned step of the same ops, and told apart from them only after its "
               "first op, replays the largest plan (its peak may pass that plan's budget); the next step is "
               "recorded whole and planned");
    }
    decide_kind(cover >= 0 ? cover : undecided_.front());
    if (cover >= 0) {
      choice_.family = true;
      if (replayer_) replayer_->set_any_size();
      log_family();
    }
  } else if (left.size() == 1 || acts) {
    decide_kind(left.front());
  } else {
    undecided_ = std::move(left);
  }
}

void Agent::log_family() {
  log_once("family", LogLevel::Info,
           fmt::format("a step of a size with no plan of its own (another sequence length or batch size, with {} "
                       "or more kinds of step seen) replays the plan of the smallest larger step of the same ops; "
                       "steps larger than every planned one are profiled and planned",
                       StepKinds::kOwnPlans));
}

// The running step replays plans_[plan]: the other candidates drop what they recorded of it.
void Agent::decide_kind(int plan) {
  for (int other : undecided_) {
    Replayer* r = plans_[static_cast<size_t>(other)].replayer.get();
    if (other != plan && r) r->abandon_step();
  }
  undecided_.clear();
  if (plan == choice_.plan) return;
  const PlanRecord& rec = plans_[static_cast<size_t>(plan)];
  debug("step {}: its ops so far are kind {:016x}'s, not the predicted {:016x}'s", steps_, rec.kind, choice_.kind);
  choice_.kind = rec.kind;
  choice_.plan = plan;
  replayer_ = rec.replayer.get();
  pause_backward_nodes(recorder_.light() && (replayer_ == nullptr || !replayer_->needs_node_callbacks()));
}

// A node of a graph another thread built (its own backward, running beside ours) is not the
// step's. The engine's "evaluate_function" wrapper carries no forward thread (0).
bool Agent::foreign_node(const at::RecordFunction& fn) const {
  return fn.forwardThreadId() != 0 && fn.forwardThreadId() != owner_.load(std::memory_order_relaxed);
}

// This backward's nodes run on one thread: the calling thread on the CPU, a device's engine
// thread on a GPU. When a graph has nodes on two devices (the CPU and a GPU, or two GPUs), the
// engine runs them on two threads at once, and the recorder and the replayer, written from both,
// would race. Only the first thread's callbacks go on; the step is dropped at its end and memplan
// stops (backward_end). Cost: a TLS read and a relaxed load; one CAS per backward.
bool Agent::on_node_thread() {
  const uint64_t me = at::RecordFunction::currentThreadId();
  uint64_t first = node_thread_.load(std::memory_order_relaxed);
  if (first == me) return true;
  if (first == 0 && node_thread_.compare_exchange_strong(first, me)) return true;
  split_backward_.store(true, std::memory_order_relaxed);
  return false;
}

void Agent::node_start(const at::RecordFunction& fn) {
  if (foreign_node(fn) || inert_ || !recording() || !recorder_.in_step() || backward_depth_ == 0) return;
  if (!on_node_thread()) return;
  OverheadTimer timer(&recorder_);
  const int64_t before = recorder_.current_node();
  recorder_.node_start(fn);
  const int64_t node = recorder_.current_node();
  if (node == before) return;  // the engine's "evaluate_function: X" wrapper makes no node
  if (timing_device_) device_timer_.op_begin(backward_op_id(node));
  if (replayer_) replayer_->node_start(node, recorder_.current_node_name());
}

void Agent::node_end(const at::RecordFunction& fn) {
  if (foreign_node(fn) || inert_ || !recording() || !recorder_.in_step() || backward_depth_ == 0) return;
  if (!on_node_thread()) return;
  OverheadTimer timer(&recorder_);
  // Ignored when that node is not open (the engine wrapper's end comes after the node's).
  if (timing_device_ && recorder_.current_node() >= 0) device_timer_.op_end(backward_op_id(recorder_.current_node()));
  recorder_.node_end(fn);
  if (replayer_ && recorder_.current_node() >= 0) replayer_->node_end(recorder_.current_node());
}

Saved Agent::pack(const at::Tensor& t) {
  Saved h{std::make_shared<SavedState>()};
  SavedState& s = *h.s;
  s.tensor = t.tensor_data();
  if (std::vector<at::Tensor>* capture = Replayer::capture()) {
    // A rebuild is re-running an op: hand over what it saves; this graph is thrown away.
    capture->push_back(s.tensor);
    return h;
  }
  s.counter = t.unsafeGetTensorImpl()->version_counter();
  s.version = s.counter.current_version();
  s.grad_fn = c10::weak_intrusive_ptr<torch::autograd::Node>(t.grad_fn());
  s.output_nr = t.output_nr();
  if (!inert_ && recording() && recorder_.in_step() && backward_depth_ == 0 && on_owner_thread()) {
    OverheadTimer timer(&recorder_);
    s.value = recorder_.on_pack(t, s.tensor);
    s.step = steps_;
    each_replayer([&](Replayer& r) { r.on_pack(h.s, t, recorder_.pack_owner()); });
    if (choice_.profile || plans_[static_cast<size_t>(choice_.plan)].grads.fresh_bytes > 0) watch_param(t);
  }
  return h;
}

at::Tensor Agent::unpack(const Saved& h) {
  SavedState& s = *h.s;
  // With default hooks set, autograd skips its own "modified by an inplace operation" check;
  // re-do it with autograd's exact message (design.md 3b.11). The counter is the live tensor's,
  // also while ours is evicted or rebuilt.
  if (s.counter.enabled()) {
    const uint32_t now = s.counter.current_version();
    if (now != s.version) throw std::runtime_error(inplace_error_message(s, now));
  }
  if (s.value >= 0 && s.step == steps_ && recording() && recorder_.in_step() &&
      (backward_depth_ == 0 || on_node_thread())) {
    OverheadTimer timer(&recorder_);
    recorder_.on_unpack(s.value);
  }
  if (s.evicted) {
    if (!replayer_ || s.step != steps_) {
      throw std::runtime_error("memplan: an evicted saved tensor outlived its step's recipes");
    }
    return replayer_->materialize(s);
  }
  return s.tensor;
}

void Agent::hooks_pushed() { pack_hooks::remember(); }

// Cost: a TLS read and a pointer compare.
bool Agent::our_hooks_on_top() const {
  const auto& tls = at::SavedTensorDefaultHooks::get_tls_state();
  if (tls.is_tracing || tls.disabled_error_message) return false;
  return pack_hooks::on_top();
}

void Agent::restore_pack_hooks() {
  if (!packs_off_) return;
  at::SavedTensorDefaultHooks::set_tracing(packs_prev_tracing_);
  packs_off_ = false;
}

// The training thread, or while its backward runs, the thread running that backward's nodes: on
// a GPU a post-accumulate-grad hook's optimizer step runs on the engine's device thread.
bool Agent::on_training_thread() const {
  const uint64_t me = at::RecordFunction::currentThreadId();
  return me == owner_.load(std::memory_order_relaxed) ||
         (backward_depth_ > 0 && me == node_thread_.load(std::memory_order_relaxed));
}

void Agent::optimizer_step_begin(bool observed) {
  if (inert_ || !on_training_thread() || observed || phase_ == Phase::Done) return;
  quiet_ops_begin();
  opt_live_before_ = recording() && recorder_.in_step() ? recorder_.live() : -1;
}

void Agent::optimizer_step_end() {
  if (!on_training_thread()) return;
  // State the optimizer kept (made lazily by its first step: SGD's momentum, Adam's moments) is
  // no activation of the step whose window the step fell in: without this, a script that runs an
  // op reading a tensor that requires grad between backward and the optimizer step (copying its
  // parameters) profiled its first steps with tens of MiB of "activation" that no later step has.
  if (opt_live_before_ >= 0 && recording() && recorder_.in_step()) {
    const int64_t kept = recorder_.live() - opt_live_before_;
    if (kept > 0) recorder_.raise_baseline(kept);
    if (backward_depth_ == 0) recorder_.skip_gap();
  }
  opt_live_before_ = -1;
  if (opt_round_step_ != steps_) {
    ++opt_rounds_;
    opt_round_step_ = steps_;
  }
  quiet_ops_end();
}

// An optimizer step raised after the pre hook (its post hook never runs) and the script caught
// it: its record_function ended, so the stretch ends here, before the next forward, which is
// then seen and replayed as planned. (Waiting for the next backward cost a step run unplanned,
// at the un-planned peak.) What the step made before raising is kept as its state would be.
void Agent::quiet_stretch_unwound() {
  if (!on_training_thread()) return;
  log_once("optimizer-raised", LogLevel::Info,
           "an optimizer step raised and the script went on: the steps go on as planned");
  optimizer_step_end();
}

namespace {
thread_local int tl_foreign_backward = 0;  // backward calls of another thread, nested
}

// A backward that keeps its graph for another (a gradient penalty's create_graph, two losses
// backward through one graph): each backward ends a step (what a step is), and the saved tensors
// its nodes read stay in the graph, rebuilt ones too, until the graph is freed. So the step up
// to it can evict only until its recomputes, and the step after it reads them where they are:
// little to plan (the warnings then say so, per step), all results as they were. One message
// tells why.
void Agent::said_graph_kept() {
  log_once("graph-kept", LogLevel::Info,
           "a backward keeps its graph for another one (retain_graph or create_graph): memplan plans each "
           "backward as a step of its own, and the saved tensors the first one reads stay in the graph for "
           "the next, rebuilt ones too, so these steps can be lowered little or not at all; results are "
           "unchanged");
}

void Agent::backward_begin(bool keeps_graph) {
  if (inert_) return;
  if (!on_owner_thread()) {
    ++tl_foreign_backward;  // another thread's backward is no step boundary of ours
    return;
  }
  if (quiet_ops_active()) {
    // An optimizer step raised (its post hook never ran) and the script went on, and the end of
    // its record_function did not end the stretch (quiet_stretch_unwound, which does so before
    // the next forward, always should): a fallback. Observe again from the next step; this
    // one's forward went unseen, so it runs without planned actions.
    quiet_ops_end();
    log_once("optimizer-raised", LogLevel::Warn,
             "an optimizer step raised: one training step ran without the plan's actions");
  }
  if (backward_depth_ != 0) {
    ++backward_depth_;
    return;
  }
  if (keeps_graph && phase_ != Phase::Done) said_graph_kept();
  graph_kept_ = keeps_graph;
  ++backward_depth_;
  node_thread_.store(0, std::memory_order_relaxed);  // no node of this backward has run yet
  restore_pack_hooks();  // a backward inside a forward op (a Python-kernel custom op)
  if (!undecided_.empty() && recording()) decide_kind(undecided_.front());  // the forward ran alike for them all
  // Forward ops are ignored during backward (op_start): stop the dispatcher boxing the arguments
  // of every aten op the backward runs, only for us to drop them.
  pause_forward_ops(true);
  if (recording() && recorder_.in_step()) {
    OverheadTimer timer(&recorder_);
    recorder_.begin_backward();
  }
}

bool Agent::backward_end() {
  if (inert_) return false;
  if (tl_foreign_backward > 0) {
    --tl_foreign_backward;
    return true;  // only the training thread's backward ends the agent's work
  }
  if (backward_depth_ == 0) return phase_ != Phase::Done;
  if (--backward_depth_ > 0) return true;
  pause_forward_ops(false);
  // Wall time of each whole iteration (backward end to backward end), by the phase it ran in:
  // what recording and replay really cost, boxing and Python hooks included.
  const auto now = std::chrono::steady_clock::now();
  if (steps_ > 0) {
    const double us = std::chrono::duration<double, std::micro>(now - last_backward_end_).count();
    if (!recording() || !recorder_.in_step()) {
      iteration_us_[1].push_back(us);
    } else if (choice_.profile) {
      iteration_us_[0].push_back(us);
    } else {
      plans_[static_cast<size_t>(choice_.plan)].iteration_us.push_back(us);
    }
  }
  last_backward_end_ = now;
  const bool split = split_backward_.load(std::memory_order_relaxed);
  if ((split || cuda_unmeasured_) && phase_ != Phase::Done) {
    // Split: the engine is done, no node callback runs any more; the step's record misses the
    // other thread's nodes, so it is dropped, and no later step is safe to observe either.
    // Unmeasured (said in op_start): this step was never recorded.
    if (split) {
      warn("the nodes of one backward ran on two threads (a graph with nodes on the CPU and a GPU, or on two "
           "GPUs): memplan plans no such step and runs plain PyTorch from here");
    }
    stop_observing();
  }
  if (failed_.load(std::memory_order_relaxed) && phase_ != Phase::Done) stop_after_failure();
  if (recording() && recorder_.in_step()) {
    Profile p = recorder_.end_step();
    if (replayer_) p.overhead_us += static_cast<double>(replayer_->take_hook_ns()) / 1000.0;
    if (timing_device_) {
      timing_device_ = false;
      std::vector<double> fc, fe, bc, be;
      device_timer_.end_step(&fc, &fe, &bc, &be);
      apply_device_times(&p.forward, fc, fe);
      apply_device_times(&p.backward, bc, be);
    }
    p.rank = env_rank();
    p.device = step_device_;
    p.graph_kept = graph_kept_;
    if (p.device == "cpu") p.rng_state_bytes = cpu_rng_state_bytes();
    end_step(std::move(p));
  }
  ++steps_;
  return phase_ != Phase::Done;
}

namespace {
// The step's first op as StepKinds knows it: identity, structure, and its inputs' elements (a
// sequence length or batch size makes them more). Once per step.
StepKinds::FirstOp first_op_of(const at::RecordFunction& fn) {
  StepKinds::FirstOp f;
  f.identity = Recorder::identity_hash(fn, &f.structure);
  f.numel = input_numel(fn);
  return f;
}
}  // namespace

// At a step's first op: which kind of step this is predicted to be (among those that start with
// this op), and so whether it is recorded whole (profiled) or replays that kind's plan.
void Agent::begin_step(const at::RecordFunction& first) {
  first_op_ = first_op_of(first);
  choice_ = planning_ ? kinds_.next(first_op_) : StepKinds::Choice{};
  if (profile_next_ && planning_ && !choice_.profile) {
    // The last step was larger than every planned one (narrow_kinds): record this one whole and
    // plan it at once; it is likely of that size, and if not, its own size gets a plan.
    choice_ = StepKinds::Choice{};
    choice_.plan_at_once = true;
  }
  if (log_enabled(LogLevel::Debug)) {
    debug("step {}: first op {:016x}, {} kind {:016x}{}{}, {} other candidate(s)", steps_, first_op_.identity,
          choice_.profile ? "record" : "replay", choice_.kind, choice_.family ? " (its family's plan)" : "",
          choice_.plan_at_once ? " (plan at once)" : "", choice_.others.size());
  }
  if (choice_.family) log_family();
  // Noted for a record (the last begin of a step counts: a step restarted at its forward, after
  // a zero_grad).
  if (choice_.profile) {
    step_began_ = steps_ == 0 || lacks_gradient(step_param_) ? kWithoutGrads
                  : step_param_.expired()                     ? kUnknown
                                                              : kWithGrads;
  }
  credit_at_begin();
  replayer_ = choice_.profile ? nullptr : plans_[static_cast<size_t>(choice_.plan)].replayer.get();
  undecided_.clear();
  // Followed op by op while other kinds may still be it, or, past kOwnPlans kinds, while a longer
  // or shorter step of the same ops may turn out to be it (narrow_kinds).
  if (!choice_.profile && !choice_.family && (!choice_.others.empty() || kinds_.kinds() >= StepKinds::kOwnPlans)) {
    undecided_.push_back(choice_.plan);
    undecided_.insert(undecided_.end(), choice_.others.begin(), choice_.others.end());
  }
  // Replayed steps are recorded light, their record read for its peak and signature only; the
  // first one with actions is kept whole, for the trace. A debug log keeps every one whole.
  recorder_.set_light(!choice_.profile && (replay_profile_ != nullptr || replayer_ == nullptr) &&
                      !log_enabled(LogLevel::Debug));
  recorder_.begin_step(steps_);
  // A light replayed step needs no node callbacks when the plan's actions hang on the nodes.
  pause_backward_nodes(recorder_.light() && (replayer_ == nullptr || !replayer_->needs_node_callbacks()));
  each_replayer([&](Replayer& r) { r.begin_step(choice_.family); });
}

void Agent::end_step(Profile p) {
  if (!planning_) {
    // Profile only: the first MEMPLAN_WARMUP steps, written out, then nothing more to do.
    keep_record(std::move(p));
    if (static_cast<int>(profiles_.size()) >= options().warmup) {
      write_outputs();
      stop_observing();
    }
    return;
  }
  const bool diverged = replayer_ != nullptr && replayer_->diverged();
  // Ran its plan's ops with stretches left out (Replayer::skip_to), none of them other, and the
  // plan's evictions all took place. One that refused some is a kind of its own after all,
  // recorded and planned as before (StepKinds::never_cover): the greedy match lined its ops up with ops
  // the plan made no recipes for. So is a step of a kind the plan covers whose forward ended
  // sooner (an adversarial attack whose loss is one op short of the step's: the replayer skipped
  // nothing, the backward came first); before, each such step was a miss, and four gave up
  // planning (the CNN --adversarial shorter). Also under a covering plan without actions (one
  // planned again for what steps kept through backward, whose minimum is then the un-planned
  // peak): such a step ran plainly, as its plan asks.
  bool gapped = !diverged && ((replayer_ != nullptr && replayer_->gapped()) ||
                              (!choice_.profile && p.signature != choice_.kind &&
                               kinds_.cover_of(p.signature) == choice_.kind));
  if (gapped && replayer_ != nullptr && replayer_->refused() > 0 && p.signature != choice_.kind) {
    gapped = false;
    kinds_.never_cover(p.signature);
    log_once("gap-refused", LogLevel::Info,
             "a step that left out some of its plan's ops could not evict what the plan evicts from the ops it ran: "
             "its kind of step is profiled and planned on its own");
  }
  bool other_kind = false;  // ran other ops than its kind's, undetected while it ran
  bool measured = false;    // its peak measures its plan's prediction
  bool resized = false;     // its kind's ops, with other sizes after an op whose output shape follows from data
  if (!choice_.profile && !diverged && p.signature != choice_.kind) {  // (a divergence says so itself)
    // The same ops with other sizes, in a kind whose ops' sizes follow from data (a loss over the
    // tokens a mask keeps): a step of the kind it replayed (Replayer::check_divergence let it run
    // on as planned; a plan without actions has no replayer, and is matched here).
    const PlanRecord& rec = plans_[static_cast<size_t>(choice_.plan)];
    if ((rec.data_dependent || choice_.family) && p.structure_signature == rec.structure) {
      p.signature = choice_.kind;
      resized = rec.data_dependent && !choice_.family;
    } else if (gapped) {
      // Its kind is its own (StepKinds::finish decides which the history keeps), its peak the
      // plan's to keep under, though not to predict: measured apart.
    } else {
      other_kind = true;
      log_once("other-kind", LogLevel::Info,
               "a step ran other ops than the step predicted for it (its kind of step, or a new one): "
               "that step ran without planned actions; new kinds of step are profiled and planned on "
               "their own");
    }
  }
  // A plan without actions (no replayer): its steps are not measured, though one with other sizes
  // may pass the budget (check_sizes).
  const bool plain_plan = !choice_.profile && replayer_ == nullptr;
  if (replayer_) {
    replayer_->end_step();
    ReplayStats& st = replayer_->stats();
    if (other_kind) {
      // No measure of this plan: its peak is not the plan's to predict; kept apart.
      st.other_kind_peak.push_back(p.peak_bytes);
      st.other_kind_baseline.push_back(p.baseline_bytes);
    } else if (gapped) {
      st.gapped_peak.push_back(p.peak_bytes);
      st.gapped_baseline.push_back(p.baseline_bytes);
      st.count_step(p.overhead_us, p.step, recorder_.light());
    } else if (!diverged) {
      if (!replay_profile_ && !recorder_.light()) {  // (light: the step's kind was decided late)
        replay_profile_ = std::make_unique<Profile>(p);
        replay_actions_ = replayer_->first_step_actions();
      }
      // A smaller step of the same ops (Choice::family) is measured apart: its peak says whether
      // it kept to the budget, not how good the prediction for the plan's own size was.
      measured = !choice_.family;
      (choice_.family ? st.family_peak : st.measured_peak).push_back(p.peak_bytes);
      (choice_.family ? st.family_baseline : st.measured_baseline).push_back(p.baseline_bytes);
      st.count_step(p.overhead_us, p.step, recorder_.light());
      if (log_enabled(LogLevel::Debug)) {
        debug("replayed step {}: peak {} at {}", p.step, format_bytes(p.peak_bytes), peak_location(p));
        std::string error;
        if (!profile_path_.empty()) write_profile_file(profile_path_ + ".replay" + std::to_string(p.step) + ".json", p, &error);
      }
    }
    replayer_ = nullptr;
  }
  if (log_enabled(LogLevel::Debug)) {
    debug("step {}: kind {:016x}, {}{}", p.step, p.signature,
          choice_.profile ? "profiled" : fmt::format("replayed kind {:016x}", choice_.kind),
          diverged ? ", diverged" : "");
  }
  // A step run plainly (a record, or a step under a plan without actions) tells how far its
  // kind's sizes range (sizes_settled).
  if ((choice_.profile || plain_plan) && !diverged && !gapped && !other_kind) note_size(p.signature, p);
  bool plan_now = kinds_.finish(choice_, p.signature, first_op_, diverged, gapped);
  if (choice_.profile) {
    profile_next_ = false;  // reset here: begin_step may run more than once per step
    keep_record(std::move(p));
    if (cover_kind(profiles_.back(), &plan_now)) plan_now = false;
    if (plan_now) plan_record(profiles_.size() - 1);
  } else {
    check_gradient_credit(p);
    if (resized && (measured || (plain_plan && !gapped))) check_sizes(p);
    if (measured || gapped) check_gap(p, gapped);
    if (diverged) plan_covering_record(p.signature);
  }
  if (std::optional<std::string> why = kinds_.give_up()) {
    warn("{}: memplan stops planning and runs plain PyTorch from here", *why);
    stop_observing();
  } else if (nothing_to_do()) {
    stop_observing();
  }
}

// Whether the plan of `by` can replay the steps of `kind`'s ops: `kind`'s ops are among its own,
// in order, from the same first op, and it has actions (a plan without them has no replayer to
// follow a step past its gaps). Cost: one pass over both op sequences.
bool Agent::covers(const PlanRecord& by, const PlanRecord& kind) const {
  return by.replayer != nullptr && kind.ops.within(by.ops);
}

// A record `p` just kept, of a kind with no plan: if a planned kind runs its ops with others
// between (LayerDrop skipped layers of that one), its steps replay that kind's plan from now on
// (StepKinds::set_cover) and true; if it runs the ops of a planned kind with others between
// (more layers), it is due a plan now (*plan_now), which replaces theirs (plan_kind).
bool Agent::cover_kind(const Profile& p, bool* plan_now) {
  if (kinds_.plan_of(p.signature) >= 0 || !kinds_.coverable(p.signature)) return false;
  PlanRecord self;
  self.ops = OpSequence(p.forward);
  for (const PlanRecord& rec : plans_) {
    // (A kind's current plan, not one a larger kind's plan replaced.)
    if (rec.kind == p.signature || kinds_.plan_of(rec.kind) != &rec - plans_.data() || kinds_.covered(rec.kind)) {
      continue;
    }
    if (covers(rec, self)) {
      kinds_.set_cover(p.signature, rec.kind);
      log_once("covered", LogLevel::Info,
               fmt::format("kind of step {:016x} runs the ops of kind {:016x} with some left out (fewer layers, as "
                           "with LayerDrop): its steps replay that kind's plan, leaving out the ops they do not run",
                           p.signature, rec.kind));
      return true;
    }
    if (rec.replayer && rec.ops.within(self.ops)) *plan_now = true;
  }
  return false;
}

// The record to plan the kind of record `i` from: of the kind's records, the one whose backward
// ran the most nodes (`i` if it did, else the latest that did). Steps of the same forward ops
// may differ in their backward: adversarial training's attack takes the gradient of the input alone
// (torch.autograd.grad: no parameter's AccumulateGrad runs), then the step's backward makes
// every parameter's. A plan from the attack's record counts none of those gradients, and the
// other steps ran over it (the CNN --adversarial at 50%: +13.7%); a plan from the larger
// backward's holds both, the smaller doing less of the same. Cost: one pass over the records.
size_t Agent::widest_backward(size_t i) const {
  size_t best = i;
  for (size_t j = profiles_.size(); j-- > 0;) {
    if (profiles_[j].signature == profiles_[i].signature &&
        profiles_[j].backward.size() > profiles_[best].backward.size()) {
      best = j;
    }
  }
  return best;
}

// Plans the kind of record `i` (profiles_), from its widest_backward record.
void Agent::plan_record(size_t i) {
  i = widest_backward(i);
  // A step of the kind may allocate gradients this record added into (kind_profile.h):
  // the plan counts them. The record is replaced, so the profile file, the summary and the
  // trace show what was planned.
  FreshGradients fresh;
  Profile planned = with_fresh_gradients(profiles_, i, &fresh, &began_);
  std::shared_ptr<const Profile> uncredited;
  if (fresh.kept > 0) {
    info("step {} kept up to {} of gradients through its backward that step {} of the same kind "
         "freed before it (zeroed between forward and backward): the plan counts them",
         fresh.kept_from, format_bytes(fresh.kept), profiles_[i].step);
  }
  if (fresh.bytes > 0) {
    info("step {} allocated {} of gradients that step {} of the same kind added into (gradient "
         "accumulation): the plan counts them",
         fresh.from_step, format_bytes(fresh.bytes), profiles_[i].step);
    uncredited = std::make_shared<const Profile>(std::move(profiles_[i]));
    profiles_[i] = std::move(planned);
  } else if (fresh.kept > 0) {
    profiles_[i] = std::move(planned);  // nothing its steps may not allocate: kept as planned
  }
  plan_kind(profiles_[i], std::move(uncredited), fresh, began_[i] != kWithGrads);
}

// A step of kind `kind` diverged from the plan it replayed: if a record of that kind (recorded
// whole before, as a warm-up step) runs the ops of a planned kind with others between (a layer
// LayerDrop skipped in the planned one), it is planned now rather than after more records of its
// own: its plan covers the smaller kinds, whose steps would diverge no more. (Waiting, each such
// step was a miss, and a model skipping 30% of 6 layers gave up after four.)
void Agent::plan_covering_record(uint64_t kind) {
  if (kinds_.plan_of(kind) >= 0 || kinds_.covered(kind)) return;
  for (size_t i = profiles_.size(); i-- > 0;) {
    if (profiles_[i].signature != kind) continue;
    bool plan_now = false;
    if (!cover_kind(profiles_[i], &plan_now) && plan_now) {
      info("step {} ran more ops than the plan it replayed, as recorded step {} did: that record is planned now",
           steps_, profiles_[i].step);
      plan_record(i);
    }
    return;
  }
}

// A step recorded whole joins the records, with whether it began without gradients.
void Agent::keep_record(Profile p) {
  profiles_.push_back(std::move(p));
  began_.push_back(step_began_);
  outputs_written_ = false;
}

// The recent steps are all of kinds whose plans have no actions (and, for sizes that follow from
// data, whose steps keep well under the budget: sizes_settled): stop observing ops, zero cost
// from here (a budget above the un-planned peak).
bool Agent::nothing_to_do() const {
  constexpr int kRecent = 8;  // steps looked at: a first step that differed ages out of them
  const std::vector<uint64_t> recent = kinds_.recent(kRecent);
  if (static_cast<int>(recent.size()) < std::min(options().warmup, kRecent)) return false;
  for (uint64_t kind : recent) {
    const int plan = kinds_.plan_of(kind);
    if (plan < 0) return false;
    const PlanRecord& rec = plans_[static_cast<size_t>(plan)];
    // Made without gradients a step may yet allocate: watched (credit_at_begin), the plan that
    // counts them may have actions.
    if (rec.replayer || (rec.grads.credited >= 0 && rec.grads.fresh_bytes > 0)) return false;
    // Sizes that follow from data, close to the budget: watched (check_sizes).
    if (rec.data_dependent && !sizes_settled(rec)) return false;
  }
  return true;
}

void Agent::stop_observing() {
  remove_op_callbacks();
  if (phase_ == Phase::Warmup) nvtx::range_pop();  // memplan/warmup
  if (replay_range_) nvtx::range_pop();            // memplan/replay
  replay_range_ = false;
  phase_ = Phase::Done;
}

// Kind `p.signature` is due a plan (StepKinds::finish); `p` is its latest whole record (with the
// gradients of another record counted, `fresh`; `uncredited`: without).
void Agent::plan_kind(const Profile& p, std::shared_ptr<const Profile> uncredited, const FreshGradients& fresh,
                      bool began_without) {
  if (phase_ == Phase::Warmup) nvtx::range_pop();  // memplan/warmup
  write_outputs();
  PlanRecord rec = make_plan(p);
  rec.grads.uncredited = std::move(uncredited);
  rec.grads.fresh_bytes = rec.grads.uncredited ? fresh.bytes : 0;
  rec.grads.fresh_from = fresh.from_step;
  rec.grads.param = step_param_;
  rec.grads.began_with_grads = !began_without;
  rec.grads.rounds_at_plan = opt_rounds_;
  if (!plans_.empty()) {
    info("planned another kind of step ({} op sequences seen): each kind replays its own plan",
         kinds_.kinds());
  }
  plans_.push_back(std::move(rec));
  kinds_.set_plan(p.signature, static_cast<int>(plans_.size()) - 1);
  // Planned kinds whose ops this one runs with more between (fewer layers): its plan covers them.
  const PlanRecord& made = plans_.back();
  for (const PlanRecord& other : plans_) {
    if (&other != &made && other.kind != made.kind && kinds_.plan_of(other.kind) == &other - plans_.data() &&
        covers(made, other) && kinds_.set_cover(other.kind, made.kind)) {
      log_once("cover", LogLevel::Info,
               fmt::format("kind of step {:016x} runs the ops of kind {:016x} with others between (more layers, as "
                           "with LayerDrop): its plan replaces that kind's, leaving out the ops a step does not run",
                           made.kind, other.kind));
    }
  }
  // And kinds recorded but not planned yet (a warm-up step that skipped a layer): no plan of
  // their own either.
  if (made.replayer) {
    for (const Profile& r : profiles_) {
      if (r.signature == made.kind || kinds_.plan_of(r.signature) >= 0 || kinds_.covered(r.signature)) continue;
      if (OpSequence(r.forward).within(made.ops)) kinds_.set_cover(r.signature, made.kind);
    }
  }
  if (phase_ == Phase::Warmup) {
    phase_ = Phase::Replay;
    nvtx::range_push("memplan/replay");
    replay_range_ = true;
  }
}

void Agent::fork_child() {
  // A DataLoader worker or any forked child: never record, never write files.
  inert_ = true;
  finished_ = true;
  remove_op_callbacks();
}

}  // namespace memplan
