// Per-block option menus (Rockmate's per-block ILP, restricted to what the runtime can replay).
//
// The block's forward runs once, in the user's order. For each candidate saved value the ILP picks
// keep (autograd holds it until backward) or evict (dropped after its last forward use); evicted
// values are rebuilt by one recompute action before the block's backward, which reruns a set R of
// the block's ops. An op in R needs each input either rebuilt (its producer in R), or still alive
// (a kept candidate, the block input, or a persistent value). Variables: e_c (evict candidate c),
// r_o (rerun op o), all binary:
//     e_c <= r_prod(c)                        an evicted value must be rebuilt
//     r_o <= r_p                              o reads a non-saved value of op p (or p's view)
//     r_o <= r_p + 1 - e_c                    o reads candidate c of op p
//     sum_c (1-e_c) bytes_c <= S              kept-for-backward budget (bdg_save)
//     sum_c (1-e_c) bytes_c + sum_o r_o out_o <= A   peak budget of the block (bdg_all)
//     r_o = 0                                 o cannot be re-run (Graph::rerunnable)
//     minimise sum_o r_o time_o
// Solved over a grid of (A, S); the distinct Pareto-optimal solutions become the block's options.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/blocks.h"
#include "planner/milp.h"

namespace memplan::planner {

struct BlockProblem {
  int n_ops = 0;
  std::vector<double> time;          // per local op
  std::vector<char> rerunnable;      // per local op: Graph::rerunnable (r_o = 0 where it is 0)
  std::vector<int64_t> out_bytes;    // per local op: bytes it creates when rerun
  std::vector<int64_t> cand_bytes;   // per candidate
  std::vector<int> cand_op;          // per candidate: local producer
  std::vector<std::pair<int, int>> must;     // (o, p): r_o <= r_p
  std::vector<std::array<int, 3>> cond;      // (o, p, c): r_o <= r_p + 1 - e_c
  double fwd_time = 0, bwd_time = 0;
  int64_t bwd_growth = 0;            // measured growth of memory inside the block's backward
  int64_t ff_overhead = 0;           // no-grad forward: transient peak above input and output
};

struct BlockOption {
  std::vector<char> evict;           // per candidate
  std::vector<char> rerun;           // per local op
  double time_fwd = 0, time_bwd = 0;
  int64_t size_a_bar = 0, overhead_fwd = 0, overhead_bwd = 0;
  std::string source;                // "ilp", "keep-all", "evict-all"
};

struct BlockMenu {
  std::vector<BlockOption> options;
  // Per option: 1 if it is on the Pareto front of the coarse grid's solves alone (with keep-all
  // and evict-all). The planner runs its DP over these too and keeps both DPs' schedules as
  // candidates: the DP prices a schedule in rounded memory units and a fine menu can lead it to
  // one the simulator finds slower (the synthetic transformer4 at 24/26/72/74% of its activation
  // memory, Planner.FineMenusLoseNoPlanOfTheCoarseOnes).
  std::vector<char> coarse;
  double ff_time = 0;
  int64_t ff_overhead = 0;
  int solves = 0, optimal = 0, timeouts = 0;
};

struct IlpOptions {
  // S levels 0, 1/(n-1), ..., 1 of the candidates' bytes, and A levels 1/n, ..., 1 of all bytes.
  // The coarse grid's points are among the fine grid's ((grid_save-1) a multiple of
  // (coarse_save-1), grid_all of coarse_all).
  int grid_save = 7;
  int grid_all = 8;
  int coarse_save = 4;
  int coarse_all = 4;
  double solve_time_s = 0.25; // per solve
  int max_options = 16;       // of the fine front; the coarse front keeps at most max_options / 2
  bool use_ilp = true;        // false: only the keep-all / evict-all options
  // No solve starts after this, and none runs past it (the planner's ILP time for all blocks).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

BlockProblem make_block_problem(const Graph& g, const Block& b, int64_t out_separator);

// The cheapest rerun set for a given eviction vector (a least fixed point) and its numbers.
BlockOption closure_option(const BlockProblem& bp, const std::vector<char>& evict);

// Solves one (S, A) point. Returns the status; on a solution fills `out`.
MilpStatus solve_block_point(const BlockProblem& bp, MilpSolver& solver, int64_t save_budget,
                             int64_t all_budget, const MilpLimits& limits, BlockOption* out,
                             bool* clock_stopped = nullptr);

// A block's solves so far: keep-all and evict-all, then the grid's points, each marked
// whether it is a point of the coarse grid.
struct BlockSolves {
  std::vector<BlockOption> all;
  std::vector<char> on_coarse;
  int solves = 0, optimal = 0, timeouts = 0;
};
BlockSolves start_block(const BlockProblem& bp);
// Solves the coarse grid's points (coarse_pass) or the fine grid's others into `sv`. The planner
// solves every block's coarse points before any fine one: under its ILP time limit the coarse
// menus come whole.
void solve_grid(const BlockProblem& bp, MilpSolver& solver, const IlpOptions& opt, bool coarse_pass,
                BlockSolves* sv);
// The Pareto fronts of the fine and the coarse solves, as one menu (BlockMenu::coarse).
BlockMenu make_menu(const BlockProblem& bp, const BlockSolves& sv, const IlpOptions& opt);
// All three in one.
BlockMenu solve_block(const BlockProblem& bp, MilpSolver& solver, const IlpOptions& opt);

}  // namespace memplan::planner
