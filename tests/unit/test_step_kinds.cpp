#include "agent/step_kinds.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace memplan {
namespace {

constexpr uint64_t A = 0xa, B = 0xb, C = 0xc, L = 0x1;

// Runs a script's steps through StepKinds as the agent does: choose, run `actual`, finish, plan
// when asked (plans numbered in order). Returns, per step, 'p' (profiled), 'r' (replayed the
// right plan) or 'x' (replayed a wrong guess).
std::string drive(StepKinds& k, const std::vector<uint64_t>& steps, int* plans = nullptr) {
  std::string out;
  int next_plan = 0;
  for (uint64_t actual : steps) {
    const StepKinds::Choice c = k.next();
    out += c.profile ? 'p' : (c.kind == actual ? 'r' : 'x');
    if (k.finish(c, actual, !c.profile && c.kind != actual)) k.set_plan(actual, next_plan++);
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
  EXPECT_TRUE(k.next().profile);
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

TEST(StepKinds, AShapeChangeIsOneMissThenANewPlan) {
  // The sequence length changes at step 6 for good.
  StepKinds k(2);
  std::vector<uint64_t> steps = repeat({A}, 6);
  for (uint64_t s : repeat({B}, 6)) steps.push_back(s);
  int plans = 0;
  EXPECT_EQ(drive(k, steps, &plans), "pprrrrxpprrr");
  EXPECT_EQ(plans, 2);
  EXPECT_EQ(k.misses(), 1);
  EXPECT_FALSE(k.give_up().has_value());
}

TEST(StepKinds, ASmallerLastBatchPerEpochIsLearnt) {
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
  StepKinds::Choice c = k.next();
  ASSERT_FALSE(c.profile);
  EXPECT_FALSE(k.finish(c, A, /*diverged=*/true));
  EXPECT_TRUE(k.next().profile);  // A's plan is gone: profile it again
  c = k.next();
  EXPECT_FALSE(k.finish(c, A, false));
  c = k.next();
  EXPECT_TRUE(k.finish(c, A, false));  // planned again after two fresh records
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
  for (uint64_t s : {A, B, C, A, B}) k.finish(StepKinds::Choice{}, s, false);
  EXPECT_EQ(k.predict(), C);  // "A B" was followed by C
  k.finish(StepKinds::Choice{}, A, false);
  EXPECT_EQ(k.predict(), B);  // "B A" never seen; "A" was last followed by B
}

}  // namespace
}  // namespace memplan
