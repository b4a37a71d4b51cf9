// Replay: runs a plan's actions inside a training step, bit-identically.
//
// Correctness never depends on the plan (design.md §6). Every forward op of the step leaves a
// recipe (its operator, its non-tensor arguments, where each tensor argument came from, RNG state
// for random ops); every saved tensor knows its source (an op output, possibly viewed, or a tensor
// made inside an op and packed by it). An evicted saved tensor can therefore always be rebuilt by
// re-running its producer chain through the dispatcher, with autograd on so that ops which save
// internal tensors (layer_norm's mean/rstd) hand them over through the same pack hook. The plan
// only decides what is evicted, when, and which rebuilds are done ahead of the backward node that
// needs them; anything needed earlier is rebuilt on demand at unpack.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <memory_resource>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "agent/kernel_choice.h"
#include "agent/saved.h"
#include "planner/plan.h"
#include "profiler/op_sequence.h"
#include "profiler/nvtx_ranges.h"
#include "profiler/op_writes.h"
#include "profiler/profile.h"
#include "profiler/rerun_handle.h"
#include "profiler/trace_export.h"

namespace memplan {

// Same sizes, strides, storage offset and dtype: views of one storage laid out alike read the
// same elements. Cost: a few compares.
inline bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes().equals(b.sizes()) && a.strides().equals(b.strides()) &&
         a.storage_offset() == b.storage_offset() && a.scalar_type() == b.scalar_type();
}

// An exception's message in one line: c10::Error's what() appends a backtrace of tens of lines.
inline std::string brief(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  return what.substr(0, what.find('\n'));
}

struct ReplayStats {
  int64_t steps = 0;
  int64_t evicted = 0;         // saved tensors dropped after their last forward use
  int64_t rebuilt = 0;         // saved tensors put back (planned or on demand)
  int64_t on_demand = 0;       // of which rebuilt at unpack, not ahead of time
  int64_t ops_rerun = 0;       // forward ops re-run to rebuild them
  int64_t not_rebuildable = 0; // evictions skipped: no recipe (custom Function internals...)
  int64_t divergences = 0;
  int64_t ops_hooked = 0;       // forward ops whose packs went through our hooks
  int64_t ops_unhooked = 0;     // ... and whose saved tensors were left to autograd
  int64_t compacted = 0;        // dropout masks kept compact (compact.h)
  int64_t compact_refused = 0;  // ... planned but not such a mask: kept as they were
  int64_t expanded = 0;         // unpacks served from a compact mask
  int64_t tail_reruns = 0;      // dropout re-runs done as input x expanded mask (of ops_rerun)
  std::vector<int64_t> measured_peak;   // per replayed step, absolute allocated bytes
  std::vector<int64_t> measured_baseline;
  std::vector<int64_t> family_peak;      // the same, for the steps of its family (Choice::family)
  std::vector<int64_t> family_baseline;
  // The same, for steps predicted of this kind that ran other ops (undetected while they ran, so
  // without the plan's actions from where they departed): no measure of the plan's prediction.
  std::vector<int64_t> other_kind_peak;
  std::vector<int64_t> other_kind_baseline;
  // Per replayed step: time inside the agent's callbacks (record, replay, rebuilds), us. Not the
  // dispatcher's cost of calling them (boxing the top-level op's arguments) nor Python's.
  std::vector<double> callback_us;
  std::vector<int64_t> callback_steps;  // the step number of each (benchmarks group steps by it)
  int64_t light_steps = 0;  // replayed steps recorded light (Recorder::set_light)
  // One replayed step measured (its own plan's or one with ops left out): its callback time.
  void count_step(double us, int64_t step, bool light) {
    callback_us.push_back(us);
    callback_steps.push_back(step);
    if (light) ++light_steps;
  }
  int64_t node_hooks = 0;   // planned recomputes started from a hook on their autograd Node
  int64_t snapshots = 0;    // inputs or parameters copied when captured, as a write would follow
  int64_t drifted = 0;      // steps replayed with other sizes after a data-dependent shape
  int64_t family_steps = 0; // steps of another size replayed with this plan (Choice::family)
  // Steps that ran the profile's ops with stretches left out (Replayer::skip_to: a layer that
  // LayerDrop skipped), replayed with the plan's actions of the ops they ran. Measured apart:
  // they run less than the plan predicts for.
  int64_t gapped_steps = 0;
  std::vector<int64_t> gapped_peak;
  std::vector<int64_t> gapped_baseline;
};

