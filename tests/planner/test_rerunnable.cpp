// Ops a rebuild cannot call again (Op::rerunnable false: a custom autograd.Function,
// torch.compile's CompiledFunction): no plan re-runs them, what only they could rebuild is never
// evicted, and what their saved results let a rebuild read in place still is.
#include <gtest/gtest.h>

#include <algorithm>

#include "planner/graph.h"
#include "planner/planner.h"
#include "planner/rerun_ops.h"
#include "planner/simulate.h"
#include "planner/synth.h"
#include "profiler/profile_io.h"

using namespace memplan;
using namespace memplan::planner;

namespace {

// A GPT-2 MLP with its GELU as the user's own Function (op 1), and a side branch through a
// result of it that nothing saves:
//   h0 = linear(in)            saved by the Function
//   y, u = Function(h0)        y saved by it and by linear 2; u saved by nobody
//   z = linear(y)              saved by gelu        (rebuilt by reading y in place)
//   g = gelu(z)                saved by linear 4    (rebuilt from z)
//   out = linear(g)
//   m = mul(u); k = tanh(m)    k saved by tanh itself (its rebuild needs m, so u, so the Function)
//   loss = sum(add(out, k))
struct OpaqueMlp {
  Profile p;
  int64_t h0 = 0, y = 0, u = 0, z = 0, g = 0, k = 0;
  static constexpr int64_t kFunction = 1;
  explicit OpaqueMlp(bool opaque = true) {
    SynthBuilder b;
    const int64_t in = b.input(1 << 18);
    h0 = b.op("aten::linear", {in, b.param(1 << 16)}, {{1 << 20}}, {in}, 40)[0];
    const auto yu = b.op_saving_outputs("TanhGelu", {h0}, {{1 << 20}, {1 << 20}}, {h0}, {0}, 30);
    y = yu[0];
    u = yu[1];
    z = b.op("aten::linear", {y, b.param(1 << 16)}, {{1 << 20}}, {y}, 40)[0];
    g = b.op("aten::gelu", {z}, {{1 << 20}}, {z}, 5)[0];
    const int64_t out = b.op("aten::linear", {g, b.param(1 << 16)}, {{1 << 18}}, {g}, 40)[0];
    const int64_t m = b.op("aten::mul", {u}, {{1 << 20}}, {}, 5)[0];
    k = b.op_saving_outputs("aten::tanh", {m}, {{1 << 20}}, {}, {0}, 5)[0];
    const int64_t s = b.op("aten::add", {out, k}, {{1 << 20}}, {}, 2)[0];
    b.op("aten::sum", {s}, {{4}}, {}, 1);
    p = b.finish();
    p.forward[kFunction].rerunnable = !opaque;
  }
  Graph graph() const {
    Graph gr;
    std::string err;
    EXPECT_TRUE(build_graph(p, &gr, &err)) << err;
    return gr;
  }
};

// Every candidate plan of `pl` (prepared) simulates and re-runs no `op`; every plan for a budget of
// 0%, 5%, ..., 100% evicts none of `kept`, and is handed to `each`.
template <typename Each>
void expect_plans_leave_alone(const Planner& pl, int64_t op, const std::vector<int64_t>& kept, Each each) {
  for (const Candidate& c : pl.candidates()) {
    const SimResult s = simulate(pl.graph(), c.plan);
    ASSERT_TRUE(s.ok) << "slot " << c.slot << ": " << s.error;
    for (const Recompute& r : c.plan.recomputes)
      EXPECT_EQ(std::count(r.ops.begin(), r.ops.end(), op), 0) << "slot " << c.slot;
  }
  for (int pct = 0; pct <= 100; pct += 5) {
    Budget b;
    b.kind = Budget::Kind::Percent;
    b.percent = pct;
    const PlanResult r = pl.plan_for(b);
    ASSERT_TRUE(r.ok) << r.error;
    for (const Eviction& e : r.plan.evictions)
      EXPECT_EQ(std::count(kept.begin(), kept.end(), e.value), 0) << pct << "%: value " << e.value;
    each(r);
  }
}

}  // namespace

