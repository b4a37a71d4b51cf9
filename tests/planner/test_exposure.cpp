// Which op output the tensor an op read (TensorRef::from): the planner re-runs that op to make the
// tensor again. Without it the planner guesses from the storage and the shape, which cannot tell
// q from k, two views of the packed projection with one shape: a GPT-2 plan re-ran the view of v
// where the replay re-ran those of q and k, ops no plan priced.
#include <gtest/gtest.h>

#include "planner/graph.h"
#include "planner/plan_builder.h"
#include "planner/simulate.h"
#include "planner/synth.h"

using namespace memplan;
using namespace memplan::planner;

namespace {

//   qkv = linear(x)          op 0
//   q = qkv.transpose()      op 1
//   k = qkv.transpose()      op 2 (same shape as q)
//   s = matmul(q, k)         op 3
Profile views(bool told) {
  SynthBuilder b;
  const int64_t x = b.input(1 << 18);
  const int64_t qkv = b.op("aten::linear", {x, b.param(1 << 16)}, {{1 << 20}}, {x}, 40)[0];
  SynthBuilder::Out view;
  view.view_of = qkv;
  b.op("aten::transpose", {qkv}, {view}, {}, 1);
  b.op("aten::transpose", {qkv}, {view}, {}, 1);
  const int64_t s = b.op("aten::matmul", {qkv, qkv}, {{1 << 20}}, {qkv}, 10)[0];
  b.op("aten::sum", {s}, {{4}}, {}, 1);
  Profile p = b.finish();
  for (int k = 0; k < 2; ++k) {
    p.forward[3].inputs[k].shape = p.forward[1].outputs[0].shape;  // the views' shape
    if (told) p.forward[3].inputs[k].from = 1 + k;
  }
  return p;
}

std::vector<int64_t> sources(const Profile& p, int64_t op) {
  Graph g;
  std::string err;
  EXPECT_TRUE(build_graph(p, &g, &err)) << err;
  std::vector<int64_t> out;
  for (const Dep& d : g.deps[op]) out.push_back(d.src);
  return out;
}

}  // namespace

TEST(Exposure, AnInputIsMadeAgainByTheOpThatOutputIt) {
  EXPECT_EQ(sources(views(true), 3), (std::vector<int64_t>{1, 2}));
}

TEST(Exposure, WithoutItTheLastViewOfTheSameShapeIsGuessed) {
  EXPECT_EQ(sources(views(false), 3), (std::vector<int64_t>{2}));
}

TEST(Exposure, AnOpThatOutputNoneOfTheValueIsNoSource) {
  Profile p = views(true);
  p.forward[3].inputs[0].from = 0;  // linear did output qkv: its own tensor
  EXPECT_EQ(sources(p, 3), (std::vector<int64_t>{0, 2}));
  p.forward[3].inputs[0].from = 4;  // a later op: ignored, guessed instead
  p.forward[3].inputs[1].from = -1;
  EXPECT_EQ(sources(p, 3), (std::vector<int64_t>{2}));
}

// A value a recompute makes beside its target and keeps for a later node (keep_byproducts) is
// kept with the views its savers read, as a target is: the op that made such a view runs in the
// same recompute. Mixtral's router linear saves a reshape of the normed hidden states; the plan
// kept those states as a byproduct without the reshape, and the replay re-ran it unpriced.
//   (a, m) = two_out(x)      op 0
//   v = a.view()             op 1
//   y = linear(v, w)         op 2, saves v (a, through op 1's view)
//   u = mul(y, m)            op 3, saves m: its node comes first in backward
//   sum(u)                   op 4
TEST(Exposure, AByproductKeptForALaterNodeComesWithTheViewsItsSaversRead) {
  SynthBuilder b;
  const int64_t x = b.input(1 << 18), w = b.param(1 << 16);
  const std::vector<int64_t> am = b.op("aten::two_out", {x}, {{1 << 20}, {1 << 16}}, {}, 40);
  const int64_t a = am[0], m = am[1];
  SynthBuilder::Out view;
  view.view_of = a;
  b.op("aten::view", {a}, {view}, {}, 1);
  const int64_t y = b.op("aten::linear", {a, w}, {{1 << 18}}, {a, w}, 20)[0];
  const int64_t u = b.op("aten::mul", {y, m}, {{1 << 18}}, {y, m}, 5)[0];
  b.op("aten::sum", {u}, {{4}}, {}, 1);
  Profile p = b.finish();
  p.forward[2].inputs[0].shape = p.forward[1].outputs[0].shape;
  p.forward[2].inputs[0].from = 1;
  Graph g;
  std::string err;
  ASSERT_TRUE(build_graph(p, &g, &err)) << err;
  ASSERT_TRUE(g.evictable[a] && g.evictable[m]);
  ASSERT_LT(g.first_unpack[m], g.first_unpack[a]);
  std::vector<char> evict(p.values.size(), 0), none(p.values.size(), 0);
  evict[a] = evict[m] = 1;
  Plan plan;
  build_eviction_actions(g, {}, evict, none, 1, &plan);
  ASSERT_EQ(plan.recomputes.size(), 1u);  // a is kept from m's rebuild: nothing left to rebuild
  EXPECT_EQ(plan.recomputes[0].ops, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(plan.recomputes[0].keep, (std::vector<int64_t>{a, m}));
  const SimResult r = simulate(g, plan);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.recompute_us, p.forward[0].time_us + p.forward[1].time_us);
}