class Replayer {
 public:
  Replayer(const Profile& profile, planner::Plan plan);

  const planner::Plan& plan() const { return plan_; }
  bool diverged() const { return diverged_; }
  // This step left out some of the profile's ops and ran the rest in order (skip_to).
  bool gapped() const { return shift_ > 0; }
  // Planned evictions this step refused (no recipe for the value's chain, or it reads an
  // external written since): in a gapped step, a sign that the greedy match put ops where the
  // plan made no recipes (a DataLoader's batch `set_` twice where the profile ran it four times:
  // matched to the first two, whose outputs the plan never re-made).
  int64_t refused() const { return refused_; }
  ReplayStats& stats() { return stats_; }

  // `any_size`: the step runs the profile's ops at other sizes (a sequence length of the same
  // model that has no plan of its own, replaying the plan of a larger one: StepKinds::Choice::
  // family). Its ops are matched by structure, its values mapped by position, as after a
  // data-dependent shape; every rebuild still re-runs the step's own calls.
  void begin_step(bool any_size = false);
  // From here the step runs the profile's ops at other sizes (Agent::narrow_kinds found it a
  // longer or shorter step of them, before the plan's first action): as begin_step(true).
  void set_any_size() {
    if (!any_size_) ++stats_.family_steps;
    any_size_ = true;
  }
  // Evicts nothing more this step and runs no planned recompute: what it evicted is rebuilt when
  // backward reads it (Agent::callback_failed). Its record is not used.
  void give_up() { diverged_ = true; }
  // This step is another kind's after all (Agent::narrow_kinds): drop what it recorded of it.
  // Only before first_action_op()'s end, so nothing was evicted, held or hooked.
  void abandon_step() {
    if (any_size_) --stats_.family_steps;
    begin_step();
  }
  // The first forward op at whose end the plan acts (evicts, compacts, holds, hooks a node), or
  // -1 for none. Up to there a step only builds recipes and state a rebuild might need.
  int64_t first_action_op() const { return first_action_op_; }
  // A top-level forward op `op` (the recorder's index) starts / ends. `dropped` mirrors the
  // recorder leaving out an op with no tensor output; `hash` is the op's identity and
  // `structure` the same without sizes (op_hash.h).
  // `hash`, `structure`: the op's identity and structure hashes (Recorder::current_identity).
  void op_start(const at::RecordFunction& fn, int64_t op, bool random, uint64_t hash, uint64_t structure);
  void op_end(const at::RecordFunction& fn, int64_t op, bool dropped, uint64_t hash, uint64_t structure);
  // An op is about to run: one the step does not record (under no_grad: a buffer or statistic a
  // module updates in its forward), or a recorded one (called from op_start). If it writes in
  // place an external some recipe captured, that external is copied first, so a rebuild reads
  // what the forward read. Cost: one check while nothing is captured; else one cached lookup by
  // name, and for an op that writes, one map lookup per written tensor.
  void before_write(const at::RecordFunction& fn);
  // The running op turned out to draw random numbers its recipe did not snapshot: it is not
  // rebuildable this step (call before op_end).
  void forget_recipe(int64_t step_op) {
    const int64_t op = at(step_op);
    if (op >= 0 && static_cast<size_t>(op) < recipes_.size()) recipes_[op].valid = false;
  }
  // A saved tensor packed during (or, for a custom Function, just after) forward op `op`.
  void on_pack(const std::shared_ptr<SavedState>& s, const at::Tensor& t, int64_t op);
  // Whether op `op`'s packs must come through our hooks: it saves a value the plan evicts (or the
  // step has left the profile). The others' saved tensors stay with autograd, as without memplan,
  // and cost no Python call.
  bool wants_packs(int64_t op) const;
  // Backward node `node` (the recorder's index) starts / ends. Only planned actions that have no
  // node to hook (via_callback_) run from here; the rest run from node_hook.
  void node_start(int64_t node, const char* name);
  void node_end(int64_t node);
  // A planned node's pre-hook fired (attached in op_end; ignored unless `generation` is this
  // step's): its recompute, then its releases.
  void node_hook(int64_t node, uint64_t generation);
  // The backward node callbacks drive some planned action (no node to hook): keep them on.
  bool needs_node_callbacks() const { return needs_node_callbacks_; }
  // Time spent in node hooks since the last call, ns (for the step's callback time).
  int64_t take_hook_ns();
  // The tensor for an unpack: rebuilt first if it was evicted.
  at::Tensor materialize(SavedState& s);
  void end_step();

