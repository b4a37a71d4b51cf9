#include "profiler/kind_profile.h"

#include <algorithm>

namespace memplan {

namespace {

constexpr const char* kAccumulateGrad = "torch::autograd::AccumulateGrad";

int64_t allocated(const Op& n) { return n.live_after - n.live_before; }

}  // namespace

Profile with_fresh_gradients(const std::vector<Profile>& recorded, size_t latest, FreshGradients* out) {
  Profile p = recorded[latest];
  std::vector<int64_t> extra(p.backward.size(), 0);
  // Per node: the most any record's memory rose above the node's start while it ran (a first
  // micro-step's AccumulateGrad may copy the incoming gradient rather than keep it: both live,
  // then an optimizer stepped in its hook adds its temporaries on top).
  std::vector<int64_t> rise(p.backward.size(), 0);
  for (size_t j = 0; j < p.backward.size(); ++j) rise[j] = p.backward[j].peak - p.backward[j].live_before;
  std::vector<int64_t> by_record(recorded.size(), 0);
  for (size_t r = 0; r < recorded.size(); ++r) {
    const Profile& o = recorded[r];
    // Same ops, sizes aside: a parameter's gradient does not follow the data's sizes (a loss
    // over the rows a mask keeps makes every step's sizes its own).
    if (r == latest || o.structure_signature != p.structure_signature || first_other_op(o.forward, p.forward) >= 0 ||
        first_other_op(o.backward, p.backward) >= 0)
      continue;
    for (size_t j = 0; j < p.backward.size(); ++j) {
      if (p.backward[j].name != kAccumulateGrad) continue;
      rise[j] = std::max(rise[j], o.backward[j].peak - o.backward[j].live_before);
      const int64_t more = allocated(o.backward[j]) - allocated(p.backward[j]);
      if (more <= 0) continue;
      by_record[r] += more;
      extra[j] = std::max(extra[j], more);
    }
  }
  if (out) *out = FreshGradients{};
  if (std::all_of(extra.begin(), extra.end(), [](int64_t e) { return e == 0; })) return p;
  int64_t added = 0;
  for (size_t j = 0; j < p.backward.size(); ++j) {
    Op& n = p.backward[j];
    n.live_before += added;
    n.peak = std::max(n.peak + added, n.live_before + rise[j]);
    added += extra[j];
    n.live_after += added;
    n.peak = std::max(n.peak, n.live_after);
    p.peak_bytes = std::max(p.peak_bytes, n.peak);
  }
  p.end_bytes += added;
  if (out) {
    out->bytes = added;
    const size_t r = static_cast<size_t>(std::max_element(by_record.begin(), by_record.end()) - by_record.begin());
    out->from_step = recorded[r].step;
  }
  return p;
}

}  // namespace memplan
