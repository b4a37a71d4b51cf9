// The replayer's part in backward: the hooks on the autograd nodes before which the plan recomputes
// (hook_nodes: found from each op's outputs, from a view's base, inside a CopySlices), the planned
// recomputes they run and the holds freed after them.
#include "agent/replay.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/tensor.h>

#include <algorithm>

#include "agent/log.h"
#include "hooks/op_callbacks.h"
#include "profiler/tensor_args.h"

namespace memplan {

namespace {

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
    log_once("planned-rebuild", LogLevel::Warn, "planned recompute failed: " + brief(e));
  }
}

void Replayer::run_recompute(int64_t node) {
  auto it = recompute_before_.find(node);
  if (it == recompute_before_.end()) return;
  if (!op_running_) settle_writes();
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
  // Each op once, in forward order, before anything is taken: the order the simulator prices
  // (simulate.cpp: outputs made op by op, each freed after its last reader in the action).
  // Resolved depth-first from the kept values instead, an argument came before the ops made for
  // the next one: zeros_like's tensor (scatter_'s first argument) stood while the chain of its
  // second (max's indices, from the softmax of the Gumbel noise) was re-made, 1.5 MiB over the
  // prediction (gumbel_step.py at 1%, +5.8% in some plans). Every input a re-run reads is then in
  // the memo already, made by an earlier op. Cost: a pass over the flags.
  for (size_t o = 0; o < memo.will_run.size(); ++o) {
    if (memo.will_run[o]) run_op(static_cast<int64_t>(o), memo, 0);
  }
  for (int64_t v : it->second->keep) {
    bool had_handles = false;
    at::Tensor saved;  // as a saved tensor has it, for a hold
    auto h = handles_.find(v);
    if (h != handles_.end()) {
      for (auto& w : h->second) {
        auto s = w.lock();
        if (!s) continue;
        had_handles = true;
        if (s->evicted) rebuild(*s, memo);
        if (!saved.defined() && !s->evicted) saved = s->tensor;
      }
    }
    auto slot = value_slot_.find(v);
    if (slot == value_slot_.end()) continue;
    const auto [op, index] = slot->second;
    if (!had_handles) {
      // A checkpoint a later recompute reads: keep it until its release.
      holds_[v] = Hold{slot_tensor(op, index, memo, 0), op, index};
      continue;
    }
    // Saved, and read by a later recompute too (a layer's output that the next layer's rebuild
    // starts from): autograd frees it after its last unpack, the plan keeps it to its release
    // (simulate.cpp: a kept value's copy ends at the later of the two). Held only by the saved
    // tensor, it was re-made from the step's first op for that later recompute: gumbel_step.py
    // at 1% with such a plan, 6 MiB in transients where 1.5 were planned, +3.8% over the
    // prediction, and its kind planned again. The hold is the saved tensor, where it is laid out
    // as the op's output (held_view re-views a hold as the output it stands for).
    auto last = last_release_.find(v);
    if (last == last_release_.end() || last->second < node || !saved.defined() || static_cast<size_t>(op) >= slots_.size() ||
        static_cast<size_t>(index) >= slots_[op].size()) {
      continue;
    }
    if (saved.has_storage() && slots_[op][index].laid_out_as(saved)) holds_[v] = Hold{saved, op, index};
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

}  // namespace memplan
