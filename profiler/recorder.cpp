#include "profiler/recorder.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <ATen/core/function_schema.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "profiler/op_hash.h"
#include "profiler/rerun_handle.h"
#include "profiler/tensor_args.h"

namespace memplan {

namespace {
constexpr const char* kEnginePrefix = "autograd::engine::evaluate_function: ";

void push_unique(std::vector<int64_t>* v, int64_t x) {
  if (v->empty() || v->back() != x) v->push_back(x);
}
}  // namespace

double Recorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
}

void Recorder::begin_step(int64_t step_index) {
  light_ = light_next_;
  light_ops_ = light_nodes_ = 0;
  light_sig_ = kSignatureSeed;
  light_struct_sig_ = kSignatureSeed;
  profile_ = Profile();
  profile_.step = step_index;
  seq_begin_.clear();
  seq_end_.clear();
  held_watch_.clear();
  input_watch_.clear();
  input_versions_.clear();
  slots_.clear();
  index_.clear();
  exposed_.clear();
  last_write_.clear();
  current_op_ = -1;
  current_node_ = -1;
  overhead_ns_ = 0;
  in_backward_ = false;
  t0_ = std::chrono::steady_clock::now();
  profile_.baseline_bytes = memory_->live();
  memory_->reset_peak();
  in_step_ = true;
  skip_gap_ = false;
  shifted_peak_ = 0;
}

void Recorder::raise_baseline(int64_t bytes) {
  if (!in_step_) return;
  profile_.baseline_bytes += bytes;
  // Light records keep no per-op memory; their step's peak is still shifted.
  for (std::vector<Op>* ops : {&profile_.forward, &profile_.backward}) {
    for (Op& o : *ops) {
      o.live_before += bytes;
      o.live_after += bytes;
      o.peak += bytes;
    }
  }
  // An op or node still running keeps its shifted live_before; its end reads live memory,
  // which now holds the state.
  shifted_peak_ = std::max(shifted_peak_, memory_->peak()) + bytes;
}

namespace {
// A tensor's version, 0 where its counter is off (an inference tensor's).
uint32_t version_now(const c10::TensorImpl& t) {
  return t.version_counter().enabled() ? t.version_counter().current_version() : 0;
}
}  // namespace

int64_t Recorder::value_of(const at::Tensor& t, int64_t producer) {
  if (!t.defined() || !t.has_storage()) return -1;
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s == nullptr) return -1;
  auto it = index_.find(s);
  if (it != index_.end() && !slots_[it->second].storage.expired()) return it->second;
  // A storage we have not seen, or an address reused after the old storage died.
  const int64_t id = static_cast<int64_t>(profile_.values.size());
  Value& v = profile_.values.emplace_back();
  v.bytes = static_cast<int64_t>(s->nbytes());
  if (producer < 0 && !(t.requires_grad() && t.is_leaf())) producer = made_by_step_op(t);
  if (producer >= 0) {
    v.kind = ValueKind::Activation;
    v.producer = producer;
  } else {
    if (t.requires_grad() && t.is_leaf()) {
      v.kind = ValueKind::Parameter;
    } else {
      v.kind = ValueKind::Input;
      input_watch_.push_back(id);
    }
    const c10::VariableVersion& vc = t.unsafeGetTensorImpl()->version_counter();
    if (vc.enabled()) input_versions_.push_back({id, vc, vc.current_version(), false, v.kind == ValueKind::Parameter});
  }
  slots_.push_back({c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl())});
  index_[s] = id;
  return id;
}

