// The replayer follows a step op by op against its plan: which saved tensor is which value
// (source_of), divergence and skipped stretches, evictions and compactions after an op, and the end
// of the step. Backward's hooks are in replay_nodes.cpp, rebuilding in rebuild.cpp.
#include "agent/replay.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>

#include "agent/log.h"
#include "hooks/op_callbacks.h"
#include "planner/rerun_ops.h"
#include "profiler/nvtx_ranges.h"
#include "profiler/op_writes.h"
#include "profiler/rerun_handle.h"
#include "profiler/tensor_args.h"

namespace memplan {

namespace {

}  // namespace

Replayer::Replayer(const Profile& profile, planner::Plan plan)
    : plan_(std::move(plan)), ops_(profile.forward) {
  const size_t n = profile.forward.size();
  for (const Op& node : profile.backward) node_names_.push_back(node.name);
  makes_nodes_.assign(profile.forward.size(), 0);
  for (const Op& node : profile.backward) {
    if (node.fwd_op >= 0 && static_cast<size_t>(node.fwd_op) < makes_nodes_.size()) makes_nodes_[node.fwd_op] = 1;
  }
  // Inputs and parameters the profiled step wrote in place (a buffer a backward hook updates, a
  // parameter an optimizer step in backward updates; unseen by the write guard while forward
  // callbacks are paused): copied when a recipe captures them, for the ops a planned recompute
  // re-runs at or after the write (planner::copied_when_captured; the simulator counts the
  // copies). Most optimizer-in-backward writes come after every re-run that reads the
  // parameter (its gradient is complete only after its ops' backward), and cost no copy; a
  // parameter also read without grad (`w.detach()`) may not.
  const std::vector<int64_t> last_rerun = planner::last_rerun_node(plan_.recomputes, n);
  for (size_t o = 0; o < n; ++o) {
    const auto& in = profile.forward[o].inputs;
    for (size_t k = 0; k < in.size(); ++k) {
      const int64_t v = in[k].value;
      if (v < 0 || static_cast<size_t>(v) >= profile.values.size() ||
          !planner::copied_when_captured(profile.values[v], last_rerun[o])) {
        continue;
      }
      if (written_input_.empty()) written_input_.resize(n);
      written_input_[o].resize(in.size(), 0);
      written_input_[o][k] = 1;
    }
  }
  evict_after_.resize(n);
  hold_from_.resize(n);
  for (const auto& e : plan_.evictions) {
    if (e.after_fwd >= 0 && static_cast<size_t>(e.after_fwd) < n) evict_after_[e.after_fwd].push_back(e.value);
  }
  for (const auto& h : plan_.holds) {
    if (h.from_fwd >= 0 && static_cast<size_t>(h.from_fwd) < n) hold_from_[h.from_fwd].push_back(h.value);
  }
  compact_after_.resize(n);
  for (int64_t v : plan_.compactions) {
    if (v < 0 || static_cast<size_t>(v) >= profile.values.size()) continue;
    const int64_t prod = profile.values[v].producer;
    if (prod >= 0 && static_cast<size_t>(prod) < n) {
      compact_after_[prod].push_back(v);
      if (profile.forward[prod].name == "aten::dropout") op_mask_[prod] = v;
    }
  }
  tail_state_.assign(n, 0);
  // Ops a rebuild may re-run: every op that provides (creates or re-exposes, as a view) an evicted
  // value, and transitively every op providing their inputs. Only these keep a strong reference
  // to their inputs from before the step: another op's (a script cloning last step's gradients
  // before the forward) would keep memory alive that the script frees mid-step (+16-22% over
  // the predicted peak at 35% in that loop, measured).
  {
    std::vector<int64_t> evicted;
    for (const auto& e : plan_.evictions) evicted.push_back(e.value);
    hold_externals_ = planner::rerun_ops(profile, planner::value_providers(profile), evicted);
  }
  for (const auto& r : plan_.recomputes) recompute_before_[r.before_bwd] = &r;
  for (const auto& r : plan_.releases) {
    release_after_[r.after_bwd].push_back(r.value);
    int64_t& last = last_release_.try_emplace(r.value, r.after_bwd).first->second;
    last = std::max(last, r.after_bwd);
  }
  // Where each planned recompute runs: a pre-hook on the autograd Node it must precede, found
  // when the forward op that creates the node ends (its sequence number relative to the op's, and
  // its name). Releases are at recompute nodes (plan_builder): the same hook does them. A node
  // with no creating op, or a release elsewhere (a hand-made plan), is driven by the backward
  // node callbacks instead, which then stay on.
  const int64_t nb = static_cast<int64_t>(profile.backward.size());
  via_callback_.assign(nb, 0);
  node_actions_.resize(n);
  for (const auto& [node, r] : recompute_before_) {
    if (node < 0 || node >= nb) continue;
    const Op& b = profile.backward[node];
    const int64_t j = b.fwd_op;
    if (j < 0 || static_cast<size_t>(j) >= n || b.seq_nr < 0 || profile.forward[j].seq_nr < 0) {
      via_callback_[node] = 1;
      continue;
    }
    node_actions_[j].push_back({node, b.seq_nr - profile.forward[j].seq_nr, b.name});
  }
  for (const auto& [node, values] : release_after_) {
    if (node >= 0 && node < nb && !recompute_before_.count(node)) via_callback_[node] = 1;
  }
  for (char c : via_callback_) needs_node_callbacks_ = needs_node_callbacks_ || c;
  // Values by position, from the profile: the k-th output / k-th pack of op i. The planned step
  // runs the same ops (checked op by op), so these name the same storages without relying on the
  // recorder's running numbering, which skipped packs would shift.
  std::vector<char> acted_on(profile.values.size(), 0);  // evicted or compacted: packs wanted
  for (const auto& e : plan_.evictions) {
    if (e.value >= 0 && static_cast<size_t>(e.value) < acted_on.size()) acted_on[e.value] = 1;
  }
  for (int64_t v : plan_.compactions) {
    if (v >= 0 && static_cast<size_t>(v) < acted_on.size()) acted_on[v] = 1;
  }
  value_bytes_.reserve(profile.values.size());
  for (const Value& v : profile.values) value_bytes_.push_back(v.bytes);
  output_values_.resize(n);
  opaque_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) opaque_[i] = profile.forward[i].rerunnable ? 0 : 1;
  pack_values_.resize(n);
  wants_packs_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (const TensorRef& t : profile.forward[i].outputs) output_values_[i].push_back(t.value);
    pack_values_[i] = profile.forward[i].packs;
    for (int64_t v : pack_values_[i]) {
      if (v >= 0 && static_cast<size_t>(v) < acted_on.size() && acted_on[v]) wants_packs_[i] = 1;
    }
  }
  for (size_t i = 0; i < n && first_action_op_ < 0; ++i) {
    if (!evict_after_[i].empty() || !hold_from_[i].empty() || !compact_after_[i].empty() || !node_actions_[i].empty()) {
      first_action_op_ = static_cast<int64_t>(i);
    }
  }
}

