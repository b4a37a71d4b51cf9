// Gradient accumulation, a kind whose plan counts gradients its steps may not allocate
// (profiler/kind_profile.h): watched, planned again without them, and sent back.
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>

#include "agent/agent.h"
#include "agent/log.h"
#include "agent/options.h"
#include "profiler/bytes.h"
#include "profiler/kind_profile.h"

namespace memplan {

namespace {
// The parameter a node's graph reaches first within `depth` edges (depth first), or null.
const at::Tensor* param_behind(const torch::autograd::Node& fn, int depth) {
  for (const torch::autograd::Edge& e : fn.next_edges()) {
    const torch::autograd::Node* next = e.function.get();
    if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(next)) return &acc->variable;
    if (next && depth > 1) {
      if (const at::Tensor* p = param_behind(*next, depth - 1)) return p;
    }
  }
  return nullptr;
}
}  // namespace

// One parameter is watched for whether a step begins with gradients (credit_at_begin): the first
// leaf that requires grad saved for backward in a step recorded whole (kept while it lives), or
// the first one a few nodes behind a saved tensor (Linear saves its weight transposed; under
// autocast, a transposed copy). Each plan keeps the one of when it was made; in a replayed step
// of a plan that counts gradients some of its steps may not allocate, where only the planned
// ops' packs come here, it is taken again from those when it is gone (a script that replaces its
// parameters). Until one is found: at most 3 + 9 + 27 edges per pack.
void Agent::watch_param(const at::Tensor& t) {
  constexpr int kDepth = 3;
  c10::weak_intrusive_ptr<c10::TensorImpl>& w =
      choice_.profile ? step_param_ : plans_[static_cast<size_t>(choice_.plan)].grads.param;
  if (!w.expired()) return;
  const at::Tensor* param = t.is_leaf() ? (t.requires_grad() ? &t : nullptr)
                            : t.grad_fn() ? param_behind(*t.grad_fn(), kDepth)
                                          : nullptr;
  if (param) w = c10::weak_intrusive_ptr<c10::TensorImpl>(param->getIntrusivePtr());
}

// A step about to replay a plan made without the gradients (check_gradient_credit) while its
// watched parameter has none: this step allocates them (zeroed with set_to_none, and the
// logging that made its first micro-steps a kind apart has stopped). It and the later ones
// replay the plan that counts them, decided before any of its ops ran. Gradients present at the
// begin allocate nothing new: zeroed inside the step (between forward and backward), they were
// in its baseline. Only a watched leaf that is no parameter of the optimizer (a script's own
// leaf whose gradient it never resets) misleads this; check_gradient_credit then sees the step
// allocate them at its end. Once per step: a weak pointer's lock and a read.
//
// And a step that begins without them, of a kind whose plan was made from a record that began
// with them (and counts none: gradients zeroed between forward and backward were in that
// record's baseline), allocates them above its baseline: the step after a backward that raised
// (--zero-grad-late --backward-raises-at: tv-regnet +17.9% over the prediction, tools/soak.py).
// It replays a plan made from a record of the kind that began without them (plan_without_gradients).
void Agent::credit_at_begin() {
  if (choice_.profile || choice_.plan < 0) return;
  const auto index = static_cast<size_t>(choice_.plan);
  PlanRecord& rec = plans_[index];
  PlanRecord::Gradients& g = rec.grads;
  if (g.fresh_bytes == 0 && g.credited < 0 && g.began_with_grads && lacks_gradient(g.param)) {
    const int variant = plan_without_gradients(index);
    if (variant >= 0) choice_.plan = variant;
    return;
  }
  if (g.credited < 0 || g.fresh_bytes == 0 || !lacks_gradient(g.param)) return;
  info("step {} begins with no gradients, and will allocate the {} of them its plan left out (gradient "
       "accumulation): its kind of step goes back to the plan that counts them",
       steps_, format_bytes(g.fresh_bytes));
  g.fresh_bytes = 0;  // watched no more
  choice_.plan = g.credited;
  kinds_.set_plan(rec.kind, g.credited);
}

// `param` is alive and has no gradient. Cost: a weak pointer's lock and a read.
bool Agent::lacks_gradient(const c10::weak_intrusive_ptr<c10::TensorImpl>& param) const {
  const c10::intrusive_ptr<c10::TensorImpl> p = param.lock();
  return p && !at::Tensor(p).grad().defined();
}

