#include "agent/step_kinds.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace memplan {
namespace {

constexpr uint64_t A = 0xa, B = 0xb, C = 0xc, L = 0x1;

// The first op of a step of each kind: the same for all (kinds that differ only later in the
// step, which must be predicted), or its own per kind (a batch of another length or size).
uint64_t alike(uint64_t) { return 7; }
uint64_t own(uint64_t kind) { return 1000 + kind; }

// Runs a script's steps through StepKinds as the agent does: choose at the first op, run
// `actual`, finish, plan when asked (plans numbered in order). Returns, per step, 'p'
// (profiled), 'r' (replayed the right plan) or 'x' (replayed a wrong guess).
std::string drive(StepKinds& k, const std::vector<uint64_t>& steps, int* plans = nullptr,
                  const std::function<uint64_t(uint64_t)>& first = alike) {
  std::string out;
  int next_plan = 0;
  for (uint64_t actual : steps) {
    const StepKinds::Choice c = k.next(first(actual));
    out += c.profile ? 'p' : (c.kind == actual ? 'r' : 'x');
    if (k.finish(c, actual, first(actual), !c.profile && c.kind != actual)) k.set_plan(actual, next_plan++);
  }
  if (plans) *plans = next_plan;
  return out;
}

std::vector<uint64_t> repeat(const std::vector<uint64_t>& cycle, int times) {
  std::vector<uint64_t> out;
  for (int i = 0; i < times; ++i) out.insert(out.end(), cycle.begin(), cycle.end());
  return out;
}

TEST(StepKinds, NothingKnownMeansProfile) {
  StepKinds k(2);
  EXPECT_FALSE(k.predict().has_value());
  EXPECT_TRUE(k.next(7).profile);
}

TEST(StepKinds, OneKindIsPlannedAfterTheWarmupThenReplayed) {
  StepKinds k(2);
  int plans = 0;
  EXPECT_EQ(drive(k, repeat({A}, 8), &plans), "pprrrrrr");
  EXPECT_EQ(plans, 1);
  EXPECT_EQ(k.recent(2), (std::vector<uint64_t>{A, A}));
  EXPECT_FALSE(k.give_up().has_value());
}

TEST(StepKinds, TheWarmupPlansItsLastStepEvenIfTheFirstDiffered) {
  // Step 0 also ran the script's setup ops: the warm-up's last step is planned all the same.
  StepKinds k(2);
  std::vector<uint64_t> steps = {C};
  for (uint64_t s : repeat({A}, 6)) steps.push_back(s);
  int plans = 0;
  EXPECT_EQ(drive(k, steps, &plans), "pprrrrr");
  EXPECT_EQ(plans, 1);
  EXPECT_EQ(k.plan_of(A), 0);
}

TEST(StepKinds, AlternatingStepsEachGetTheirPlan) {
  // A GAN: discriminator step A, generator step B.
  StepKinds k(2);
  int plans = 0;
  // The warm-up (A, B) ends with B planned from its one record; the next step is guessed to be
  // B again (one kind seen after another, no pattern yet): one miss. A is planned at its second
  // record; from then on every guess is right.
  EXPECT_EQ(drive(k, repeat({A, B}, 8), &plans), "ppxrprrrrrrrrrrr");
  EXPECT_EQ(plans, 2);
  EXPECT_EQ(k.misses(), 1);
  EXPECT_EQ(k.recent(2), (std::vector<uint64_t>{A, B}));
}

TEST(StepKinds, AFirstStepThatDiffersDoesNotBreakTheCycle) {
  // The first iteration lacks an op the later ones start with (a sum of the previous losses).
  StepKinds k(2);
  std::vector<uint64_t> steps = {C, B};
  for (uint64_t s : repeat({A, B}, 6)) steps.push_back(s);
  EXPECT_EQ(drive(k, steps), "ppxpprprrrrrrr");
  EXPECT_EQ(k.misses(), 1);
  EXPECT_EQ(k.plan_of(C), -1);  // never planned: it never came back
}

TEST(StepKinds, ACycleWithARepeatedKindIsFollowed) {
  // Two accumulation micro-steps, then a different third one: A A B A A B ...
  StepKinds k(2);
  const std::string got = drive(k, repeat({A, A, B}, 8));
  EXPECT_EQ(got.substr(12), "rrrrrrrrrrrr") << got;
  EXPECT_LE(k.misses(), 1);  // the first B, before any B was seen
}

TEST(StepKinds, AChangeAfterTheFirstOpIsOneMissThenANewPlan) {
  // The model changes at step 6 for good, after the step's first op (a layer frozen).
  StepKinds k(2);
  std::vector<uint64_t> steps = repeat({A}, 6);
  for (uint64_t s : repeat({B}, 6)) steps.push_back(s);
  int plans = 0;
  EXPECT_EQ(drive(k, steps, &plans), "pprrrrxpprrr");
  EXPECT_EQ(plans, 2);
  EXPECT_EQ(k.misses(), 1);
  EXPECT_FALSE(k.give_up().has_value());
}

TEST(StepKinds, ALastStepThatDiffersAfterItsFirstOpIsLearnt) {
  // Each epoch ends with a step that starts like the others (an extra validation loss).
  StepKinds k(2);
  std::vector<uint64_t> steps;
  for (int epoch = 0; epoch < 6; ++epoch) {
    for (uint64_t s : repeat({A}, 10)) steps.push_back(s);
    steps.push_back(L);
  }
  drive(k, steps);
  // Once, in the first epoch: from the second on, ten A's are known to be followed by L.
  EXPECT_EQ(k.misses(), 1);
  EXPECT_FALSE(k.give_up().has_value());
  EXPECT_EQ(k.kinds(), 2u);
}

TEST(StepKinds, AStepOfTheSameOpsThatDivergedIsRecordedAgain) {
  StepKinds k(2);
  drive(k, repeat({A}, 3));
  StepKinds::Choice c = k.next(7);
  ASSERT_FALSE(c.profile);
  EXPECT_FALSE(k.finish(c, A, 7, /*diverged=*/true));
  EXPECT_TRUE(k.next(7).profile);  // A's plan is gone: profile it again
  c = k.next(7);
  EXPECT_FALSE(k.finish(c, A, 7, false));
  c = k.next(7);
  EXPECT_TRUE(k.finish(c, A, 7, false));  // planned again after two fresh records
}

TEST(StepKinds, AShapeChangeAtTheFirstOpIsANewKindNotAMiss) {
  // The sequence length changes at step 6 for good: the first op's input shapes say so.
  StepKinds k(2);
  std::vector<uint64_t> steps = repeat({A}, 6);
  for (uint64_t s : repeat({B}, 6)) steps.push_back(s);
  int plans = 0;
  EXPECT_EQ(drive(k, steps, &plans, own), "pprrrrpprrrr");
  EXPECT_EQ(plans, 2);
  EXPECT_EQ(k.misses(), 0);
}

TEST(StepKinds, BucketedLengthsInAnyOrderEachReplayTheirOwnPlan) {
  // Batches bucketed by sequence length, buckets drawn at random: no pattern to predict, but
  // each step's first op names its bucket.
  StepKinds k(2);
  const std::vector<uint64_t> steps = {A, B, A, C, B, B, C, A, C, A, B, C, C, A, B, A, B, B, C, A,
                                       A, C, B, C, A, B, A, C, C, B, A, B, C, A, A, B, C, B, A, C};
  int plans = 0;
  const std::string got = drive(k, steps, &plans, own);
  // A and B: planned in the warm-up (B as its last step, A at its second record); C at its
  // second record; every other step replays its own plan.
  EXPECT_EQ(got, "pppprrp" + std::string(steps.size() - 7, 'r'));
  EXPECT_EQ(plans, 3);
  EXPECT_EQ(k.misses(), 0);
  EXPECT_FALSE(k.give_up().has_value());
}

TEST(StepKinds, ASmallerLastBatchPerEpochIsNeverAMiss) {
  StepKinds k(2);
  std::vector<uint64_t> steps;
  for (int epoch = 0; epoch < 6; ++epoch) {
    for (uint64_t s : repeat({A}, 10)) steps.push_back(s);
    steps.push_back(L);
  }
  const std::string got = drive(k, steps, nullptr, own);
  EXPECT_EQ(got.substr(0, 12), "pprrrrrrrrpr") << got;  // L first recorded, then planned at its second
  EXPECT_EQ(got.substr(22), std::string(steps.size() - 22, 'r')) << got;
  EXPECT_EQ(k.misses(), 0);
}

TEST(StepKinds, AmongKindsThatStartAlikeThePatternDecides) {
  // A GAN whose two steps start alike (A, B), with an evaluation step C of its own first op
  // every fifth step.
  StepKinds k(2);
  const auto first = [](uint64_t kind) -> uint64_t { return kind == C ? 2 : 1; };
  std::vector<uint64_t> steps;
  for (int i = 0; i < 8; ++i) {
    for (uint64_t s : {A, B, A, B}) steps.push_back(s);
    steps.push_back(C);
  }
  const std::string got = drive(k, steps, nullptr, first);
  // Two misses while the cycle is new (B guessed after the first B; after the first C, what
  // follows it is unknown), then every step of A and B replays its own plan, and so does C.
  EXPECT_EQ(got.substr(10), std::string(steps.size() - 10, 'r')) << got;
  EXPECT_EQ(k.misses(), 2) << got;
}

TEST(StepKinds, AReplayNamesTheOtherPlannedKindsThatStartAlike) {
  // Lengths in random order behind a first op that does not see the length: the agent follows
  // the other planned kinds that start alike until an op tells them apart (Agent::narrow_kinds).
  StepKinds k(2);
  const auto first = [](uint64_t kind) -> uint64_t { return kind == C ? 2 : 1; };
  std::vector<uint64_t> steps = repeat({A, B}, 6);
  for (uint64_t s : {C, C, C}) steps.push_back(s);
  const std::string got = drive(k, steps, nullptr, first);
  ASSERT_GE(k.plan_of(A), 0) << got;
  ASSERT_GE(k.plan_of(B), 0) << got;
  ASSERT_GE(k.plan_of(C), 0) << got;
  const StepKinds::Choice c = k.next(1);
  ASSERT_FALSE(c.profile);
  EXPECT_TRUE(c.kind == A || c.kind == B);
  EXPECT_EQ(c.others, std::vector<int>{k.plan_of(c.kind == A ? B : A)});  // not C, which starts otherwise
  EXPECT_TRUE(k.next(2).others.empty());
  EXPECT_TRUE(k.next(3).others.empty());  // a first op no kind starts with: profiled
}

TEST(StepKinds, AKindWithoutAPlanIsNoOtherCandidate) {
  StepKinds k(2);
  drive(k, {A, A, A});  // A planned
  k.finish(k.next(alike(B)), B, alike(B), true);  // B seen once, diverging from A's plan
  const StepKinds::Choice c = k.next(alike(A));
  EXPECT_TRUE(c.others.empty());
}

TEST(StepKinds, ANewLengthEveryStepReplaysThePlanOfALongerOne) {
  // Padding to each batch's longest sequence: a new length (kind) nearly every step, all of the
  // same ops. Past kOwnPlans kinds, a length with no plan of its own replays the plan of the
  // shortest planned length at least as long (f); a longer one is profiled and planned at once.
  StepKinds k(2);
  const std::vector<int64_t> cycle = {8, 12, 16, 20, 24, 28, 32, 36, 40, 44};
  std::string got;
  int plans = 0;
  for (int round = 0; round < 3; ++round) {
    for (int64_t len : cycle) {
      const StepKinds::FirstOp first(1000 + len, 77, len);
      const uint64_t actual = 500 + len;  // its op sequence
      const StepKinds::Choice c = k.next(first);
      if (c.family) {
        ASSERT_GT(c.kind, static_cast<uint64_t>(500 + len));  // a longer length's plan
        ASSERT_FALSE(c.plan_at_once);
      }
      got += c.profile ? 'p' : c.family ? 'f' : (c.kind == actual ? 'r' : 'x');
      // The agent counts a family's step that ran the same ops as the kind it replayed.
      const uint64_t signature = c.family ? c.kind : actual;
      if (k.finish(c, signature, first, false)) k.set_plan(signature, plans++);
    }
  }
  // 8, 12: the warm-up (12 planned); 16 and 20 recorded once (kinds 3 and 4); 24-44, past
  // kOwnPlans kinds and longer than every planned one, planned at once. Then 8 replays 12's plan
  // and 16 and 20 replay 24's.
  EXPECT_EQ(got, "pppppppppp" "frffrrrrrr" "frffrrrrrr");
  EXPECT_EQ(plans, 7);
  EXPECT_EQ(k.misses(), 0);
  EXPECT_FALSE(k.give_up().has_value());
}

TEST(StepKinds, FamiliesAreChosenByStructureAndSize) {
  StepKinds k(1);
  int plans = 0;
  // Four kinds of two structures, each planned after one record (warm-up 1).
  for (auto [id, st, n] : std::vector<std::tuple<uint64_t, uint64_t, int64_t>>{
           {1, 70, 100}, {2, 70, 300}, {3, 80, 200}, {4, 70, 200}}) {
    const StepKinds::Choice c = k.next({id, st, n});
    ASSERT_TRUE(c.profile);
    if (k.finish(c, 100 + id, {id, st, n}, false)) k.set_plan(100 + id, plans++);
  }
  ASSERT_EQ(plans, 4);
  StepKinds::Choice c = k.next({9, 70, 150});  // the smallest planned kind of structure 70 with >= 150
  EXPECT_TRUE(c.family);
  EXPECT_EQ(c.kind, 104u);
  c = k.next({9, 70, 200});  // as large as kind 4: its plan
  EXPECT_EQ(c.kind, 104u);
  c = k.next({9, 80, 150});  // the other structure
  EXPECT_TRUE(c.family);
  EXPECT_EQ(c.kind, 103u);
  c = k.next({9, 70, 301});  // longer than every planned one: recorded, planned at once
  EXPECT_TRUE(c.profile);
  EXPECT_FALSE(c.family);
  EXPECT_TRUE(c.plan_at_once);
  c = k.next({9, 0, 150});  // no structure known: no family
  EXPECT_TRUE(c.profile);
  EXPECT_FALSE(c.family);
  c = k.next({2, 70, 300});  // a kind's own first op: its own plan
  EXPECT_FALSE(c.family);
  EXPECT_EQ(c.kind, 102u);
}

TEST(StepKinds, NoFamilyByAFirstOpThatAPlannedKindStartsWith) {
  // Its size at the first op says nothing of the step's when a planned kind starts with the
  // same op (the length shows later): an unplanned kind predicted there is recorded whole and
  // planned, not replayed with the plan of a kind whose first op has more elements.
  StepKinds k(1);
  int plans = 0;
  for (auto [id, n, sig] : std::vector<std::tuple<uint64_t, int64_t, uint64_t>>{
           {1, 100, 101}, {2, 300, 102}, {3, 200, 103}}) {
    const StepKinds::Choice c = k.next({id, 70, n});
    ASSERT_TRUE(c.profile);
    if (k.finish(c, sig, {id, 70, n}, false)) k.set_plan(sig, plans++);
  }
  ASSERT_EQ(plans, 3);
  const StepKinds::Choice a = k.next({1, 70, 100});  // kind 101's own plan, which this step leaves
  ASSERT_FALSE(a.profile);
  ASSERT_EQ(a.kind, 101u);
  k.finish(a, 104, {1, 70, 100}, true);  // a fourth kind, unplanned, that starts with op 1
  const StepKinds::Choice c = k.next({1, 70, 100});
  ASSERT_EQ(c.kind, 104u);  // the latest kind of those that start so
  EXPECT_TRUE(c.profile);
  EXPECT_FALSE(c.family);  // not kind 102's plan, although its first op has more elements
  EXPECT_TRUE(c.plan_at_once);
}

TEST(StepKinds, NoFamiliesBeforeOwnPlansKinds) {
  StepKinds k(1);
  const StepKinds::Choice a = k.next({1, 70, 300});
  ASSERT_TRUE(k.finish(a, 101, {1, 70, 300}, false));
  k.set_plan(101, 0);
  const StepKinds::Choice c = k.next({2, 70, 100});  // smaller, same structure; only one kind yet
  EXPECT_TRUE(c.profile);
  EXPECT_FALSE(c.family);
  EXPECT_FALSE(c.plan_at_once);
}

TEST(StepKinds, GivesUpOnAStepThatChangesEveryTime) {
  // A new sequence length every batch.
  StepKinds k(2);
  std::vector<uint64_t> steps;
  for (uint64_t i = 0; i < StepKinds::kMaxKinds; ++i) steps.push_back(100 + i);
  drive(k, steps);
  EXPECT_FALSE(k.give_up().has_value());
  drive(k, {999});
  ASSERT_TRUE(k.give_up().has_value());
  EXPECT_NE(k.give_up()->find("9 different op sequences"), std::string::npos) << *k.give_up();
}

TEST(StepKinds, GivesUpOnKindsInNoPattern) {
  // Two known kinds picked at random: the guesses keep missing.
  StepKinds k(2);
  drive(k, repeat({A, B}, 4));
  const std::vector<uint64_t> noise = {A, A, B, A, B, B, B, A, A, B, A, A, A, B, B, A};
  drive(k, noise);
  ASSERT_TRUE(k.give_up().has_value());
  EXPECT_NE(k.give_up()->find("other ops than predicted"), std::string::npos);
}

TEST(StepKinds, PredictionUsesTheLongestContext) {
  StepKinds k(1);
  for (uint64_t s : {A, B, C, A, B}) k.finish(StepKinds::Choice{}, s, 7, false);
  EXPECT_EQ(k.predict(), C);  // "A B" was followed by C
  k.finish(StepKinds::Choice{}, A, 7, false);
  EXPECT_EQ(k.predict(), B);  // "B A" never seen; "A" was last followed by B
}

TEST(StepKinds, ACoveredKindReplaysThePlanThatCoversIt) {
  // Kinds A and B are planned; then B's plan is found to cover A (A's ops are among B's: fewer
  // layers). A step predicted as A replays B's plan, and B is the candidate, not A's old plan.
  StepKinds k(1);
  EXPECT_EQ(drive(k, {A, B, B}), "pxp");  // B's first step was a wrong guess of A
  EXPECT_EQ(k.plan_of(B), 1);
  k.set_cover(A, B);
  StepKinds::Choice c = k.next(alike(A));
  EXPECT_FALSE(c.profile);
  EXPECT_EQ(c.kind, B);
  EXPECT_EQ(c.plan, 1);
  EXPECT_TRUE(c.others.empty());
  // Its step ran B's ops with some left out: no miss, and the history holds B.
  EXPECT_FALSE(k.finish(c, A, alike(A), /*diverged=*/false, /*gapped=*/true));
  EXPECT_EQ(k.misses(), 1);  // the one before
  EXPECT_EQ(k.recent(1), (std::vector<uint64_t>{B}));
  // A kind covered by one that another covers follows the chain; a covered kind is never due a
  // plan of its own, however often it is recorded.
  k.set_cover(B, C);
  k.set_plan(C, 2);
  EXPECT_EQ(k.next(alike(A)).plan, 2);
  StepKinds::Choice rec;  // recorded whole (profile)
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(k.finish(rec, A, alike(A), false));
  // A kind whose gapped steps refused evictions is planned on its own: no cover, now or later.
  k.never_cover(A);
  EXPECT_FALSE(k.covered(A));
  EXPECT_FALSE(k.set_cover(A, C));
  EXPECT_FALSE(k.covered(A));
  EXPECT_EQ(k.next(alike(A)).plan, 0);  // its own plan again (the history's last kind is A)
}

TEST(StepKinds, KindsCoveredByAPlanWithoutActionsGoBackToTheirOwn) {
  StepKinds k(1);
  EXPECT_EQ(drive(k, {A, B, B}), "pxp");
  k.set_cover(A, B);
  k.set_cover(C, B);
  EXPECT_EQ(k.cover_of(A), B);
  EXPECT_EQ(k.cover_of(B), 0u);
  // B's plan is remade without actions (Agent::remake_for_gap): nothing follows A's or C's steps
  // past the ops they leave out, and A replays its own plan again.
  k.uncover_by(B);
  EXPECT_FALSE(k.covered(A));
  EXPECT_FALSE(k.covered(C));
  EXPECT_EQ(k.cover_of(A), 0u);
  EXPECT_EQ(k.plan_of(A), 0);
}

TEST(StepKinds, AGappedStepThatDivergedIsAMiss) {
  StepKinds k(1);
  EXPECT_EQ(drive(k, {A}), "p");
  const StepKinds::Choice c = k.next(alike(A));
  EXPECT_FALSE(k.finish(c, B, alike(B), /*diverged=*/true, /*gapped=*/true));
  EXPECT_EQ(k.misses(), 1);
  EXPECT_EQ(k.recent(1), (std::vector<uint64_t>{B}));
}

}  // namespace
}  // namespace memplan
