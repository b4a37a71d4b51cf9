#include "profiler/kind_profile.h"

#include <algorithm>

namespace memplan {

namespace {

constexpr const char* kAccumulateGrad = "torch::autograd::AccumulateGrad";

int64_t allocated(const Op& n) { return n.live_after - n.live_before; }

// What record `o` allocated beyond `p` in backward node j (negative: less).
int64_t allocated_beyond(const Profile& o, const Profile& p, size_t j) {
  return allocated(o.backward[j]) - allocated(p.backward[j]);
}

// Whether what record `o` allocated beyond `p` at the AccumulateGrad nodes looks like gradients
// made afresh rather than another thread's allocations caught inside those short nodes. Memory is
// counted process-wide: a thread that allocates and frees while the step runs (a prefetch or
// metrics thread) lands an allocation in some node of one record and a free in another's, as
// often one way as the other. Gradients made afresh are one-sided: beyond `p` at their nodes,
// under it nowhere. So `o` lends them only when what it allocated beyond `p` is more than twice
// what it allocated under it. (GPT-2 with a side thread's 16 KiB tensors: 415.8 KiB of them
// taken for gradients, which kept the step after a refused backward, which began without its
// gradients, on a plan that counted none of them: +7-9% over its prediction, tools/soak.py.)
bool one_sided(const Profile& o, const Profile& p) {
  int64_t above = 0, below = 0;
  for (size_t j = 0; j < p.backward.size(); ++j) {
    if (p.backward[j].name != kAccumulateGrad) continue;
    const int64_t more = allocated_beyond(o, p, j);
    (more > 0 ? above : below) += more > 0 ? more : -more;
  }
  return above > 2 * below;
}

}  // namespace

Profile with_fresh_gradients(const std::vector<Profile>& recorded, size_t latest, FreshGradients* out,
                             const std::vector<char>* began) {
  Profile p = recorded[latest];
  std::vector<int64_t> extra(p.backward.size(), 0);
  // Per node: the most any record's memory rose above the node's start while it ran (a first
  // micro-step's AccumulateGrad may copy the incoming gradient rather than keep it: both live,
  // then an optimizer stepped in its hook adds its temporaries on top).
  std::vector<int64_t> rise(p.backward.size(), 0);
  for (size_t j = 0; j < p.backward.size(); ++j) rise[j] = p.backward[j].peak - p.backward[j].live_before;
  std::vector<int64_t> by_record(recorded.size(), 0);
  // kept_after[j]: the most any record kept beyond the latest after node j (kept_before: before).
  std::vector<int64_t> kept_before(p.backward.size(), 0), kept_after(p.backward.size(), 0);
  int64_t kept_most = 0, kept_from = -1;
  auto gap = [](const Profile& q) { return q.backward[0].live_before - q.forward.back().live_after; };
  for (size_t r = 0; r < recorded.size(); ++r) {
    const Profile& o = recorded[r];
    // Same ops, sizes aside: a parameter's gradient does not follow the data's sizes (a loss
    // over the rows a mask keeps makes every step's sizes its own).
    if (r == latest || o.structure_signature != p.structure_signature || first_other_op(o.forward, p.forward) >= 0 ||
        first_other_op(o.backward, p.backward) >= 0)
      continue;
    // Kept across the gap (same sizes: the forwards match), then what the latest allocates
    // again beyond it at each AccumulateGrad node.
    const bool began_alike = began == nullptr || began->size() != recorded.size() || (*began)[r] == (*began)[latest];
    int64_t kept =
        began_alike && !p.forward.empty() && !p.backward.empty() && o.op_hash == p.op_hash ? gap(o) - gap(p) : 0;
    const bool keeps = kept > 0;
    const bool lends = one_sided(o, p);
    for (size_t j = 0; j < p.backward.size(); ++j) {
      if (keeps) kept_before[j] = std::max(kept_before[j], kept);
      if (p.backward[j].name == kAccumulateGrad) {
        rise[j] = std::max(rise[j], o.backward[j].peak - o.backward[j].live_before);
        const int64_t more = allocated_beyond(o, p, j);
        kept += more;
        if (more > 0 && lends) {
          by_record[r] += more;
          extra[j] = std::max(extra[j], more);
        }
      }
      if (keeps) {
        kept_after[j] = std::max(kept_after[j], kept);
        if (kept_before[j] > kept_most) {
          kept_most = kept_before[j];
          kept_from = o.step;
        }
      }
    }
  }
  if (out) *out = FreshGradients{};
  if (std::all_of(extra.begin(), extra.end(), [](int64_t e) { return e == 0; }) && kept_most == 0) return p;
  int64_t added = 0;  // fresh gradients so far
  for (size_t j = 0; j < p.backward.size(); ++j) {
    Op& n = p.backward[j];
    const int64_t before = std::max(added, kept_before[j]);
    n.live_before += before;
    n.peak = std::max(n.peak + before, n.live_before + rise[j]);
    added += extra[j];
    n.live_after += std::max(added, kept_after[j]);
    n.peak = std::max(n.peak, n.live_after);
    p.peak_bytes = std::max(p.peak_bytes, n.peak);
  }
  p.end_bytes += std::max(added, p.backward.empty() ? 0 : kept_after.back());
  if (out) {
    out->bytes = added;
    if (added > 0) {
      const size_t r = static_cast<size_t>(std::max_element(by_record.begin(), by_record.end()) - by_record.begin());
      out->from_step = recorded[r].step;
    }
    out->kept = kept_most;
    out->kept_from = kept_from;
  }
  return p;
}

Profile with_gradients_kept(const Profile& recorded, int64_t* added) {
  Profile p = recorded;
  int64_t kept = 0;  // freed by the AccumulateGrad nodes so far
  for (Op& n : p.backward) {
    const int64_t freed = n.name == kAccumulateGrad ? std::max<int64_t>(0, -allocated(n)) : 0;
    n.live_before += kept;
    n.peak += kept;
    kept += freed;
    n.live_after += kept;
    n.peak = std::max(n.peak, n.live_after);
    p.peak_bytes = std::max(p.peak_bytes, n.peak);
  }
  p.end_bytes += kept;
  if (added) *added = kept;
  return p;
}

Profile with_gap_kept(const Profile& recorded, int64_t bytes, bool in_gap) {
  Profile p = recorded;
  if (bytes == 0 || p.backward.empty()) return p;
  int64_t backward_peak = 0;
  for (Op& n : p.backward) {
    n.live_before += bytes;
    n.live_after += bytes;
    n.peak += bytes;
    backward_peak = std::max(backward_peak, n.peak);
  }
  if (bytes > 0) {
    p.peak_bytes = std::max(p.peak_bytes, backward_peak);
  } else {  // lowered down to the forward's peak at most, which stays
    int64_t forward_peak = 0;
    for (const Op& o : p.forward) forward_peak = std::max({forward_peak, o.peak, o.live_after});
    p.peak_bytes = std::max({p.peak_bytes + bytes, forward_peak, backward_peak});
  }
  p.end_bytes += bytes;
  if (p.gap_bytes && in_gap) *p.gap_bytes += bytes;
  return p;
}

bool backward_excess(const Profile& step, const Profile& record, const std::vector<int64_t>& predicted_live,
                     const std::vector<int64_t>& predicted_peak, std::vector<int64_t>* live,
                     std::vector<int64_t>* peak) {
  const size_t m = record.backward.size(), n = step.backward.size();
  if (m == 0 || n < m || predicted_live.size() != m || predicted_peak.size() != m) return false;
  std::vector<size_t> at(m);  // at[j]: the step's node matched to the record's node j
  size_t k = 0;
  for (size_t j = 0; j < m; ++j) {
    while (k < n && step.backward[k].name != record.backward[j].name) ++k;
    if (k == n) return false;
    at[j] = k++;
  }
  live->assign(m, 0);
  peak->assign(m, 0);
  for (size_t j = 0; j < m; ++j) {
    const size_t first = j == 0 ? 0 : at[j], end = j + 1 < m ? at[j + 1] : n;
    int64_t top = 0;
    for (size_t i = first; i < end; ++i) top = std::max({top, step.backward[i].peak, step.backward[i].live_after});
    const int64_t after = step.backward[end - 1].live_after - step.baseline_bytes;
    (*live)[j] = std::max<int64_t>(0, after - (predicted_live[j] - record.baseline_bytes));
    (*peak)[j] = std::max<int64_t>(0, (top - step.baseline_bytes) - (predicted_peak[j] - record.baseline_bytes));
  }
  return true;
}

Profile with_backward_excess(const Profile& recorded, const std::vector<int64_t>& live,
                             const std::vector<int64_t>& peak) {
  Profile p = recorded;
  if (p.backward.empty() || live.size() != p.backward.size() || peak.size() != p.backward.size()) return p;
  for (size_t j = 0; j < p.backward.size(); ++j) {
    Op& node = p.backward[j];
    if (j > 0) node.live_before += live[j - 1];
    node.live_after += live[j];
    node.peak = std::max({node.peak + peak[j], node.live_before, node.live_after});
    p.peak_bytes = std::max(p.peak_bytes, node.peak);
  }
  p.end_bytes += live.back();
  return p;
}

}  // namespace memplan
