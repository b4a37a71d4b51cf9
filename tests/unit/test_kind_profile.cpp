// The record of a kind of step the planner gets (profiler/kind_profile.h).
#include <gtest/gtest.h>

#include "profiler/kind_profile.h"

namespace memplan {
namespace {

Op node(const std::string& name, int64_t before, int64_t after, int64_t peak) {
  Op o;
  o.name = name;
  o.live_before = before;
  o.live_after = after;
  o.peak = peak;
  return o;
}

constexpr const char* kAcc = "torch::autograd::AccumulateGrad";

// A micro-step of gradient accumulation on a 1000-byte baseline: one linear layer whose weight
// gradient is 100 bytes. `first`: no gradient exists, AccumulateGrad keeps the incoming one
// (nothing freed); else it adds into the existing one and frees the incoming one.
Profile micro(int64_t step, bool first, int64_t one_time = 0) {
  Profile p;
  p.step = step;
  p.signature = p.structure_signature = 7;
  p.baseline_bytes = first ? 1000 : 1100;
  Op f;
  f.name = "aten::linear";
  f.live_before = p.baseline_bytes;
  f.live_after = f.peak = p.baseline_bytes + 500 + one_time;  // a library's workspace, made once
  p.forward = {f};
  const int64_t b = f.live_after;
  p.backward = {node("AddmmBackward0", b, b - 400 + 100, b + 100),   // activations freed, gradient made
                node(kAcc, b - 300, first ? b - 300 : b - 400, b - 300),
                node("TBackward0", first ? b - 300 : b - 400, first ? b - 300 : b - 400, first ? b - 300 : b - 400)};
  p.peak_bytes = b + 100;
  p.end_bytes = p.backward.back().live_after;
  return p;
}

TEST(KindProfile, GradientsAnotherMicroStepAllocatedAreCountedFromTheirNodeOn) {
  const std::vector<Profile> r = {micro(0, true), micro(1, false)};
  FreshGradients fresh;
  const Profile p = with_fresh_gradients(r, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 100);
  EXPECT_EQ(fresh.from_step, 0);
  const Profile& latest = r[1];
  EXPECT_EQ(p.backward[0].live_after, latest.backward[0].live_after);  // before the node: as it was
  EXPECT_EQ(p.backward[1].live_before, latest.backward[1].live_before);
  EXPECT_EQ(p.backward[1].live_after, latest.backward[1].live_after + 100);
  EXPECT_EQ(p.backward[2].live_before, latest.backward[2].live_before + 100);
  EXPECT_EQ(p.backward[2].peak, latest.backward[2].peak + 100);
  EXPECT_EQ(p.end_bytes, latest.end_bytes + 100);
  // What the step allocates is the first micro-step's, on this record's baseline.
  EXPECT_EQ(p.backward[2].live_after - p.baseline_bytes, r[0].backward[2].live_after - r[0].baseline_bytes);
  EXPECT_EQ(p.forward[0].live_after, latest.forward[0].live_after);
}

TEST(KindProfile, AFirstStepsOtherAllocationsAreNotEveryStepsAndALighterRecordLendsNothing) {
  // The first record also made a 300-byte workspace in its forward: not counted.
  const std::vector<Profile> r = {micro(0, true, 300), micro(1, false)};
  FreshGradients fresh;
  const Profile p = with_fresh_gradients(r, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 100);
  EXPECT_EQ(p.forward[0].live_after, r[1].forward[0].live_after);
  // The other way round: the latest is the first micro-step; the second allocates less.
  const Profile q = with_fresh_gradients({micro(0, false), micro(1, true)}, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 0);
  EXPECT_EQ(fresh.from_step, -1);
  EXPECT_EQ(q.peak_bytes, micro(1, true).peak_bytes);
}

TEST(KindProfile, OtherKindsAndOtherNodesLendNothing) {
  std::vector<Profile> r = {micro(0, true), micro(1, false)};
  r[0].structure_signature = 9;
  FreshGradients fresh;
  with_fresh_gradients(r, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 0);
  r[0].structure_signature = 7;
  r[0].signature = 8;  // other sizes, same ops (data-dependent sizes): it counts
  with_fresh_gradients(r, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 100);
  r[0].backward[0].name = "MmBackward0";  // same signature, another node: not comparable
  with_fresh_gradients(r, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 0);
}

TEST(KindProfile, EachNodeTakesTheMostAnyRecordAllocated) {
  // Three records: two first micro-steps, one of them allocating more at the node.
  std::vector<Profile> r = {micro(0, true), micro(1, true), micro(2, false)};
  r[1].backward[1].live_after += 40;
  FreshGradients fresh;
  const Profile p = with_fresh_gradients(r, 2, &fresh);
  EXPECT_EQ(fresh.bytes, 140);
  EXPECT_EQ(fresh.from_step, 1);
  EXPECT_EQ(p.backward[2].live_before, r[2].backward[2].live_before + 140);
}

// `p` with one more AccumulateGrad node per entry of `alloc`, each allocating that much (another
// thread's tensor made, or freed, while the node ran).
Profile with_acc_nodes(Profile p, const std::vector<int64_t>& alloc) {
  for (int64_t a : alloc) {
    const int64_t at = p.backward.back().live_after;
    p.backward.push_back(node(kAcc, at, at + a, std::max(at, at + a)));
  }
  p.end_bytes = p.backward.back().live_after;
  return p;
}

// Another thread that allocates and frees while the step runs puts its tensors inside some
// AccumulateGrad nodes of one record and its frees inside others, of either record: no
// gradients. What a record allocated beyond the latest is lent only when it is one-sided.
TEST(KindProfile, AnotherThreadsAllocationsInsideAccumulateGradNodesAreNoGradients) {
  FreshGradients fresh;
  // Both add into their gradients; one 16-byte tensor made inside a node of each (of the other
  // thread), the earlier record's also freed inside a later node.
  const std::vector<Profile> noise = {with_acc_nodes(micro(0, false), {16, 0, -16, 0}),
                                      with_acc_nodes(micro(1, false), {0, 16, 0, 0})};
  const Profile p = with_fresh_gradients(noise, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 0);
  EXPECT_EQ(p.peak_bytes, noise[1].peak_bytes);
  // The same noise beside a gradient made afresh: lent, the noise with it.
  const std::vector<Profile> real = {with_acc_nodes(micro(0, true), {16, 0, -16, 0}),
                                     with_acc_nodes(micro(1, false), {0, 16, 0, 0})};
  with_fresh_gradients(real, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 116);
  EXPECT_EQ(fresh.from_step, 0);
}

TEST(KindProfile, AnAccumulateGradNodeRisesAsHighAsInAnyRecord) {
  // The first micro-step copied the incoming gradient (both alive for a moment) where the latest
  // added into the existing one.
  std::vector<Profile> r = {micro(0, true), micro(1, false)};
  Op& acc = r[0].backward[1];
  acc.peak = acc.live_before + 100;
  FreshGradients fresh;
  const Profile p = with_fresh_gradients(r, 1, &fresh);
  EXPECT_EQ(p.backward[1].peak - p.backward[1].live_before, 100);
  // Without fresh gradients nothing changes, however high a node rose elsewhere.
  const std::vector<Profile> same = {r[0], r[0]};
  const Profile q = with_fresh_gradients(same, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 0);
  EXPECT_EQ(q.backward[1].peak, r[0].backward[1].peak);
}

// Adversarial training's attack recorded (the input's gradient alone), a training step replayed
// on its plan: the step's backward also runs each weight's TBackward0 and AccumulateGrad, and
// makes 100 bytes of the first layer's gradient inside AddmmBackward0 (with 20 bytes of
// temporaries), 40 of the second's in its TBackward0 (after its peak, so the peak excess there is
// the first's 100). Its baseline is 50 bytes higher.
TEST(KindProfile, WhatAWiderBackwardMadeIsCountedAtTheNodeThatMadeIt) {
  Profile rec;
  rec.baseline_bytes = 1000;
  rec.backward = {node("AddmmBackward0", 1500, 1400, 1600), node("ReluBackward0", 1400, 1300, 1450),
                  node("AddmmBackward0", 1300, 1200, 1350)};
  rec.peak_bytes = 1600;
  rec.end_bytes = 1200;
  Profile step;
  step.baseline_bytes = 1050;
  const int64_t d = 50;
  step.backward = {node("AddmmBackward0", 1500 + d, 1500 + d, 1720 + d), node("TBackward0", 1500 + d, 1500 + d, 1500 + d),
                   node(kAcc, 1500 + d, 1500 + d, 1500 + d), node("ReluBackward0", 1500 + d, 1400 + d, 1550 + d),
                   node("AddmmBackward0", 1400 + d, 1300 + d, 1450 + d), node("TBackward0", 1300 + d, 1340 + d, 1340 + d),
                   node(kAcc, 1340 + d, 1340 + d, 1340 + d)};
  // The plan predicted the record as it is (no action lowers these nodes).
  std::vector<int64_t> live_pred, peak_pred;
  for (const Op& n : rec.backward) live_pred.push_back(n.live_after), peak_pred.push_back(n.peak);
  std::vector<int64_t> live, peak;
  ASSERT_TRUE(backward_excess(step, rec, live_pred, peak_pred, &live, &peak));
  EXPECT_EQ(live, (std::vector<int64_t>{100, 100, 140}));
  EXPECT_EQ(peak, (std::vector<int64_t>{120, 100, 100}));
  const Profile q = with_backward_excess(rec, live, peak);
  EXPECT_EQ(q.backward[0].live_before, 1500);  // the gap as it was
  EXPECT_EQ(q.backward[0].live_after, 1500);
  EXPECT_EQ(q.backward[0].peak, 1720);
  EXPECT_EQ(q.backward[1].live_before, 1500);
  EXPECT_EQ(q.backward[1].peak, 1550);
  EXPECT_EQ(q.backward[2].live_before, 1400);
  EXPECT_EQ(q.backward[2].live_after, 1340);
  EXPECT_EQ(q.end_bytes, 1340);
  EXPECT_EQ(q.peak_bytes, 1720);
  // Where the plan predicted more than the step had, nothing is taken away.
  peak_pred[1] += 500;
  live_pred[1] += 500;
  ASSERT_TRUE(backward_excess(step, rec, live_pred, peak_pred, &live, &peak));
  EXPECT_EQ(live[1], 0);
  EXPECT_EQ(peak[1], 0);
  // A record node the step did not run, or a step recorded light (no nodes): nothing to tell.
  Profile other = rec;
  other.backward[1].name = "GeluBackward0";
  EXPECT_FALSE(backward_excess(step, other, live_pred, peak_pred, &live, &peak));
  Profile light = step;
  light.backward.clear();
  EXPECT_FALSE(backward_excess(light, rec, live_pred, peak_pred, &live, &peak));
}

}  // namespace
// A micro-step on a 1100-byte baseline (a 100-byte gradient exists) whose forward adds 500.
// `zeroed`: the script sets the gradient to None between forward and backward (freed in the gap)
// and AccumulateGrad keeps the incoming one; else it adds into it and frees the incoming one.
Profile late(int64_t step, bool zeroed) {
  Profile p;
  p.step = step;
  p.signature = p.structure_signature = 7;
  p.op_hash = "same sizes";
  p.baseline_bytes = 1100;
  Op f;
  f.name = "aten::linear";
  f.live_before = 1100;
  f.live_after = f.peak = 1600;
  p.forward = {f};
  const int64_t b = zeroed ? 1500 : 1600;
  const int64_t acc = zeroed ? b - 300 : b - 400;
  p.backward = {node("AddmmBackward0", b, b - 300, b + 100), node(kAcc, b - 300, acc, b - 300),
                node("TBackward0", acc, acc, acc)};
  p.peak_bytes = 1700;
  p.end_bytes = acc;
  return p;
}

TEST(KindProfile, GradientsAnotherRecordKeptThroughItsBackwardAreCountedUntilMadeAgain) {
  const std::vector<Profile> r = {late(1, false), late(2, true)};
  FreshGradients fresh;
  const Profile p = with_fresh_gradients(r, 1, &fresh);
  EXPECT_EQ(fresh.bytes, 0);
  EXPECT_EQ(fresh.kept, 100);
  EXPECT_EQ(fresh.kept_from, 1);
  const Profile& kept = r[0];
  // Through the backward, the record that kept its gradient; the forward as it was.
  for (size_t j = 0; j < p.backward.size(); ++j) {
    EXPECT_EQ(p.backward[j].live_before, kept.backward[j].live_before) << j;
    EXPECT_EQ(p.backward[j].live_after, kept.backward[j].live_after) << j;
    EXPECT_EQ(p.backward[j].peak, kept.backward[j].peak) << j;
  }
  EXPECT_EQ(p.forward[0].live_after, r[1].forward[0].live_after);
  EXPECT_EQ(p.end_bytes, kept.end_bytes);
  // The other way round, or other sizes: nothing kept beyond the latest.
  const Profile q = with_fresh_gradients({late(1, true), late(2, false)}, 1, &fresh);
  EXPECT_EQ(fresh.kept, 0);
  EXPECT_EQ(q.backward[0].live_before, late(2, false).backward[0].live_before);
  std::vector<Profile> sizes = r;
  sizes[0].op_hash = "other sizes";
  with_fresh_gradients(sizes, 1, &fresh);
  EXPECT_EQ(fresh.kept, 0);
  // A record that began without gradients (the run's first step) lends nothing it kept.
  const std::vector<char> began = {1, 0};
  with_fresh_gradients(r, 1, &fresh, &began);
  EXPECT_EQ(fresh.kept, 0);
  const std::vector<char> alike = {0, 0};
  with_fresh_gradients(r, 1, &fresh, &alike);
  EXPECT_EQ(fresh.kept, 100);
}

// A later micro-step's record, as a first micro-step runs the same ops: on its own baseline,
// every count is the first micro-step's, from the AccumulateGrad node on.
TEST(KindProfile, ALaterMicroStepWithItsGradientsKeptIsTheFirstMicroStep) {
  const Profile later = micro(1, false), first = micro(0, true);
  int64_t added = -1;
  const Profile p = with_gradients_kept(later, &added);
  EXPECT_EQ(added, 100);
  auto on_base = [](const Profile& q, int64_t bytes) { return bytes - q.baseline_bytes; };
  for (size_t j = 0; j < p.backward.size(); ++j) {
    EXPECT_EQ(on_base(p, p.backward[j].live_before), on_base(first, first.backward[j].live_before)) << j;
    EXPECT_EQ(on_base(p, p.backward[j].live_after), on_base(first, first.backward[j].live_after)) << j;
    EXPECT_EQ(on_base(p, p.backward[j].peak), on_base(first, first.backward[j].peak)) << j;
  }
  EXPECT_EQ(on_base(p, p.peak_bytes), on_base(first, first.peak_bytes));
  EXPECT_EQ(on_base(p, p.end_bytes), on_base(first, first.end_bytes));
  EXPECT_EQ(p.forward[0].live_after, later.forward[0].live_after);
  // Two parameters: each node keeps its own gradient, added up from there on.
  Profile two = later;
  two.backward.push_back(node(kAcc, two.backward[2].live_after, two.backward[2].live_after - 50,
                              two.backward[2].live_after));
  two.backward.push_back(node("TBackward0", two.backward[3].live_after, two.backward[3].live_after,
                              two.backward[3].live_after));
  two.end_bytes = two.backward.back().live_after;
  const Profile k = with_gradients_kept(two, &added);
  EXPECT_EQ(added, 150);
  EXPECT_EQ(k.backward[2].live_after, two.backward[2].live_after + 100);
  EXPECT_EQ(k.backward[3].live_before, two.backward[3].live_before + 100);
  EXPECT_EQ(k.backward[3].live_after, two.backward[3].live_after + 150);
  EXPECT_EQ(k.backward[4].peak, two.backward[4].peak + 150);
  EXPECT_EQ(k.end_bytes, two.end_bytes + 150);
  // A first micro-step's record frees nothing there: as it is.
  const Profile q = with_gradients_kept(first, &added);
  EXPECT_EQ(added, 0);
  EXPECT_EQ(q.peak_bytes, first.peak_bytes);
  EXPECT_EQ(q.backward[2].live_after, first.backward[2].live_after);
}

TEST(KindProfile, WhatAStepFreesLessBeforeBackwardIsKeptThroughItsBackward) {
  Profile p = micro(3, false);
  p.gap_bytes = -100;  // the record freed a gradient between forward and backward
  const Profile k = with_gap_kept(p, 100);
  ASSERT_EQ(k.backward.size(), p.backward.size());
  for (size_t j = 0; j < p.backward.size(); ++j) {
    EXPECT_EQ(k.backward[j].live_before, p.backward[j].live_before + 100) << j;
    EXPECT_EQ(k.backward[j].live_after, p.backward[j].live_after + 100) << j;
    EXPECT_EQ(k.backward[j].peak, p.backward[j].peak + 100) << j;
  }
  EXPECT_EQ(k.peak_bytes, p.peak_bytes + 100);  // the peak is a backward node's
  EXPECT_EQ(k.end_bytes, p.end_bytes + 100);
  EXPECT_EQ(*k.gap_bytes, 0);
  // The forward as it was, and the step's peak where the forward's is higher.
  EXPECT_EQ(k.forward[0].live_after, p.forward[0].live_after);
  Profile high = p;
  high.forward[0].peak = high.peak_bytes = p.peak_bytes + 1000;
  EXPECT_EQ(with_gap_kept(high, 100).peak_bytes, high.peak_bytes);
  EXPECT_EQ(with_gap_kept(p, 0).end_bytes, p.end_bytes);
  // Made in backward, not left in the gap (the attack's record, a training step's gradients):
  // the same counts, the gap as recorded, or the next steps would seem to free more there.
  const Profile made = with_gap_kept(p, 100, /*in_gap=*/false);
  EXPECT_EQ(made.peak_bytes, k.peak_bytes);
  EXPECT_EQ(made.end_bytes, k.end_bytes);
  EXPECT_EQ(made.backward.back().live_after, k.backward.back().live_after);
  EXPECT_EQ(*made.gap_bytes, -100);
}

TEST(KindProfile, WhatAStepFreesMoreBeforeBackwardIsFreedThroughItsBackward) {
  Profile p = micro(0, true);
  p.gap_bytes = 0;  // the run's first step: no gradients to free
  const Profile k = with_gap_kept(p, -100);
  for (size_t j = 0; j < p.backward.size(); ++j) {
    EXPECT_EQ(k.backward[j].live_before, p.backward[j].live_before - 100) << j;
    EXPECT_EQ(k.backward[j].live_after, p.backward[j].live_after - 100) << j;
    EXPECT_EQ(k.backward[j].peak, p.backward[j].peak - 100) << j;
  }
  EXPECT_EQ(k.end_bytes, p.end_bytes - 100);
  EXPECT_EQ(*k.gap_bytes, -100);
  EXPECT_EQ(k.peak_bytes, p.peak_bytes - 100);  // backward's peak, lowered
  // Lowered only down to the forward's peak, which stays.
  const Profile far = with_gap_kept(p, -300);
  EXPECT_EQ(far.backward[0].peak, p.backward[0].peak - 300);
  EXPECT_EQ(far.peak_bytes, p.forward[0].peak);
}

}  // namespace memplan
