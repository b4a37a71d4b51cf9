// Which record of a kind of step the planner gets. Steps of one kind run the same ops but need
// not use the same memory: under gradient accumulation the first micro-step of each optimizer
// step allocates every gradient (none exists yet), the next ones add into them. The latest record
// may be the lighter one, and a plan made from it let the other steps pass the prediction by the
// gradients (a model whose peak comes late in backward: +40% at 32%, tools/soak.py). The plan
// must hold for every step of the kind, so it gets the heaviest record's memory, with the latest
// record's times (a first step's times carry one-time costs). Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/profile.h"

namespace memplan {

// Index into `recorded` of the record of `recorded[latest]`'s kind (same signature) with the
// highest activation peak (peak minus baseline), when it passes the latest's by more than
// `margin` of it (allocator noise stays with the latest), and its ops and nodes are the
// latest's by name; else `latest`.
size_t heaviest_of_kind(const std::vector<Profile>& recorded, size_t latest, double margin = 0.01);

// `memory` with every time of `times` (per op and node, and the step's): the two must be records
// of one kind of step, as heaviest_of_kind checks.
Profile with_times_of(Profile memory, const Profile& times);

}  // namespace memplan
