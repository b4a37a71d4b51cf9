#include "agent/replay.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/as_strided.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <cstring>

#include "agent/log.h"
#include "agent/pack_hooks.h"
#include "hooks/op_callbacks.h"
#include "planner/rerun_ops.h"
#include "profiler/nvtx_ranges.h"
#include "profiler/op_hash.h"
#include "profiler/op_writes.h"
#include "profiler/rerun_handle.h"
#include "profiler/tensor_args.h"

namespace memplan {

namespace {

thread_local std::vector<at::Tensor>* tl_capture = nullptr;
constexpr int kMaxDepth = 4000;  // a rebuild chain longer than the step itself means a cycle

bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes().equals(b.sizes()) && a.strides().equals(b.strides()) &&
         a.storage_offset() == b.storage_offset() && a.scalar_type() == b.scalar_type();
}

// Restores a forward op's thread-local state around its re-run: grad mode on (the original ran
// with autograd, which is what makes it pack internal tensors), its autocast state, and its RNG
// state, leaving the user's RNG stream and autocast state as they were.
class RerunState {
 public:
  RerunState(const std::vector<std::pair<at::Generator, at::Tensor>>& rng, bool cpu_ac,
             at::ScalarType cpu_dt, bool cuda_ac, at::ScalarType cuda_dt)
      : grad_(true),
        cpu_ac_(at::autocast::is_autocast_enabled(at::kCPU)),
        cuda_ac_(at::autocast::is_autocast_enabled(at::kCUDA)),
        cpu_dt_(at::autocast::get_autocast_dtype(at::kCPU)),
        cuda_dt_(at::autocast::get_autocast_dtype(at::kCUDA)),
        cache_(at::autocast::is_autocast_cache_enabled()) {
    // No autocast weight cache: a re-run runs outside the user's autocast region, so nothing
    // would clear the bf16/fp16 weight copies it cached until the next forward's region ends,
    // memory no plan accounts for (+23% over the predicted peak at 35% under CPU bf16 autocast).
    // Uncached casts give the same values and die with the op.
    at::autocast::set_autocast_cache_enabled(false);
    at::autocast::set_autocast_enabled(at::kCPU, cpu_ac);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_ac);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dt);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dt);
    for (const auto& [gen, state] : rng) {
      at::Generator g = gen;
      std::lock_guard<std::mutex> lock(g.mutex());
      saved_rng_.emplace_back(g, g.get_state());
      g.set_state(state);
    }
  }
  ~RerunState() {
    for (auto& [gen, state] : saved_rng_) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
    at::autocast::set_autocast_enabled(at::kCPU, cpu_ac_);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_ac_);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dt_);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dt_);
    at::autocast::set_autocast_cache_enabled(cache_);
  }

 private:
  at::AutoGradMode grad_;
  bool cpu_ac_, cuda_ac_;
  at::ScalarType cpu_dt_, cuda_dt_;
  bool cache_;
  std::vector<std::pair<at::Generator, at::Tensor>> saved_rng_;
};

// Runs a planned recompute just before its autograd Node (Replayer::node_hook). Cost when the
// node runs: one call; the gradients pass through untouched.
class PlannedNodeHook final : public torch::autograd::FunctionPreHook {
 public:
  PlannedNodeHook(Replayer* r, int64_t node, uint64_t generation) : r_(r), node_(node), generation_(generation) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    r_->node_hook(node_, generation_);
    return grads;
  }
  // Compiled autograd traces hooks; this one has nothing to trace (unpack still rebuilds).
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs&) const override {}

 private:
  Replayer* r_;  // replayers are kept for the process's life (Agent::plans_)
  int64_t node_;
  uint64_t generation_;
};
}  // namespace

// The nodes op `op` created have sequence numbers [its first, the next op's first); those that
// backward reaches hang off its outputs' grad_fns, through next_edges within that range. A Python
// autograd.Function's RecordFunction has no outputs: its nodes are looked for once more from the
// next op's inputs (look_again), which usually read its output; what is still missing is left to
// on-demand rebuilds.
namespace {
// The node a CopySlices (autograd's node for a base whose view was written in place) runs for the
// write, or null. By name: no RTTI of torch's classes needed.
const torch::autograd::Node* copy_slices_fn(torch::autograd::Node* n) {
  if (n->name() != "torch::autograd::CopySlices") return nullptr;
  return static_cast<torch::autograd::CopySlices*>(n)->fn.get();
}
}  // namespace

void Replayer::attach_node_hooks(int64_t op, c10::ArrayRef<at::Tensor> outputs) {
  c10::SmallVector<char, 8> done(node_actions_[op].size(), 0);
  hook_nodes(op, outputs, &done);
  for (size_t i = 0; i < done.size(); ++i)
    if (!done[i]) unhooked_.push_back({op, i});
}

