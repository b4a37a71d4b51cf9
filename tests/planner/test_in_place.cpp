// Ops that write a value in place (Op::writes: relu_, hardswish_): what an op read before the
// write is gone once the write happened, though autograd keeps the written tensor, so a re-run of
// that op needs the value's maker re-run first; what an op read after the write is read where it
// is. Plans said otherwise and the replay re-ran more than the plan (tv-mobilenet at 50%: 140 ops
// a step where the plan re-ran 128, BatchNorms and convolutions the simulator never counted).
#include <gtest/gtest.h>

#include <algorithm>

#include "planner/blocks.h"
#include "planner/graph.h"
#include "planner/planner.h"
#include "planner/simulate.h"
#include "planner/synth.h"

using namespace memplan;
using namespace memplan::planner;

namespace {

//   h = linear(x)      op 0
//   e = exp(h)         op 1, saves e: reads h before the write
//   relu_(h)           op 2, saves h: writes it
//   y = mul(e, h)      op 3, saves e and h
//   z = tanh(h)        op 4, saves z: reads h after the write
//   loss = sum(y + z)  ops 5, 6
struct InPlace {
  Profile p;
  int64_t h = 0, e = 0, z = 0;
  explicit InPlace(bool writes = true) {
    SynthBuilder b;
    const int64_t x = b.input(1 << 18);
    h = b.op("aten::linear", {x, b.param(1 << 16)}, {{1 << 20}}, {x}, 40)[0];
    e = b.op_saving_outputs("aten::exp", {h}, {{1 << 20}}, {}, {0}, 5)[0];
    SynthBuilder::Out in_place;
    in_place.written = h;
    b.op_saving_outputs("aten::relu_", {h}, {in_place}, {}, {0}, 2);
    const int64_t y = b.op("aten::mul", {e, h}, {{1 << 20}}, {e, h}, 5)[0];
    z = b.op_saving_outputs("aten::tanh", {h}, {{1 << 20}}, {}, {0}, 5)[0];
    const int64_t s = b.op("aten::add", {y, z}, {{1 << 20}}, {}, 2)[0];
    b.op("aten::sum", {s}, {{4}}, {}, 1);
    p = b.finish();
    if (!writes) p.forward[2].writes.clear();  // a profile from before Op::writes
  }
  Graph graph() const {
    Graph g;
    std::string err;
    EXPECT_TRUE(build_graph(p, &g, &err)) << err;
    return g;
  }
};

const Dep* dep(const Graph& g, int64_t op, int64_t value) {
  for (const Dep& d : g.deps[op])
    if (d.value == value) return &d;
  return nullptr;
}

bool has(const std::vector<int64_t>& ops, int64_t o) { return std::find(ops.begin(), ops.end(), o) != ops.end(); }

}  // namespace

TEST(InPlace, WhatAnOpReadBeforeALaterWriteIsStale) {
  const InPlace t;
  EXPECT_EQ(t.p.forward[2].writes, std::vector<int64_t>{t.h});
  const Graph g = t.graph();
  for (int64_t op : {1, 2}) {  // exp and relu_ itself read h as linear made it
    const Dep* d = dep(g, op, t.h);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->src, 0);
    EXPECT_TRUE(d->stale) << op;
  }
  for (int64_t op : {3, 4}) {  // mul and tanh read relu_'s result, which nothing writes after
    const Dep* d = dep(g, op, t.h);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->src, 2);
    EXPECT_FALSE(d->stale) << op;
  }
  EXPECT_FALSE(g.evictable[t.h]);  // re-running relu_ would write it again
  EXPECT_TRUE(g.evictable[t.e] && g.evictable[t.z]);

  const InPlace old(false);
  EXPECT_FALSE(dep(old.graph(), 1, old.h)->stale);
}

TEST(InPlace, NoBlockEndsBetweenTheMakerAndTheWrite) {
  const InPlace t;
  const Graph g = t.graph();
  BlockOptions one;
  one.min_ops = 1;
  const std::vector<Block> blocks = make_blocks(g, one);
  ASSERT_GT(blocks.size(), 1u);
  for (const Block& b : blocks) EXPECT_TRUE(b.last != 0 && b.last != 1) << b.first << ".." << b.last;
  // Without the write known, the cut after linear is a separator (only h crosses it).
  const InPlace old(false);
  const std::vector<Block> old_blocks = make_blocks(old.graph(), one);
  EXPECT_TRUE(std::any_of(old_blocks.begin(), old_blocks.end(), [](const Block& b) { return b.last == 0; }));
}

TEST(InPlace, TheSimulatorRefusesARerunOfWhatAWriteReplacedWithoutItsMaker) {
  const InPlace t;
  const Graph g = t.graph();
  Plan plan;
  plan.evictions.push_back({t.e, g.last_fwd_use[t.e]});
  plan.recomputes.push_back({g.first_unpack[t.e], {1}, {t.e}});
  SimResult s = simulate(g, plan);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.error.find("written in place later"), std::string::npos) << s.error;
  plan.recomputes[0].ops = {0, 1};
  s = simulate(g, plan);
  EXPECT_TRUE(s.ok) << s.error;
}

TEST(InPlace, PlansRerunTheMakerBeforeTheEarlyReaderAndReadTheWrittenValueWhereItIs) {
  const InPlace t;
  Planner pl;
  std::string err;
  ASSERT_TRUE(pl.prepare(t.p, PlannerOptions{}, &err)) << err;
  bool e_rebuilt = false, z_rebuilt = false;
  for (const Candidate& c : pl.candidates()) {
    const SimResult s = simulate(pl.graph(), c.plan);
    ASSERT_TRUE(s.ok) << "slot " << c.slot << ": " << s.error;
    for (const Recompute& r : c.plan.recomputes) {
      if (has(r.ops, 1)) EXPECT_TRUE(has(r.ops, 0)) << "slot " << c.slot;  // exp after linear
      EXPECT_FALSE(has(r.ops, 2)) << "slot " << c.slot;  // relu_ never: h stays, as written
      e_rebuilt = e_rebuilt || has(r.keep, t.e);
      if (has(r.keep, t.z) && !has(r.keep, t.e)) {
        EXPECT_EQ(r.ops, std::vector<int64_t>{4}) << "slot " << c.slot;  // tanh reads h where it is
        z_rebuilt = true;
      }
    }
  }
  EXPECT_TRUE(e_rebuilt);
  EXPECT_TRUE(z_rebuilt);
}
