// Sizes that follow from data: a replayed step that ran its plan's ops with larger sizes than the
// record the plan was made from, against the budget.
#include <fmt/format.h>

#include <algorithm>

#include "agent/agent.h"
#include "agent/log.h"
#include "profiler/bytes.h"

namespace memplan {

// A kind of step with an op whose output shape follows from data (the rows a boolean mask keeps,
// an expert's share of a batch) is planned from one record, at that record's sizes; its later
// steps replay the plan at their own (Replayer::check_divergence). One with more rows keeps more
// in every activation after that op, so its peak passes the prediction by what the sizes added:
// over the budget when the plan was close to it (the MLP --drop-rows --release-params at 87%:
// 5.2% of its activation memory over the prediction, 1.6% of the whole peak over the budget;
// tools/soak.py seed 43). No record tells how large a later step will be; the steps tell how far
// over they ran. One that ran over the budget, and over the prediction by more than the margin,
// has its kind planned again from the same record that much further under the budget: the kind's
// headroom, which grows by each such step's excess (at most kMaxRemakes plans per kind, as
// check_gap's). Steps of those sizes then keep under the budget: a plan that keeps less lets the
// same sizes add less, so the headroom errs on the safe side. The step that ran over is the old
// plan's last; smaller steps run under. Every later plan of the kind (Agent::obtain_plan) keeps the
// headroom and counts it in its prediction. A plan file the user gave (MEMPLAN_PLAN) is replayed
// as it is. Cost: a few compares per such step.
void Agent::check_sizes(const Profile& p) {
  if (choice_.profile || choice_.plan < 0) return;
  const auto index = static_cast<size_t>(choice_.plan);
  const PlanRecord& rec = plans_[index];
  if (!replannable_for_sizes(rec) || kinds_.plan_of(rec.kind) != static_cast<int>(index)) return;
  const int64_t predicted = rec.info.predicted_peak - rec.info.baseline;
  const int64_t used = p.peak_bytes - p.baseline_bytes;
  const int64_t over = used - predicted;
  const int64_t over_budget = used - (rec.info.budget - rec.info.baseline);
  if (over_budget <= 0 || over <= remake_margin(predicted)) return;
  if (refuse_remake(rec, p.step, over)) return;
  int64_t& headroom = headroom_[rec.kind];
  headroom += over;
  info("step {} ran its kind's ops with larger sizes than step {} its plan was made from (after an op whose output "
       "shape follows from data) and peaked {} over the prediction, {} over the budget: its kind of step is planned "
       "again {} under the budget",
       p.step, rec.record_step, format_bytes(over), format_bytes(over_budget), format_bytes(headroom));
  remake(index, *rec.planned, "", ", planned under the budget by what its steps' larger sizes added");
}

// Whether `rec`'s kind could be planned again with room (check_sizes). An infeasible budget's plan
// is the least memory any plan keeps: no headroom lowers it.
bool Agent::replannable_for_sizes(const PlanRecord& rec) const {
  return rec.planned && !rec.info.source.empty() && rec.info.feasible;
}

// A step of kind `kind` that ran plainly, its peak above its baseline. Cost: one map lookup.
void Agent::note_size(uint64_t kind, const Profile& p) {
  SizeRange& r = sizes_[kind];
  const int64_t used = p.peak_bytes - p.baseline_bytes;
  r.low = std::min(r.low, used);
  r.high = std::max(r.high, used);
  ++r.steps;
}

// A plan without actions has no replayer to follow its steps: once every kind's plan is such,
// the agent stops observing ops (Agent::nothing_to_do), and steps after that are not seen. For a
// kind whose sizes follow from data that is safe when the budget is far above the peaks its steps
// reached: kSpread times the range they spanned, after kSeen of them (the GPT-2 --masked-loss at
// 200%: stops, and costs nothing after that). Close to it, the steps stay observed, at the cost of
// recording them light (~1-2 us an op: +6-10% on a 4.7 ms dispatch-bound step), so that one that
// runs over the budget has its kind planned with room (check_sizes): the MLP --small --drop-rows
// --release-params at 106% ran its step 26 49 KiB over the budget unseen. A range of n steps of
// sizes drawn alike spans about 2 standard deviations at n = 4 (the expected range of a normal
// sample), so 3 ranges past the highest is ~6 deviations: rare enough to stop watching for.
bool Agent::sizes_settled(const PlanRecord& rec) const {
  constexpr int kSeen = 4;
  constexpr int64_t kSpread = 3;
  if (!replannable_for_sizes(rec) || !may_remake(rec)) return true;  // nothing check_sizes would do
  const auto it = sizes_.find(rec.kind);
  if (it == sizes_.end() || it->second.steps < kSeen) return false;
  const int64_t room = rec.info.budget - rec.info.baseline - it->second.high;
  return room >= kSpread * (it->second.high - it->second.low);
}

}  // namespace memplan
