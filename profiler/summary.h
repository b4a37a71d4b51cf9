// The one-screen summary printed at the end of a profiled run (torch-free: works on a Profile,
// so the offline tools can print it too).
#pragma once

#include <string>

#include "profiler/profile.h"

namespace memplan {

struct SummaryInputs {
  std::string profile_path;
  std::string trace_path;
  int warmup_steps = 1;
  // Wall time of steps with the recorder on vs off (medians, microseconds; 0 = not measured).
  double recorded_step_us = 0;
  double plain_step_us = 0;
};

std::string format_summary(const Profile& p, const SummaryInputs& in);

// Names the moment of the step's peak: "forward op 12 aten::linear" / "backward node 3 ...".
std::string peak_location(const Profile& p);

}  // namespace memplan
