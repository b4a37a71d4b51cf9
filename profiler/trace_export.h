// Profiles -> Perfetto-loadable trace: one track for forward ops, one for backward nodes, a
// counter track for live memory, one span per step. Collection (the Profile) apart from output.
#pragma once

#include <string>
#include <vector>

#include "profiler/profile.h"
#include "profiler/trace_writer.h"

namespace memplan {

// Steps are laid end to end on the time axis in the order given.
void add_profiles_to_trace(const std::vector<Profile>& steps, TraceBuilder* trace);
bool write_trace_file(const std::string& path, const std::vector<Profile>& steps, std::string* error);

}  // namespace memplan