  // The actions of the first replayed step, for the trace (later steps repeat them).
  const std::vector<TraceAction>& first_step_actions() const { return actions_; }

  // While a rebuild re-runs an op with autograd on, the pack hook hands what it packs here.
  static std::vector<at::Tensor>* capture();

 private:
  struct Arg {
    enum class Kind : uint8_t { Constant, Tensor, TensorList, OptionalTensorList };
    Kind kind = Kind::Constant;
    c10::IValue constant;
    // Inline sizes cover nearly every op (no allocation per recipe): most args hold one tensor.
    c10::SmallVector<TensorSource, 1> tensors;
    c10::SmallVector<bool, 4> requires_grad;
    c10::SmallVector<bool, 4> present;  // OptionalTensorList: which entries are tensors
    bool written = false;       // schema says Tensor(a!): rebuild on a scratch copy
  };
  struct Recipe {
    std::optional<c10::OperatorHandle> op;
    c10::SmallVector<Arg, 6> args;
    bool valid = false;
    bool random = false;
    std::vector<std::pair<at::Generator, at::Tensor>> rng;  // generator, its state at op start
    bool autocast_cpu = false, autocast_cuda = false;
    at::ScalarType autocast_cpu_dtype = at::kBFloat16, autocast_cuda_dtype = at::kHalf;
    KernelChoice kernels;  // SDPA backends, cuDNN/oneDNN on or off, as the op ran
  };
  // One output of a forward op. The Python-visible tensor often dies right after forward while
  // its storage lives on in a saved alias: then the output is re-viewed from that storage.
  struct Slot {
    c10::weak_intrusive_ptr<c10::TensorImpl> impl{c10::intrusive_ptr<c10::TensorImpl>()};
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    c10::VariableVersion counter{c10::VariableVersion::DISABLED};
    uint32_t version = 0;
    c10::SmallVector<int64_t, 6> sizes, strides;
    int64_t offset = 0;
    at::TensorOptions options;
    bool below_autograd = false;  // an unnumbered op's (a factory's): no counter kept (op_end)
    bool made_storage = false;    // its storage is its op's (no input's: not a view, not written in place)
    // Its storage was written since, through a tensor with a counter of its own (`x.data.sub_()`),
    // so its version says nothing of it: its contents are no longer the op's (mark_overwritten).
    bool overwritten = false;
    // The output as a view of `storage` (its own, or one made again like it) at `at_offset`, no copy.
    at::Tensor view(c10::Storage storage, int64_t at_offset) const;
    // Whether `t` is laid out as the output was when its op ended: sizes, strides, storage
    // offset, dtype (what a rebuild of it makes).
    bool laid_out_as(const at::Tensor& t) const {
      return t.sizes().equals(sizes) && t.strides().equals(strides) && t.storage_offset() == offset &&
             t.scalar_type() == options.dtype().toScalarType();
    }
  };
  struct Pending {
    std::shared_ptr<SavedState> state;
    at::Tensor original;  // held until its op ends, so its identity cannot be reused meanwhile
  };
  // A rebuild's working set: op outputs and internal packs re-made so far.
  // Entries are dropped at their last planned use (counted before anything runs), so a rebuild
  // holds what the simulator assumes: each intermediate until its last reader.
  // On the global heap, not step_pool_: an on-demand rebuild runs on whichever thread unpacks,
  // perhaps beside the node thread's planned recompute (a graph with CPU and GPU nodes).
  struct Memo {
    std::map<std::pair<int64_t, int64_t>, at::Tensor> outputs, packs;
    std::map<std::pair<int64_t, int64_t>, int> output_uses, pack_uses;
    std::vector<bool> will_run;  // per op: re-run planned
  };