TEST(Rerunnable, WhatOnlyAnOpaqueOpCouldRebuildIsNotEvictable) {
  OpaqueMlp t;
  const Graph g = t.graph();
  EXPECT_FALSE(g.evictable[t.y]);  // made by the Function
  EXPECT_FALSE(g.evictable[t.k]);  // tanh reads m, which only a re-run of mul(u) makes: u is the Function's
  EXPECT_TRUE(g.evictable[t.h0]);  // linear from the input
  EXPECT_TRUE(g.evictable[t.z]);   // linear from y, which autograd keeps until the Function's backward
  EXPECT_TRUE(g.evictable[t.g]);
  EXPECT_TRUE(g.stuck[OpaqueMlp::kFunction]);
  EXPECT_FALSE(g.stuck[2]);        // linear 2 reads y in place
  EXPECT_EQ(g.unrebuildable_bytes, g.bytes(t.y) + g.bytes(t.k));
  const std::string note = unrebuildable_note(g);
  EXPECT_NE(note.find("TanhGelu"), std::string::npos) << note;
  EXPECT_NE(note.find("2.00 MiB"), std::string::npos) << note;

  // torch.compile's Function: the note points to torch.compile's own budget.
  OpaqueMlp compiled;
  compiled.p.forward[OpaqueMlp::kFunction].name = "CompiledFunction";
  EXPECT_NE(unrebuildable_note(compiled.graph()).find("activation_memory_budget"), std::string::npos);
  EXPECT_EQ(note.find("activation_memory_budget"), std::string::npos);

  // The same step with the Function re-runnable: all of them may go, and nothing is said.
  const OpaqueMlp plain(false);  // outlives its graph, which points into its profile
  const Graph free = plain.graph();
  EXPECT_TRUE(free.evictable[t.y] && free.evictable[t.k]);
  EXPECT_EQ(free.unrebuildable_bytes, 0);
  EXPECT_EQ(unrebuildable_note(free), "");
}

TEST(Rerunnable, TheSimulatorRefusesARecomputeThatRerunsAnOpaqueOp) {
  OpaqueMlp t;
  const Graph g = t.graph();
  Plan plan;
  plan.evictions.push_back({t.h0, g.last_fwd_use[t.h0]});
  plan.recomputes.push_back({g.first_unpack[t.h0], {0, OpaqueMlp::kFunction}, {t.h0}});
  SimResult s = simulate(g, plan);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.error.find("cannot be re-run"), std::string::npos) << s.error;
  plan.recomputes[0].ops = {0};
  s = simulate(g, plan);
  EXPECT_TRUE(s.ok) << s.error;
  // A recipe never captures for the Function: the replay could not call it.
  const std::vector<char> rerun = rerun_ops(t.p, g.providers, {t.z, t.h0});
  EXPECT_TRUE(rerun[0] && rerun[2]);
  EXPECT_FALSE(rerun[OpaqueMlp::kFunction]);
}

TEST(Rerunnable, PlansAtEveryBudgetLeaveTheOpaqueOpAloneAndStillSave) {
  OpaqueMlp t;
  Planner pl;
  std::string err;
  ASSERT_TRUE(pl.prepare(t.p, PlannerOptions{}, &err)) << err;
  bool z_evicted = false;
  expect_plans_leave_alone(pl, OpaqueMlp::kFunction, {t.y, t.k}, [&](const PlanResult& r) {
    EXPECT_NE(std::find_if(r.messages.begin(), r.messages.end(),
                           [](const std::string& m) { return m.find("TanhGelu") != std::string::npos; }),
              r.messages.end());
    for (const Eviction& e : r.plan.evictions) z_evicted = z_evicted || e.value == t.z;
  });
  EXPECT_TRUE(z_evicted);  // rebuilt from y in place, below some budget
  EXPECT_LT(pl.min_feasible(), pl.unplanned_peak());
}

// An aten op run under a TorchDispatchMode of the script's (Op::dispatch_mode, so not re-runnable):
// the note counts such ops apart instead of naming them as if they were custom Functions.
TEST(Rerunnable, OpsRunUnderAScriptsDispatchModeAreCountedApartInTheNote) {
  OpaqueMlp t;
  t.p.forward[OpaqueMlp::kFunction].name = "aten::mul";
  t.p.forward[OpaqueMlp::kFunction].dispatch_mode = true;
  const Graph g = t.graph();
  EXPECT_EQ(g.unrebuildable_bytes, g.bytes(t.y) + g.bytes(t.k));
  const std::string note = unrebuildable_note(g);
  EXPECT_NE(note.find("1 forward op(s) run under a TorchDispatchMode the script entered"), std::string::npos) << note;
  EXPECT_EQ(note.find("aten::mul"), std::string::npos) << note;
  EXPECT_EQ(note.find("custom autograd.Function"), std::string::npos) << note;
  EXPECT_NE(note.find("2.00 MiB"), std::string::npos) << note;
}

