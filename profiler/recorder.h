// Records one training step (forward + backward) into a Profile.
//
// Fed by hooks/ (RecordFunction callbacks, saved-tensor pack/unpack, step boundaries); knows
// nothing of planning. Single training thread for the forward (the thread that dispatches
// autograd ops); backward nodes may run on the engine's threads, serialised by the engine.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "profiler/memory.h"
#include "profiler/op_writes.h"
#include "profiler/profile.h"
#include "profiler/rng_watch.h"

namespace memplan {

class Recorder {
 public:
  explicit Recorder(MemoryCounter* memory) : memory_(memory) {}

  void set_memory(MemoryCounter* memory) { memory_ = memory; }
  // Light recording, for replayed steps whose record nobody reads op by op (the first replayed
  // step is kept for the trace, later ones only for their peak): ops and nodes are counted, not
  // stored; no strings, shapes, values or per-op memory. What replay needs stays: each op's
  // index, its identity hash (op_hash), whether it is random, which ops are left out (no tensor
  // output), the node index and name, the step's peak and timings. Takes effect at begin_step.
  void set_light(bool light) { light_next_ = light; }
  bool light() const { return light_; }
  // Starts a new step record (called lazily at the first forward op of a step).
  void begin_step(int64_t step_index);
  bool in_step() const { return in_step_; }

  // Top-level forward op (seqNr >= 0, grad mode on, depth 0). Inputs are valid only here.
  void op_start(const at::RecordFunction& fn);
  void op_end(const at::RecordFunction& fn);
  int64_t current_op() const { return current_op_; }
  // The op a pack now belongs to: the running op, else the one just finished (a custom
  // autograd.Function saves after its last op); -1 before the step's first op.
  int64_t pack_owner() const {
    return current_op_ >= 0 ? current_op_ : op_count() - 1;
  }
  // The step's record. In light mode, forward and backward stay empty.
  const Profile& current() const { return profile_; }
  int64_t current_node() const { return current_node_; }
  // Forward ops recorded so far this step (both modes).
  int64_t op_count() const { return light_ ? light_ops_ : static_cast<int64_t>(profile_.forward.size()); }
  // The running op is random (draws from a generator, or named dropout).
  bool current_random() const { return current_random_; }
  // The op just ended drew random numbers though it was not known as random when it started
  // (full recording only; see RngWatch). Its recipe, if any, has no generator snapshot.
  bool drew_unmarked() const { return drew_unmarked_; }
  // Identity hash of op `op`, which has just ended and was kept: OpHasher::add_op of its Op in
  // full mode; in light mode the same value, fed from the RecordFunction (only the last op's).
  uint64_t op_hash(int64_t op) const;
  // Its structure hash (OpHasher::add_op_structure: no sizes), in either mode.
  uint64_t op_structure_hash(int64_t op) const;
  // The same identity hash, of an op about to run (its name, overload and inputs' dtypes and
  // shapes): for any op, in any mode. Cost: one pass over the inputs' shapes, no allocation.
  static uint64_t identity_hash(const at::RecordFunction& fn, uint64_t* structure = nullptr);
  // The running op's identity and structure hashes (`fn` is it): light mode has them already; a
  // full record computes them (identity_hash's cost).
  uint64_t current_identity(const at::RecordFunction& fn, uint64_t* structure) const {
    if (!light_) return identity_hash(fn, structure);
    *structure = light_structure_;
    return light_hash_;
  }
  // Name of the running backward node (valid until the next node starts).
  const char* current_node_name() const { return current_node_name_; }

  // A tensor autograd saves for backward, during the current forward op; `handle` is the tensor
  // the pack handle keeps (its own TensorImpl of t's storage, gone when the handle is).
  // Returns its value id.
  int64_t on_pack(const at::Tensor& t, const at::Tensor& handle);
  // A backward node read a saved value.
  void on_unpack(int64_t value);

  void node_start(const at::RecordFunction& fn);
  void node_end(const at::RecordFunction& fn);

  void begin_backward();
  // Finishes the step; returns the Profile (validated links, fwd_op of every node resolved).
  Profile end_step();

  // Bytes allocated now (the step's memory counter).
  int64_t live() const { return memory_->live(); }
  // Memory that stays allocated from here on but is not the step's: an optimizer's state made
  // by its first step, inside this step's window (ops recorded between a backward and the
  // optimizer step open the next step; or an optimizer stepped from a post-accumulate-grad hook,
  // one parameter at a time through the backward). It counts as what was allocated when the
  // step began: the ops recorded so far are shifted up by it, as if it had existed since then
  // (as it does in every later step). Cost: one pass over the step's records so far.
  void raise_baseline(int64_t bytes);
  // The stretch since the last op began held an optimizer step (its callbacks off): what it
  // allocated is no op's (its state stays, counted by raise_baseline; its first step's is not in
  // any later step), so the next op does not add that stretch to the last one's peak.
  void skip_gap() { skip_gap_ = in_step_; }
  // Time spent inside our own callbacks this step (recording overhead), microseconds.
  void add_overhead_ns(int64_t ns) { overhead_ns_ += ns; }