// Cost: nothing unless the previous op left nodes unhooked; then a walk from this op's inputs.
void Replayer::look_again(const at::RecordFunction& fn) {
  std::vector<at::Tensor> inputs;
  for (const c10::IValue& iv : fn.inputs()) for_each_tensor(iv, [&](const at::Tensor& t) { inputs.push_back(t); });
  for (size_t k = 0; k < unhooked_.size();) {
    const int64_t op = unhooked_[k].first;
    c10::SmallVector<char, 8> done(node_actions_[op].size(), 1);
    size_t e = k;
    for (; e < unhooked_.size() && unhooked_[e].first == op; ++e) done[unhooked_[e].second] = 0;
    hook_nodes(op, inputs, &done);
    for (size_t i = 0; i < done.size(); ++i) {
      if (!done[i]) {
        log_once("node-hook", LogLevel::Info,
                 fmt::format("backward node {} ({}) of forward op {} not found in the graph: its planned "
                             "recompute is left to on-demand rebuilds",
                             node_actions_[op][i].node, node_actions_[op][i].name, op));
      }
    }
    k = e;
  }
  unhooked_.clear();
}

void Replayer::hook_nodes(int64_t op, c10::ArrayRef<at::Tensor> from, c10::SmallVectorImpl<char>* done_out) {
  c10::SmallVectorImpl<char>& done = *done_out;
  const int64_t begin = op < static_cast<int64_t>(seq_begin_.size()) ? seq_begin_[op] : -1;
  const int64_t end = at::sequence_number::peek();
  if (begin < 0) return;
  auto in_range = [&](const torch::autograd::Node* n) {
    const auto seq = static_cast<int64_t>(n->sequence_nr());
    return seq >= begin && seq < end;
  };
  c10::SmallVector<torch::autograd::Node*, 16> work, seen;  // an op's nodes: a few
  auto visit = [&](torch::autograd::Node* n) {
    if (n == nullptr || !in_range(n) || std::find(seen.begin(), seen.end(), n) != seen.end()) return;
    seen.push_back(n);
    work.push_back(n);
  };
  for (const at::Tensor& t : from) {
    if (!t.defined()) continue;
    visit(t.grad_fn().get());
    // An op that wrote a view in place (EfficientNet's dropout_ on a flatten) rebased the view's
    // base onto a CopySlices; the view's own grad_fn, made again when asked for, is numbered
    // after the op and leads nowhere in range.
    if (t.is_view()) visit(t._base().grad_fn().get());
  }
  while (!work.empty()) {
    torch::autograd::Node* n = work.back();
    work.pop_back();
    // A CopySlices runs the in-place op's own node (its `fn`, which the profile recorded) inside
    // its apply, where no hook of that node runs: the CopySlices' pre-hook stands for it.
    const torch::autograd::Node* inner = copy_slices_fn(n);
    for (size_t i = 0; i < done.size(); ++i) {
      const NodeAction& a = node_actions_[op][i];
      auto is = [&](const torch::autograd::Node* m) {
        return m != nullptr && begin + a.seq_offset == static_cast<int64_t>(m->sequence_nr()) && m->name() == a.name;
      };
      if (!done[i] && (is(n) || is(inner))) {
        n->add_pre_hook(std::make_unique<PlannedNodeHook>(this, a.node, generation_));
        done[i] = 1;
      }
    }
    for (const torch::autograd::Edge& e : n->next_edges()) visit(e.function.get());
  }
}

