// Which op output the tensor an op read (TensorRef::from): the planner re-runs that op to make the
// tensor again. Without it the planner guesses from the storage and the shape, which cannot tell
// q from k, two views of the packed projection with one shape: a GPT-2 plan re-ran the view of v
// where the replay re-ran those of q and k, ops no plan priced.
#include <gtest/gtest.h>

#include "planner/graph.h"
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
