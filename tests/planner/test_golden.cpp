// Golden tests: checked-in synthetic profiles -> plan summaries at fixed budgets, compared exactly
// with checked-in text. Regenerate with MEMPLAN_UPDATE_GOLDEN=1 (then review the diff).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "agent/options.h"
#include "planner/plan_io.h"
#include "planner/planner.h"
#include "planner/report.h"
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