std::vector<at::Tensor>* Replayer::capture() { return tl_capture; }

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
  for (const auto& r : plan_.releases) release_after_[r.after_bwd].push_back(r.value);
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
  overwritten_.clear();
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
    if (!s.impl.expired() && s.version == version) {
      src.kind = TensorSource::Kind::Slot;
      src.op = it->second.first;
      src.index = it->second.second;
      return src;
    }
  }
  if (t.has_storage()) {
    // The latest slot on this storage that is still alive, unwritten since: the latest of all
    // may be a view whose tensor is gone (a saved alias the plan evicted, which held the last
    // reference) while an earlier view of the same storage lives on (the `v` of q, k, v split
    // from one projection, which this op reads). Taking only the latest left the pack without
    // a source: kept, not evicted, over the budget (1 of 9 evictions in some GPT-2 plans).
    // Cost: one entry per output viewing the storage (a handful), a weak lock for each newer one.
    std::pair<int64_t, int64_t> found{-1, -1};
    c10::intrusive_ptr<c10::TensorImpl> base;
    const auto [first, last] = slot_by_storage_.equal_range(t.storage().unsafeGetStorageImpl());
    for (auto st = first; st != last; ++st) {
      const auto [o, k] = st->second;
      if (st->second <= found || static_cast<size_t>(k) >= slots_[o].size()) continue;
      const Slot& s = slots_[o][k];
      // Views share their base's version counter: equal versions mean no unrecorded write since.
      if (s.version != version) continue;
      if (auto impl = s.impl.lock()) {
        found = st->second;
        base = std::move(impl);
      }
    }
    if (base) {
      src.kind = TensorSource::Kind::Slot;
      src.op = found.first;
      src.index = found.second;
      at::Tensor b = at::Tensor(std::move(base));
      if (!same_layout(b, t)) {
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
    src.kind = TensorSource::Kind::External;
    src.external = t;
    src.external_version = version;
    auto [e, fresh] = externals_.emplace(t.unsafeGetTensorImpl(), External{t, version, version});
    if (fresh) {
      if (t.has_storage()) external_storage_.emplace(t.storage().unsafeGetStorageImpl(), t.unsafeGetTensorImpl());
      if (written_externals_.count(t.unsafeGetTensorImpl())) snapshot_external(t, version);
    } else {
      e->second.last_version = version;
    }
    return src;
  }
  return src;  // None: the caller decides (an op's internal tensor)
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
  before_write(fn);
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
  int64_t op = at(step_op);
  ahead_ = -1;
  if (op < 0 || static_cast<size_t>(op) >= recipes_.size()) return;
  if (dropped) {
    recipes_[op] = Recipe();
    slots_[op].clear();
    pending_.clear();
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
    if (t.defined()) {
      s.impl = c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr());
      s.counter = t.unsafeGetTensorImpl()->version_counter();
      s.version = s.counter.current_version();
      if (t.has_storage() && t.layout() == at::kStrided) {
        s.storage = c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl());
        s.sizes.assign(t.sizes().begin(), t.sizes().end());
        s.strides.assign(t.strides().begin(), t.strides().end());
        s.offset = t.storage_offset();
        s.options = t.options();
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
  for (Pending& p : pending_) {
    TensorSource src = source_of(p.original, /*unknown_is_external=*/false);
    if (src.kind == TensorSource::Kind::None) {
      src.kind = TensorSource::Kind::Internal;
      src.op = op;
      src.index = p.state->ordinal;
    }
    p.state->source = std::move(src);
  }
  pending_.clear();
  if (!diverged_) {
    evict_after(op);
    compact_after(op);
    hold_after(op);
  }
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

void Replayer::snapshot_external(const at::Tensor& t, uint32_t version) {
  const std::pair<const c10::TensorImpl*, uint32_t> key{t.unsafeGetTensorImpl(), version};
  if (snapshots_.count(key)) return;
  AgentScope scope;  // not an op of the step
  at::NoGradGuard no_grad;
  snapshots_.emplace(key, t.detach().clone(at::MemoryFormat::Preserve));
  ++stats_.snapshots;
}

namespace {
// Whether `t`'s storage no longer holds its elements (resized smaller since: FSDP2 frees a
// block's unsharded parameters after its forward, and gathers them again for its backward).
// Cost: a few multiplications.
bool released(const at::Tensor& t) {
  if (!t.has_storage() || t.layout() != at::kStrided) return false;
  return t.storage().nbytes() <
         at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize(), static_cast<size_t>(t.storage_offset()));
}
}  // namespace

// An external as a re-run must read it: itself if unchanged since `src` captured it (and its
// storage still there), else its snapshot from then (snapshot_external); undefined if neither.
at::Tensor Replayer::external_as_captured(const TensorSource& src) const {
  if (!src.external.defined()) return src.external;
  const c10::TensorImpl* impl = src.external.unsafeGetTensorImpl();
  if (src.external._version() == src.external_version && (overwritten_.empty() || !overwritten_.count(impl)) &&
      !released(src.external)) {
    return src.external;
  }
  auto it = snapshots_.find({impl, src.external_version});
  return it == snapshots_.end() ? at::Tensor() : it->second;
}

bool Replayer::written_unsnapshotted(const c10::TensorImpl* impl, const External& e) const {
  return e.tensor.defined() && (e.tensor._version() != e.version || overwritten_.count(impl)) &&
         !snapshots_.count({impl, e.version});
}

void Replayer::guard_external(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  auto range = external_storage_.equal_range(t.storage().unsafeGetStorageImpl());
  for (auto it = range.first; it != range.second; ++it) {
    auto e = externals_.find(it->second);
    if (e == externals_.end() || !e->second.tensor.defined()) continue;
    const uint32_t now = e->second.tensor._version();
    // Contents no recipe captured (written since, and not captured again) need no copy.
    if (e->second.last_version != now) continue;
    snapshot_external(e->second.tensor, now);
    overwritten_.insert(it->second);  // for a write that leaves the version alone (`.data`)
  }
}

void Replayer::before_write(const at::RecordFunction& fn) {
  if (externals_.empty()) return;
  const std::vector<char>& w = writes_.of(fn);
  if (w.empty()) return;
  const auto inputs = fn.inputs();
  for (size_t i = 0; i < inputs.size() && i < w.size(); ++i) {
    if (w[i]) for_each_tensor(inputs[i], [&](const at::Tensor& t) { guard_external(t); });
  }
}

// Cost: one version read per external captured this step (parameters, inputs, buffers).
bool Replayer::externals_changed() const {
  for (const auto& [impl, e] : externals_) {
    if (written_unsnapshotted(impl, e)) return true;
  }
  return false;
}

// The whole chain a rebuild might re-run (every slot taken as gone: what is alive now may not be
// then), each op once.
const at::Tensor* Replayer::chain_reads_changed_external(const TensorSource& src, std::vector<char>& seen,
                                                        int depth) {
  static const at::Tensor kUnfollowable;
  if (depth > kMaxDepth) return &kUnfollowable;
  switch (src.kind) {
    case TensorSource::Kind::External:
      if (src.external.defined() && !external_as_captured(src).defined()) {
        refused_by_.insert(src.external.unsafeGetTensorImpl());
        return &src.external;
      }
      return nullptr;
    case TensorSource::Kind::None:
      return &kUnfollowable;
    case TensorSource::Kind::Slot:
    case TensorSource::Kind::Internal:
      break;
  }
  if (src.op < 0 || static_cast<size_t>(src.op) >= recipes_.size()) return &kUnfollowable;
  if (seen[src.op]) return nullptr;
  seen[src.op] = 1;
  for (const Arg& a : recipes_[src.op].args) {
    for (const TensorSource& t : a.tensors) {
      if (const at::Tensor* w = chain_reads_changed_external(t, seen, depth + 1)) return w;
    }
  }
  return nullptr;
}

void Replayer::evict_after(int64_t op) {
  // Rare: something wrote an external in place since a recipe captured it, unseen (an optimizer
  // step inside the step's window; writes we see are copied first, before_write). Then each
  // eviction's chain is checked, and a value whose rebuild would read the new contents is kept.
  const bool changed = externals_changed();
  for (int64_t v : evict_after_[op]) {
    each_resident(handles_, v, [&](SavedState& s) {
      if (s.source.kind == TensorSource::Kind::External || !rebuildable(s.source)) {
        ++stats_.not_rebuildable;
        ++refused_;
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
    });
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

// Whether output `index` of `op` can be had without re-running it (alive, or its storage alive
// and unchanged).
at::Tensor Replayer::Slot::view(c10::Storage storage, int64_t at_offset) const {
  at::Tensor t = at::empty({0}, options);
  t.set_(std::move(storage), at_offset, sizes, strides);
  return t;
}

bool Replayer::slot_available(int64_t op, int64_t index) const {
  const Slot& s = slots_[op][index];
  if (auto impl = s.impl.lock()) return impl->version_counter().current_version() == s.version;
  if (!s.storage.expired()) return s.counter.enabled() && s.counter.current_version() == s.version;
  return held_view(op, index, /*make=*/false).defined();
}

at::Tensor Replayer::held_view(int64_t op, int64_t index, bool make) const {
  const Slot& s = slots_[op][index];
  // The forward's storage must be gone: while it lives, what shares it is the forward's own
  // tensor, which the version checks before this judge.
  const c10::StorageImpl* storage = s.storage._unsafe_get_target();
  if (storage == nullptr || !s.storage.expired() || !s.counter.enabled()) return at::Tensor();
  if (static_cast<size_t>(op) >= output_values_.size() || static_cast<size_t>(index) >= output_values_[op].size())
    return at::Tensor();
  const int64_t v = output_values_[op][index];
  if (v < 0) return at::Tensor();
  // `t` was re-made as output `from_index` of `from_op` (viewed as `src` if a view): it stands for
  // the forward's storage at that slot's version, laid out as the forward's was, shifted by where
  // it starts in it.
  auto view_of = [&](const at::Tensor& t, int64_t from_op, int64_t from_index, const TensorSource* src) {
    if (!t.defined() || !t.has_storage() || t.layout() != at::kStrided) return at::Tensor();
    const Slot& from = slots_[from_op][from_index];
    // Views of one storage share one version counter: equal versions, equal contents.
    if (from.storage._unsafe_get_target() != storage || from.version != s.version) return at::Tensor();
    const bool viewed = src != nullptr && src->view;
    if (!t.sizes().equals(viewed ? src->sizes : from.sizes) || !t.strides().equals(viewed ? src->strides : from.strides) ||
        t.scalar_type() != s.options.dtype().toScalarType()) {
      return at::Tensor();
    }
    const int64_t offset = s.offset + t.storage_offset() - (viewed ? src->offset : from.offset);
    int64_t last = offset;
    for (size_t d = 0; d < s.sizes.size(); ++d) {
      if (s.sizes[d] == 0) return at::Tensor();
      last += (s.sizes[d] - 1) * s.strides[d];
    }
    if (offset < 0 || (last + 1) * static_cast<int64_t>(t.element_size()) > static_cast<int64_t>(t.storage().nbytes()))
      return at::Tensor();
    return make ? s.view(t.storage(), offset) : t;
  };
  if (auto h = holds_.find(v); h != holds_.end() && h->second.op >= 0) {
    if (at::Tensor t = view_of(h->second.tensor, h->second.op, h->second.index, nullptr); t.defined()) return t;
  }
  // A saved tensor of the value a recompute put back (SDPA's q, k, v; the next recompute re-runs
  // SDPA for its output).
  if (auto h = handles_.find(v); h != handles_.end()) {
    for (const auto& w : h->second) {
      auto st = w.lock();
      if (!st || st->evicted || st->source.kind != TensorSource::Kind::Slot) continue;
      if (at::Tensor t = view_of(st->tensor, st->source.op, st->source.index, &st->source); t.defined()) return t;
    }
  }
  return at::Tensor();
}

void Replayer::count_uses(const TensorSource& src, Memo& memo, int depth) {
  if (depth > kMaxDepth) throw std::runtime_error("memplan: rebuild chain too deep");
  int64_t op = -1;
  if (src.kind == TensorSource::Kind::Slot) {
    if (src.op < 0 || static_cast<size_t>(src.op) >= slots_.size() ||
        static_cast<size_t>(src.index) >= slots_[src.op].size()) {
      throw std::runtime_error("memplan: rebuild refers to an unknown op output");
    }
    if (slot_available(src.op, src.index)) return;
    ++memo.output_uses[{src.op, src.index}];
    op = src.op;
  } else if (src.kind == TensorSource::Kind::Internal) {
    ++memo.pack_uses[{src.op, src.index}];
    op = src.op;
  } else {
    return;
  }
  if (memo.will_run.size() <= static_cast<size_t>(op)) memo.will_run.resize(recipes_.size(), false);
  if (memo.will_run[op]) return;
  memo.will_run[op] = true;
  for (const Arg& a : recipes_.at(op).args) {
    for (const TensorSource& t : a.tensors) count_uses(t, memo, depth + 1);
  }
}

namespace {
// Takes one use of a memo entry; the entry goes at its last use.
at::Tensor take(std::map<std::pair<int64_t, int64_t>, at::Tensor>& entries,
                std::map<std::pair<int64_t, int64_t>, int>& uses, std::pair<int64_t, int64_t> key) {
  auto e = entries.find(key);
  if (e == entries.end()) return at::Tensor();
  at::Tensor t = e->second;
  auto u = uses.find(key);
  if (u == uses.end() || --u->second <= 0) {
    entries.erase(e);
    if (u != uses.end()) uses.erase(u);
  }
  return t;
}
}  // namespace

at::Tensor Replayer::slot_tensor(int64_t op, int64_t index, Memo& memo, int depth) {
  if (at::Tensor t = take(memo.outputs, memo.output_uses, {op, index}); t.defined()) return t;
  if (op < 0 || static_cast<size_t>(op) >= slots_.size() || static_cast<size_t>(index) >= slots_[op].size()) {
    throw std::runtime_error("memplan: rebuild refers to an unknown op output");
  }
  const Slot& s = slots_[op][index];
  if (auto impl = s.impl.lock()) {
    at::Tensor live(impl);
    if (impl->version_counter().current_version() == s.version) return live;
  } else if (auto storage = s.storage.lock()) {
    // The output tensor is gone but its storage is alive (a saved alias, a view) and unchanged:
    // view it again instead of re-running the op.
    if (s.counter.enabled() && s.counter.current_version() == s.version) {
      return s.view(c10::Storage(std::move(storage)), s.offset);
    }
  }
  if (at::Tensor t = held_view(op, index, /*make=*/true); t.defined()) return t;
  if (memo.output_uses.find({op, index}) == memo.output_uses.end()) memo.output_uses[{op, index}] = 1;
  run_op(op, memo, depth + 1);
  at::Tensor t = take(memo.outputs, memo.output_uses, {op, index});
  if (!t.defined()) throw std::runtime_error("memplan: re-run returned fewer outputs");
  return t;
}

at::Tensor Replayer::resolve(const TensorSource& src, Memo& memo, int depth) {
  if (depth > kMaxDepth) throw std::runtime_error("memplan: rebuild chain too deep");
  switch (src.kind) {
    case TensorSource::Kind::External:
      // Written in place after the value was evicted: its old contents are gone, and re-running
      // with the new ones would give another tensor. Fail loudly rather than differ silently.
      if (!src.external.defined()) return src.external;
      if (at::Tensor t = external_as_captured(src); t.defined()) return t;
      refused_by_.insert(src.external.unsafeGetTensorImpl());
      throw std::runtime_error(
          "memplan: an input of a recomputed op was written in place after its value was evicted; "
          "cannot rebuild it bit for bit (set MEMPLAN_DISABLE=1 for this script)");
    case TensorSource::Kind::Slot: {
      at::Tensor base = slot_tensor(src.op, src.index, memo, depth);
      if (!src.view) return base;
      return at::as_strided(base, src.sizes, src.strides, src.offset);
    }
    case TensorSource::Kind::Internal: {
      const std::pair<int64_t, int64_t> key{src.op, src.index};
      if (at::Tensor t = take(memo.packs, memo.pack_uses, key); t.defined()) return t;
      if (memo.pack_uses.find(key) == memo.pack_uses.end()) memo.pack_uses[key] = 1;
      run_op(src.op, memo, depth + 1);
      at::Tensor t = take(memo.packs, memo.pack_uses, key);
      if (!t.defined()) {
        const Recipe& r = recipes_.at(src.op);
        throw std::runtime_error(fmt::format("memplan: re-run packed fewer tensors (forward op {} {}, pack {})", src.op,
                                             r.op ? r.op->schema().name() : "?", src.index));
      }
      return t;
    }
    case TensorSource::Kind::None:
      break;
  }
  throw std::runtime_error("memplan: tensor has no source to rebuild it from");
}

std::shared_ptr<SavedState> Replayer::tail_mask(int64_t op, const Memo& memo) const {
  auto m = op_mask_.find(op);
  if (m == op_mask_.end() || tail_state_[op] < 0) return nullptr;
  const Recipe& r = recipes_[op];
  if (r.args.empty() || r.args[0].kind != Arg::Kind::Tensor || r.op->schema().name() != "aten::dropout")
    return nullptr;
  for (const auto& [key, uses] : memo.pack_uses)
    if (key.first == op) return nullptr;  // an evicted pack of this op is rebuilt from this run
  auto h = handles_.find(m->second);
  if (h == handles_.end()) return nullptr;
  for (const auto& w : h->second) {
    auto s = w.lock();
    if (s && s->compact) return s;
  }
  return nullptr;
}

void Replayer::run_op(int64_t op, Memo& memo, int depth) {
  const Recipe& r = recipes_.at(op);
  if (!r.valid || !r.op) throw std::runtime_error("memplan: no recipe to rebuild from");
  // Dropout with its mask kept compact: on the CPU aten::dropout returns `input * noise` (after
  // drawing noise); the noise is the compact mask, so that product is the op's output bit for bit,
  // without the random draw. Checked against a full re-run the first time (below).
  const std::shared_ptr<SavedState> mask = tail_mask(op, memo);
  if (mask && tail_state_[op] == 1) {
    at::Tensor in = resolve(r.args[0].tensors[0], memo, depth);
    if (tail_fits(in, mask->mask)) {
      at::Tensor out;
      {
        AgentScope scope;
        at::NoGradGuard no_grad;
        out = at::mul(in.detach(), expand_mask(mask->mask));
      }
      ++stats_.ops_rerun;
      ++stats_.tail_reruns;
      const std::pair<int64_t, int64_t> key{op, 0};
      if (memo.output_uses.count(key)) memo.outputs[key] = out;
      return;
    }
    tail_state_[op] = -1;  // cannot happen in a step that matches the profile; never again
  }
  torch::jit::Stack stack;
  stack.reserve(r.args.size());
  auto prepare = [&](const TensorSource& src, bool requires_grad, bool written) {
    at::Tensor t = resolve(src, memo, depth);
    if (!t.defined()) return t;
    // A tensor this rebuild made that nothing else holds (the memo gave up its last use: a
    // BatchNorm output that an in-place activation re-run writes) may be written where it is:
    // no one can see the write. Copying it was memory the plan did not count (a CNN with
    // in-place Hardswish at its minimum budget measured +10.7% over its predicted peak).
    // Dense in any layout, not only contiguous: a channels-last one copied measured +12.1% over
    // the prediction (CNN with Hardswish, channels-last, at its minimum budget). Cost: two
    // refcount reads and a cached flag.
    const bool exclusive = written && t.use_count() == 1 && t.has_storage() && t.storage().use_count() == 1 &&
                           t.is_non_overlapping_and_dense();
    // Never let a re-run write a live tensor (BatchNorm running stats, in-place ops): scratch.
    // An argument that required grad gets it again, so the re-run records and packs as the
    // original did. A written one is made a non-leaf, with grad mode on (a rebuild mostly runs
    // inside backward, where it is off): an in-place op on a leaf that requires grad is an error
    // (hardswish_ on a BatchNorm output, in MobileNetV3). A copy does that; so does
    // _unsafe_view, with no copy, for an exclusive one (autograd sees a new tensor, not a view
    // of the leaf, which it would refuse to write in place too).
    t = t.detach();
    if (requires_grad) t.requires_grad_(true);
    if (written) {
      AgentScope scope;  // not an op of the step
      at::AutoGradMode grad(requires_grad);
      if (!exclusive) {
        t = t.clone(at::MemoryFormat::Preserve);
      } else if (requires_grad) {
        t = at::_unsafe_view(t, t.sizes());
      }
    }
    return t;
  };
  for (const Arg& a : r.args) {
    switch (a.kind) {
      case Arg::Kind::Constant:
        stack.push_back(a.constant);
        break;
      case Arg::Kind::Tensor:
        stack.emplace_back(prepare(a.tensors[0], a.requires_grad[0], a.written));
        break;
      case Arg::Kind::TensorList: {
        std::vector<at::Tensor> list;
        for (size_t i = 0; i < a.tensors.size(); ++i) list.push_back(prepare(a.tensors[i], a.requires_grad[i], a.written));
        stack.emplace_back(std::move(list));
        break;
      }
      case Arg::Kind::OptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        size_t j = 0;
        for (bool present : a.present) {
          if (present) {
            list.push_back(prepare(a.tensors[j], a.requires_grad[j], a.written));
            ++j;
          } else {
            list.push_back(std::nullopt);
          }
        }
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
  at::Tensor tail_input;  // kept for the one-time check of the dropout tail
  if (mask && tail_state_[op] == 0 && !stack.empty() && stack[0].isTensor()) tail_input = stack[0].toTensor();
  std::vector<at::Tensor> packs;
  {
    AgentScope scope;  // our callbacks ignore the re-run
    // A re-run must pack through our hooks (that is how internal tensors are recovered), also
    // inside an op whose own packs bypass them (Agent::op_start) and during backward, when the
    // shim has taken them off the stack.
    pack_hooks::OnTop hooks;
    RerunState state(r.rng, r.autocast_cpu, r.autocast_cpu_dtype, r.autocast_cuda, r.autocast_cuda_dtype);
    std::vector<at::Tensor>* outer = tl_capture;
    tl_capture = &packs;
    try {
      r.op->callBoxed(&stack);
    } catch (...) {
      tl_capture = outer;
      throw;
    }
    tl_capture = outer;
  }
  ++stats_.ops_rerun;
  if (tail_input.defined()) {
    bool same = false;
    if (!stack.empty() && stack[0].isTensor()) {
      AgentScope scope;
      at::NoGradGuard no_grad;
      same = tail_matches(tail_input.detach(), mask->mask, stack[0].toTensor().detach());
    }
    tail_state_[op] = same ? 1 : -1;
    if (!same) {
      log_once("dropout-tail", LogLevel::Warn,
               fmt::format("forward op {}: input x mask differs from re-running dropout; re-running it", op));
    }
  }
  // Keep only what a planned use will take; the rest dies here.
  int64_t k = 0;
  auto keep_output = [&](const at::Tensor& t) {
    const std::pair<int64_t, int64_t> key{op, k++};
    if (memo.output_uses.count(key)) memo.outputs[key] = t.detach();
  };
  for (const c10::IValue& iv : stack) {
    if (iv.isTensor()) {
      keep_output(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorVector()) keep_output(t);
    }
  }
  for (size_t p = 0; p < packs.size(); ++p) {
    const std::pair<int64_t, int64_t> key{op, static_cast<int64_t>(p)};
    if (memo.pack_uses.count(key)) memo.packs[key] = packs[p];
  }
}

void Replayer::rebuild(SavedState& s, Memo& memo) {
  at::Tensor t = resolve(s.source, memo, 0);
  s.tensor = t.defined() ? t.detach() : t;
  s.evicted = false;
  ++stats_.rebuilt;
}

void Replayer::node_start(int64_t node, const char* name) {
  if (diverged_ || !follow_nodes_) return;
  if (static_cast<size_t>(node) >= node_names_.size() || node_names_[node] != name) {
    follow_nodes_ = false;  // the backward took another order: rely on on-demand rebuilds
    log_once("node-order", LogLevel::Debug,
             fmt::format("backward node {} ({}) differs from the profile; planned recomputes off", node, name));
    return;
  }
  if (via_callback_[node]) planned_recompute(node);
}

void Replayer::node_end(int64_t node) {
  if (diverged_ || !follow_nodes_ || static_cast<size_t>(node) >= via_callback_.size() || !via_callback_[node]) return;
  run_releases(node);
}

void Replayer::node_hook(int64_t node, uint64_t generation) {
  if (generation != generation_ || diverged_) return;  // a graph kept from an earlier step
  const auto t0 = std::chrono::steady_clock::now();
  ++stats_.node_hooks;
  planned_recompute(node);
  // The node's releases are of holds only recomputes read, the last of them this one: free them
  // now rather than after the node (no post hook: it would keep the node's incoming gradients
  // alive through the node, memory no plan counts).
  run_releases(node);
  hook_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

int64_t Replayer::take_hook_ns() {
  const int64_t ns = hook_ns_;
  hook_ns_ = 0;
  return ns;
}

void Replayer::planned_recompute(int64_t node) {
  try {
    run_recompute(node);
  } catch (const std::exception& e) {
    // Unpack rebuilds on demand (or reports) for the tensors this did not put back.
    log_once("planned-rebuild", LogLevel::Warn, std::string("planned recompute failed: ") + e.what());
  }
}

void Replayer::run_recompute(int64_t node) {
  auto it = recompute_before_.find(node);
  if (it == recompute_before_.end()) return;
  AgentScope scope;  // the ops a rebuild runs (views, re-runs) are ours, never the step's
  ActionSpan span(this, "memplan/recompute",
                  naming_actions() ? fmt::format("memplan/recompute before node {}", node) : std::string());
  Memo memo;
  // Count every planned use first, so each intermediate goes at its last use.
  for (int64_t v : it->second->keep) {
    auto h = handles_.find(v);
    bool had_handles = false;
    if (h != handles_.end()) {
      for (auto& w : h->second) {
        auto s = w.lock();
        if (!s) continue;
        had_handles = true;
        if (s->evicted) count_uses(s->source, memo, 0);
      }
    }
    auto slot = value_slot_.find(v);
    if (!had_handles && slot != value_slot_.end()) {
      count_uses(TensorSource{TensorSource::Kind::Slot, slot->second.first, slot->second.second}, memo, 0);
    }
  }
  for (int64_t v : it->second->keep) {
    bool had_handles = false;
    auto h = handles_.find(v);
    if (h != handles_.end()) {
      for (auto& w : h->second) {
        auto s = w.lock();
        if (!s) continue;
        had_handles = true;
        if (s->evicted) rebuild(*s, memo);
      }
    }
    if (!had_handles) {
      // A checkpoint a later recompute reads: keep it until its release.
      auto slot = value_slot_.find(v);
      if (slot != value_slot_.end()) {
        holds_[v] = Hold{slot_tensor(slot->second.first, slot->second.second, memo, 0), slot->second.first,
                         slot->second.second};
      }
    }
  }
}


void Replayer::run_releases(int64_t node) {
  auto it = release_after_.find(node);
  if (it == release_after_.end()) return;
  for (int64_t v : it->second) {
    if (holds_.erase(v)) {
      if (naming_actions()) {
        action(fmt::format("memplan/free value {} after node {}", v, node).c_str(), std::chrono::steady_clock::now(), false);
      } else {
        action("memplan/free", {}, false);
      }
    }
  }
}

at::Tensor Replayer::materialize(SavedState& s) {
  if (!s.evicted) return s.tensor;
  // Also outside backward (a script reading grad_fn._saved_* in forward): these ops are ours.
  AgentScope scope;
  if (s.compact) {  // each unpack gets its own copy, freed when the node is done with it
    ++stats_.expanded;
    return expand_mask(s.mask);
  }
  ++stats_.on_demand;
  log_once("on-demand", LogLevel::Debug, "a saved tensor was needed before its planned recompute; rebuilt on demand");
  ActionSpan span(this, "memplan/recompute on demand",
                  naming_actions() ? fmt::format("memplan/recompute value {} on demand", s.value) : std::string());
  Memo memo;
  count_uses(s.source, memo, 0);
  rebuild(s, memo);
  return s.tensor;
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
          log_once("end-rebuild", LogLevel::Warn, std::string("could not restore a saved tensor: ") + e.what());
        }
      }
    }
  }
  ++stats_.steps;
  logging_actions_ = false;
  begin_step();  // drop the step's state now, not at the next step
}

}  // namespace memplan
