// Plan <-> JSON (docs/plan-schema.md). Reading validates the structure and never throws; checking
// a plan against its profile (indices, availability, budget) is validate_plan.
#pragma once

#include <string>

#include "planner/plan.h"
#include "profiler/profile.h"

namespace memplan::planner {

std::string plan_to_json(const Plan& p, int indent = 1);
bool plan_from_json(const std::string& text, Plan* out, std::string* error);
bool write_plan_file(const std::string& path, const Plan& p, std::string* error);
bool read_plan_file(const std::string& path, Plan* out, std::string* error);

// The plan belongs to this profile (hash) and passes the simulator.
bool validate_plan(const Plan& plan, const Profile& prof, std::string* error);

}  // namespace memplan::planner