bool Replayer::ahead_in(int64_t op, const std::vector<char>& per_op) const {
  return ahead_ >= 0 && op != ahead_ && !diverged_ && static_cast<size_t>(ahead_) < per_op.size() && per_op[ahead_];
}

bool Replayer::hold_externals(int64_t op) const {
  if (ahead_in(op, hold_externals_)) return true;
  return diverged_ || op < 0 || static_cast<size_t>(op) >= hold_externals_.size() || hold_externals_[op];
}

bool Replayer::wants_packs(int64_t step_op) const {
  const int64_t op = at(step_op);
  if (ahead_in(op, wants_packs_)) return true;
  return diverged_ || op < 0 || static_cast<size_t>(op) >= wants_packs_.size() || wants_packs_[op];
}

int64_t Replayer::planned_value(int64_t op, int64_t ordinal, const at::Tensor& t) const {
  if (op < 0 || static_cast<size_t>(op) >= pack_values_.size()) return -1;
  const std::vector<int64_t>& packs = pack_values_[op];
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= packs.size()) return -1;
  const int64_t v = packs[ordinal];
  if (v < 0 || static_cast<size_t>(v) >= value_bytes_.size() || !t.has_storage()) return -1;
  // A sanity check on the mapping: the same storage size as profiled. Not after an op whose
  // output shape follows from data: there sizes may differ (check_divergence), and the plan's
  // evictions must still happen, or its rebuilds would only add copies (a mixture of experts at
  // 50%: +51% over the predicted peak, above the un-planned one).
  if (static_cast<int64_t>(t.storage().nbytes()) != value_bytes_[v] && !any_size_ &&
      (ops_.first_data_dependent() < 0 || op <= ops_.first_data_dependent())) {
    return -1;
  }
  return v;
}

void Replayer::action(const char* name, std::chrono::steady_clock::time_point start, bool span) {
  if (!span) nvtx::mark(name);
  if (!logging_actions_) return;
  const auto now = std::chrono::steady_clock::now();
  TraceAction a;
  a.name = name;
  a.ts_us = std::chrono::duration<double, std::micro>(start - t0_).count();
  a.dur_us = span ? std::chrono::duration<double, std::micro>(now - start).count() : 0;
  actions_.push_back(std::move(a));
}

