// Per-block ILP: its optimum equals brute force over keep/evict subsets on tiny blocks, every
// option respects the budgets it was solved at, and every option replays in the simulator.
#include <gtest/gtest.h>

#include <random>

#include "planner/block_ilp.h"
#include "planner/plan_builder.h"
#include "planner/simulate.h"
#include "planner/synth.h"

using namespace memplan;
using namespace memplan::planner;

namespace {

BlockProblem random_problem(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int> coin(0, 2), bytes(1, 9), t(1, 20);
  BlockProblem bp;
  bp.n_ops = n;
  for (int o = 0; o < n; ++o) {
    bp.time.push_back(t(rng));
    bp.out_bytes.push_back(bytes(rng));
    if (coin(rng) > 0) {  // this op's output is a candidate (saved, evictable)
      bp.cand_op.push_back(o);
      bp.cand_bytes.push_back(bp.out_bytes.back());
    }
  }
  for (int o = 1; o < n; ++o)
    for (int p = 0; p < o; ++p) {
      if (coin(rng) != 0) continue;
      int cand = -1;
      for (size_t c = 0; c < bp.cand_op.size(); ++c)
        if (bp.cand_op[c] == p) cand = static_cast<int>(c);
      if (cand >= 0)
        bp.cond.push_back({o, p, cand});
      else
        bp.must.push_back({o, p});
    }
  return bp;
}

// Brute force, written apart from the library: for each eviction subset the rerun set is the
// smallest set closed under "evicted => producer reruns" and "rerun op => its needed inputs rerun".
double brute(const BlockProblem& bp, int64_t S, int64_t A) {
  const int nc = static_cast<int>(bp.cand_op.size());
  double best = -1;
  for (int mask = 0; mask < (1 << nc); ++mask) {
    std::vector<char> r(bp.n_ops, 0);
    for (int c = 0; c < nc; ++c)
      if (mask >> c & 1) r[bp.cand_op[c]] = 1;
    for (bool changed = true; changed;) {
      changed = false;
      for (auto [o, p] : bp.must)
        if (r[o] && !r[p]) r[p] = changed = true;
      for (const auto& k : bp.cond)
        if (r[k[0]] && (mask >> k[2] & 1) && !r[k[1]]) r[k[1]] = changed = true;
    }
    int64_t kept = 0, rebuilt = 0;
    double time = 0;
    for (int c = 0; c < nc; ++c)
      if (!(mask >> c & 1)) kept += bp.cand_bytes[c];
    for (int o = 0; o < bp.n_ops; ++o)
      if (r[o]) {
        rebuilt += bp.out_bytes[o];
        time += bp.time[o];
      }
    if (kept <= S && kept + rebuilt <= A && (best < 0 || time < best)) best = time;
  }
  return best;
}

}  // namespace

TEST(BlockIlp, OptimumEqualsBruteForceOnTinyBlocks) {
  std::mt19937 rng(2024);
  auto solver = make_cbc_solver();
  int solved = 0;
  for (int trial = 0; trial < 40; ++trial) {
    BlockProblem bp = random_problem(rng, 3 + trial % 5);
    int64_t tc = 0, to = 0;
    for (int64_t b : bp.cand_bytes) tc += b;
    for (int64_t b : bp.out_bytes) to += b;
    for (int64_t S : {int64_t{0}, tc / 3, tc / 2, tc})
      for (int64_t A : {tc / 2, tc, tc + to / 2, tc + to}) {
        const double want = brute(bp, S, A);
        BlockOption o;
        MilpStatus st = solve_block_point(bp, *solver, S, A, MilpLimits{5.0}, &o);
        if (want < 0) {
          EXPECT_EQ(st, MilpStatus::Infeasible) << "trial " << trial;
          continue;
        }
        ASSERT_EQ(st, MilpStatus::Optimal) << "trial " << trial;
        double time = o.time_bwd - bp.bwd_time;
        EXPECT_NEAR(time, want, 1e-6) << "trial " << trial << " S " << S << " A " << A;
        // The solution keeps its promises.
        EXPECT_LE(o.size_a_bar, S);
        EXPECT_LE(o.overhead_bwd - bp.bwd_growth + o.size_a_bar, A);
        // And it is closed: the library's closure of its evictions is no bigger.
        BlockOption c = closure_option(bp, o.evict);
        EXPECT_LE(c.time_bwd, o.time_bwd + 1e-9);
        ++solved;
      }
  }
  EXPECT_GT(solved, 100);
}