// An aten op that may not be re-run (a nondeterministic kernel without deterministic algorithms:
// profiler/op_determinism.h). The replay registers none of its outputs, so a recipe that reads
// one holds it to the step's end, like a custom Function's result: the simulator counts that, and
// the note tells how to let memplan re-run it.
TEST(Rerunnable, ANondeterministicOpsResultReadByARerunIsHeldToTheStepsEnd) {
  OpaqueMlp t;
  t.p.forward[OpaqueMlp::kFunction].name = "aten::index_copy";
  const Graph g = t.graph();
  EXPECT_TRUE(g.unseen[t.y] && g.unseen[t.u]);
  EXPECT_FALSE(g.unseen[t.z] || g.unseen[t.h0]);
  const std::string note = unrebuildable_note(g);
  EXPECT_NE(note.find("aten::index_copy runs a nondeterministic kernel"), std::string::npos) << note;
  EXPECT_NE(note.find("torch.use_deterministic_algorithms(True)"), std::string::npos) << note;
  EXPECT_EQ(note.find("custom autograd.Function"), std::string::npos) << note;
  // An op with no deterministic kernel: the mode would make it raise, so the note does not suggest it.
  OpaqueMlp histc;
  histc.p.forward[OpaqueMlp::kFunction].name = "aten::histc";
  const std::string no_kernel = unrebuildable_note(histc.graph());
  EXPECT_NE(no_kernel.find("no deterministic one"), std::string::npos) << no_kernel;
  EXPECT_EQ(no_kernel.find("use_deterministic_algorithms"), std::string::npos) << no_kernel;

  // Evict z (linear 2's result, read by gelu's backward), rebuilt from y: the recipe of linear 2
  // captures y, which then lives past its natural end (the Function's backward) to the step's end.
  Plan plan;
  plan.evictions.push_back({t.z, g.last_fwd_use[t.z]});
  plan.recomputes.push_back({g.first_unpack[t.z], {2}, {t.z}});
  const SimResult held = simulate(g, plan);
  ASSERT_TRUE(held.ok) << held.error;
  const int64_t last = static_cast<int64_t>(held.bwd_live.size()) - 1;
  ASSERT_GT(g.natural_end[t.y], g.n_fwd);
  ASSERT_LT(g.natural_end[t.y] - g.n_fwd, last);
  // The same plan with the op re-runnable: y is not held past its end.
  const OpaqueMlp plain(false);  // outlives its graph, which points into its profile
  const Graph free = plain.graph();
  const SimResult unheld = simulate(free, plan);
  ASSERT_TRUE(unheld.ok) << unheld.error;
  EXPECT_EQ(held.bwd_live[last] - unheld.bwd_live[last], g.bytes(t.y));
}

// The same op in place (`y[idx] = v`: index_put_ outputs its own input). Its producer can be
// re-run, but the replay registers no output of index_put_, and the producer's own output is stale
// after the write: a recipe reading the value captures it, and the simulator must count the hold.
TEST(Rerunnable, AValueWrittenInPlaceByAnOpaqueOpIsUnseen) {
  SynthBuilder b;
  const int64_t in = b.input(1 << 18);
  const int64_t x = b.op("aten::linear", {in, b.param(1 << 16)}, {{1 << 20}}, {in}, 40)[0];
  const int64_t y = b.op("aten::index_put_", {x, in}, {{0, x}}, {}, 10)[0];
  const int64_t z = b.op("aten::gelu", {y}, {{1 << 20}}, {y}, 5)[0];
  b.op("aten::sum", {z}, {{4}}, {}, 1);
  Profile p = b.finish();
  ASSERT_EQ(y, x);  // the same value: index_put_ re-exposes it
  Graph plain;
  std::string err;
  ASSERT_TRUE(build_graph(p, &plain, &err)) << err;
  EXPECT_FALSE(plain.unseen[x]);
  p.forward[1].rerunnable = false;
  Graph opaque;
  ASSERT_TRUE(build_graph(p, &opaque, &err)) << err;
  EXPECT_TRUE(opaque.unseen[x]);
}

