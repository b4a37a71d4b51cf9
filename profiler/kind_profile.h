// The record of a kind of step the planner gets. Steps of one kind run the same ops but need not
// allocate the same memory: under gradient accumulation the first micro-step of each optimizer
// step allocates every gradient (none exists: AccumulateGrad keeps the incoming one), the next
// ones add into them and free the incoming one. A budget caps what a step allocates, so the
// first micro-step is the heavier; when the latest warm-up record was a later micro-step, the
// plan let every first one pass its predicted peak by the gradients (a CNN with --accum 2 at
// 50%: +6.2%; tools/soak.py). The plan gets the latest record with, at each AccumulateGrad node,
// the most another record of the kind allocated there beyond it. Only gradients: a first step's
// other allocations (a library's workspace made once) are not every step's.
//
// The other way round too: a script that zeroes the gradients between forward and backward
// (before the first micro-step's backward, under accumulation) frees them there and allocates
// them again node by node; the later micro-steps keep theirs. Planned from the first, the others
// passed their prediction by the gradients not yet made again (tv-shufflenet --accum 2 at 49%:
// +9.7%, over the budget; tools/soak.py). So what another record of the same sizes kept across
// the gap between forward and backward beyond it is counted too, from the first node on, less
// what the latest allocates again at each AccumulateGrad node beyond it. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/profile.h"

namespace memplan {

struct FreshGradients {
  int64_t bytes = 0;      // added by the end of the step (0: the latest record as it is)
  int64_t from_step = -1; // the record that allocated the most of them
  int64_t kept = 0;       // the most added at any node for gradients another record kept
  int64_t kept_from = -1; // that record
};

// `recorded[latest]` with, from each AccumulateGrad node on, what other records of its kind
// allocated there beyond it (records of the same ops and nodes, by structure signature and name:
// sizes may differ): every later live and peak count is raised by it; and each AccumulateGrad
// node's peak rises above its start as much as it did in any of them; and, from the first
// backward node on, what another record of the same sizes kept across the gap before it beyond
// it, less what the latest allocated beyond it at each AccumulateGrad node since (the larger of
// the two counts at each node). `*out` (may be null) says how much was added and from which
// record. Only when some record allocated or kept more is anything changed (else the latest
// record as it is). `began` (per record, may be null): how each step began, with or without its
// gradients (any values, compared for equality only); only a record that began as the latest did
// lends what it kept (the run's first step holds its gradients through its backward for having
// none at its start, not for keeping them: a step that begins so has a plan of its own, agent.h
// plan_without_gradients).
Profile with_fresh_gradients(const std::vector<Profile>& recorded, size_t latest, FreshGradients* out = nullptr,
                             const std::vector<char>* began = nullptr);

// `p`, the record of a step that began with gradients and added into them, as the same ops run
// by a step that begins without them: each AccumulateGrad node keeps the incoming gradient it
// freed (it becomes the parameter's .grad; AccumulateGrad steals it when nothing else holds it),
// so every later live and peak count rises by what the nodes so far freed. For a kind with no
// record of a step that began so (re-profiled after a divergence in a later micro-step, with
// MEMPLAN_WARMUP=1: its first micro-steps passed their prediction by the gradients, GPT-2 at 26%
// +12.3%; tools/soak.py). `*added` (may be null): the bytes kept by the end (0: `p` as it is).
Profile with_gradients_kept(const Profile& p, int64_t* added = nullptr);

// `p` as a step runs it that frees `bytes` less between forward and backward than `p` did
// (negative: more): every backward node's live and peak counts, and the step's end, move by them.
// A script that zeroes the gradients there frees what the previous step left, which another kind
// of step may have made (GPT-2 with --depth-random --accum 2 --zero-grad-late: a one-block step's
// only record followed a four-block step and freed its gradients; the next micro-step frees
// none), or none at all before the record (MEMPLAN_WARMUP=1: the run's first step, whose later
// steps each free the gradients there), so the record's gap says little about its kind's other
// steps; the agent watches the gap of each replayed step (agent/gap_check.cpp). Kept to the end
// of backward, on the safe side: a step that zeroes nothing there adds into its gradients rather
// than allocating them, and so ends under this by up to its gradients.
// `in_gap` false: the bytes are what the step's backward made beyond `p`'s (gradients of
// parameters `p`'s backward took none for: adversarial training's attack), kept as above, with
// the record's gap as it was: the step freed there what `p` did.
Profile with_gap_kept(const Profile& p, int64_t bytes, bool in_gap = true);

// A replayed step whose backward ran more nodes than its plan's record (the record adversarial
// training's attack, which takes the input's gradient alone; the step's backward makes every
// parameter's): what it had allocated beyond the plan's prediction at each of the record's
// backward nodes. The record's nodes are found in order, by name, among the step's (false when one
// is not, or the step has no backward record: recorded light); the step's nodes before the second
// match count with the first, those after a match up to the next with it. `predicted_live` and
// `predicted_peak`: the plan's simulated memory after and during each of the record's nodes
// (planner SimResult::bwd_live/bwd_peak, on the record's baseline). Out, per record node: the
// excess after it and during it, neither below zero. Cost: one pass over both backwards.
bool backward_excess(const Profile& step, const Profile& record, const std::vector<int64_t>& predicted_live,
                     const std::vector<int64_t>& predicted_peak, std::vector<int64_t>* live,
                     std::vector<int64_t>* peak);

// `p` with `live[j]` more allocated after its backward node j (so before node j + 1) and its peak
// during node j `peak[j]` higher (at least its new live counts); the step's end and peak follow.
// Gradients the step made node by node are counted where they were made, not from the start of
// backward as with_gap_kept's bytes (which over-predicted the views model by 9.3%).
Profile with_backward_excess(const Profile& p, const std::vector<int64_t>& live, const std::vector<int64_t>& peak);

}  // namespace memplan
