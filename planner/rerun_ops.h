// Which forward ops a rebuild may re-run under a plan: every op that provides an evicted value
// (creates it, or re-exposes it as a view or an in-place result), and transitively every op
// providing their inputs, except ops that cannot be re-run (Op::rerunnable false: no plan re-runs
// them, and the replay gives them no recipe). The replay gives exactly these ops a recipe, which holds their inputs
// from before the step until it ends (agent/replay.cpp); the simulator counts what that keeps
// alive. One function, so the two agree.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/plan.h"
#include "profiler/profile.h"

namespace memplan::planner {

// Per value: the forward ops that provide it (its producer and every op that outputs it).
std::vector<std::vector<int64_t>> value_providers(const Profile& p);

// Per forward op: 1 if a rebuild of one of `evicted` may re-run it: their providers, and for each
// such op the providers of its inputs that ran before it, transitively. `providers` is
// value_providers(p). Cost: linear in the ops and inputs reached.
std::vector<char> rerun_ops(const Profile& p, const std::vector<std::vector<int64_t>>& providers,
                            const std::vector<int64_t>& evicted);

// Per forward op: the latest backward node before which one of `recomputes` re-runs it; -1 if
// none does.
std::vector<int64_t> last_rerun_node(const std::vector<Recompute>& recomputes, size_t n_fwd);

// Whether the replay copies input or parameter `v` when a recipe of an op re-run last before
// backward node `last_rerun` (-1: no recompute re-runs it) captures it: the step writes it in
// place (an optimizer step in a backward hook, a buffer a hook updates) before that node, or
// when, is not known. The copy lives to the step's end; the simulator counts it.
inline bool copied_when_captured(const Value& v, int64_t last_rerun) {
  return v.written && (v.written_before_node < 0 || (last_rerun >= 0 && v.written_before_node <= last_rerun));
}

}  // namespace memplan::planner