 private:
  // References to value `v`'s storage beyond the pack handles autograd owns (each holds one
  // TensorImpl of it); -1 if the storage is gone. Used to tell what else still holds it.
  int64_t refs_beyond_packs(int64_t v) const;
  struct ValueSlot {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  };
  double now_us() const;
  int64_t value_of(const at::Tensor& t, int64_t producer);
  void add_tensor_refs(const c10::IValue& v, std::vector<TensorRef>* refs, int64_t producer);
  // Random: the op has a Generator? argument or "dropout" in its name, or a dropout probability
  // argument (float named *dropout*) above zero while its `train` flag, if any, is set, or it was
  // seen drawing from a default generator (RngWatch) earlier.
  struct RandomRule {
    bool always = false;
    int p_arg = -1;      // the dropout probability argument
    int train_arg = -1;  // a `train` flag beside it
  };
  bool is_random(const at::RecordFunction& fn);
  int64_t made_by_step_op(const at::Tensor& t) const;
  int64_t op_of_node(int64_t seq, uint64_t thread) const;  // the forward op that made that node, or -1
  static RandomRule random_rule(const at::RecordFunction& fn);
  void light_op_start(const at::RecordFunction& fn);
  void light_op_end(const at::RecordFunction& fn);

  MemoryCounter* memory_;
  bool in_step_ = false;
  bool light_ = false, light_next_ = false;
  int64_t light_ops_ = 0, light_nodes_ = 0;  // light mode: ops and nodes so far
  uint64_t light_hash_ = 0;                  // light mode: hash of the running / last op
  int64_t light_fwd_end_live_ = 0;           // light mode: allocated when the last kept op ended
  uint64_t light_structure_ = 0;             // ... and its structure hash
  uint64_t light_sig_ = 0;                   // light mode: signature of the kept ops so far
  uint64_t light_struct_sig_ = 0;            // ... and their structure signature
  int64_t light_seq_begin_ = 0;              // light mode: the running op's first sequence number
  bool current_random_ = false;
  const char* current_node_name_ = "";
  bool in_backward_ = false;
  Profile profile_;
  std::vector<int64_t> seq_begin_;  // per forward op: sequence numbers [begin, end) it created
  std::vector<int64_t> seq_end_;
  std::vector<ValueSlot> slots_;
  std::unordered_map<const c10::StorageImpl*, int64_t> index_;
  // Per tensor a recorded op output this step: the last such op (TensorRef::from). The weak
  // reference keeps the address from going to another tensor while the step records.
  struct Exposure {
    int64_t op;
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
    uint32_t version = 0;  // the tensor's version then
  };
  std::unordered_map<const c10::TensorImpl*, Exposure> exposed_;
  // Per value: the last op that wrote it in place (Op::writes). A tensor read after that write,
  // last exposed before it and at the version it had then, shares no counter with the tensor
  // written: a write through `.data` (the batch centred by `x.data.sub_(x.data.mean())`). It holds
  // what the write left, so it is read from the writer (TensorRef::from), not from the op that
  // made it: re-running that op alone would give the contents from before the write.
  std::unordered_map<int64_t, int64_t> last_write_;
  // The running op's input tensors with their version when it began, for an op the recorder
  // cannot see into (Op::rerunnable false: a Python autograd.Function, a compiled region): one
  // whose counter moved was written by it, though no schema says so (note_hidden_writes).
  struct InputAtStart {
    size_t ref;  // index into the op's inputs
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
    c10::VariableVersion counter;
    uint32_t version;
  };
  std::vector<InputAtStart> inputs_at_start_;
  void note_hidden_writes(int64_t idx);
  std::unordered_map<const char*, RandomRule> random_by_name_;  // schema inspection cached per op name
  WritesByName writes_;  // which arguments an op may write (Op::writes)
  RngWatch rng_;
  bool watching_rng_ = false;
  bool drew_unmarked_ = false;
  // Per value: the tensors its pack handles keep. A handle dies with its node (the hidden state
  // of `out, _ = lstm(packed)`, an index_select whose result nobody reads), and with it the
  // storage reference it held: only the live ones are autograd's (refs_beyond_packs).
  struct PackHandle {
    int64_t op;
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
  };
  std::unordered_map<int64_t, std::vector<PackHandle>> pack_handles_;
  // Saved values something besides autograd may still hold (full mode): checked at each op's
  // start until nothing else does (Value::held_until). Usually a handful.
  std::vector<int64_t> held_watch_;
  std::vector<int64_t> input_watch_;  // inputs still alive (Value::dies_after)
  struct InputVersion {
    int64_t value;
    c10::VariableVersion counter;  // shared with the tensor (and its views)
    uint32_t version;              // when first seen this step
    bool written = false;          // seen written (Value::written set)
    bool parameter = false;        // watched from the backward's start only
  };
  // Inputs and parameters: Value::written and written_before_node, checked at each backward
  // node's start (full records) and at the step's end. An input is watched from when it was
  // first seen; a parameter from the backward's start, since the optimizer may step in the
  // window before the forward reads it (that write comes before any read a re-run repeats).
  std::vector<InputVersion> input_versions_;
  void check_written(int64_t before_node);
  void absorb_gap(Op* previous);
  bool skip_gap_ = false;
  // The step's peak before its last raise_baseline, shifted as the records were (0: none).
  int64_t shifted_peak_ = 0;
  void update_held(int64_t op);
  int64_t current_op_ = -1;
  int64_t packs_in_op_ = 0;
  int64_t current_node_ = -1;
  std::chrono::steady_clock::time_point t0_;
  double backward_t0_us_ = 0;
  int64_t overhead_ns_ = 0;
};

}  // namespace memplan