// The clock is read only for the trace (its first replayed step): otherwise a span costs the
// NVTX push and pop, which are a flag test each without a tool attached.
Replayer::ActionSpan::ActionSpan(Replayer* r, const char* label, std::string detail)
    : r_(r), label_(label), detail_(std::move(detail)),
      start_(r->logging_actions_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {
  nvtx::range_push(name());
}

Replayer::ActionSpan::~ActionSpan() {
  nvtx::range_pop();
  r_->action(name(), start_, true);
}

void Replayer::begin_step(bool any_size) {
  ++generation_;
  t0_ = std::chrono::steady_clock::now();
  diverged_ = false;
  drifted_ = false;
  any_size_ = any_size;
  shift_ = 0;
  last_ended_ = -1;
  refused_ = 0;
  if (any_size) ++stats_.family_steps;
  follow_nodes_ = true;
  recipes_.clear();
  for (std::vector<Slot>& outs : slots_) outs.clear();
  rebuildable_op_.clear();
  slot_by_impl_.clear();
  slot_by_storage_.clear();
  // Externals written in place unseen during the last step, which kept values from being evicted
  // (or failed a rebuild): copied when captured from now on, so those values can be evicted.
  written_externals_.insert(refused_by_.begin(), refused_by_.end());
  refused_by_.clear();
  externals_.clear();
  external_storage_.clear();
  op_running_ = false;
  moment_copies_.clear();
  unbumped_.clear();
  writing_.clear();
  snapshots_.clear();
  value_slot_.clear();
  unhooked_.clear();
  pending_.clear();
  handles_.clear();
  holds_.clear();
  packs_in_op_ = 0;
}

TensorSource Replayer::source_of(const at::Tensor& t, bool unknown_is_external) {
  TensorSource src;
  if (!t.defined()) {
    src.kind = TensorSource::Kind::External;  // an undefined tensor rebuilds as itself
    return src;
  }
  const uint32_t version = t.unsafeGetTensorImpl()->version_counter().current_version();
  auto it = slot_by_impl_.find(t.unsafeGetTensorImpl());
  if (it != slot_by_impl_.end()) {
    const Slot& s = slots_[it->second.first][it->second.second];
    if (!s.impl.expired() && s.version == version && !s.overwritten) {
      src.kind = TensorSource::Kind::Slot;
      src.op = it->second.first;
      src.index = it->second.second;
      return src;
    }
  }
  if (t.has_storage()) {
    if (const auto [o, k] = adopt_rewrapped(t); o >= 0) {
      src.kind = TensorSource::Kind::Slot;
      src.op = o;
      src.index = k;
      return src;
    }
    // The latest slot on this storage that is still alive, unwritten since: the latest of all
    // may be a view whose tensor is gone (a saved alias the plan evicted, which held the last
    // reference) while an earlier view of the same storage lives on (the `v` of q, k, v split
    // from one projection, which this op reads). Taking only the latest left the pack without
    // a source: kept, not evicted, over the budget (1 of 9 evictions in some GPT-2 plans).
    //
    // Failing a live one, the latest dead one at this version, on a storage an op of this step
    // made: the slice a script wrote through (`m[:, :k] = False`, then `m.logical_not()`) is
    // gone, and `m`'s own slot is at the version before the write. The fill_'s output is `m`'s
    // contents laid out otherwise, and its rebuild (ones_like, slice, fill_ in place: run_op
    // writes a view it alone holds where it is) is `m`'s storage again. A slot's weak reference
    // keeps its storage's address from reuse: the same key, the same storage. Without this, `m`
    // was an external held to the step's end, which the plan does not count (+7.9% over the
    // prediction in the first replayed step, 512 KiB a layer, then a re-plan). Not on a storage
    // from outside (a KV cache written through a slice): its rebuild would copy all of it.
    // Cost: one entry per output viewing the storage (a handful), a weak lock for each newer one.
    std::pair<int64_t, int64_t> found{-1, -1}, found_dead{-1, -1};
    bool made_here = false;
    c10::intrusive_ptr<c10::TensorImpl> base;
    const auto [first, last] = slot_by_storage_.equal_range(t.storage().unsafeGetStorageImpl());
    for (auto st = first; st != last; ++st) {
      const auto [o, k] = st->second;
      if (static_cast<size_t>(k) >= slots_[o].size()) continue;
      const Slot& s = slots_[o][k];
      made_here = made_here || s.made_storage;
      if (st->second <= found) continue;
      // Views share their base's version counter: equal versions mean no unrecorded write since.
      // Another dtype is no view as_strided can make (resolve re-views the slot's tensor).
      if (s.version != version || s.options.dtype() != t.dtype() || s.overwritten) continue;
      if (auto impl = s.impl.lock()) {
        found = st->second;
        base = std::move(impl);
      } else if (st->second > found_dead && s.counter.enabled() &&
                 s.storage._unsafe_get_target() == t.storage().unsafeGetStorageImpl()) {
        found_dead = st->second;
      }
    }
    if (found.first < 0 && made_here) found = found_dead;
    if (found.first >= 0) {
      const Slot& s = slots_[found.first][found.second];
      src.kind = TensorSource::Kind::Slot;
      src.op = found.first;
      src.index = found.second;
      // The live tensor's layout, which may have moved since its op (resize_); the dead one's as
      // its op left it, which is what a rebuild makes.
      const bool same = base ? same_layout(at::Tensor(std::move(base)), t) : s.laid_out_as(t);
      if (!same) {
        src.view = true;
        src.sizes.assign(t.sizes().begin(), t.sizes().end());
        src.strides.assign(t.strides().begin(), t.strides().end());
        src.offset = t.storage_offset();
      }
      return src;
    }
  }
  auto ext = externals_.find(t.unsafeGetTensorImpl());
  if (ext != externals_.end() || unknown_is_external) {
    const uint32_t version = version_of(t);  // an external's: counting writes that did not bump it
    src.kind = TensorSource::Kind::External;
    src.external = t;
    src.external_version = version;
    auto [e, fresh] = externals_.emplace(t.unsafeGetTensorImpl(), External{t, version, version});
    if (fresh) {
      if (op_running_) op_externals_.push_back(t.unsafeGetTensorImpl());
      if (t.has_storage()) external_storage_.emplace(t.storage().unsafeGetStorageImpl(), t.unsafeGetTensorImpl());
      if (written_externals_.count(t.unsafeGetTensorImpl())) snapshot_external(t, version);
    } else {
      e->second.last_version = version;
    }
    return src;
  }
  return src;  // None: the caller decides (an op's internal tensor)
}

// A factory called from Python (torch.empty_like, torch.zeros_like) runs below autograd and
// hands what the dispatcher returned to autograd::make_variable, which wraps it in a new
// TensorImpl with a version counter of its own unless it owns the first and its counter alone
// (op_end keeps no copy of that counter, so it mostly does; another observer may hold the
// output): the script's tensor is then not the op's output our end callback saw, which dies at
// once. The same storage, laid out alike, and `t` unwritten since it was made: the same
// contents. The slot takes the script's tensor as its own, so the op that fills it in place
// (gumbel_softmax's exponential_) finds its input's producer instead of an external to copy.
std::pair<int64_t, int64_t> Replayer::adopt_rewrapped(const at::Tensor& t) {
  if (t.layout() != at::kStrided || version_of(t) != 0) return {-1, -1};
  const auto [first, last] = slot_by_storage_.equal_range(t.storage().unsafeGetStorageImpl());
  for (auto st = first; st != last; ++st) {
    const auto [o, k] = st->second;
    if (static_cast<size_t>(k) >= slots_[o].size()) continue;
    Slot& s = slots_[o][k];
    // Only an unnumbered op's output is wrapped again: a numbered op's dead output whose storage
    // `t` shares is an alias of something else (`loss.detach()`, dead, and `loss`). `t` unwritten
    // (version 0): nothing can have written the storage since but `t`, the op's output being dead.
    if (!s.below_autograd || !s.impl.expired()) continue;
    if (s.offset != t.storage_offset() || !t.sizes().equals(s.sizes) || !t.strides().equals(s.strides) ||
        s.options.dtype() != t.dtype()) {
      continue;
    }
    s.impl = c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr());
    s.version = 0;
    slot_by_impl_[t.unsafeGetTensorImpl()] = st->second;
    return st->second;
  }
  return {-1, -1};
}