// The step's op whose autograd node made `t`: its grad_fn's sequence number lies in the op's
// range. A Python autograd.Function's RecordFunction has no outputs, so its results are first seen
// as a later op's inputs; without this they would count as inputs from before the step (alive
// throughout, in the planner's model) though backward frees them. Reads the grad_fn as stored
// (grad_fn() could make a new node for a view, taking a sequence number). Cost: a binary search,
// once per storage first seen as an input.
int64_t Recorder::made_by_step_op(const at::Tensor& t) const {
  const torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(t);
  if (meta == nullptr || !meta->grad_fn_) return -1;
  const int64_t j = op_of_node(static_cast<int64_t>(meta->grad_fn_->sequence_nr()), meta->grad_fn_->thread_id());
  return j != current_op_ ? j : -1;
}

// Op i created the nodes numbered [seq_begin_[i], seq_end_[i]) on its thread (sequence numbers
// are per thread). Cost: a binary search, and a short walk back.
int64_t Recorder::op_of_node(int64_t seq, uint64_t thread) const {
  auto it = std::upper_bound(seq_begin_.begin(), seq_begin_.end(), seq);
  if (it == seq_begin_.begin()) return -1;
  const size_t i = static_cast<size_t>(it - seq_begin_.begin()) - 1;
  // Ops that created no node share a begin with the next one: walk back to the creator.
  for (size_t j = i + 1; j-- > 0;) {
    if (seq_begin_[j] <= seq && seq < seq_end_[j] && profile_.forward[j].thread == thread) return static_cast<int64_t>(j);
    if (seq_end_[j] <= seq) break;
  }
  return -1;
}

void Recorder::add_tensor_refs(const c10::IValue& iv, std::vector<TensorRef>* refs, int64_t producer) {
  for_each_tensor(iv, [&](const at::Tensor& t) {
    TensorRef& r = refs->emplace_back();
    r.value = value_of(t, producer);
    r.shape.assign(t.sizes().begin(), t.sizes().end());
    r.dtype = c10::toString(t.scalar_type());
  });
}

// Cost: one cached lookup by name pointer; reads at most two scalar arguments.
bool Recorder::is_random(const at::RecordFunction& fn) {
  const char* name = fn.name();
  auto it = random_by_name_.find(name);
  if (it == random_by_name_.end()) it = random_by_name_.emplace(name, random_rule(fn)).first;
  const RandomRule& rule = it->second;
  if (rule.always) return true;
  if (rule.p_arg < 0) return false;
  // A dropout probability in the arguments (scaled_dot_product_attention's dropout_p, the
  // recurrent ops' dropout between layers): random when it is above zero and, for an op with a
  // `train` flag, in training.
  const auto inputs = fn.inputs();
  if (static_cast<size_t>(rule.p_arg) >= inputs.size() || !inputs[rule.p_arg].isDouble()) return true;
  if (inputs[rule.p_arg].toDouble() <= 0.0) return false;
  if (rule.train_arg >= 0 && static_cast<size_t>(rule.train_arg) < inputs.size() && inputs[rule.train_arg].isBool()) {
    return inputs[rule.train_arg].toBool();
  }
  return true;
}

Recorder::RandomRule Recorder::random_rule(const at::RecordFunction& fn) {
  RandomRule rule;
  rule.always = std::strstr(fn.name(), "dropout") != nullptr;
  auto schema = fn.operator_schema();
  if (!schema) return rule;
  const auto& args = schema->arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& ty = args[i].type();
    if (ty->kind() == c10::TypeKind::OptionalType &&
        ty->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType) {
      rule.always = true;
    }
    if (ty->kind() == c10::TypeKind::FloatType && args[i].name().find("dropout") != std::string::npos) {
      rule.p_arg = static_cast<int>(i);
    }
    if (ty->kind() == c10::TypeKind::BoolType && args[i].name() == "train") rule.train_arg = static_cast<int>(i);
  }
  return rule;
}

uint64_t Recorder::op_hash(int64_t op) const { return light_ ? light_hash_ : identity_of(profile_.forward.at(op)); }

uint64_t Recorder::op_structure_hash(int64_t op) const {
  return light_ ? light_structure_ : structure_of(profile_.forward.at(op));
}

