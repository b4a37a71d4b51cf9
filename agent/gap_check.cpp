// The gap between forward and backward: what a replayed step freed there, against what its plan
// counted on (profiler/kind_profile.h with_gap_kept); and what it left allocated at its end.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/log.h"
#include "agent/options.h"
#include "planner/graph.h"
#include "planner/simulate.h"
#include "profiler/bytes.h"
#include "profiler/kind_profile.h"
#include "profiler/op_hash.h"
#include "profiler/profile_io.h"

namespace memplan {

// A plan predicts the steps of its kind from one record, and takes what the script freed between
// that record's forward and backward (zero_grad there) as every step's. It may not be: the script
// frees what the step before left, and a step of another kind may have left more (the gradients
// of the layers only it ran: --depth-random), or only the first micro-step of an accumulation
// frees anything there. A later step that frees less runs its whole backward that much above the
// prediction (GPT-2 --accum 2 --depth-random --zero-grad-late at 1%: its one-block steps +15.5%
// and +8.9% in turn, their only record being one that followed a four-block step; tools/soak.py).
// No record can tell beforehand; the replayed steps can: one that freed less there than the
// plan's record by more than the margin, and peaked over the prediction by more than it too, has
// its kind planned again from that record with the difference kept through backward. That one
// step ran over its prediction (the report links the plans: "remade_from").
//
// The other way, a record that freed less than its kind's later steps: the run's first step
// (MEMPLAN_WARMUP=1) had no gradients to zero there, each later one frees them (--zero-grad-late:
// GPT-2 at 50% 17.6% under the prediction, the CNN 6.9%), so the plan recomputes more than the
// budget asks. Safe, so the kind is planned again only after kLowerSteps replayed steps in a
// row each freed more by the margin and peaked under by it, for the least any of them freed
// more: accumulation's micro-steps that alternate (the first zeroes, the later keep) never do.
//
// And a step that ran over the prediction by the margin and ended with more allocated than the
// record by it too (beyond their baselines), or, recorded whole, ran more backward nodes than the
// record (what they made may be freed before the end), made in its backward what the record's did
// not: the gradients of every parameter, where the record, adversarial training's attack, took the
// input's alone (torch.autograd.grad; with MEMPLAN_WARMUP=1 the attack's step is the only
// record, Agent::widest_backward has no other). Its kind is planned again from the record with,
// at each of its backward nodes, what the step had there beyond the plan's prediction
// (kind_profile.h backward_excess; the CNN --adversarial at 50%: +13.7% -> +0.0%, the attack's
// steps under); or, when the step was recorded light, with the larger of the two differences
// kept through backward.
//
// A step that left out some of its plan's ops (`gapped`: a kind the plan covers) is held to the
// plan's prediction, not predicted by it: it may run over it (and so have the kind planned
// again), never count as a step under it (adversarial training's attack steps, covered by the
// step's plan, keep the gradients the step's zero_grad frees before its backward: --adversarial
// shorter --zero-grad-late on the views model at 1% +1.6% over it; tools/soak.py).
//
// At most twice per kind either way (each remade plan's record counts the last difference), and
// never for a plan file the user gave (MEMPLAN_PLAN), which is replayed as it is. Once per
// measured step: a few compares.
void Agent::check_gap(const Profile& p, bool gapped) {
  constexpr int kLowerSteps = 3;
  if (choice_.profile || choice_.plan < 0 || !p.gap_bytes) return;
  const auto index = static_cast<size_t>(choice_.plan);
  PlanRecord& rec = plans_[index];
  if (!rec.planned || !rec.planned->gap_bytes || !rec.replayer || kinds_.plan_of(rec.kind) != static_cast<int>(index))
    return;
  const int64_t predicted = rec.info.predicted_peak - rec.info.baseline;
  const int64_t margin = remake_margin(predicted);
  const int64_t less = *p.gap_bytes - *rec.planned->gap_bytes;
  const int64_t over = (p.peak_bytes - p.baseline_bytes) - predicted;
  if (less < -margin && over < -margin) {
    if (gapped) return;
    rec.more_freed = rec.more_freed_steps == 0 ? -less : std::min(rec.more_freed, -less);
    if (++rec.more_freed_steps < kLowerSteps || !may_remake(rec)) return;
    info("{} replayed steps in a row, the latest step {}, each freed at least {} more between forward and "
         "backward than step {} its plan was made from (the script frees memory there: gradients zeroed "
         "before backward), and peaked under the prediction by more than {}: its kind of step is planned "
         "again with that memory freed through backward",
         rec.more_freed_steps, p.step, format_bytes(rec.more_freed), rec.record_step, format_bytes(margin));
    remake_for_gap(index, -rec.more_freed,
                   ", what its kind's steps freed between forward and backward beyond its record's freed");
    return;
  }
  if (!gapped) rec.more_freed_steps = 0;
  if (over <= margin) return;
  // Or it ended with more allocated than the record, beyond their baselines: its backward made
  // what the record's did not (the gradients of every parameter, where the record took the
  // input's alone: see Agent::widest_backward; with MEMPLAN_WARMUP=1 the attack's step may be
  // the only record).
  const int64_t more_end =
      (p.end_bytes - p.baseline_bytes) - (rec.planned->end_bytes - rec.planned->baseline_bytes);
  // Or, recorded whole, its backward ran more nodes than the record's: what it made there may be
  // freed before its end (at batch 8 the CNN --adversarial --small's training steps end 39 KB
  // under the attack's record, their weight gradients' temporaries 55 KB over it at the peak).
  const bool more_nodes = p.backward.size() > rec.planned->backward.size();
  if (less <= margin && (more_end > margin || more_nodes)) {
    if (refuse_remake(rec, p.step, over)) return;
    // Where it made them, node by node, when the step's record tells (not recorded light): kept
    // through the whole backward they over-predict its early nodes (the views model at 73%:
    // -9.3%, the MLP --autograd-grad at 50%: -5.8%; now both +0.0%).
    std::vector<int64_t> live, peak;
    const bool by_node = backward_excess_of(p, rec, &live, &peak);
    info("step {} {} than step {} its plan was made from (its backward made what that step's did not: gradients "
         "of parameters that step took none for), and peaked {} over the prediction: its kind of step is planned "
         "again with that memory {}",
         p.step,
         more_end > margin ? fmt::format("ended with {} more allocated", format_bytes(more_end))
                           : fmt::format("ran {} backward nodes, {} more", p.backward.size(),
                                         p.backward.size() - rec.planned->backward.size()),
         rec.record_step, format_bytes(over),
         by_node ? "where that step's backward made it" : "kept through backward");
    if (by_node) {
      remake(index, with_backward_excess(*rec.planned, live, peak),
             fmt::format("-backward-excess-{:016x}", excess_key(live, peak)),
             ", what its kind's steps allocated beyond its record's at each backward node");
      return;
    }
    // Else what it ran over by, when more: the extra of a backward that runs more nodes is not
    // all left at its end (the CNN's weight gradients' temporaries: +1.3% with the end's alone).
    remake_for_gap(index, std::max(more_end, over), ", what its kind's steps allocated beyond its record's kept",
                   /*in_gap=*/false);
    return;
  }
  if (less <= margin) return;
  if (refuse_remake(rec, p.step, over)) return;
  info("step {} freed {} less between forward and backward than step {} its plan was made from (the script frees "
       "memory there: gradients zeroed before backward, another step's), and peaked {} over the prediction: its "
       "kind of step is planned again with that memory kept through backward",
       p.step, format_bytes(less), rec.record_step, format_bytes(over));
  remake_for_gap(index, less, ", what its record freed between forward and backward kept");
}

// The least difference from a plan's prediction (`predicted`: its activation memory) worth planning
// its kind again: a share of it, or a floor (the views model's attack steps keep its 16 KB of
// gradients through backward; the CNN --adversarial --small's training steps ran 55 KB, 7% at
// batch 4, over the attack's record).
int64_t Agent::remake_margin(int64_t predicted) {
  constexpr int64_t kPercent = 2;
  constexpr int64_t kBytes = 32 << 10;
  return std::max(kBytes, predicted * kPercent / 100);
}

// Whether the kind of `rec` may be planned again: not a user's plan file (MEMPLAN_PLAN, replayed as
// it is), and not remade kMaxRemakes times already.
bool Agent::may_remake(const PlanRecord& rec) const { return options().plan.empty() && rec.remakes < kMaxRemakes; }

// Whether a plan that a step ran `over` its prediction must be kept all the same: the user's
// plan file, or a kind planned again twice already (one warning).
bool Agent::refuse_remake(const PlanRecord& rec, int64_t step, int64_t over) {
  if (may_remake(rec)) return false;
  log_once("gap-kept-not", LogLevel::Warn,
           fmt::format("step {} peaked {} over the prediction, and allocated more than the record its plan was "
                       "made from; {}",
                       step, format_bytes(over),
                       options().plan.empty() ? "its kind was planned again for that twice already: it keeps its plan"
                                              : "the plan file given (MEMPLAN_PLAN) is replayed as it is"));
  return true;
}

// Plans the kind of plans_[index] again from its record with `bytes` more kept from the end of
// the forward through backward (fewer: freed), in place of it; `source` says why (the plan's
// source in the summary and the report); `in_gap`: as with_gap_kept's.
void Agent::remake_for_gap(size_t index, int64_t bytes, const char* source, bool in_gap) {
  remake(index, with_gap_kept(*plans_[index].planned, bytes, in_gap),
         fmt::format("-{}-{}-{}", in_gap ? "gap" : "backward", bytes > 0 ? "kept" : "freed", std::abs(bytes)), source);
}

// What replayed step `p` of plans_[index] had allocated beyond the plan's prediction at each node
// of its record's backward (kind_profile.h backward_excess), the prediction simulated again from
// the record and the plan (once per remake: a graph build and a simulation).
bool Agent::backward_excess_of(const Profile& p, const PlanRecord& rec, std::vector<int64_t>* live,
                               std::vector<int64_t>* peak) const {
  if (!rec.replayer || !rec.planned || p.backward.empty()) return false;
  planner::Graph g;
  std::string error;
  if (!planner::build_graph(*rec.planned, &g, &error)) return false;
  const planner::Plan& plan = rec.replayer->plan();
  const planner::SimResult sim = planner::simulate(g, plan);
  if (!sim.ok) return false;
  // A recompute's memory as the step's record counts it (in the node before the one it serves):
  // predicted there, it is in no node's excess (without, the ViT --adversarial at 40% ran 4.8%
  // under its new prediction).
  std::vector<int64_t> fwd_peak, predicted_peak;
  planner::recorded_peaks(plan, sim, &fwd_peak, &predicted_peak);
  return backward_excess(p, *rec.planned, sim.bwd_live, predicted_peak, live, peak);
}

// The plan cache's name for a profile remade with these excesses (OpHasher's FNV-1a over both).
uint64_t Agent::excess_key(const std::vector<int64_t>& live, const std::vector<int64_t>& peak) {
  OpHasher h;
  for (const std::vector<int64_t>* v : {&live, &peak})
    for (int64_t x : *v) h.add(x);
  return h.value();
}

// Plans the kind of plans_[index] again from `profile` (its record, changed), in place of it;
// `variant` names it in the plan cache, `source` says why (the summary and the report).
void Agent::remake(size_t index, const Profile& profile, const std::string& variant, const char* source) {
  PlanRecord next = make_plan(profile, variant);
  if (log_enabled(LogLevel::Debug) && !profile_path_.empty()) {
    // The record the new plan was made from, for `memplan-plan PROFILE --plan P --against R`.
    std::string error;
    write_profile_file(fmt::format("{}.plan{}.json", profile_path_, plans_.size()), profile, &error);
  }
  const PlanRecord& old = plans_[index];
  next.grads = old.grads;
  next.remade_from = static_cast<int>(index);
  next.remakes = old.remakes + 1;
  next.info.source += source;
  plans_.push_back(std::move(next));  // (old is invalid from here)
  kinds_.set_plan(plans_.back().kind, static_cast<int>(plans_.size()) - 1);
  // With that much more kept, nothing may lower the peak (the minimum is the un-planned peak): the
  // kinds this one covered go back to their own plans. Covered, they ran plainly under it, and
  // higher than its prediction (adversarial training's attack, which keeps the gradients the
  // step frees before its backward: the MLP --adversarial shorter --zero-grad-late at 1%, +4.4%).
  if (!plans_.back().replayer) kinds_.uncover_by(plans_.back().kind);
}

}  // namespace memplan