// An op other than the profile's at this position ends the plan for this step. Other sizes only
// (the same op, input dtypes and ranks) after an op whose output shape follows from data (a loss
// over the tokens a boolean mask keeps, an expert's share of a batch) are the same kind of step:
// the plan's actions still line up op for op, every rebuild re-runs this step's own calls, and
// only the memory differs, as it would without memplan. Such a step goes on as planned.
void Replayer::check_divergence(int64_t op, uint64_t hash, uint64_t structure, const char* name) {
  if (diverged_) return;
  const OpSequence::Match m = ops_.match(op, hash, structure, any_size_);
  if (m == OpSequence::Match::Drift) {
    if (any_size_) return;  // a family's step: other sizes throughout (stats().family_steps)
    if (!drifted_) ++stats_.drifted;
    drifted_ = true;
    log_once("drift", LogLevel::Info,
             fmt::format("a step ran the profile's ops with other sizes after an op whose output shape "
                         "depends on the data ({}, forward op {}): replayed with the same plan; its "
                         "peak varies with those sizes",
                         ops_.first_data_dependent_name(), ops_.first_data_dependent()));
    return;
  }
  if (m == OpSequence::Match::Other) {
    diverged_ = true;
    ++stats_.divergences;
    log_once("divergence", LogLevel::Info,
             fmt::format("step diverged from the profile at forward op {} ({}): evictions stop for "
                         "this step, evicted tensors are rebuilt on demand; a new kind of step is "
                         "profiled again and gets its own plan",
                         op, name));
  }
}

// Which arguments an op may write: profiler/op_writes.h. Cost: one SchemaInfo per operator per
// Replayer (cached by schema address), then a map lookup.
const std::vector<char>& Replayer::written_args(const c10::FunctionSchema& schema) {
  auto it = written_by_schema_.find(&schema);
  if (it != written_by_schema_.end()) return it->second;
  return written_by_schema_.emplace(&schema, mutable_args(schema)).first->second;
}

