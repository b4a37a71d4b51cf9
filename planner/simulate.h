// Profile + plan -> predicted memory timeline and step time. The model: the measured un-planned
// timeline, minus each evicted value between its eviction and its rebuild, plus held values beyond
// their natural life, plus kept recompute outputs, plus each recompute action's transient (values
// it creates, freed at last use, and each op's workspace = peak - max(live_before, live_after)).
// Compacted values count their compact bytes between producer and unpack (simulate.cpp).
// Time: the measured step time plus the time of every recomputed op and every compaction; a
// dropout re-run while its mask is compact costs the mask's compaction estimate (compaction.md).
// It also checks the plan: indices, forward uses after eviction, every recompute input available,
// every unpack of an evicted value preceded by its rebuild.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/graph.h"
#include "planner/plan.h"

namespace memplan::planner {

struct SimResult {
  bool ok = false;
  std::string error;                  // first problem found when !ok
  std::vector<int64_t> fwd_live, fwd_peak;   // per forward op: live after it, peak during it
  std::vector<int64_t> bwd_live, bwd_peak;   // per backward node (peak includes the recompute
                                             // action that runs just before it)
  std::vector<int64_t> action_peak;          // per plan.recomputes entry
  int64_t peak = 0;
  double time_us = 0;
  double recompute_us = 0;
  double compact_us = 0;                     // estimated cost of the plan's compactions
};

SimResult simulate(const Graph& g, const Plan& plan);

// `sim`'s peaks per forward op and backward node as a replayed step's record counts them: a
// planned recompute runs before its node's callbacks begin, so the recorder counts its memory in
// the op or node before (Recorder::absorb_gap), where the simulator counts it in the node it
// serves. That op or node is raised to the action's peak; the served node keeps it too (a
// recompute on demand, inside the node, lands there).
void recorded_peaks(const Plan& plan, const SimResult& sim, std::vector<int64_t>* fwd_peak,
                    std::vector<int64_t>* bwd_peak);

}  // namespace memplan::planner