// An op run on a side stream (`with torch.cuda.stream(s)`; Op::side_stream, and so not re-runnable:
// rerun_handle.h side_stream_of). A re-run would go to whatever stream is current at the rebuild,
// and an eviction after the last forward use could hand what it reads to the default stream while
// its kernels still read it there: what it makes and what it reads stay. The note says why, and
// does not take its name for a custom Function's.
TEST(Rerunnable, WhatAnOpOnASideStreamReadsOrMakesStays) {
  OpaqueMlp t(false);
  constexpr int64_t kGelu = 3;  // reads z (saved by it), makes g
  t.p.forward[kGelu].side_stream = true;
  t.p.forward[kGelu].rerunnable = false;
  const Graph g = t.graph();
  EXPECT_FALSE(g.evictable[t.z]);  // read on the side stream
  EXPECT_FALSE(g.evictable[t.g]);  // made there
  EXPECT_TRUE(g.evictable[t.h0]);
  EXPECT_TRUE(g.evictable[t.y]);
  EXPECT_EQ(g.side_stream_bytes, g.bytes(t.z));
  EXPECT_EQ(g.unrebuildable_bytes, g.bytes(t.g));
  const std::string note = unrebuildable_note(g);
  EXPECT_NE(note.find("side stream"), std::string::npos) << note;
  EXPECT_EQ(note.find("autograd.Function"), std::string::npos) << note;
  EXPECT_EQ(note.find("aten::gelu"), std::string::npos) << note;

  Planner pl;
  std::string err;
  ASSERT_TRUE(pl.prepare(t.p, PlannerOptions{}, &err)) << err;
  bool saved = false;
  expect_plans_leave_alone(pl, kGelu, {t.z, t.g},
                           [&](const PlanResult& r) { saved = saved || !r.plan.evictions.empty(); });
  EXPECT_TRUE(saved);  // the rest is still planned

  // Read back from a profile file, the op is still on its side stream.
  Profile back;
  ASSERT_TRUE(profile_from_json(profile_to_json(t.p), &back, &err)) << err;
  EXPECT_TRUE(back.forward[kGelu].side_stream);
  EXPECT_FALSE(back.forward[0].side_stream);
}

// A custom Function that writes its input in place and returns it (ctx.mark_dirty), whose
// RecordFunction has no outputs: the recorder notes the write (Op::writes, from the input's
// version counter) and that the next reader read the tensor from it (TensorRef::from). That
// reader cannot be re-run on the unwritten tensor, so what it made stays, and a recipe that
// reads the written tensor holds it (unseen). Before, the planner took the reader's input from
// the op before the Function: it re-ran both on the unwritten tensor, which the replay refused
// by holding it unplanned (probe: +44% over the prediction).
//   x = linear(in)            saved by nobody
//   Scale(x)                  writes x, returns nothing the recorder sees
//   k = tanh(x)               saved by tanh (its output)
//   loss = sum(k)
TEST(Rerunnable, AReaderOfWhatAFunctionWroteInPlaceIsReadFromThatFunction) {
  SynthBuilder b;
  const int64_t in = b.input(1 << 18);
  const int64_t x = b.op("aten::linear", {in, b.param(1 << 16)}, {{1 << 20}}, {in}, 40)[0];
  b.op("Scale", {x}, {}, {}, 10);
  const int64_t k = b.op_saving_outputs("aten::tanh", {x}, {{1 << 20}}, {}, {0}, 5)[0];
  b.op("aten::sum", {k}, {{4}}, {}, 1);
  Profile p = b.finish();
  constexpr int64_t kScale = 1, kTanh = 2;
  p.forward[kScale].rerunnable = false;
  std::string err;
  // As profiles were before: no write noted, the reader's input from the linear. tanh's result is
  // evictable, rebuilt by re-running linear and tanh, which would read x unwritten.
  Graph before;
  ASSERT_TRUE(build_graph(p, &before, &err)) << err;
  EXPECT_TRUE(before.evictable[k]);
  EXPECT_FALSE(before.unseen[x]);
  // As the recorder notes it now.
  p.forward[kScale].writes = {x};
  p.forward[kTanh].inputs[0].from = kScale;
  Graph g;
  ASSERT_TRUE(build_graph(p, &g, &err)) << err;
  EXPECT_FALSE(g.rerunnable[kScale]);  // it makes no value, but it wrote one
  EXPECT_TRUE(g.stuck[kTanh]);
  EXPECT_FALSE(g.evictable[k]);
  EXPECT_TRUE(g.unseen[x]);
  Planner pl;
  ASSERT_TRUE(pl.prepare(p, PlannerOptions{}, &err)) << err;
  expect_plans_leave_alone(pl, kTanh, {k}, [](const PlanResult&) {});
  // The profile file keeps both.
  Profile back;
  ASSERT_TRUE(profile_from_json(profile_to_json(p), &back, &err)) << err;
  EXPECT_EQ(back.forward[kScale].writes, std::vector<int64_t>{x});
  EXPECT_EQ(back.forward[kTanh].inputs[0].from, kScale);
}