void Replayer::op_start(const at::RecordFunction& fn, int64_t step_op, bool random, uint64_t hash,
                        uint64_t structure) {
  if (!pending_.empty()) settle_late_packs();
  const int64_t op = at(step_op);
  // Not the profile's op here, by skip_to's own test: perhaps the first after a stretch the step
  // leaves out (skip_to decides at its end). A guess, which only makes this op keep more; the
  // same op at other sizes after a data-dependent shape (Drift) is no candidate, and costs no scan.
  ahead_ = -1;
  if (!diverged_ && !any_size_ && op >= 0 && ops_.match(op, hash, structure) == OpSequence::Match::Other) {
    ahead_ = next_same(op, hash);
  }
  if (static_cast<size_t>(op) >= recipes_.size()) {
    recipes_.resize(op + 1);
    rebuildable_op_.resize(op + 1, false);
  }
  if (static_cast<size_t>(op) >= slots_.size()) slots_.resize(op + 1);
  const std::vector<char>& op_writes = writes_.of(fn);  // one lookup for both
  settle_writes();  // an untracked op's, before this op captures anything
  moment_copies_.clear();
  op_running_ = true;
  note_writes(fn, op_writes);
  input_storages_.clear();  // keeps its capacity: no allocation after the first ops
  op_externals_.clear();
  for (const c10::IValue& iv : fn.inputs()) {
    for_each_tensor(iv, [&](const at::Tensor& in) {
      if (in.defined() && in.has_storage()) input_storages_.push_back(in.storage().unsafeGetStorageImpl());
    });
  }
  before_write(fn, op_writes);
  if (!unhooked_.empty()) look_again(fn);
  Recipe& r = recipes_[op];
  r = Recipe();
  packs_in_op_ = 0;
  if (static_cast<size_t>(op) >= seq_begin_.size()) seq_begin_.resize(op + 1, -1);
  seq_begin_[op] = fn.seqNr();
  // Only an op that provides an evicted value (or an input of one, transitively) can be re-run:
  // the others get no recipe (no operator lookup, no argument copies, no RNG snapshot) and are
  // not rebuildable, which only matters if the step leaves the profile (then every op is).
  if (!hold_externals(op)) return;
  r.op = rerun_handles_.of(static_cast<size_t>(op), fn);  // the recorder's Op::rerunnable test: the plan re-runs no other op
  if (!r.op) return;
  const auto& schema = r.op->schema();
  const auto inputs = fn.inputs();
  r.valid = true;
  r.args.resize(inputs.size());
  const std::vector<char>& written = written_args(schema);
  const std::vector<char>* written_in_step =
      static_cast<size_t>(op) < written_input_.size() && !written_input_[op].empty() ? &written_input_[op] : nullptr;
  size_t tensor_k = 0;  // defined tensors so far (for_each_tensor's order): the profile op's inputs
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& iv = inputs[i];
    Arg& a = r.args[i];
    a.written = written[i] != 0;
    auto add = [&](const at::Tensor& t) {
      a.tensors.push_back(source_of(t, /*unknown_is_external=*/hold_externals(op)));
      a.requires_grad.push_back(t.defined() && t.requires_grad());
      // This op writes an external (StochasticDepth's noise: empty, then bernoulli_ and div_ in
      // place): keep its contents from before the write, for any re-run that reads them.
      const TensorSource& src = a.tensors.back();
      const bool profiled_written =
          written_in_step && t.defined() && tensor_k < written_in_step->size() && (*written_in_step)[tensor_k];
      if (t.defined()) ++tensor_k;
      if ((a.written || profiled_written) && src.kind == TensorSource::Kind::External && src.external.defined()) {
        snapshot_external(src.external, src.external_version);
      }
    };
    if (iv.isTensor()) {
      a.kind = Arg::Kind::Tensor;
      add(iv.toTensor());
    } else if (iv.isTensorList()) {
      a.kind = Arg::Kind::TensorList;
      for (const at::Tensor t : iv.toTensorList()) add(t);  // the list itself, not a vector copy
    } else if (iv.isList() && iv.toListRef().size() > 0 && [&] {
                 for (const auto& e : iv.toListRef()) {
                   if (e.isTensor()) return true;
                 }
                 return false;
               }()) {
      a.kind = Arg::Kind::OptionalTensorList;
      for (const auto& e : iv.toListRef()) {
        a.present.push_back(e.isTensor());
        if (e.isTensor()) add(e.toTensor());
      }
    } else {
      a.constant = iv;
      if (iv.isGenerator()) {
        r.random = true;
        r.rng.emplace_back(iv.toGenerator(), at::Tensor());
      }
    }
  }
  r.random = r.random || random;
  if (r.random) {
    if (r.rng.empty()) {
      // The op's tensors decide the default generator (not only those from outside the step: a
      // dropout's input is the step's own); a CPU default covers CPU dropout.
      const c10::Device dev = rng_device(inputs);
      // A CUDA op's re-run keeps the CPU generator's state too (an op may draw on both); each
      // generator once, or RerunState would put back the recipe's state instead of the user's.
      if (dev.is_cuda()) r.rng.emplace_back(at::globalContext().defaultGenerator(dev), at::Tensor());
      r.rng.emplace_back(at::detail::getDefaultCPUGenerator(), at::Tensor());
    }
    for (auto& [gen, state] : r.rng) {
      at::Generator g = gen;
      std::lock_guard<std::mutex> lock(g.mutex());
      state = g.get_state();
    }
  }
  r.autocast_cpu = at::autocast::is_autocast_enabled(at::kCPU);
  r.autocast_cuda = at::autocast::is_autocast_enabled(at::kCUDA);
  r.autocast_cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  r.autocast_cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  r.kernels = KernelChoice::now();
}

void Replayer::on_pack(const std::shared_ptr<SavedState>& s, const at::Tensor& t, int64_t step_op) {
  const int64_t op = at(step_op);
  s->op = op;
  s->ordinal = packs_in_op_++;
  pending_.push_back({s, t});
  if (diverged_) return;
  const int64_t v = planned_value(op, s->ordinal, t);
  if (v >= 0) handles_[v].push_back(s);
}

