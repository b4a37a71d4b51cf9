#include "profiler/kind_profile.h"

namespace memplan {

namespace {

bool same_ops(const std::vector<Op>& a, const std::vector<Op>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name) return false;
  return true;
}

}  // namespace

size_t heaviest_of_kind(const std::vector<Profile>& recorded, size_t latest, double margin) {
  const Profile& last = recorded[latest];
  const double floor = static_cast<double>(last.activation_bytes()) * (1.0 + margin);
  size_t best = latest;
  int64_t best_bytes = last.activation_bytes();
  for (size_t i = 0; i < recorded.size(); ++i) {
    const Profile& p = recorded[i];
    if (i == latest || p.signature != last.signature || p.activation_bytes() <= best_bytes) continue;
    if (static_cast<double>(p.activation_bytes()) <= floor) continue;
    if (!same_ops(p.forward, last.forward) || !same_ops(p.backward, last.backward)) continue;
    best = i;
    best_bytes = p.activation_bytes();
  }
  return best;
}

Profile with_times_of(Profile memory, const Profile& times) {
  auto copy = [](std::vector<Op>& to, const std::vector<Op>& from) {
    for (size_t i = 0; i < to.size() && i < from.size(); ++i) {
      to[i].start_us = from[i].start_us;
      to[i].time_us = from[i].time_us;
      to[i].cpu_us = from[i].cpu_us;
      to[i].cupti_us = from[i].cupti_us;
      to[i].event_us = from[i].event_us;
    }
  };
  copy(memory.forward, times.forward);
  copy(memory.backward, times.backward);
  memory.forward_us = times.forward_us;
  memory.backward_us = times.backward_us;
  memory.overhead_us = times.overhead_us;
  return memory;
}

}  // namespace memplan
