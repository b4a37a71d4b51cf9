// device_us_by_op: joining synthetic kernel and external-correlation records.
#include "profiler/kernel_times.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace memplan {
namespace {

KernelRecord kernel(uint32_t corr, uint64_t start, uint64_t end, uint32_t stream = 7, const char* name = "k") {
  return KernelRecord{corr, start, end, stream, name};
}

TEST(KernelTimes, SumsKernelsPerExternalId) {
  std::vector<KernelRecord> k = {kernel(1, 1000, 3000), kernel(2, 3000, 3500), kernel(3, 4000, 10000)};
  std::vector<ExternalCorrelation> c = {{1, 0}, {2, 0}, {3, 1}};
  KernelJoinStats st;
  auto us = device_us_by_op(k, c, &st);
  ASSERT_EQ(us.size(), 2u);
  EXPECT_DOUBLE_EQ(us[0], 2.5);
  EXPECT_DOUBLE_EQ(us[1], 6.0);
  EXPECT_EQ(st.kernels, 3);
  EXPECT_EQ(st.unmatched, 0);
}

TEST(KernelTimes, OrderDoesNotMatter) {
  std::vector<KernelRecord> k;
  std::vector<ExternalCorrelation> c;
  for (uint32_t i = 1; i <= 200; ++i) {
    k.push_back(kernel(i, i * 100, i * 100 + i, i % 3));
    c.push_back({i, (uint64_t{1} << 32) + i % 10});  // backward-style ids too
  }
  const auto want = device_us_by_op(k, c);
  std::mt19937 rng(42);
  for (int round = 0; round < 5; ++round) {
    std::shuffle(k.begin(), k.end(), rng);
    std::shuffle(c.begin(), c.end(), rng);
    auto got = device_us_by_op(k, c);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [id, t] : want) EXPECT_NEAR(got[id], t, 1e-9) << id;
  }
}

TEST(KernelTimes, KernelsWithoutCorrelationAreLeftOut) {
  std::vector<KernelRecord> k = {kernel(1, 0, 1000), kernel(9, 0, 5000), kernel(0, 0, 7000)};
  std::vector<ExternalCorrelation> c = {{1, 4}};
  KernelJoinStats st;
  auto us = device_us_by_op(k, c, &st);
  ASSERT_EQ(us.size(), 1u);
  EXPECT_DOUBLE_EQ(us[4], 1.0);
  EXPECT_EQ(st.unmatched, 2);
}

TEST(KernelTimes, DuplicateRecordsCountOnce) {
  std::vector<KernelRecord> k = {kernel(1, 0, 2000), kernel(1, 0, 2000), kernel(1, 3000, 4000)};
  std::vector<ExternalCorrelation> c = {{1, 5}, {1, 5}, {1, 5}};
  KernelJoinStats st;
  auto us = device_us_by_op(k, c, &st);
  // One launch may run several kernels (a CUDA graph): distinct kernels of one correlation add up.
  EXPECT_DOUBLE_EQ(us[5], 3.0);
  EXPECT_EQ(st.duplicates, 1);
  EXPECT_EQ(st.conflicts, 0);
}

TEST(KernelTimes, ConflictingCorrelationTakesSmallerIdWhateverTheOrder) {
  std::vector<KernelRecord> k = {kernel(1, 0, 1000)};
  KernelJoinStats st;
  auto a = device_us_by_op(k, {{1, 8}, {1, 3}}, &st);
  EXPECT_EQ(st.conflicts, 1);
  auto b = device_us_by_op(k, {{1, 3}, {1, 8}});
  EXPECT_DOUBLE_EQ(a[3], 1.0);
  EXPECT_DOUBLE_EQ(b[3], 1.0);
  EXPECT_EQ(a.count(8), 0u);
}

TEST(KernelTimes, BadTimestampsAreDropped) {
  KernelJoinStats st;
  auto us = device_us_by_op({kernel(1, 5000, 1000), kernel(1, 5000, 6000)}, {{1, 2}}, &st);
  EXPECT_DOUBLE_EQ(us[2], 1.0);
  EXPECT_EQ(st.bad_times, 1);
}

