// Golden tests: checked-in synthetic profiles -> plan summaries at fixed budgets, compared exactly
// with checked-in text. Regenerate with MEMPLAN_UPDATE_GOLDEN=1 (then review the diff).
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "agent/options.h"
#include "planner/plan_builder.h"
#include "planner/plan_io.h"
#include "planner/planner.h"
#include "planner/report.h"
#include "planner/synth.h"
#include "profiler/profile_io.h"

using namespace memplan;
using namespace memplan::planner;

namespace {

const std::string kDir = std::string(MEMPLAN_SOURCE_DIR) + "/tests/data/profiles/";

std::string summaries(const std::string& name) {
  Profile p;
  std::string err;
  EXPECT_TRUE(read_profile_file(kDir + name + ".json", &p, &err)) << err;
  Planner pl;
  EXPECT_TRUE(pl.prepare(p, PlannerOptions{}, &err)) << err;
  std::string out;
  for (const char* b : {"100%", "70%", "50%", "33%", "5%"}) {
    Budget budget;
    EXPECT_TRUE(memplan::parse_budget(b, &budget));
    PlanResult r = pl.plan_for(budget);
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_TRUE(validate_plan(r.plan, p, &err)) << err;
    out += fmt::format("=== {} at {}\n", name, b) + format_summary(pl, r, true);
  }
  out += "=== sweep\n" + format_sweep(pl);
  return out;
}

void golden(const std::string& name) {
  const std::string got = summaries(name);
  const std::string path = kDir + name + ".expected";
  if (std::getenv("MEMPLAN_UPDATE_GOLDEN")) {
    std::ofstream(path) << got;
    return;
  }
  std::ifstream f(path);
  ASSERT_TRUE(f) << "missing " << path << " (run with MEMPLAN_UPDATE_GOLDEN=1)";
  std::stringstream want;
  want << f.rdbuf();
  EXPECT_EQ(got, want.str()) << "golden mismatch for " << name;
}

}  // namespace

TEST(Golden, Transformer) { golden("transformer3"); }
TEST(Golden, Resnet) { golden("resnet8"); }

namespace {

// A source of extra candidates may only add plans: with it, every chosen plan still passes the
// simulator under its budget and is never slower than without it; its work is bounded by counts,
// not time, so two planners give the same plan, byte for byte. Returns at how many budgets a plan
// from that source (`origin`; empty: any) was strictly faster.
int check_added_candidates(const Profile& p, const PlannerOptions& without, const PlannerOptions& with,
                           std::initializer_list<double> percents, const std::string& origin) {
  std::string err;
  Planner a, b, c;
  EXPECT_TRUE(a.prepare(p, without, &err) && b.prepare(p, with, &err) && c.prepare(p, with, &err)) << err;
  int better = 0;
  for (double pct : percents) {
    const Budget bud{Budget::Kind::Percent, 0, pct};
    const PlanResult r0 = a.plan_for(bud), r1 = b.plan_for(bud), r2 = c.plan_for(bud);
    EXPECT_TRUE(r0.ok && r1.ok && r2.ok) << pct;
    EXPECT_TRUE(r1.plan.feasible) << pct;
    std::string verr;
    EXPECT_TRUE(validate_plan(r1.plan, p, &verr)) << pct << ": " << verr;
    EXPECT_LE(r1.sim.peak, budget_bytes(bud, p)) << pct;
    EXPECT_LE(r1.plan.predicted_time_us, r0.plan.predicted_time_us + 1e-6) << pct;
    if ((origin.empty() || r1.origin == origin) && r1.plan.predicted_time_us < r0.plan.predicted_time_us - 1e-6) ++better;
    EXPECT_EQ(plan_to_json(r1.plan), plan_to_json(r2.plan)) << pct;
  }
  return better;
}

int check_added_candidates(const PlannerOptions& without, const PlannerOptions& with,
                           std::initializer_list<double> percents, const std::string& origin) {
  Profile p;
  std::string err;
  EXPECT_TRUE(read_profile_file(kDir + "gpt2_cpu.json", &p, &err)) << err;
  return check_added_candidates(p, without, with, percents, origin);
}

}  // namespace