  void check_divergence(int64_t op, uint64_t hash, uint64_t structure, const char* name);
  // The plan's index of the step's op `op` (the recorder's index): past the stretches of the
  // profile the step left out.
  int64_t at(int64_t op) const { return op < 0 ? op : op + shift_; }
  // Step op `op` (at its end, as the plan's op `op`) is not the profile's op there but a later
  // one's: the step left out the ops between (LayerDrop skipped a layer). Moves what the step
  // recorded of it to that op, runs the left-out ops' evictions and holds, and returns its index;
  // returns `op` if no later op matches (check_divergence then stops the plan). The match is
  // greedy, the earliest later op of the same identity: a wrong pick (an op repeated in a later
  // layer) only mislabels ops, whose actions then fall elsewhere; every rebuild still re-runs the
  // step's own calls. Cost: a scan of the profile's ops, once per stretch left out.
  int64_t skip_to(int64_t op, uint64_t hash, uint64_t structure);
  // The earliest profile op after `op` of identity `hash`, or -1. Cost: a scan of the profile.
  int64_t next_same(int64_t op, uint64_t hash) const;
  // Whether op_start's guess `ahead_` (not `op`) is an op that `per_op` marks.
  bool ahead_in(int64_t op, const std::vector<char>& per_op) const;
  void hold_after(int64_t op);
  int64_t planned_value(int64_t op, int64_t ordinal, const at::Tensor& t) const;
  TensorSource source_of(const at::Tensor& t, bool unknown_is_external);
  // The output slot `t` stands for though it is not the op's own TensorImpl (adopted from now on),
  // or {-1, -1}: see the definition. Cost: one multimap range of `t`'s storage (a handful).
  std::pair<int64_t, int64_t> adopt_rewrapped(const at::Tensor& t);
  bool rebuildable(const TensorSource& src) const;
  bool slot_available(int64_t op, int64_t index) const;
  // Output `index` of `op`, its forward storage gone, as a view of a tensor an earlier recompute
  // re-made from that storage at the same version and still keeps: a hold of its value, or a saved
  // tensor of it put back (one recompute puts back SDPA's q, k, v, views of the packed
  // projection; the next re-runs SDPA from them instead of re-running the projection beside
  // them). Undefined if none; with !make, any defined tensor means found. Cost: two hash lookups
  // and a pass over the value's saved handles (a few); one set_ if made.
  at::Tensor held_view(int64_t op, int64_t index, bool make) const;
  void count_uses(const TensorSource& src, Memo& memo, int depth);
  at::Tensor resolve(const TensorSource& src, Memo& memo, int depth);
  at::Tensor slot_tensor(int64_t op, int64_t index, Memo& memo, int depth);
  void run_op(int64_t op, Memo& memo, int depth);
  // The compact mask op `op` saved, if it is a dropout whose mask is kept compact, the re-run may
  // be `input * mask` instead, and nothing asks for the op's own packs; else null.
  std::shared_ptr<SavedState> tail_mask(int64_t op, const Memo& memo) const;
  void rebuild(SavedState& s, Memo& memo);
  void evict_after(int64_t op);
  void evict_one(SavedState& s, int64_t v, int64_t op, bool changed);
  void resolve_pending(int64_t op);  // the sources of pending_'s packs, made during or after op `op`
  void settle_late_packs();
  int64_t last_ended_ = -1;  // the step's op that ended last (after skip_to), for late packs
  void attach_node_hooks(int64_t op, c10::ArrayRef<at::Tensor> outputs);
  void look_again(const at::RecordFunction& fn);
  // Hooks the nodes of `op`'s actions not yet `done` that hang off `from` (marks them done).
  void hook_nodes(int64_t op, c10::ArrayRef<at::Tensor> from, c10::SmallVectorImpl<char>* done);
  void run_recompute(int64_t node);
  void planned_recompute(int64_t node);  // run_recompute; a failure is logged, unpack rebuilds
  void run_releases(int64_t node);
  void compact_after(int64_t op);

