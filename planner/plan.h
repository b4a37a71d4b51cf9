// The plan: what the replay engine does in every later step, with indices into the Profile it was
// made from (keyed by Profile::op_hash). Plain structs; JSON in plan_io.h; schema in
// docs/plan-schema.md, versioned by kPlanVersion.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/chain_dp.h"

namespace memplan::planner {

inline constexpr int kPlanVersion = 1;

struct BlockChoice {
  int64_t first_op = 0, last_op = 0;
  Mode mode = Mode::Fe;   // in the user's forward (sweep 0)
  int option = 0;         // Fe only: index in the block's option menu
};

// Drop autograd's hold of saved value `value` after forward op `after_fwd` ends.
struct Eviction {
  int64_t value = 0, after_fwd = 0;
};

// Keep `value` alive from forward op `from_fwd` until the recompute before backward node
// `until_bwd` has run (it is released with a Release entry).
struct Hold {
  int64_t value = 0, from_fwd = 0, until_bwd = 0;
};

// Before backward node `before_bwd`: rerun `ops` (forward op indices, in forward order) without
// grad; keep `keep` (values those ops create) alive afterwards, free the rest at last use.
struct Recompute {
  int64_t before_bwd = 0;
  std::vector<int64_t> ops;
  std::vector<int64_t> keep;
};

// Drop the agent's reference to `value` (a hold or a kept recompute output) after backward node
// `after_bwd` ends. Saved values autograd still needs are freed by autograd after their last unpack.
struct Release {
  int64_t value = 0, after_bwd = 0;
};

// Keep saved value `value` (a 0/scale dropout mask, Graph::compact_bytes) as one bit per element
// from the end of its producer until backward unpacks it; expanded bit-exactly at each unpack.
// Plans list the values only (sorted); docs/compaction.md.

// The bytes a compact mask of `numel` elements takes: what the planner counts (Graph::compact_bytes)
// and what the replay allocates (agent/compact.h).
inline int64_t compact_mask_bytes(int64_t numel) { return (numel + 7) / 8; }

struct Plan {
  int version = kPlanVersion;
  std::string profile_hash;
  int64_t budget_bytes = 0;
  int64_t baseline_bytes = 0;
  int64_t unplanned_peak_bytes = 0;
  int64_t predicted_peak_bytes = 0;
  int64_t min_feasible_bytes = 0;
  double predicted_time_us = 0;
  double unplanned_time_us = 0;
  bool feasible = true;
  std::vector<BlockChoice> schedule;
  std::vector<Eviction> evictions;
  std::vector<Hold> holds;
  std::vector<Recompute> recomputes;  // sorted by before_bwd, at most one per node
  std::vector<Release> releases;
  std::vector<int64_t> compactions;   // values kept compact, sorted; none is evicted

  bool empty() const {
    return evictions.empty() && holds.empty() && recomputes.empty() && compactions.empty();
  }
};

}  // namespace memplan::planner
