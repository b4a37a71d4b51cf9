// Memory budgets: absolute bytes (a cap on everything allocated during the step, baseline
// included) or a percentage of the un-planned step's activation memory (peak - baseline), as
// torch.compile's activation_memory_budget counts it: abs = baseline + pct/100 * (peak - baseline).
#pragma once

#include <cstdint>
#include <string>

#include "profiler/profile.h"

namespace memplan::planner {

struct Budget {
  enum class Kind { None, Bytes, Percent } kind = Kind::None;
  int64_t bytes = 0;   // Kind::Bytes
  double percent = 0;  // Kind::Percent, e.g. 50 for 50%
};

// Parsing ("300MiB", "50%") is memplan::parse_budget in agent/options.h, shared by the
// MEMPLAN_BUDGET option and the memplan-plan CLI.

// Absolute bytes for this profile (None: the un-planned peak, i.e. no limit).
int64_t budget_bytes(const Budget& b, const Profile& p);
// `bytes` as a percentage of the profile's activation memory (100 if there is none).
double activation_percent(int64_t bytes, const Profile& p);

}  // namespace memplan::planner