// A call on a side stream is another op than the same call on the default stream (OpHasher::
// add_op: Op::side_stream): a step whose op moved to or from a side stream leaves its plan's
// profile, so the replay stops evicting and the step is recorded again.
// Cost: FNV-1a over ~100-200 bytes per op, a device read per tensor (CallDevice), and for a call
// off the CPU side_stream_of's two virtual calls; no allocation.
uint64_t Recorder::identity_hash(const at::RecordFunction& fn, uint64_t* structure) {
  OpHasher h, st;
  h.add(fn.name());
  h.add(fn.overload_name());
  if (structure) {
    st.add(fn.name());
    st.add(fn.overload_name());
  }
  CallDevice device;
  for (const c10::IValue& iv : fn.inputs()) {
    device.see(iv);
    for_each_tensor(iv, [&](const at::Tensor& t) {
      const auto sizes = t.sizes();
      const char* dtype = c10::toString(t.scalar_type());
      h.add_input(dtype, sizes.data(), sizes.size());
      if (structure) st.add_input_structure(dtype, sizes.size());
      device.see(t);
    });
  }
  if (device.side_stream()) {  // on_side_stream, from this pass
    h.add_side_stream();
    if (structure) st.add_side_stream();
  }
  if (structure) *structure = st.value();
  return h.value();
}

// Cost: identity_hash, a cached name lookup; no allocation.
void Recorder::light_op_start(const at::RecordFunction& fn) {
  light_hash_ = identity_hash(fn, &light_structure_);
  current_random_ = is_random(fn);
  drew_unmarked_ = false;
  light_seq_begin_ = at::sequence_number::peek();  // fn.seqNr() is -1 for an unnumbered op
  current_op_ = light_ops_++;
}

// Cost: a walk of the outputs for a tensor, a relaxed load of the live bytes; no allocation.
void Recorder::light_op_end(const at::RecordFunction& fn) {
  bool output = false;
  for (const c10::IValue& iv : fn.outputs()) for_each_tensor(iv, [&](const at::Tensor&) { output = true; });
  // Left out as in op_end: no tensor output, no autograd node, nothing packed.
  if (!output && at::sequence_number::peek() == light_seq_begin_ && packs_in_op_ == 0) {
    --light_ops_;
    if (light_ops_ == 0) in_step_ = false;
  } else {
    light_fwd_end_live_ = memory_->live();
    light_sig_ = fold_signature(light_sig_, light_hash_);
    light_struct_sig_ = fold_signature(light_struct_sig_, light_structure_);
  }
  current_op_ = -1;
  packs_in_op_ = 0;
}

