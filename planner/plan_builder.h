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

}  // namespace memplan::planner
