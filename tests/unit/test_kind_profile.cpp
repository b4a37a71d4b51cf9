// Which record of a kind of step the planner gets (profiler/kind_profile.h).
#include <gtest/gtest.h>

#include "profiler/kind_profile.h"

namespace memplan {
namespace {

Op op(const std::string& name, double us) {
  Op o;
  o.name = name;
  o.time_us = o.cpu_us = us;
  return o;
}

// A record of `signature` with activation peak `act` over a 1000-byte baseline and op times
// scaled by `slow`.
Profile record(int64_t step, uint64_t signature, int64_t act, double slow = 1.0) {
  Profile p;
  p.step = step;
  p.signature = signature;
  p.baseline_bytes = 1000;
  p.peak_bytes = 1000 + act;
  p.forward = {op("aten::linear", 10 * slow), op("aten::relu", 2 * slow)};
  p.backward = {op("ReluBackward0", 3 * slow), op("AddmmBackward0", 20 * slow)};
  p.forward[0].live_after = 1000 + act;  // a memory field that must come from the heavy record
  p.forward_us = 12 * slow;
  p.backward_us = 23 * slow;
  return p;
}

TEST(KindProfile, TheHeaviestRecordOfTheKindWins) {
  // Gradient accumulation: step 0 allocates the gradients, step 1 adds into them; step 2 is
  // another kind, heavier still, and does not count.
  std::vector<Profile> r = {record(0, 7, 5000), record(1, 7, 3000), record(2, 9, 9000), record(3, 7, 3000)};
  EXPECT_EQ(heaviest_of_kind(r, 3), 0u);
  EXPECT_EQ(heaviest_of_kind(r, 2), 2u);  // alone in its kind
}

TEST(KindProfile, NoiseStaysWithTheLatest) {
  std::vector<Profile> r = {record(0, 7, 3020), record(1, 7, 3000)};
  EXPECT_EQ(heaviest_of_kind(r, 1), 1u);          // 0.7% heavier: within the 1% margin
  EXPECT_EQ(heaviest_of_kind(r, 1, 0.001), 0u);   // beyond a 0.1% margin
  r[0].peak_bytes = 1000 + 2000;                  // lighter
  EXPECT_EQ(heaviest_of_kind(r, 1, 0.0), 1u);
}

TEST(KindProfile, OtherOpsNeverLendTheirMemory) {
  std::vector<Profile> r = {record(0, 7, 5000), record(1, 7, 3000)};
  r[0].backward[1].name = "MmBackward0";  // same signature, another node: not comparable
  EXPECT_EQ(heaviest_of_kind(r, 1), 1u);
  r[0].backward.pop_back();
  EXPECT_EQ(heaviest_of_kind(r, 1), 1u);
}

TEST(KindProfile, MemoryOfOneTimesOfTheOther) {
  const Profile heavy = record(0, 7, 5000, /*slow=*/3.0);  // a first step: slow
  const Profile latest = record(1, 7, 3000);
  const Profile m = with_times_of(heavy, latest);
  EXPECT_EQ(m.peak_bytes, heavy.peak_bytes);
  EXPECT_EQ(m.forward[0].live_after, heavy.forward[0].live_after);
  for (size_t i = 0; i < m.forward.size(); ++i) {
    EXPECT_EQ(m.forward[i].time_us, latest.forward[i].time_us);
    EXPECT_EQ(m.forward[i].cpu_us, latest.forward[i].cpu_us);
  }
  for (size_t i = 0; i < m.backward.size(); ++i) EXPECT_EQ(m.backward[i].time_us, latest.backward[i].time_us);
  EXPECT_EQ(m.forward_us, latest.forward_us);
  EXPECT_EQ(m.backward_us, latest.backward_us);
}

}  // namespace
}  // namespace memplan