void Recorder::op_start(const at::RecordFunction& fn) {
  if (light_) {
    light_op_start(fn);
    return;
  }
  const int64_t idx = static_cast<int64_t>(profile_.forward.size());
  Op& op = profile_.forward.emplace_back();
  op.name = fn.name();
  op.overload = fn.overload_name();
  op.seq_nr = fn.seqNr();
  op.thread = fn.threadId();
  op.random = current_random_ = is_random(fn);
  op.side_stream = on_side_stream(fn.inputs());  // also makes rerun_handle refuse it
  op.dispatch_mode = under_script_mode();        // so does this
  op.rerunnable = rerun_handle(fn).has_value();
  drew_unmarked_ = false;
  watching_rng_ = !op.random;
  if (watching_rng_) rng_.before(fn.inputs());
  const std::vector<char>& writes = writes_.of(fn);
  size_t arg = 0;
  for (const c10::IValue& iv : fn.inputs()) {
    const size_t first = op.inputs.size();
    add_tensor_refs(iv, &op.inputs, -1);
    if (!exposed_.empty()) {  // which op output each of these very tensors
      size_t k = first;
      for_each_tensor(iv, [&](const at::Tensor& t) {
        auto e = exposed_.find(t.unsafeGetTensorImpl());
        if (e != exposed_.end() && op.inputs[k].value >= 0) {
          op.inputs[k].from = e->second.op;
          const auto w = last_write_.find(op.inputs[k].value);
          if (w != last_write_.end() && w->second > e->second.op && w->second < idx &&
              version_now(*t.unsafeGetTensorImpl()) == e->second.version)
            op.inputs[k].from = w->second;
        }
        ++k;
      });
    }
    if (arg < writes.size() && writes[arg]) {
      for (size_t k = first; k < op.inputs.size(); ++k) {
        if (op.inputs[k].value >= 0) {
          push_unique(&op.writes, op.inputs[k].value);
          last_write_[op.inputs[k].value] = idx;
        }
      }
    }
    ++arg;
  }
  for (const TensorRef& r : op.inputs) {
    if (r.value >= 0) push_unique(&profile_.values[r.value].consumers, idx);
  }
  inputs_at_start_.clear();
  if (!op.rerunnable) {
    size_t k = 0;
    for (const c10::IValue& iv : fn.inputs()) {
      for_each_tensor(iv, [&](const at::Tensor& t) {
        const size_t ref = k++;
        if (!t.defined() || op.inputs[ref].value < 0) return;
        const c10::VariableVersion& vc = t.unsafeGetTensorImpl()->version_counter();
        if (!vc.enabled()) return;
        inputs_at_start_.push_back({ref, c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), vc,
                                    vc.current_version()});
      });
    }
  }
  // The next number, not fn.seqNr(): an op autograd does not number (a factory) gets the empty
  // range [next, next), which keeps seq_begin_ sorted for op_of_node.
  seq_begin_.push_back(at::sequence_number::peek());
  seq_end_.push_back(seq_begin_.back());
  update_held(idx);
  current_op_ = idx;
  if (idx > 0) absorb_gap(&profile_.forward[idx - 1]);
  op.live_before = memory_->live();
  memory_->reset_window();
  op.start_us = now_us();
}

void Recorder::op_end(const at::RecordFunction& fn) {
  if (light_) {
    light_op_end(fn);
    return;
  }
  const double end = now_us();
  const int64_t idx = current_op_;
  if (idx < 0) return;
  Op& op = profile_.forward[idx];
  if (watching_rng_ && rng_.drew()) {
    // Drew from a default generator though its schema does not say so: random from now on (the
    // replayer snapshots its generators before every later call).
    op.random = true;
    drew_unmarked_ = true;
    random_by_name_[fn.name()].always = true;
  }
  watching_rng_ = false;
  if (!inputs_at_start_.empty()) note_hidden_writes(idx);
  op.time_us = op.cpu_us = end - op.start_us;
  op.live_after = memory_->live();
  op.peak = std::max({memory_->window_peak(), op.live_before, op.live_after});
  for (const c10::IValue& iv : fn.outputs()) {
    add_tensor_refs(iv, &op.outputs, idx);
    for_each_tensor(iv, [&](const at::Tensor& t) {
      if (t.defined()) {
        exposed_.insert_or_assign(t.unsafeGetTensorImpl(),
                                  Exposure{idx, c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()),
                                           version_now(*t.unsafeGetTensorImpl())});
      }
    });
  }
  seq_end_[idx] = at::sequence_number::peek();
  current_op_ = -1;
  // An op that returns no tensor and made no autograd node (aten::item of the previous step's
  // loss, aten::is_nonzero, aten::equal) has nothing to save or rebuild: leave it out, so the
  // step's op sequence does not depend on what the script printed before it.
  if (op.outputs.empty() && seq_end_[idx] == seq_begin_[idx] && packs_in_op_ == 0) {
    for (const TensorRef& r : op.inputs) {
      if (r.value >= 0 && !profile_.values[r.value].consumers.empty() &&
          profile_.values[r.value].consumers.back() == idx) {
        profile_.values[r.value].consumers.pop_back();
      }
    }
    profile_.forward.pop_back();
    seq_begin_.pop_back();
    seq_end_.pop_back();
    // Nothing recorded yet: the step has not really begun (its baseline must be taken at the
    // first op that counts, after the script's own bookkeeping such as zero_grad).
    if (profile_.forward.empty()) in_step_ = false;
  }
  // A tensor made inside this op and saved by it that something besides autograd still holds now
  // that the op is done: autocast's cache of a parameter's low-precision copy, held until the
  // user's autocast region ends. Evicting it frees nothing during forward, which the planner's
  // memory model would not see: count it as held outside autograd.
  if (idx < static_cast<int64_t>(profile_.forward.size())) {
    for (int64_t v : profile_.forward[idx].packs) {
      Value& val = profile_.values[v];
      if (val.producer != idx || val.held_outside) continue;
      bool output = false;
      for (const TensorRef& r : profile_.forward[idx].outputs) output = output || r.value == v;
      if (!output && refs_beyond_packs(v) > 0) val.held_outside = true;
    }
  }
  packs_in_op_ = 0;
}

