// The planner's public entry point, used in-process by the agent and offline by memplan-plan.
// Never throws. Pipeline: Profile -> Graph -> blocks -> per-block option menus (ILP, identical
// blocks solved once) -> DP table over memory slots -> one schedule per slot -> plan -> simulator.
// Every simulator-feasible plan is a candidate; a budget picks the fastest candidate whose
// simulated peak fits, so predicted time never grows with the budget and every emitted plan is
// simulator-feasible.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "planner/block_ilp.h"
#include "planner/blocks.h"
#include "planner/budget.h"
#include "planner/graph.h"
#include "planner/whole_graph.h"
#include "planner/plan.h"
#include "planner/refine.h"
#include "planner/simulate.h"

namespace memplan::planner {

struct PlannerOptions {
  BlockOptions blocks;
  IlpOptions ilp;
  int mem_slots = 300;         // DP memory discretisation
  WholeGraphOptions whole_graph;  // extra whole-graph eviction candidates (whole_graph.h)
  RefineOptions refine;        // local-search candidates at a grid of budgets (refine.h)
  bool compact_masks = true;   // may keep dropout masks compact (Graph::compact_bytes)
  int64_t fine_max_ops = 1000; // the fine grid's ILP points (IlpOptions) only up to this many
                               // forward ops: past it they took the ILP's whole time and the DP's
                               // candidates twice the simulations (10,756 ops: 14 s -> 29 s)
  double ilp_total_s = -1;     // all ILP solves together, then only the keep-all/evict-all
                               // options; < 0: auto, 1 s + 1.5 ms per forward op, at most 20 s
};

struct PlanResult {
  bool ok = false;             // false only when the profile is unusable (see error)
  std::string error;
  Plan plan;
  SimResult sim;               // the simulator's timeline of `plan`
  std::vector<std::string> messages;
  // Where the plan came from: "blocks" (the DP's block schedule), "whole-graph ILP" (a whole-graph
  // ILP candidate), "local search" (refine.h, from either), "mask compaction" (compactions
  // only) or "eviction set of a candidate with its masks compact"; all but "blocks" have no block
  // schedule.
  std::string origin = "blocks";
};

struct Candidate {
  Plan plan;                   // actions and schedule only
  int64_t peak = 0;
  double time_us = 0;
  int slot = -1;               // DP memory slot that produced it (-1: the empty plan,
                               // -2: a whole-graph plan, -3: a local-search plan, -4: the empty
                               // plan with masks compact, -5: a candidate's evictions minus
                               // its masks, which stay compact); compacted variants keep their slot
  bool fine = false;           // a schedule of the full menus the coarse ones did not give
};

struct PlannerStats {
  int blocks = 0, distinct_blocks = 0, ilp_solves = 0, ilp_optimal = 0, ilp_timeouts = 0;
  int candidates = 0;
  int64_t refine_sims = 0;
  double ilp_s = 0, dp_s = 0, candidates_s = 0;
  int64_t unit_bytes = 0;
};

class Planner {
 public:
  Planner() = default;
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Everything that does not depend on the budget. False (and `error`) on an unusable profile.
  bool prepare(const Profile& p, const PlannerOptions& opt, std::string* error);
  PlanResult plan_for(const Budget& b) const;

  const Profile& profile() const { return prof_; }
  const Graph& graph() const { return graph_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  const BlockMenu& menu(size_t block) const { return menus_[blocks_[block].shape_id]; }
  const std::vector<Candidate>& candidates() const { return cands_; }  // sorted by peak
  const PlannerStats& stats() const { return stats_; }
  int64_t unplanned_peak() const { return unplanned_peak_; }
  double unplanned_time() const { return graph_.step_time_us; }
  int64_t min_feasible() const { return cands_.empty() ? unplanned_peak_ : cands_.front().peak; }

 private:
  Profile prof_;
  Graph graph_;
  std::vector<Block> blocks_;
  std::vector<BlockMenu> menus_;
  std::vector<Candidate> cands_;
  PlannerStats stats_;
  int64_t unplanned_peak_ = 0;
};

PlanResult make_plan(const Profile& p, const Budget& b, const PlannerOptions& opt = {});

}  // namespace memplan::planner
