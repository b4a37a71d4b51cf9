// Profiles -> Perfetto-loadable trace: one track for forward ops, one for backward nodes, a
// counter track for live memory, one span per step. Collection (the Profile) apart from output.
#pragma once

#include <string>
#include <vector>

#include "profiler/profile.h"
#include "profiler/trace_writer.h"

namespace memplan {

// An action the replay injected (evict, recompute, free), timed from its step's start.
struct TraceAction {
  std::string name;   // "evict value 12", "recompute before node 40", "free value 7"
  double ts_us = 0;
  double dur_us = 0;  // 0: an instant
};

// Steps are laid end to end on the time axis in the order given; `actions` belong to the last
// step (a replayed one) and go on their own track.
void add_profiles_to_trace(const std::vector<Profile>& steps, TraceBuilder* trace,
                           const std::vector<TraceAction>& actions = {});
bool write_trace_file(const std::string& path, const std::vector<Profile>& steps, std::string* error,
                      const std::vector<TraceAction>& actions = {});

}  // namespace memplan
