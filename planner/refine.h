// Local search over eviction sets, with the simulator as the judge. From a plan's evictions and
// compactions it tries every single change (evict one more value, keep one evicted value, keep a
// dropout mask compact or not) and every swap
// (keep one evicted value, evict one kept), applies the one that makes the step fastest while the
// simulated peak still fits the budget, and repeats until no change helps. Each candidate set
// becomes a plan through build_eviction_actions (each value rebuilt just before its first unpack).
// Deterministic: bounded by a count of simulations, not by time.
//
// The planner runs it from its best candidate at a grid of budgets and adds what it finds to the
// candidates (planner.cpp). Measured on tests/data/profiles/gpt2_cpu.json, with compact dropout
// masks: 38% +16.4% -> +15.4%, 45% +13.1% -> +12.1%; 33%, 50% and 70% unchanged (the picks there
// are already local optima); about 1 s of the 5 s planning.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/blocks.h"
#include "planner/graph.h"
#include "planner/plan.h"
#include "planner/simulate.h"

namespace memplan::planner {

// Work bounds (counts, not time): a simulation walks the whole step, so both the number of
// searches and the simulations per search shrink as the step grows.
struct RefineOptions {
  bool enabled = true;
  int levels = 24;            // the planner searches from the best plan at this many budgets...
  int64_t level_ops = 3200;   // ... at most level_ops / forward ops of them
  int64_t max_ops = 1000;     // skipped above this many forward ops
  int64_t max_sims = 5000;    // simulations per search at most...
  int64_t sim_ops = 300000;   // ... and at most sim_ops / forward ops
};

struct Refined {
  bool improved = false;      // plan/sim hold a faster plan that fits
  Plan plan;                  // actions and schedule only
  SimResult sim;
  int64_t sims = 0;
};

Refined refine_evictions(const Graph& g, const std::vector<Block>& blocks, const Plan& start,
                         double start_time_us, int64_t budget, const RefineOptions& opt);

}  // namespace memplan::planner
