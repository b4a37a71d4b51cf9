// Human-readable sizes, one formatter for every layer (profile summary, planner reports, agent
// messages): binary units, "512 B", "8.29 MiB", "300.0 MiB"; negative sizes keep the sign.
#pragma once

#include <cstdint>
#include <string>

namespace memplan {

// Rounded to the nearest displayed digit.
std::string format_bytes(int64_t bytes);
// Rounded up at the displayed precision, never below `bytes`: for a minimum (the minimum
// feasible budget) that a user may paste back as MEMPLAN_BUDGET and must then be enough.
std::string format_bytes_up(int64_t bytes);

}  // namespace memplan