  planner::Plan plan_;
  OpSequence ops_;                     // the profile's forward ops, as identities
  int64_t first_action_op_ = -1;
  std::vector<std::string> node_names_;                       // per profile backward node
  std::vector<char> makes_nodes_;                             // per fwd op: some backward node is its
  std::vector<std::vector<int64_t>> evict_after_;             // per fwd op: values to evict
  std::vector<std::vector<int64_t>> hold_from_;               // per fwd op: values to hold
  std::vector<std::vector<int64_t>> compact_after_;           // per fwd op: masks to compact
  std::unordered_map<int64_t, int64_t> op_mask_;              // fwd op -> its compacted mask
  // Per fwd op, across steps: 0 the dropout tail is unchecked, 1 checked bit-identical to a full
  // re-run (used from then on), -1 it differed (never used).
  std::vector<int8_t> tail_state_;
  // Per fwd op: a rebuild may re-run it, so it gets a recipe and holds its inputs from before the
  // step (ctor).
  std::vector<char> hold_externals_;
  // Per operator schema: which arguments it may write (written_args).
  std::unordered_map<const c10::FunctionSchema*, std::vector<char>> written_by_schema_;
  const std::vector<char>& written_args(const c10::FunctionSchema& schema);
  RerunHandles rerun_handles_;  // the operator each recipe re-runs, per fwd op
  bool hold_externals(int64_t op) const;
  std::unordered_map<int64_t, const planner::Recompute*> recompute_before_;
  std::unordered_map<int64_t, std::vector<int64_t>> release_after_;
  std::unordered_map<int64_t, int64_t> last_release_;  // value -> the latest node after which a release frees it
  struct NodeAction {
    int64_t node;        // profile backward node
    int64_t seq_offset;  // its sequence number minus its forward op's first
    std::string name;
  };
  std::vector<std::vector<NodeAction>> node_actions_;  // per fwd op: planned nodes it creates
  std::vector<std::pair<int64_t, size_t>> unhooked_;   // (op, action) attach_node_hooks missed
  std::vector<char> via_callback_;                    // per bwd node: driven by node callbacks
  bool needs_node_callbacks_ = false;
  uint64_t generation_ = 0;  // step counter, for hooks left on a graph kept from an earlier step
  int64_t hook_ns_ = 0;
  std::vector<int64_t> value_bytes_;                          // per profile value
  std::vector<std::vector<int64_t>> output_values_;           // per fwd op: value of each output
  // per fwd op: Op::rerunnable false (a Python autograd.Function, a nondeterministic kernel). Its
  // outputs become no slots: a recipe that reads one holds it as it holds an input from before
  // the step, to the step's end (planner Graph::unseen, which the simulator counts), instead of
  // finding it unrebuildable.
  std::vector<char> opaque_;
  std::vector<std::vector<int64_t>> pack_values_;             // per fwd op: value of each pack
  std::vector<char> wants_packs_;                             // per fwd op
  std::vector<std::vector<char>> written_input_;  // per fwd op, per input tensor: Value::written