int64_t Recorder::on_pack(const at::Tensor& t, const at::Tensor& handle) {
  // pack runs inside the op's autograd kernel; a pack outside any recorded op (a custom
  // autograd.Function saving at the end of apply) belongs to the op just finished.
  if (light_) {  // no value numbering: the replayer names packs by (op, ordinal)
    ++packs_in_op_;
    return -1;
  }
  const int64_t op = pack_owner();
  const int64_t id = value_of(t, op);
  if (id < 0) return -1;
  Value& v = profile_.values[id];
  if (op >= 0) {
    push_unique(&v.saved_by, op);
    profile_.forward[op].packs.push_back(id);
  }
  auto& handles = pack_handles_[id];
  if (handles.empty() && v.kind == ValueKind::Activation) held_watch_.push_back(id);
  handles.push_back({op, c10::weak_intrusive_ptr<c10::TensorImpl>(handle.getIntrusivePtr())});
  ++packs_in_op_;
  v.saved_bytes = v.bytes;  // the whole storage, once however many tensors of it were saved
  return id;
}

void Recorder::on_unpack(int64_t value) {
  if (value < 0 || value >= static_cast<int64_t>(profile_.values.size()) || current_node_ < 0) return;
  push_unique(&profile_.values[value].unpacked_by, current_node_);
}

void Recorder::begin_backward() {
  if (in_backward_) return;
  in_backward_ = true;
  backward_t0_us_ = now_us();
  profile_.forward_us = backward_t0_us_;
  held_watch_.clear();  // what still holds them now is what held_outside counts
  input_watch_.clear();
  // What the script freed (or allocated) since the forward's last op: zero_grad here.
  if (light_ ? light_ops_ > 0 : !profile_.forward.empty())
    profile_.gap_bytes = memory_->live() - (light_ ? light_fwd_end_live_ : profile_.forward.back().live_after);
  if (light_) return;
  if (!profile_.forward.empty()) absorb_gap(&profile_.forward.back());
  for (InputVersion& iv : input_versions_) {
    if (iv.parameter) iv.version = iv.counter.current_version();
  }
  // Whatever still holds a saved storage besides the handles autograd owns makes evicting it
  // useless: count references now, at the end of forward. Each pack handle owns one TensorImpl
  // of that storage (its tensor_data alias) until its node dies.
  for (size_t i = 0; i < profile_.values.size(); ++i) {
    Value& v = profile_.values[i];
    if (v.saved_by.empty()) continue;
    // Saved by the ops whose handles are still alive: a node that died in the forward (the
    // values output of max nobody reads; the hidden state `out, _ = lstm(packed)` drops, and
    // with it index_select's node that saved the sequence's unsorted indices) unpacks nothing.
    const auto it = pack_handles_.find(static_cast<int64_t>(i));
    std::erase_if(v.saved_by, [&](int64_t op) {
      if (it == pack_handles_.end()) return false;
      for (const PackHandle& h : it->second)
        if (h.op == op && !h.impl.expired()) return false;
      return true;
    });
    const int64_t extra = refs_beyond_packs(static_cast<int64_t>(i));
    if (extra < 0 || v.saved_by.empty()) {
      // Gone before backward began, or nothing will unpack it: every node that saved it died in
      // the forward. max's indices in gumbel_softmax (`y.max(dim)[1]`): MaxBackward0 dies with
      // the values output nobody uses. Counted as saved, it lived to the step's end in the
      // planner's model, a recompute counted on it, and the replay re-ran max unpriced.
      v.saved_by.clear();
      v.saved_bytes = 0;
      continue;
    }
    v.held_outside = v.held_outside || v.kind != ValueKind::Activation || extra > 0;
  }
}

