// Which forward ops a rebuild may re-run under a plan: every op that provides an evicted value
// (creates it, or re-exposes it as a view or an in-place result), and transitively every op
// providing their inputs. The replay gives exactly these ops a recipe, which holds their inputs
// from before the step until it ends (agent/replay.cpp); the simulator counts what that keeps
// alive. One function, so the two agree.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/profile.h"

namespace memplan::planner {

// Per value: the forward ops that provide it (its producer and every op that outputs it).
std::vector<std::vector<int64_t>> value_providers(const Profile& p);

// Per forward op: 1 if a rebuild of one of `evicted` may re-run it. `providers` is
// value_providers(p). Cost: linear in the ops and inputs reached.
std::vector<char> rerun_ops(const Profile& p, const std::vector<std::vector<int64_t>>& providers,
                            const std::vector<int64_t>& evicted);

}  // namespace memplan::planner
