// The record of a kind of step the planner gets. Steps of one kind run the same ops but need not
// allocate the same memory: under gradient accumulation the first micro-step of each optimizer
// step allocates every gradient (none exists: AccumulateGrad keeps the incoming one), the next
// ones add into them and free the incoming one. A budget caps what a step allocates, so the
// first micro-step is the heavier; when the latest warm-up record was a later micro-step, the
// plan let every first one pass its predicted peak by the gradients (a CNN with --accum 2 at
// 50%: +6.2%; tools/soak.py). The plan gets the latest record with, at each AccumulateGrad node,
// the most another record of the kind allocated there beyond it. Only gradients: a first step's
// other allocations (a library's workspace made once) are not every step's. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/profile.h"

namespace memplan {

struct FreshGradients {
  int64_t bytes = 0;      // added by the end of the step (0: the latest record as it is)
  int64_t from_step = -1; // the record that allocated the most of them
};

// `recorded[latest]` with, from each AccumulateGrad node on, what other records of its kind
// allocated there beyond it (records of the same ops and nodes, by structure signature and name:
// sizes may differ): every later live and peak count is raised by it; and each AccumulateGrad
// node's peak rises above its start as much as it did in any of them. `*out` (may be null) says
// how much was added and from which record. Only when some record allocated more is anything
// changed (else the latest record as it is).
Profile with_fresh_gradients(const std::vector<Profile>& recorded, size_t latest, FreshGradients* out = nullptr);

}  // namespace memplan