bool Replayer::rebuildable(const TensorSource& src) const {
  switch (src.kind) {
    case TensorSource::Kind::Slot:
    case TensorSource::Kind::Internal:
      return src.op >= 0 && static_cast<size_t>(src.op) < rebuildable_op_.size() && rebuildable_op_[src.op];
    case TensorSource::Kind::External:
      return true;
    case TensorSource::Kind::None:
      return false;
  }
  return false;
}

void Replayer::op_end(const at::RecordFunction& fn, int64_t step_op, bool dropped, uint64_t hash, uint64_t structure) {
  op_running_ = false;
  settle_writes();
  moment_copies_.clear();
  int64_t op = at(step_op);
  ahead_ = -1;
  if (op < 0 || static_cast<size_t>(op) >= recipes_.size()) return;
  if (dropped) {
    recipes_[op] = Recipe();
    slots_[op].clear();
    pending_.clear();
    forget_externals_of_dropped_op();
    return;
  }
  if (!diverged_ && !any_size_) op = skip_to(op, hash, structure);
  // Outputs become slots, in the order of the returned stack (lists flattened). An opaque op's
  // (see opaque_) are found by no lookup: a reader's recipe takes them as from outside the step.
  // Once the step has diverged the profile no longer says which op this is, and every op's
  // outputs are slots; the op that diverges is still judged by the profile's op at its position
  // (the check needs its outputs): at worst a reader holds its output to the step's end.
  const bool opaque = !diverged_ && static_cast<size_t>(op) < opaque_.size() && opaque_[op];
  std::vector<Slot>& outs = slots_[op];
  outs.clear();
  c10::SmallVector<at::Tensor, 4> out_tensors;  // most ops have 1-3 outputs: no allocation
  for (const c10::IValue& iv : fn.outputs()) {
    if (iv.isTensor()) {
      out_tensors.push_back(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor t : iv.toTensorList()) out_tensors.push_back(t);
    }
  }
  for (size_t k = 0; k < out_tensors.size(); ++k) {
    const at::Tensor& t = out_tensors[k];
    Slot s;
    // An unnumbered op's output (a factory's, made below autograd) keeps no copy of its version
    // counter: autograd::make_variable, which Python's factory calls next, wraps it in another
    // TensorImpl unless the counter is the impl's alone, and the script would hold a tensor that
    // no lookup by impl finds (adopt_rewrapped is the fallback, before any write to it). With no
    // counter, a dead output counts as gone (slot_available, held_view): rebuilt, never guessed.
    s.below_autograd = fn.seqNr() < 0;
    if (t.defined()) {
      s.impl = c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr());
      if (!s.below_autograd) s.counter = t.unsafeGetTensorImpl()->version_counter();
      s.version = t.unsafeGetTensorImpl()->version_counter().current_version();
      if (t.has_storage() && t.layout() == at::kStrided) {
        s.storage = c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl());
        s.sizes.assign(t.sizes().begin(), t.sizes().end());
        s.strides.assign(t.strides().begin(), t.strides().end());
        s.offset = t.storage_offset();
        s.options = t.options();
        // No input on the same storage: what source_of may rebuild as a whole. Cost: a pointer
        // compare per input tensor.
        s.made_storage = std::find(input_storages_.begin(), input_storages_.end(),
                                   t.storage().unsafeGetStorageImpl()) == input_storages_.end();
      }
      if (!opaque) {
        slot_by_impl_[t.unsafeGetTensorImpl()] = {op, static_cast<int64_t>(k)};
        if (t.has_storage()) slot_by_storage_.emplace(t.storage().unsafeGetStorageImpl(), std::pair{op, static_cast<int64_t>(k)});
      }
    }
    outs.push_back(std::move(s));
  }
  // Checked here, not at the start: an op the recorder leaves out (no tensor output) is no step.
  check_divergence(op, hash, structure, fn.name());
  if (!diverged_) {
    if (static_cast<size_t>(op) < node_actions_.size() && !node_actions_[op].empty()) {
      attach_node_hooks(op, out_tensors);
    }
    size_t k = 0;
    for (int64_t v : output_values_[op]) {
      if (v >= 0 && k < out_tensors.size()) value_slot_[v] = {op, static_cast<int64_t>(k)};
      ++k;
    }
  }
  // Rebuildable if the recipe is complete and every tensor argument is.
  bool ok = recipes_[op].valid;
  for (const Arg& a : recipes_[op].args) {
    for (const TensorSource& s : a.tensors) ok = ok && rebuildable(s);
  }
  rebuildable_op_[op] = ok;
  // Saved tensors packed during this op: now that outputs are known, find their sources.
  resolve_pending(op);
  pending_.clear();
  last_ended_ = op;
  if (!diverged_) {
    evict_after(op);
    compact_after(op);
    hold_after(op);
  }
}

void Replayer::resolve_pending(int64_t op) {
  for (Pending& p : pending_) {
    TensorSource src = source_of(p.original, /*unknown_is_external=*/false);
    if (src.kind == TensorSource::Kind::None) {
      src.kind = TensorSource::Kind::Internal;
      src.op = op;
      src.index = p.state->ordinal;
    }
    p.state->source = std::move(src);
  }
}