TEST(KernelTimes, EmptyInputs) {
  EXPECT_TRUE(device_us_by_op({}, {}).empty());
  EXPECT_TRUE(device_us_by_op({}, {{1, 2}}).empty());
}

// The seam itself: a fake tracer behaves like the real one for a caller that pushes ids.
class FakeTracer : public ActivityApi {
 public:
  bool enable() override { return on_ = true; }
  void disable() override { on_ = false; }
  void push_external_id(uint64_t id) override { stack_.push_back(id); }
  void pop_external_id() override { stack_.pop_back(); }
  void launch(uint64_t start, uint64_t end) {
    const uint32_t corr = ++next_;
    if (!on_) return;
    kernels_.push_back(kernel(corr, start, end));
    if (!stack_.empty()) corr_.push_back({corr, stack_.back()});
  }
  bool flush(std::vector<KernelRecord>* k, std::vector<ExternalCorrelation>* c) override {
    k->insert(k->end(), kernels_.begin(), kernels_.end());
    c->insert(c->end(), corr_.begin(), corr_.end());
    kernels_.clear();
    corr_.clear();
    return true;
  }

 private:
  bool on_ = false;
  uint32_t next_ = 0;
  std::vector<uint64_t> stack_;
  std::vector<KernelRecord> kernels_;
  std::vector<ExternalCorrelation> corr_;
};

TEST(KernelTimes, ThroughTheSeam) {
  FakeTracer t;
  ASSERT_TRUE(t.enable());
  t.launch(0, 500);  // before any op: unmatched
  t.push_external_id(0);
  t.launch(1000, 2000);
  t.launch(2000, 2500);
  t.pop_external_id();
  t.push_external_id(1);
  t.launch(3000, 7000);
  t.pop_external_id();
  std::vector<KernelRecord> k;
  std::vector<ExternalCorrelation> c;
  ASSERT_TRUE(t.flush(&k, &c));
  KernelJoinStats st;
  auto us = device_us_by_op(k, c, &st);
  EXPECT_DOUBLE_EQ(us[0], 1.5);
  EXPECT_DOUBLE_EQ(us[1], 4.0);
  EXPECT_EQ(st.unmatched, 1);
}

Op timed(double cpu_us) {
  Op op;
  op.time_us = op.cpu_us = cpu_us;
  return op;
}

// An op's cost is the longer of its launch and its kernels: a launch-bound op costs its CPU time,
// a device-bound one its kernel time; CUPTI is preferred to events; unmeasured ops keep CPU time.
TEST(ApplyDeviceTimes, TheLongerOfHostAndDevice) {
  std::vector<Op> ops = {timed(10), timed(10), timed(10), timed(10), timed(10), timed(10)};
  const std::vector<double> cupti = {3, 40, -1, -1, 0};   // the 6th op has no entry at all
  const std::vector<double> events = {50, 5, 25, -1, -1};
  apply_device_times(&ops, cupti, events);
  EXPECT_DOUBLE_EQ(ops[0].time_us, 10);  // kernel 3 µs behind a 10 µs launch (not the event's 50)
  EXPECT_DOUBLE_EQ(ops[1].time_us, 40);  // kernel longer than its launch
  EXPECT_DOUBLE_EQ(ops[2].time_us, 25);  // no CUPTI record: the event time
  EXPECT_DOUBLE_EQ(ops[3].time_us, 10);  // neither measured: CPU time
  EXPECT_DOUBLE_EQ(ops[4].time_us, 10);  // no kernel (a view): its launch
  EXPECT_DOUBLE_EQ(ops[5].time_us, 10);
  EXPECT_DOUBLE_EQ(ops[1].cupti_us, 40);
  EXPECT_DOUBLE_EQ(ops[2].event_us, 25);
  EXPECT_DOUBLE_EQ(ops[5].cupti_us, -1);
  EXPECT_DOUBLE_EQ(ops[1].cpu_us, 10);  // the CPU time itself is kept
}

}  // namespace
}  // namespace memplan