// The plan for the steps of plans_[index]'s kind that begin without gradients: made the first
// time one does (planning then, once, at that step's first op), from the latest record of the
// kind that began so (the run's first step, often: one-time allocations in it make the plan
// err on the safe side); with none, from the kind's latest record with the gradients its backward
// added into kept (with_gradients_kept). Negative when that adds nothing (the step runs the kind's
// plan).
int Agent::plan_without_gradients(size_t index) {
  PlanRecord& rec = plans_[index];
  if (rec.grads.without_grads != -1) return rec.grads.without_grads;
  rec.grads.without_grads = -2;
  // The variant from `p`, its plan cache tag and what its source adds.
  auto variant_from = [&](const Profile& p, const char* tag, const char* source) {
    PlanRecord variant = make_plan(p, tag);
    variant.grads.variant_of = static_cast<int>(index);
    variant.info.source += source;
    plans_.push_back(std::move(variant));  // (rec is invalid from here)
    const int at = static_cast<int>(plans_.size()) - 1;
    plans_[index].grads.without_grads = at;
    return at;
  };
  for (size_t i = profiles_.size(); i-- > 0;) {
    if (profiles_[i].signature != rec.kind || began_[i] != kWithoutGrads) continue;
    info("step {} begins without gradients, unlike step {} that its kind's plan was made from: the kind's steps "
         "that do replay a plan made from step {}, which began so too",
         steps_, rec.record_step, profiles_[i].step);
    return variant_from(profiles_[i], "-without-gradients", ", for steps that begin without gradients");
  }
  // No step of the kind began so (re-profiled in a later micro-step after a divergence, one
  // warm-up step): its latest record as such a step runs it, each gradient its backward freed
  // kept (kind_profile.h).
  for (size_t i = profiles_.size(); i-- > 0;) {
    if (profiles_[i].signature != rec.kind) continue;
    int64_t kept = 0;
    const Profile p = with_gradients_kept(profiles_[i], &kept);
    if (kept == 0) return -1;
    info("step {} begins without gradients, unlike step {} that its kind's plan was made from, and no recorded "
         "step of its kind began so: the kind's steps that do replay a plan made from step {} with the {} of "
         "gradients its backward added into kept, as a step that begins without them keeps them",
         steps_, rec.record_step, profiles_[i].step, format_bytes(kept));
    return variant_from(p, "-gradients-kept", ", for steps that begin without gradients (its gradients kept)");
  }
  return -1;
}

// Whether the gradients a plan counts are ever allocated by its steps (kind_profile.h). They are
// when the kind runs every first micro-step of an accumulation; they are not when those steps
// begin with other ops (the script reads its parameters between the optimizer step and the next
// forward: a kind of their own), and the run's first step, which allocated them, was the only
// one; or when the script zeroes them between forward and backward (then the step's baseline
// held them: freed, then allocated again, they add nothing). Then the plan over-predicts by them
// (tv-regnet with --log-grads --accum 2 at 50%: -16.6%; the CNN with --zero-grad-late: -7.5%)
// and recomputes more than the budget asks. Once two optimizer rounds have passed since the plan
// (a round's first micro-step, of this kind, would have allocated them) and two of its steps
// allocated none, peaking under the prediction, the kind is planned again without them (its own
// record; a percentage budget is of that record's activations). A step of that plan that
// allocates them after all sends the kind back to the plan that counts them, for good: before it
// runs (credit_at_begin) or, when nothing told, after (then that one step passed its prediction
// by them). Once per step: a compare.
void Agent::check_gradient_credit(const Profile& p) {
  constexpr int kFreeSteps = 2, kFreeRounds = 2;
  if (choice_.profile || choice_.plan < 0) return;
  const auto index = static_cast<size_t>(choice_.plan);
  PlanRecord& rec = plans_[index];
  if (rec.grads.fresh_bytes == 0 || kinds_.plan_of(rec.kind) != static_cast<int>(index)) return;
  const Profile& u = *rec.grads.uncredited;
  // What the step left allocated beyond what the record without them left: the gradients.
  const bool fresh = (p.end_bytes - p.baseline_bytes) - (u.end_bytes - u.baseline_bytes) > rec.grads.fresh_bytes / 2;
  if (rec.grads.credited >= 0) {
    if (!fresh) return;
    warn("step {} allocated the {} of gradients its plan left out (gradient accumulation): its kind of step "
         "goes back to the plan that counts them",
         p.step, format_bytes(rec.grads.fresh_bytes));
    kinds_.set_plan(rec.kind, rec.grads.credited);
    rec.grads.fresh_bytes = 0;  // watched no more
    return;
  }
  if (rec.grads.credit_settled) return;
  if (fresh) {
    rec.grads.credit_settled = true;
    return;
  }
  if (p.signature != rec.kind || (rec.replayer && rec.replayer->diverged())) return;
  rec.grads.free_peak = std::max(rec.grads.free_peak, p.peak_bytes - p.baseline_bytes);
  if (++rec.grads.fresh_free < kFreeSteps || opt_rounds_ - rec.grads.rounds_at_plan < kFreeRounds) return;
  rec.grads.credit_settled = true;
  // Nothing planned that counting them made more of; or the user's plan file, which any plan
  // of these ops would be again; or the steps peaked as predicted all the same (elsewhere than
  // where the gradients would add: GPT-2's peak comes before them), so another plan would do
  // about the same: not worth planning again (a second, for GPT-2).
  const int64_t predicted = rec.info.predicted_peak - rec.info.baseline;
  if (!rec.replayer || !options().plan.empty() || rec.grads.free_peak >= predicted - predicted / 50) return;
  info("{} later steps of the kind of step {}, over {} optimizer steps, allocated none of the {} of gradients "
       "that step allocated (they exist when its steps begin, or are zeroed within them): that kind is planned "
       "again without them",
       rec.grads.fresh_free, rec.grads.fresh_from, opt_rounds_ - rec.grads.rounds_at_plan,
       format_bytes(rec.grads.fresh_bytes));
  PlanRecord next = make_plan(*rec.grads.uncredited, "-without-fresh-gradients");
  next.grads.uncredited = rec.grads.uncredited;
  next.grads.fresh_bytes = rec.grads.fresh_bytes;
  next.grads.fresh_from = rec.grads.fresh_from;
  next.grads.credited = static_cast<int>(index);
  next.info.source += ", its gradients not counted";
  next.grads.param = rec.grads.param;
  plans_.push_back(std::move(next));  // (rec is invalid from here)
  kinds_.set_plan(plans_.back().kind, static_cast<int>(plans_.size()) - 1);
}

}  // namespace memplan