// Packs after op `last_ended_` ended, before the next began: a TorchScript graph's
// DifferentiableGraphBackward saves what its ops made once its last op is done (a custom
// Function saves at the end of apply, but what it saves no plan evicts). The recorder counts
// them for that op, and the plan evicts them after it (planner/graph.cpp: a value lives to the
// op that saved it), but that op's end had passed: each such eviction was skipped (a jit.script
// activation, four layers: +76% over the prediction). Settled at the next op's start, where
// memory is as it was after that op. Only these packs: evict_after(op) would count again the
// op's own packs it refused. Cost: per late pack, a source lookup and a scan of the op's
// evictions.
void Replayer::settle_late_packs() {
  const int64_t op = last_ended_;
  if (op >= 0) {
    resolve_pending(op);
    if (!diverged_ && static_cast<size_t>(op) < evict_after_.size() && !evict_after_[op].empty()) {
      const bool changed = externals_changed();
      const std::vector<int64_t>& planned = evict_after_[op];
      for (Pending& p : pending_) {
        SavedState& s = *p.state;
        const int64_t v = planned_value(s.op, s.ordinal, p.original);
        if (v < 0 || s.evicted || !s.tensor.defined() || std::find(planned.begin(), planned.end(), v) == planned.end())
          continue;
        evict_one(s, v, op, changed);
      }
    }
  }
  pending_.clear();
}

void Replayer::hold_after(int64_t op) {
  for (int64_t v : hold_from_[op]) {
    auto it = value_slot_.find(v);
    if (it == value_slot_.end()) continue;
    if (auto impl = slots_[it->second.first][it->second.second].impl.lock()) {
      holds_[v] = Hold{at::Tensor(impl), it->second.first, it->second.second};
    }
  }
}

int64_t Replayer::next_same(int64_t op, uint64_t hash) const {
  for (size_t q = static_cast<size_t>(op) + 1; q < ops_.size(); ++q) {
    if (ops_.match(static_cast<int64_t>(q), hash, 0) == OpSequence::Match::Same) return static_cast<int64_t>(q);
  }
  return -1;
}

int64_t Replayer::skip_to(int64_t op, uint64_t hash, uint64_t structure) {
  if (ops_.match(op, hash, structure) != OpSequence::Match::Other) return op;
  const int64_t to = next_same(op, hash);
  if (to < 0) return op;
  const size_t need = static_cast<size_t>(to) + 1;
  if (recipes_.size() < need) {
    recipes_.resize(need);
    rebuildable_op_.resize(need, false);
  }
  if (slots_.size() < need) slots_.resize(need);
  if (seq_begin_.size() < need) seq_begin_.resize(need, -1);
  recipes_[to] = std::move(recipes_[op]);
  recipes_[op] = Recipe();
  seq_begin_[to] = seq_begin_[op];
  // What this op packed was taken for the plan's op `op`'s values: it is op `to`'s.
  for (Pending& p : pending_) {
    const int64_t was = planned_value(op, p.state->ordinal, p.original);
    if (was >= 0) {
      auto& list = handles_[was];
      list.erase(std::remove_if(list.begin(), list.end(),
                                [&](const std::weak_ptr<SavedState>& w) { return w.lock() == p.state; }),
                 list.end());
    }
    p.state->op = to;
    const int64_t v = planned_value(to, p.state->ordinal, p.original);
    if (v >= 0) handles_[v].push_back(p.state);
  }
  // The left-out ops' actions: evictions of values they were the last to read, holds from them.
  // Their own values and nodes do not exist: nothing to do for those.
  for (int64_t q = op; q < to; ++q) {
    evict_after(q);
    hold_after(q);
  }
  // Backward nodes are numbered as they run: after a gap that made some (a layer) they no longer
  // line up with the profile's. Planned recomputes hang on the nodes themselves (node_hook); the
  // few driven by node callbacks are left to on-demand rebuilds, and the holds those callbacks
  // release go at the step's end. Left-out ops that made no node (a batch's `set_` from a
  // DataLoader worker, in some steps only) leave the backward as profiled: followed as planned.
  for (int64_t q = op; q < to; ++q) {
    if (static_cast<size_t>(q) < makes_nodes_.size() && makes_nodes_[q]) follow_nodes_ = false;
  }
  if (shift_ == 0) ++stats_.gapped_steps;
  shift_ += to - op;
  log_once("gap", LogLevel::Info,
           fmt::format("a step left out forward ops {}..{} of its plan's profile and ran the rest in order (a layer "
                       "skipped, as LayerDrop does): it replays the plan's actions of the ops it ran",
                       op, to - 1));
  return to;
}

namespace {

// Calls f on each handle of `v` that still holds its tensor.
template <typename Handles, typename F>
void each_resident(Handles& handles, int64_t v, F f) {
  auto it = handles.find(v);
  if (it == handles.end()) return;
  for (auto& w : it->second) {
    auto s = w.lock();
    if (s && !s->evicted && s->tensor.defined()) f(*s);
  }
}

// Drops the tensor, keeping what autograd's in-place error message needs.
void drop(SavedState& s) {
  s.meta_sizes.assign(s.tensor.sizes().begin(), s.tensor.sizes().end());
  s.meta_dtype = s.tensor.scalar_type();
  s.meta_cuda = s.tensor.is_cuda();
  s.tensor.reset();
  s.evicted = true;
}

}  // namespace

