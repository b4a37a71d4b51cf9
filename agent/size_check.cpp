// Sizes that follow from data: a replayed step that ran its plan's ops with larger sizes than the
// record the plan was made from, against the budget.
#include <fmt/format.h>

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
  // An infeasible budget's plan is the least memory any plan keeps: no headroom lowers it.
  if (!rec.planned || rec.info.source.empty() || !rec.info.feasible ||
      kinds_.plan_of(rec.kind) != static_cast<int>(index))
    return;
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

}  // namespace memplan