// Both extra stages on a graph past 300 forward ops, where they used to be left out: a
// synthetic ResNet of 502 ops at 50%, +13.7% with the block/DP plans alone, +7.9% with them
// (measured; ~3.5 s per prepare). At 70% neither finds better.
TEST(WholeGraph, AndLocalSearchRunPastThreeHundredOps) {
  const Profile p = synth_resnet(70);
  ASSERT_GT(p.forward.size(), 500u);
  PlannerOptions without;
  without.whole_graph.enabled = without.refine.enabled = false;
  EXPECT_GE(check_added_candidates(p, without, PlannerOptions{}, {50.0, 70.0}, ""), 1);
}

// Whole-graph ILP candidates (node-limited solves), against the block/DP plans alone.
// Measured: faster at all five (45%: +24.7% -> +21.5%, 70%: +9.1% -> +6.9%, 80%: +5.7% -> +3.6%).
TEST(WholeGraph, AddsOnlyFeasibleFasterPlansOnARecordedProfile) {
  PlannerOptions without, with;
  without.whole_graph.enabled = false;
  without.refine.enabled = with.refine.enabled = false;
  EXPECT_GE(check_added_candidates(without, with, {45.0, 60.0, 70.0, 80.0, 90.0}, "whole-graph ILP"), 3);
}

// Local-search candidates (refine.h, bounded by simulation counts), on top of everything else.
// Measured (with compact masks): 38% +16.4% -> +15.4%, 45% +13.1% -> +12.1%; 33%, 50% and 70%
// are already local optima.
TEST(Refine, AddsOnlyFeasibleFasterPlansOnARecordedProfile) {
  PlannerOptions without;
  without.refine.enabled = false;
  EXPECT_GE(check_added_candidates(without, PlannerOptions{}, {33.0, 38.0, 45.0, 50.0, 70.0}, "local search"), 2);
}

namespace {

Profile gpt2_profile() {
  Profile p;
  std::string err;
  EXPECT_TRUE(read_profile_file(kDir + "gpt2_cpu.json", &p, &err)) << err;
  return p;
}

}  // namespace

// The recorded GPT-2 step has 13 aten::dropout ops; on the CPU each saves its 0/scale noise (a
// float per element, packed inside the op). Those, and only those, are compaction candidates.
TEST(Compaction, FindsTheDropoutMasksOfARecordedProfile) {
  const Profile p = gpt2_profile();
  Graph g;
  std::string err;
  ASSERT_TRUE(build_graph(p, &g, &err)) << err;
  const std::vector<int64_t> masks = g.compaction_candidates();
  EXPECT_EQ(masks.size(), 13u);
  for (int64_t v : masks) {
    const Value& val = p.values[v];
    const Op& op = p.forward[val.producer];
    EXPECT_EQ(op.name, "aten::dropout");
    for (const TensorRef& t : op.outputs) EXPECT_NE(t.value, v);
    EXPECT_EQ(g.compact_bytes[v] * 32, g.bytes(v));  // one bit per float element
    EXPECT_GT(g.compact_us[v], 0);
  }
  // Not on a CUDA profile: the fused kernel saves a byte mask already.
  Profile cuda = p;
  cuda.device = "cuda:0";
  Graph gc;
  ASSERT_TRUE(build_graph(cuda, &gc, &err)) << err;
  EXPECT_TRUE(gc.compaction_candidates().empty());
}