void Replayer::evict_after(int64_t op) {
  // Rare: something wrote an external in place since a recipe captured it, unseen (an optimizer
  // step inside the step's window; writes we see are copied first, before_write). Then each
  // eviction's chain is checked, and a value whose rebuild would read the new contents is kept.
  const bool changed = externals_changed();
  for (int64_t v : evict_after_[op]) {
    each_resident(handles_, v, [&](SavedState& s) { evict_one(s, v, op, changed); });
  }
}

void Replayer::evict_one(SavedState& s, int64_t v, int64_t op, bool changed) {
  if (s.source.kind == TensorSource::Kind::External || !rebuildable(s.source)) {
    ++stats_.not_rebuildable;
    ++refused_;
    if (under_script_mode()) {  // a TLS read, on this rare path only
      log_once("dispatch-mode", LogLevel::Warn,
               "a replayed step runs under a TorchDispatchMode the script entered (its own, FlopCounterMode, "
               "selective activation checkpointing's): memplan does not re-run an op a mode saw, so values "
               "the plan evicts are kept in such a step, whose peak may pass the plan's");
    }
    return;
  }
  if (changed) {
    std::vector<char> seen(recipes_.size(), 0);
    if (const at::Tensor* w = chain_reads_changed_external(s.source, seen, 0)) {
      ++stats_.not_rebuildable;
      ++refused_;
      if (w->defined()) {
        log_once("external-written", LogLevel::Info,
                 fmt::format("an input of a recomputable op ({} {}) was written in place during the step, "
                             "unseen: values whose recomputation would read it are kept, not evicted "
                             "(copied from the next step on)",
                             c10::toString(w->scalar_type()), c10::str(w->sizes())));
      }
      return;
    }
  }
  drop(s);
  ++stats_.evicted;
  if (naming_actions()) {
    action(fmt::format("memplan/evict value {} after op {}", v, op).c_str(), std::chrono::steady_clock::now(), false);
  } else {
    action("memplan/evict", {}, false);
  }
}

void Replayer::compact_after(int64_t op) {
  for (int64_t v : compact_after_[op]) {
    each_resident(handles_, v, [&](SavedState& s) {
      ActionSpan span(this, "memplan/compact",
                      naming_actions() ? fmt::format("memplan/compact value {} after op {}", v, op) : std::string());
      if (!compact_mask(s.tensor, &s.mask)) {
        ++stats_.compact_refused;
        log_once("compact-refused", LogLevel::Warn,
                 fmt::format("value {} is not a 0/scale dropout mask as planned; kept as it is", v));
        return;
      }
      drop(s);
      s.compact = true;
      ++stats_.compacted;
    });
  }
}

// The last step's loss, read by `loss.item()` after `loss.detach()` opened this step's window,
// was held as an external by item's recipe (at the index of the forward op that comes next, one
// a rebuild may re-run) to this step's end, and with it the last step's graph: a leaf that
// requires grad and its gradient, which plain PyTorch frees when the script rebinds `loss`
// (tests/integration/input_grad_step.py: 4 MiB through the next step, +21.6% over the prediction
// and the kind planned again with it kept). No recipe references them once item's is dropped.
// Cost: per external the dropped op captured first (one or two), a hash erase and a bucket scan.
void Replayer::forget_externals_of_dropped_op() {
  for (const c10::TensorImpl* impl : op_externals_) {
    auto ext = externals_.find(impl);
    if (ext == externals_.end()) continue;
    const at::Tensor& t = ext->second.tensor;  // alive until the erase below: `impl` stays valid
    if (t.has_storage()) {
      for (auto [it, end] = external_storage_.equal_range(t.storage().unsafeGetStorageImpl()); it != end; ++it) {
        if (it->second == impl) {
          external_storage_.erase(it);
          break;
        }
      }
    }
    for (auto it = snapshots_.lower_bound({impl, 0}); it != snapshots_.end() && it->first.first == impl;)
      it = snapshots_.erase(it);
    externals_.erase(ext);
  }
  op_externals_.clear();
}

void Replayer::end_step() {
  // A graph kept with retain_graph (or one whose backward raised part-way) may still unpack
  // later: put every evicted tensor back while the recipes exist. Backward is over, so without
  // the scope the ops this runs would start the next step and clear the state being read here.
  AgentScope scope;
  for (auto& [v, list] : handles_) {
    for (auto& w : list) {
      auto s = w.lock();
      if (s && s->evicted && s->compact) {
        s->tensor = expand_mask(s->mask);
        s->mask = CompactMask();
        s->compact = s->evicted = false;
      } else if (s && s->evicted) {
        Memo memo;
        try {
          count_uses(s->source, memo, 0);
          rebuild(*s, memo);
        } catch (const std::exception& e) {
          log_once("end-rebuild", LogLevel::Warn, "could not restore a saved tensor: " + brief(e));
        }
      }
    }
  }
  ++stats_.steps;
  logging_actions_ = false;
  begin_step();  // drop the step's state now, not at the next step
}

}  // namespace memplan
