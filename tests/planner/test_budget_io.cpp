// Budget parsing and plan JSON round trips / rejection.
#include <gtest/gtest.h>

#include "planner/plan_io.h"
#include "planner/planner.h"
#include "planner/synth.h"

using namespace memplan;
using namespace memplan::planner;

TEST(Budget, PercentOfActivationMemory) {
  Profile p;
  p.baseline_bytes = 1000;
  p.peak_bytes = 3000;
  EXPECT_EQ(budget_bytes(Budget{Budget::Kind::Percent, 0, 50}, p), 2000);
  EXPECT_DOUBLE_EQ(activation_percent(2500, p), 75.0);
  EXPECT_EQ(budget_bytes(Budget{}, p), 3000);
}

TEST(PlanIo, RoundTrip) {
  Profile prof = synth_resnet(5);
  PlanResult r = make_plan(prof, Budget{Budget::Kind::Percent, 0, 50});
  ASSERT_TRUE(r.ok);
  ASSERT_FALSE(r.plan.empty());
  Plan back;
  std::string e;
  ASSERT_TRUE(plan_from_json(plan_to_json(r.plan), &back, &e)) << e;
  EXPECT_EQ(plan_to_json(back), plan_to_json(r.plan));
  EXPECT_TRUE(validate_plan(back, prof, &e)) << e;
}

TEST(PlanIo, RejectsBadPlans) {
  Profile prof = synth_resnet(5);
  PlanResult r = make_plan(prof, Budget{Budget::Kind::Percent, 0, 50});
  const std::string good = plan_to_json(r.plan);
  Plan p;
  std::string e;
  EXPECT_FALSE(plan_from_json(good.substr(0, good.size() / 2), &p, &e));
  EXPECT_NE(e.find("not valid JSON"), std::string::npos);
  std::string v2 = good;
  v2.replace(v2.find("\"version\": 1"), 12, "\"version\": 7");
  EXPECT_FALSE(plan_from_json(v2, &p, &e));
  EXPECT_NE(e.find("unknown plan version 7"), std::string::npos) << e;
  // A plan that evicts a value some later forward op still reads fails validation.
  Plan bad = r.plan;
  ASSERT_FALSE(bad.evictions.empty());
  bad.evictions[0].after_fwd = prof.values[bad.evictions[0].value].producer;
  if (bad.evictions[0].after_fwd < 0 ||
      prof.values[bad.evictions[0].value].consumers.empty() ||
      prof.values[bad.evictions[0].value].consumers.back() == bad.evictions[0].after_fwd)
    GTEST_SKIP();
  EXPECT_FALSE(validate_plan(bad, prof, &e));
  EXPECT_NE(e.find("still uses it"), std::string::npos) << e;
  // A recompute that misses an input fails validation.
  Plan miss = r.plan;
  ASSERT_FALSE(miss.recomputes.empty());
  for (Recompute& rc : miss.recomputes)
    if (rc.ops.size() > 1) {
      rc.ops.erase(rc.ops.begin());
      break;
    }
  EXPECT_FALSE(validate_plan(miss, prof, &e));
  Plan other = r.plan;
  other.profile_hash = "nope";
  EXPECT_FALSE(validate_plan(other, prof, &e));
}