  // Step state.
  bool diverged_ = false;
  bool drifted_ = false;  // this step ran with other sizes after a data-dependent shape (stats once)
  bool any_size_ = false; // this step may run every op at other sizes (begin_step)
  int64_t shift_ = 0;     // profile ops this step left out so far (skip_to)
  int64_t refused_ = 0;   // evictions refused this step (refused())
  // Where the running op would land past a gap (op_start's guess, from its identity; skip_to
  // decides at its end), or -1: its recipe and packs are taken if either position needs them.
  int64_t ahead_ = -1;
  bool follow_nodes_ = true;  // backward nodes still match the profile
  // The step state's hash-map nodes come from this pool: cleared maps hand their nodes back to
  // it and the next step takes them again, so a replayed step makes no malloc/free per entry
  // (~450 per dispatch-bound GPT-2 step before). Unsynchronized: the maps on it are changed by
  // one thread at a time (the forward's, then the node thread's: Agent::on_node_thread; an
  // on-demand rebuild on another thread only reads them). Declared before the maps, so it
  // outlives them.
  std::pmr::unsynchronized_pool_resource step_pool_;
  template <class K, class V>
  using StepMap = std::pmr::unordered_map<K, V>;
  std::vector<Recipe> recipes_;
  // Per op seen this step, its outputs. Kept across steps, each op's list only cleared
  // (begin_step): its storage is reused, and an op with no outputs this step has an empty list.
  std::vector<std::vector<Slot>> slots_;
  std::vector<bool> rebuildable_op_;
  std::vector<int64_t> seq_begin_;  // per fwd op: its first autograd sequence number
  StepMap<const c10::TensorImpl*, std::pair<int64_t, int64_t>> slot_by_impl_{&step_pool_};
  // Every slot viewing each storage (source_of takes the latest still alive).
  std::pmr::unordered_multimap<const c10::StorageImpl*, std::pair<int64_t, int64_t>> slot_by_storage_{&step_pool_};
  struct External {
    at::Tensor tensor;
    uint32_t version = 0;       // when first captured this step
    uint32_t last_version = 0;  // when last captured (a recipe may need the contents from then)
  };
  StepMap<const c10::TensorImpl*, External> externals_{&step_pool_};
  std::pmr::unordered_multimap<const c10::StorageImpl*, const c10::TensorImpl*> external_storage_{&step_pool_};
  // Writes that left a tensor's version counter as it was, counted per tensor this step and added
  // to its version (version_of), so a recipe that captured it before such a write reads its
  // snapshot and one that captures it after reads it where it is:
  // - writes an op's schema declares: the CPU's fused_moving_avg_obs_fake_quant (QAT's default
  //   fake quantizer) updates its observer's running min/max, scale and zero point so. Before,
  //   its re-run read the updated statistics (moving average taken twice: other scale, other
  //   mask, other gradients);
  // - writes to a captured external through another tensor of its storage with a counter of its
  //   own (`w.data.mul_()`). Until 2026-12-07 such an external was marked overwritten for the
  //   rest of the step, whatever the write did to its counter, so a recipe that captured it
  //   after a write through `w.detach()` (a shared counter: Embedding's max_norm renormalising
  //   its weight) found no snapshot of what it read: the rebuild failed and backward raised.
  std::unordered_map<const c10::TensorImpl*, uint32_t> unbumped_;
  // Tensors a write is about to land on, with their counters' versions then: the running op's
  // written arguments (note_writes) and the captured externals sharing their storage
  // (guard_external); or an untracked op's (Agent::untracked_op), settled before the next op or
  // rebuild reads a version.
  std::vector<std::pair<at::Tensor, uint32_t>> writing_;
  // The storages of the running op's input tensors, from its start (a RecordFunction's inputs are
  // gone at its end): an output on none of them made its storage (Slot::made_storage).
  std::vector<const c10::StorageImpl*> input_storages_;
  bool op_running_ = false;  // between a recorded op's start and end: its writes have not landed
  // Externals the running op's recipe captured first this step. An op the recorder leaves out at
  // its end (no tensor out, no autograd node: the last step's `loss.item()` after its
  // `loss.detach()` opened this step's window) lets them go again: they would be held, graph
  // and all, to this step's end (forget_externals_of_dropped_op).
  std::vector<const c10::TensorImpl*> op_externals_;
  void forget_externals_of_dropped_op();
  // Copies snapshot_external made at this moment (one op's start, or an untracked op's): the
  // storage, the tensor copied, the copy. Within a moment a storage's contents do not change, so
  // another tensor of it laid out alike shares the copy: a weight a recipe captured and the
  // `.data` aliases that an op reads and writes it through (the batch normalised in place through
  // `x.data` after its first use: three copies of it, where the plan counts one).
  struct MomentCopy {
    const c10::StorageImpl* storage;
    at::Tensor of, copy;
  };
  std::vector<MomentCopy> moment_copies_;
  WritesByName writes_;  // per op name: which arguments it may write; empty if none
  // A write is about to land on `t`: copy every captured external sharing its storage whose
  // current contents a recipe captured.
  void guard_external(const at::Tensor& t);
  // Whether a rebuild of `src` could read an external written in place since it was captured
  // (a buffer a module updates in its own forward, under no_grad): such a value is not evicted.
  bool externals_changed() const;  // any written since captured, with no copy from before
  // Written in place since captured, with no copy from before the write.
  bool written_unsnapshotted(const c10::TensorImpl* impl, const External& e) const;
  // Externals a recorded op wrote in place, as they were before: (tensor, version) -> copy.
  std::map<std::pair<const c10::TensorImpl*, uint32_t>, at::Tensor> snapshots_;
  void snapshot_external(const at::Tensor& t, uint32_t version);
  // Externals written in place unseen (by an op whose callbacks are off: the optimizer's) that
  // kept a value from being evicted, or failed a rebuild, in an earlier step: snapshotted when
  // captured. Kept across steps; an address reused by another tensor only costs a copy.
  std::unordered_set<const c10::TensorImpl*> written_externals_;
  std::unordered_set<const c10::TensorImpl*> refused_by_;  // this step's, for written_externals_
  at::Tensor external_as_captured(const TensorSource& src) const;
  // An external's version as recipes count it: its counter's, plus the writes that did not bump
  // it (unbumped_). Cost: a version read, and a hash lookup once any such write was seen.
  uint32_t version_of(const at::Tensor& t) const;
  // note_writes at an op's start, settle_writes at its end (and before the next op or rebuild
  // after an untracked op's write): see unbumped_. Cost: nothing for an op that writes no
  // argument; else a version read per written tensor.
  void note_writes(const at::RecordFunction& fn, const std::vector<char>& written);
  // before_write with the op's writes_.of already looked up (op_start needs them for note_writes too).
  void before_write(const at::RecordFunction& fn, const std::vector<char>& written);
  void settle_writes();
  // After a write through `t` landed: every slot on its storage whose version did not move (a
  // counter other than t's) is overwritten. Cost: one entry per output viewing that storage.
  void mark_overwritten(const at::Tensor& t);
  // The external written since capture that a rebuild of `src` would read (an undefined tensor
  // for a chain that cannot be followed), or null.
  const at::Tensor* chain_reads_changed_external(const TensorSource& src, std::vector<char>& seen, int depth);
  StepMap<int64_t, std::pair<int64_t, int64_t>> value_slot_{&step_pool_};  // value -> latest slot
  std::vector<Pending> pending_;
  using Handles = StepMap<int64_t, std::pmr::vector<std::weak_ptr<SavedState>>>;  // lists from the pool too
  Handles handles_{&step_pool_};  // by value
  // A value kept for later recomputes, with the slot it was taken from: a re-made hold no longer
  // shares its storage with the forward's; held_view finds it through that slot.
  struct Hold {
    at::Tensor tensor;
    int64_t op = -1, index = -1;
  };
  StepMap<int64_t, Hold> holds_{&step_pool_};
  int64_t packs_in_op_ = 0;
  ReplayStats stats_;
  // Action log of the first replayed step: NVTX marks/ranges always, trace events for step 1.
  // `name` is only read during the call.
  void action(const char* name, std::chrono::steady_clock::time_point start, bool span);
  // Whether an action's name with its numbers (value, op, node) reaches anyone: the trace of the
  // first replayed step, or an NVTX tool. Otherwise only its fixed label goes to NVTX (no
  // formatting, no allocation: ~20 names per replayed step of the demo).
  bool naming_actions() const { return logging_actions_ || nvtx_tool_attached(); }
  // A recompute as an NVTX range and a trace span, for its whole scope. Named `detail`, or
  // `label` (a string literal) when detail is empty.
  class ActionSpan {
   public:
    ActionSpan(Replayer* r, const char* label, std::string detail);
    ~ActionSpan();
    ActionSpan(const ActionSpan&) = delete;
    ActionSpan& operator=(const ActionSpan&) = delete;

   private:
    const char* name() const { return detail_.empty() ? label_ : detail_.c_str(); }
    Replayer* r_;
    const char* label_;
    std::string detail_;
    std::chrono::steady_clock::time_point start_;
  };
  std::chrono::steady_clock::time_point t0_;
  std::vector<TraceAction> actions_;
  bool logging_actions_ = true;
};

}  // namespace memplan