// A custom autograd.Function that writes its input in place (ctx.mark_dirty: `x.mul_(2)` under
// its no_grad forward, unrecorded) returns that very tensor, but its RecordFunction has no
// outputs: the next reader's input looked like what the op before had made (TensorRef::from), so
// the planner re-ran that op and the reader on the unwritten tensor; the replay, finding the
// tensor at another version, held it to the step's end unplanned (probe: four layers of it,
// +44% over the prediction, then planned again). Now the write is one of the op's writes
// (Op::writes) and the op the written tensor's later readers read it from, as for relu_: a
// rebuild of what they made needs this op, which cannot re-run, so the planner keeps it.
// Cost: per input tensor of such an op, one weak pointer and a counter read (full recording).
void Recorder::note_hidden_writes(int64_t idx) {
  Op& op = profile_.forward[idx];
  for (InputAtStart& in : inputs_at_start_) {
    if (in.counter.current_version() == in.version) continue;
    const int64_t v = op.inputs[in.ref].value;
    push_unique(&op.writes, v);
    last_write_[v] = idx;
    if (auto t = in.impl.lock()) exposed_.insert_or_assign(t.get(), Exposure{idx, std::move(in.impl), version_now(*t)});
  }
  inputs_at_start_.clear();
}

// Cost: per watched value, one weak lock and a map lookup, or one expiry check (full recording
// only).
void Recorder::update_held(int64_t op) {
  size_t keep = 0;
  for (int64_t v : held_watch_) {
    if (refs_beyond_packs(v) > 0) {
      profile_.values[v].held_until = op;  // it is alive while `op` runs, whatever the plan does
      held_watch_[keep++] = v;
    }
  }
  held_watch_.resize(keep);
  keep = 0;
  for (int64_t v : input_watch_) {
    if (slots_[v].storage.expired()) {
      if (op > 0) profile_.values[v].dies_after = op - 1;
    } else {
      input_watch_[keep++] = v;
    }
  }
  input_watch_.resize(keep);
}

// Cost: a lock of the storage's weak pointer, and one expiry check per pack handle of it.
int64_t Recorder::refs_beyond_packs(int64_t v) const {
  auto strong = slots_[v].storage.lock();
  if (!strong) return -1;
  const int64_t refs = static_cast<int64_t>(strong.use_count()) - 1;  // minus our lock
  int64_t live = 0;
  if (const auto it = pack_handles_.find(v); it != pack_handles_.end())
    for (const PackHandle& h : it->second) live += h.impl.expired() ? 0 : 1;
  return refs - live;
}

void Recorder::node_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (std::strncmp(name, kEnginePrefix, std::strlen(kEnginePrefix)) == 0) return;
  current_node_name_ = name;
  if (light_) {
    current_node_ = light_nodes_++;
    return;
  }
  const int64_t idx = static_cast<int64_t>(profile_.backward.size());
  if (idx > 0) absorb_gap(&profile_.backward.back());
  Op& n = profile_.backward.emplace_back();
  n.name = name;
  n.seq_nr = fn.seqNr();
  n.thread = fn.forwardThreadId();
  current_node_ = idx;
  check_written(idx);
  n.live_before = memory_->live();
  memory_->reset_window();
  n.start_us = now_us();
}

