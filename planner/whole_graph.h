// Whole-graph eviction plans (no blocks, no DP): the per-block ILP model of block_ilp.h applied to
// the forward as one block, with "kept bytes <= total - need" for a range of `need` levels. Each
// solution's eviction set becomes a plan in which every evicted value is rebuilt just before its
// first unpacking node from what is alive then (build_eviction_actions), with and without keeping
// the evicted values a rebuild recreates anyway; the simulator then measures each plan. These plans
// join the block/DP candidates: the budget pick takes the fastest simulator-feasible plan that
// fits, whichever pipeline made it. The block pipeline rebuilds whole blocks from checkpoints
// (needed for the lowest budgets); this one rebuilds exactly the evicted values and shares reruns
// across blocks, which is cheaper at moderate budgets.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/blocks.h"
#include "planner/graph.h"
#include "planner/milp.h"
#include "planner/plan.h"

namespace memplan::planner {

// Every limit here counts work, not time, so the same profile always gives the same plans.
struct WholeGraphOptions {
  bool enabled = true;
  int levels = 32;              // eviction levels between nothing and everything evictable
  int64_t max_ops = 1000;       // skipped above this many forward ops (with refine.h's search: ~5 s at
                                // 130 ops, 2.5-4 s at 370-990 ops, where level_ops leaves 4-10 levels)
  int64_t level_ops = 4000;     // levels * forward ops at most: fewer levels on bigger graphs
  int nodes = 200;              // branch-and-bound nodes per solve
  double solve_time_s = 5;      // per solve, a safety net only (a solve stopped by it is dropped)
};

struct WholeGraphPlan {
  Plan plan;                    // actions and schedule only
  int64_t peak = 0;
  double time_us = 0;
};

// compact_view: solve as if every dropout mask were kept compact (compaction.md) and return plans
// that keep them so; nothing when the graph has no masks.
std::vector<WholeGraphPlan> whole_graph_plans(const Graph& g, const std::vector<Block>& blocks,
                                              MilpSolver& solver, const WholeGraphOptions& opt,
                                              bool compact_view = false);

}  // namespace memplan::planner
