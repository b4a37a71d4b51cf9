// Turns a DP schedule (sweeps of block modes) into the replay actions of a Plan: evictions in the
// user's forward, holds of checkpoints, recompute actions (op closures) and releases.
#pragma once

#include <vector>

#include "planner/block_ilp.h"
#include "planner/blocks.h"
#include "planner/chain_dp.h"
#include "planner/graph.h"
#include "planner/plan.h"

namespace memplan::planner {

// `menus[k]` is the menu of blocks whose shape_id is k (only entries at shape ids are used).
// Fills plan->schedule, evictions, holds, recomputes, releases. Every recompute input is available
// by construction: what the schedule does not keep is rebuilt from what it does (down to
// persistent values).
void build_actions(const Graph& g, const std::vector<Block>& blocks,
                   const std::vector<BlockMenu>& menus, const std::vector<Sweep>& sweeps,
                   Plan* plan);

// Whole-graph plan without blocks: evict each value of `evict` (per value, evictable ones only)
// after its last forward use and rebuild it just before its first unpacking node, from what is
// alive then; values of `checkpoint` may be held to serve those rebuilds. keep_byproducts: an
// evicted value that an earlier rebuild recreates anyway is kept from then on instead of being
// recomputed again at its own first unpack (memory for time): 0 never, 1 always, 2 only when its
// producer is not before the earliest producer of that rebuild's own targets (not upstream). schedule lists the blocks as Fe/0
// (informational).
void build_eviction_actions(const Graph& g, const std::vector<Block>& blocks,
                            const std::vector<char>& evict, const std::vector<char>& checkpoint,
                            int keep_byproducts, Plan* plan);

// Adds to plan->compactions (in value order) every dropout mask (Graph::compact_bytes) that the
// plan does not evict, hold or keep in a recompute, and that `want` selects (null: every one).
void add_compactions(const Graph& g, const std::vector<char>* want, Plan* plan);

}  // namespace memplan::planner