void Recorder::node_end(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (std::strncmp(name, kEnginePrefix, std::strlen(kEnginePrefix)) == 0) return;
  if (current_node_ < 0 || light_) return;
  const double end = now_us();
  Op& n = profile_.backward[current_node_];
  n.time_us = n.cpu_us = end - n.start_us;
  n.live_after = memory_->live();
  n.peak = std::max({memory_->window_peak(), n.live_before, n.live_after});
}

// An input or parameter written in place since first seen (a buffer a backward hook updates, a
// parameter an optimizer step in a post-accumulate-grad hook updates) is marked written, before
// node `before_node`: a re-run from that node on would read the new contents. So is one whose
// storage was released (resized below its size when first seen): FSDP2 frees a block's
// unsharded parameters after its forward and gathers them again only for its own backward, so a
// re-run in another block's backward found an empty storage ("out of bounds for storage of size
// 0") and the rank died; it is copied when captured instead, and the simulator counts the copy.
// Full records only. Cost: one version load and one weak-pointer lock per input and parameter of
// the step (~100-200 for GPT-2), per node.
void Recorder::check_written(int64_t before_node) {
  for (InputVersion& iv : input_versions_) {
    if (iv.written) continue;
    if (iv.counter.current_version() == iv.version) {  // unchanged, unless its storage shrank
      const c10::intrusive_ptr<c10::StorageImpl> s = slots_[iv.value].storage.lock();
      if (!s || static_cast<int64_t>(s->nbytes()) >= profile_.values[iv.value].bytes) continue;
    }
    iv.written = true;
    Value& v = profile_.values[iv.value];
    v.written = true;
    v.written_before_node = before_node;
  }
}

// Memory allocated and freed between two recorded ops or nodes belongs to the earlier one's
// peak: the engine summing two gradients for a parameter used twice (autograd's input buffer, a
// transient as large as the parameter, outside any node's callbacks), a no_grad buffer update
// between forward ops. Missing from every op's peak, it was missing from the simulator's too
// (a layer applied twice at 50%: predicted 10.1 MiB, measured 11.0 MiB, with no plan at all).
void Recorder::absorb_gap(Op* previous) {
  if (std::exchange(skip_gap_, false)) return;
  previous->peak = std::max(previous->peak, memory_->window_peak());
}

Profile Recorder::end_step() {
  const double end = now_us();
  if (!light_ && !profile_.backward.empty()) absorb_gap(&profile_.backward.back());
  profile_.backward_us = in_backward_ ? end - backward_t0_us_ : 0;
  if (!in_backward_) profile_.forward_us = end;
  profile_.peak_bytes = std::max({memory_->peak(), shifted_peak_, profile_.baseline_bytes});
  profile_.end_bytes = memory_->live();
  profile_.overhead_us = static_cast<double>(overhead_ns_) / 1000.0;
  check_written(static_cast<int64_t>(profile_.backward.size()));
  input_versions_.clear();
  // Link every backward node to the forward op whose autograd kernel created it.
  for (Op& n : profile_.backward) {
    if (n.seq_nr >= 0) n.fwd_op = op_of_node(n.seq_nr, n.thread);
  }
  if (!light_) profile_.op_hash = hash_forward_ops(profile_.forward);
  profile_.signature = light_ ? light_sig_ : signature_of(profile_.forward);
  profile_.structure_signature = light_ ? light_struct_sig_ : structure_signature_of(profile_.forward);
  in_step_ = false;
  in_backward_ = false;
  pack_handles_.clear();
  slots_.clear();
  index_.clear();
  exposed_.clear();
  last_write_.clear();
  Profile out = std::move(profile_);
  profile_ = Profile();
  return out;
}

}  // namespace memplan
