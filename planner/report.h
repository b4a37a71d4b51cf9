// Human-readable summaries of a planning result (memplan-plan's output and the golden files).
#pragma once

#include <string>

#include "planner/planner.h"

namespace memplan::planner {

// Blocks, the chosen schedule per block, predicted peak and time vs the un-planned step.
std::string format_summary(const Planner& pl, const PlanResult& r, bool list_blocks = true);
// Predicted time overhead for budgets from the minimum to 100% of activation memory.
std::string format_sweep(const Planner& pl, int rows = 11);
// Where a replayed step's measured memory (`replay`: a whole record of a step that replayed
// `plan`, as MEMPLAN_LOG=debug writes them) departs from the simulator's timeline for `plan` on
// `prof`: the largest excess of a measured op's or node's peak over its predicted one, then one
// row per forward op or backward node at which the difference (measured minus predicted, both
// on the profile's baseline) changes by more than `step_bytes`. The first such row is where a
// misprediction enters. False with `error` if the two records are not of the same op sequence
// or the plan fails the simulator.
bool format_timeline_diff(const Profile& prof, const Plan& plan, const Profile& replay, int64_t step_bytes,
                          std::string* out, std::string* error);

}  // namespace memplan::planner
