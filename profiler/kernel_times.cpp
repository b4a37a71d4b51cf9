#include "profiler/kernel_times.h"

#include <algorithm>
#include <tuple>

namespace memplan {

std::unordered_map<uint64_t, double> device_us_by_op(const std::vector<KernelRecord>& kernels,
                                                     const std::vector<ExternalCorrelation>& corr,
                                                     KernelJoinStats* stats) {
  KernelJoinStats st;
  std::unordered_map<uint32_t, uint64_t> op_of;
  op_of.reserve(corr.size());
  for (const ExternalCorrelation& c : corr) {
    auto [it, inserted] = op_of.emplace(c.correlation, c.external_id);
    if (!inserted && it->second != c.external_id) {
      ++st.conflicts;
      it->second = std::min(it->second, c.external_id);
    }
  }

  // Sorting a copy of the keys makes exact duplicates adjacent without hashing names.
  std::vector<const KernelRecord*> order;
  order.reserve(kernels.size());
  for (const KernelRecord& k : kernels) order.push_back(&k);
  auto key = [](const KernelRecord* k) { return std::tie(k->correlation, k->start_ns, k->end_ns, k->stream); };
  std::sort(order.begin(), order.end(), [&](const KernelRecord* a, const KernelRecord* b) {
    return key(a) < key(b) || (key(a) == key(b) && a->name < b->name);
  });

  std::unordered_map<uint64_t, double> us;
  const KernelRecord* prev = nullptr;
  for (const KernelRecord* k : order) {
    const bool dup = prev && key(prev) == key(k) && prev->name == k->name;
    prev = k;
    if (dup) {
      ++st.duplicates;
      continue;
    }
    if (k->end_ns < k->start_ns) {
      ++st.bad_times;
      continue;
    }
    auto it = k->correlation == 0 ? op_of.end() : op_of.find(k->correlation);
    if (it == op_of.end()) {
      ++st.unmatched;
      continue;
    }
    ++st.kernels;
    us[it->second] += static_cast<double>(k->end_ns - k->start_ns) / 1000.0;
  }
  if (stats) *stats = st;
  return us;
}

void apply_device_times(std::vector<Op>* ops, const std::vector<double>& cupti, const std::vector<double>& events) {
  for (size_t i = 0; i < ops->size(); ++i) {
    Op& op = (*ops)[i];
    if (i < cupti.size()) op.cupti_us = cupti[i];
    if (i < events.size()) op.event_us = events[i];
    const double device = op.cupti_us >= 0 ? op.cupti_us : op.event_us;
    if (device >= 0) op.time_us = std::max(device, op.cpu_us);
  }
}

}  // namespace memplan