// A GAN's discriminator step (recorded): its only aten::add adds two scalar losses, 4 bytes in
// 4.8 us. Taken as a per-byte rate, it priced compacting the 256 KiB dropout mask at 0.6 s and the
// minimum-memory plan at +7600%. Small ops are not a rate; and compacting never costs more than
// the dropout that made the mask.
TEST(Compaction, TinyElementwiseOpsDoNotSetTheRate) {
  Profile p;
  std::string err;
  ASSERT_TRUE(read_profile_file(kDir + "gan_d_step_cpu.json", &p, &err)) << err;
  Graph g;
  ASSERT_TRUE(build_graph(p, &g, &err)) << err;
  const std::vector<int64_t> masks = g.compaction_candidates();
  ASSERT_FALSE(masks.empty());
  for (int64_t v : masks) {
    const Op& op = p.forward[p.values[v].producer];
    EXPECT_GT(g.compact_us[v], 0);
    EXPECT_LE(g.compact_us[v], op.time_us);
  }
  Planner pl;
  ASSERT_TRUE(pl.prepare(p, PlannerOptions{}, &err)) << err;
  for (const char* b : {"70%", "50%", "5%"}) {
    Budget budget;
    ASSERT_TRUE(memplan::parse_budget(b, &budget));
    const PlanResult r = pl.plan_for(budget);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_LT(r.plan.predicted_time_us, 1.5 * r.plan.unplanned_time_us) << b;
  }
}

// The simulator's account: between the end of its producer and its unpack a compact mask counts
// its compact bytes instead of its full bytes; the time grows by the compaction estimates.
TEST(Compaction, SimulatorCountsCompactBytesAndTime) {
  const Profile p = gpt2_profile();
  Graph g;
  std::string err;
  ASSERT_TRUE(build_graph(p, &g, &err)) << err;
  Plan none, all;
  all.compactions = g.compaction_candidates();
  const SimResult a = simulate(g, none), b = simulate(g, all);
  ASSERT_TRUE(a.ok && b.ok) << b.error;
  int64_t saved = 0;
  double cost = 0;
  for (int64_t v : all.compactions) {
    saved += g.bytes(v) - g.compact_bytes[v];
    cost += g.compact_us[v];
  }
  // After the last forward op every mask is made and none is unpacked yet.
  EXPECT_EQ(a.fwd_live.back() - b.fwd_live.back(), saved);
  EXPECT_LT(b.peak, a.peak);
  EXPECT_NEAR(b.time_us - a.time_us, cost, 1e-6);
  EXPECT_DOUBLE_EQ(b.compact_us, cost);
  // Plans that break the rules fail the simulator (and so validate_plan).
  Plan twice = all;
  twice.compactions.push_back(twice.compactions.front());
  EXPECT_FALSE(simulate(g, twice).ok);
  Plan both = all;
  both.evictions.push_back({all.compactions.front(), g.last_fwd_use[all.compactions.front()]});
  EXPECT_FALSE(simulate(g, both).ok);
  Plan not_mask;
  for (int64_t v : g.eviction_candidates())
    if (g.compact_bytes[v] == 0) {
      not_mask.compactions.push_back(v);
      break;
    }
  EXPECT_FALSE(simulate(g, not_mask).ok);
}

// A backward that keeps its graph (retain_graph, create_graph) keeps what autograd saved past the
// last node that read it, to the step's end: so do a compact mask (the replay expands it back only
// then) and a value a recompute made again. Before, the simulator took them as freed, or
// expanded, at their last unpack: GPT-2 --backward-twice at 50% measured 8.7% under its
// prediction, one dropout mask more at each MulBackward0.
TEST(Compaction, AKeptGraphKeepsMasksCompactAndRebuiltValuesToTheStepsEnd) {
  Profile p = gpt2_profile();
  p.graph_kept = true;
  Graph g;
  std::string err;
  ASSERT_TRUE(build_graph(p, &g, &err)) << err;
  Plan none, all;
  all.compactions = g.compaction_candidates();
  ASSERT_FALSE(all.compactions.empty());
  const SimResult a = simulate(g, none), b = simulate(g, all);
  ASSERT_TRUE(a.ok && b.ok) << b.error;
  int64_t saved = 0;
  for (int64_t v : all.compactions) {
    EXPECT_EQ(g.natural_end[v], g.end_pos());
    saved += g.bytes(v) - g.compact_bytes[v];
  }
  EXPECT_EQ(a.bwd_live.back() - b.bwd_live.back(), saved);  // every mask still compact
  // A GELU output evicted and made again before its first unpack: alive to the end again, as
  // without the plan.
  int64_t v = -1;
  for (size_t o = 0; o < p.forward.size() && v < 0; ++o)
    if (p.forward[o].name == "aten::gelu") v = p.forward[o].outputs.at(0).value;
  ASSERT_GE(v, 0);
  ASSERT_GE(g.first_unpack[v], 0);
  Plan rebuilt;
  rebuilt.evictions = {{v, g.last_fwd_use[v]}};
  rebuilt.recomputes = {{g.first_unpack[v], {g.producer(v)}, {v}}};
  const SimResult c = simulate(g, rebuilt);
  ASSERT_TRUE(c.ok) << c.error;
  EXPECT_EQ(c.bwd_live.back(), a.bwd_live.back());
  EXPECT_LT(c.fwd_live.back(), a.fwd_live.back());
  // Without a kept graph both end at their last unpack.
  p.graph_kept = false;
  Graph h;
  ASSERT_TRUE(build_graph(p, &h, &err)) << err;
  const SimResult d = simulate(h, none), e = simulate(h, all), f = simulate(h, rebuilt);
  ASSERT_TRUE(d.ok && e.ok && f.ok);
  EXPECT_EQ(d.bwd_live.back(), e.bwd_live.back());
  EXPECT_EQ(f.bwd_live.back(), d.bwd_live.back());
}