TEST(BlockIlp, StatusNotExceptionOnInfeasible) {
  BlockProblem bp;
  bp.n_ops = 2;
  bp.time = {1, 1};
  bp.out_bytes = {100, 100};
  bp.cand_op = {0};
  bp.cand_bytes = {100};
  bp.must = {{1, 0}};
  auto solver = make_cbc_solver();
  BlockOption o;
  // Keeping costs 100 > 10, evicting costs a rebuild of 100 > 10: infeasible.
  EXPECT_EQ(solve_block_point(bp, *solver, 10, 10, MilpLimits{1.0}, &o), MilpStatus::Infeasible);
  // A malformed problem is an error status, not a crash.
  bp.cond = {{1, 0, 5}};
  EXPECT_EQ(solve_block_point(bp, *solver, 1000, 1000, MilpLimits{1.0}, &o), MilpStatus::Error);
}

TEST(BlockIlp, EveryOptionReplaysInTheSimulator) {
  for (const Profile& p : {synth_transformer(3), synth_resnet(6)}) {
    Graph g;
    std::string err;
    ASSERT_TRUE(build_graph(p, &g, &err)) << err;
    auto blocks = make_blocks(g, BlockOptions{});
    ASSERT_GT(blocks.size(), 2u);
    auto solver = make_cbc_solver();
    std::vector<BlockMenu> menus(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].shape_id != static_cast<int>(i)) continue;
      const int64_t out = i + 1 < blocks.size() ? blocks[i + 1].input : -1;
      BlockProblem bp = make_block_problem(g, blocks[i], out);
      menus[i] = solve_block(bp, *solver, IlpOptions{});
      ASSERT_FALSE(menus[i].options.empty());
      EXPECT_GT(menus[i].solves, 0);
    }
    auto keep_all = [&](size_t i) {
      const auto& opts = menus[blocks[i].shape_id].options;
      for (size_t k = 0; k < opts.size(); ++k)
        if (std::none_of(opts[k].evict.begin(), opts[k].evict.end(), [](char e) { return e; }))
          return static_cast<int>(k);
      return -1;
    };
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto& opts = menus[blocks[i].shape_id].options;
      for (size_t k = 0; k < opts.size(); ++k) {
        Sweep s{0, static_cast<int>(blocks.size()) - 1, {}};
        for (size_t j = 0; j < blocks.size(); ++j)
          s.steps.push_back({static_cast<int>(j), Mode::Fe, j == i ? static_cast<int>(k) : keep_all(j)});
        Plan plan;
        build_actions(g, blocks, menus, {s}, &plan);
        SimResult r = simulate(g, plan);
        ASSERT_TRUE(r.ok) << "block " << i << " option " << k << ": " << r.error;
        // Evicting never raises the forward's memory beyond the checkpoints it holds, and costs
        // the recompute time it claims.
        SimResult base = simulate(g, Plan{});
        int64_t held = 0;
        for (const Hold& h : plan.holds) held += g.bytes(h.value);
        for (size_t f = 0; f < r.fwd_peak.size(); ++f) EXPECT_LE(r.fwd_peak[f], base.fwd_peak[f] + held);
        double rerun = 0;
        for (int o = 0; o < static_cast<int>(opts[k].rerun.size()); ++o)
          if (opts[k].rerun[o]) rerun += p.forward[blocks[i].first + o].time_us;
        EXPECT_NEAR(r.recompute_us, rerun, 1e-6) << "block " << i << " option " << k;
      }
    }
  }
}

// The menu is the fine grid's Pareto front plus the coarse grid's, each coarse option flagged;
// past the ILP deadline no solve runs and the menu is keep-all and evict-all.
TEST(BlockIlp, TheMenuHoldsTheCoarseFrontFlaggedAndStopsAtTheDeadline) {
  std::mt19937 rng(7);
  auto solver = make_cbc_solver();
  for (int trial = 0; trial < 20; ++trial) {
    BlockProblem bp = random_problem(rng, 7);
    IlpOptions coarse_only;
    coarse_only.grid_save = coarse_only.coarse_save;
    coarse_only.grid_all = coarse_only.coarse_all;
    coarse_only.max_options = IlpOptions{}.max_options / 2;
    BlockMenu c = solve_block(bp, *solver, coarse_only);
    BlockMenu m = solve_block(bp, *solver, IlpOptions{});
    ASSERT_EQ(m.coarse.size(), m.options.size());
    int flagged = 0;
    for (char f : m.coarse) flagged += f;
    EXPECT_EQ(flagged, static_cast<int>(c.options.size())) << "trial " << trial;
    for (const BlockOption& o : c.options) {
      bool found = false;
      for (size_t k = 0; k < m.options.size(); ++k)
        found = found || (m.coarse[k] && m.options[k].evict == o.evict && m.options[k].rerun == o.rerun);
      EXPECT_TRUE(found) << "trial " << trial << ": a coarse option is missing from the menu";
    }
    EXPECT_GE(m.solves, c.solves);
    IlpOptions late;
    late.deadline = std::chrono::steady_clock::now();
    BlockMenu l = solve_block(bp, *solver, late);
    EXPECT_EQ(l.solves, 0);
    EXPECT_LE(l.options.size(), 2u);
  }
}
