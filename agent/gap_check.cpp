// The gap between forward and backward: what a replayed step freed there, against what its plan
// counted on (profiler/kind_profile.h with_gap_kept).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "agent/agent.h"
#include "agent/log.h"
#include "agent/options.h"
#include "profiler/bytes.h"
#include "profiler/kind_profile.h"

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
// At most twice per kind either way (each remade plan's record counts the last difference), and
// never for a plan file the user gave (MEMPLAN_PLAN), which is replayed as it is. Once per
// measured step: a few compares.
void Agent::check_gap(const Profile& p) {
  constexpr int kMaxRemakes = 2;
  constexpr int kLowerSteps = 3;
  constexpr int64_t kMarginPercent = 2;  // of the plan's predicted activation memory
  constexpr int64_t kMarginBytes = 64 << 10;
  if (choice_.profile || choice_.plan < 0 || !p.gap_bytes) return;
  const auto index = static_cast<size_t>(choice_.plan);
  PlanRecord& rec = plans_[index];
  if (!rec.planned || !rec.planned->gap_bytes || !rec.replayer || kinds_.plan_of(rec.kind) != static_cast<int>(index))
    return;
  const int64_t predicted = rec.info.predicted_peak - rec.info.baseline;
  const int64_t margin = std::max(kMarginBytes, predicted * kMarginPercent / 100);
  const int64_t less = *p.gap_bytes - *rec.planned->gap_bytes;
  const int64_t over = (p.peak_bytes - p.baseline_bytes) - predicted;
  if (less < -margin && over < -margin) {
    rec.more_freed = rec.more_freed_steps == 0 ? -less : std::min(rec.more_freed, -less);
    if (++rec.more_freed_steps < kLowerSteps || !options().plan.empty() || rec.remakes >= kMaxRemakes) return;
    info("{} replayed steps in a row, the latest step {}, each freed at least {} more between forward and "
         "backward than step {} its plan was made from (the script frees memory there: gradients zeroed "
         "before backward), and peaked under the prediction by more than {}: its kind of step is planned "
         "again with that memory freed through backward",
         rec.more_freed_steps, p.step, format_bytes(rec.more_freed), rec.record_step, format_bytes(margin));
    remake_for_gap(index, -rec.more_freed);
    return;
  }
  rec.more_freed_steps = 0;
  if (less <= margin || over <= margin) return;
  if (!options().plan.empty() || rec.remakes >= kMaxRemakes) {
    log_once("gap-kept-not", LogLevel::Warn,
             fmt::format("step {} freed {} less between forward and backward than the record its plan was made "
                         "from, and peaked {} over the prediction; {}",
                         p.step, format_bytes(less), format_bytes(over),
                         options().plan.empty() ? "its kind was planned again for that twice already: it keeps its plan"
                                                : "the plan file given (MEMPLAN_PLAN) is replayed as it is"));
    return;
  }
  info("step {} freed {} less between forward and backward than step {} its plan was made from (the script frees "
       "memory there: gradients zeroed before backward, another step's), and peaked {} over the prediction: its "
       "kind of step is planned again with that memory kept through backward",
       p.step, format_bytes(less), rec.record_step, format_bytes(over));
  remake_for_gap(index, less);
}

// Plans the kind of plans_[index] again from its record with `bytes` more kept from the end of
// the forward through backward (fewer: freed), in place of it.
void Agent::remake_for_gap(size_t index, int64_t bytes) {
  const std::shared_ptr<const Profile> planned = plans_[index].planned;
  PlanRecord next = make_plan(with_gap_kept(*planned, bytes),
                              fmt::format("-gap-{}-{}", bytes > 0 ? "kept" : "freed", std::abs(bytes)));
  const PlanRecord& old = plans_[index];
  next.grads = old.grads;
  next.remade_from = static_cast<int>(index);
  next.remakes = old.remakes + 1;
  next.info.source += bytes > 0 ? ", what its record freed between forward and backward kept"
                                : ", what its kind's steps freed between forward and backward beyond its record's freed";
  plans_.push_back(std::move(next));  // (old is invalid from here)
  kinds_.set_plan(plans_.back().kind, static_cast<int>(plans_.size()) - 1);
}

}  // namespace memplan