// With compaction the planner only gains: every pick feasible, simulator-valid, never slower and
// deterministic; measured faster at all four budgets (35%: +30.1% -> +20.5%, 50%: +18.5% ->
// +10.0%, 70%: +6.9% -> +3.7%), and the moderate budgets' plans compact masks.
TEST(Compaction, PlannerPicksFasterPlansWithCompactMasks) {
  PlannerOptions without;
  without.compact_masks = false;
  EXPECT_GE(check_added_candidates(without, PlannerOptions{}, {35.0, 40.0, 50.0, 70.0}, ""), 3);
  const Profile p = gpt2_profile();
  const PlanResult r = make_plan(p, Budget{Budget::Kind::Percent, 0, 50});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_FALSE(r.plan.compactions.empty());
  Plan back;
  std::string err;
  ASSERT_TRUE(plan_from_json(plan_to_json(r.plan), &back, &err)) << err;
  EXPECT_EQ(back.compactions, r.plan.compactions);
}

// A dropout re-run while its mask is compact is `input x mask`: priced at the mask's compaction
// estimate instead of the op's recorded time (which is mostly the random draw).
TEST(Compaction, DropoutRerunFromACompactMaskIsPricedAsAProduct) {
  const Profile p = gpt2_profile();
  Graph g;
  std::string err;
  ASSERT_TRUE(build_graph(p, &g, &err)) << err;
  int64_t op = -1;
  for (int64_t i = 0; i < g.n_fwd && op < 0; ++i) {
    const int64_t out = p.forward[i].outputs.empty() ? -1 : p.forward[i].outputs[0].value;
    if (g.op_mask[i] >= 0 && out >= 0 && g.evictable[out]) op = i;
  }
  ASSERT_GE(op, 0) << "no dropout whose output backward reads";
  const int64_t out = p.forward[op].outputs[0].value, mask = g.op_mask[op];
  std::vector<char> evict(p.values.size(), 0), none(p.values.size(), 0);
  evict[out] = 1;
  Plan plain;
  build_eviction_actions(g, {}, evict, none, 1, &plain);
  Plan compact = plain;
  compact.compactions = {mask};
  const SimResult a = simulate(g, plain), b = simulate(g, compact);
  ASSERT_TRUE(a.ok && b.ok) << a.error << b.error;
  double rerun = 0;
  for (const Recompute& rc : plain.recomputes)
    for (int64_t o : rc.ops) rerun += p.forward[o].time_us;
  EXPECT_DOUBLE_EQ(a.recompute_us, rerun);
  EXPECT_DOUBLE_EQ(b.recompute_us, rerun - p.forward[op].time_us + g.compact_us[mask]);
  EXPECT_LT(b.time_us, a.time_us);
}
