// Human-readable summaries of a planning result (memplan-plan's output and the golden files).
#pragma once

#include <string>

#include "planner/planner.h"

namespace memplan::planner {

// Blocks, the chosen schedule per block, predicted peak and time vs the un-planned step.
std::string format_summary(const Planner& pl, const PlanResult& r, bool list_blocks = true);
// Predicted time overhead for budgets from the minimum to 100% of activation memory.
std::string format_sweep(const Planner& pl, int rows = 11);

}  // namespace memplan::planner
