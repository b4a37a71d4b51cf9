// DeviceTimer's CUPTI path on the CPU: a fake ActivityApi plays CUPTI, emitting kernel and
// external-correlation records for "launches" the test makes between op_begin and op_end.
// (The CUDA-event path needs a GPU: tools/gpu_check.sh exercises it.)
#include "hooks/device_timer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace memplan {
namespace {

class FakeCupti : public ActivityApi {
 public:
  bool enable_ok = true;
  bool complete = true;   // what flush reports
  bool shuffle = false;   // deliver records in a scrambled order
  int enables = 0, disables = 0, flushes = 0;

  bool enable() override {
    ++enables;
    on_ = enable_ok;
    return enable_ok;
  }
  void disable() override {
    ++disables;
    on_ = false;
  }
  void push_external_id(uint64_t id) override { stack_.push_back(id); }
  void pop_external_id() override {
    ASSERT_FALSE(stack_.empty());
    stack_.pop_back();
  }
  bool flush(std::vector<KernelRecord>* k, std::vector<ExternalCorrelation>* c) override {
    ++flushes;
    if (shuffle) {
      std::mt19937 rng(7);
      std::shuffle(kernels_.begin(), kernels_.end(), rng);
      std::shuffle(corr_.begin(), corr_.end(), rng);
    }
    k->insert(k->end(), kernels_.begin(), kernels_.end());
    c->insert(c->end(), corr_.begin(), corr_.end());
    kernels_.clear();
    corr_.clear();
    return complete;
  }
  // A kernel launch on the calling "thread": correlated to the top external id, if any.
  void launch(uint64_t dur_ns, uint32_t stream = 7) {
    const uint32_t corr = ++next_corr_;
    if (!on_) return;
    kernels_.push_back(KernelRecord{corr, t_, t_ + dur_ns, stream, "k"});
    t_ += dur_ns + 100;
    if (!stack_.empty()) corr_.push_back(ExternalCorrelation{corr, stack_.back()});
  }
  size_t depth() const { return stack_.size(); }

 private:
  bool on_ = false;
  uint32_t next_corr_ = 0;
  uint64_t t_ = 1'000'000;
  std::vector<uint64_t> stack_;
  std::vector<KernelRecord> kernels_;
  std::vector<ExternalCorrelation> corr_;
};

TEST(DeviceTimer, OpIdConvention) {
  EXPECT_EQ(forward_op_id(5), 5u);
  EXPECT_EQ(backward_op_id(0), uint64_t{1} << 32);
  EXPECT_GT(backward_op_id(0), forward_op_id(int64_t{1} << 31));
}

#if MEMPLAN_HAVE_CUDA

TEST(DeviceTimer, CuptiTimesPerForwardOpAndBackwardNode) {
  FakeCupti fake;
  DeviceTimer timer(&fake, /*events=*/false);
  fake.launch(5000);  // before the step: not recorded (tracer disabled)
  ASSERT_TRUE(timer.begin_step());
  EXPECT_TRUE(timer.cupti_on());
  EXPECT_FALSE(timer.events_on());
  fake.launch(9000);  // in the step, outside any op (optimizer, agent): attributed to none

  timer.op_begin(forward_op_id(0));
  fake.launch(2000);
  fake.launch(1000, 8);
  timer.op_end(forward_op_id(0));
  timer.op_begin(forward_op_id(1));  // a view: no kernel
  timer.op_end(forward_op_id(1));
  timer.op_begin(forward_op_id(2));
  fake.launch(4000);
  timer.op_end(forward_op_id(2));
  timer.op_begin(backward_op_id(0));
  fake.launch(6000);
  timer.op_end(backward_op_id(0));
  timer.op_begin(backward_op_id(1));
  fake.launch(500);
  timer.op_end(backward_op_id(1));
  EXPECT_EQ(fake.depth(), 0u);

  std::vector<double> cupti, events, bcupti, bevents;
  ASSERT_TRUE(timer.end_step(&cupti, &events, &bcupti, &bevents));
  ASSERT_EQ(cupti.size(), 3u);
  EXPECT_DOUBLE_EQ(cupti[0], 3.0);
  EXPECT_DOUBLE_EQ(cupti[1], 0.0);
  EXPECT_DOUBLE_EQ(cupti[2], 4.0);
  ASSERT_EQ(bcupti.size(), 2u);
  EXPECT_DOUBLE_EQ(bcupti[0], 6.0);
  EXPECT_DOUBLE_EQ(bcupti[1], 0.5);
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(bevents.empty());
  EXPECT_EQ(fake.enables, 1);
  EXPECT_EQ(fake.disables, 1);
  EXPECT_FALSE(timer.timing());
}

TEST(DeviceTimer, RecordsInAnyOrder) {
  FakeCupti fake;
  fake.shuffle = true;
  DeviceTimer timer(&fake, false);
  ASSERT_TRUE(timer.begin_step());
  for (int op = 0; op < 50; ++op) {
    timer.op_begin(forward_op_id(op));
    for (int k = 0; k <= op % 4; ++k) fake.launch(1000 * (k + 1));
    timer.op_end(forward_op_id(op));
  }
  std::vector<double> cupti;
  ASSERT_TRUE(timer.end_step(&cupti, nullptr));
  ASSERT_EQ(cupti.size(), 50u);
  for (int op = 0; op < 50; ++op) {
    const int n = op % 4 + 1;
    EXPECT_DOUBLE_EQ(cupti[op], n * (n + 1) / 2.0) << op;
  }
}

TEST(DeviceTimer, UnmeasuredOpsAreMinusOne) {
  FakeCupti fake;
  DeviceTimer timer(&fake, false);
  ASSERT_TRUE(timer.begin_step());
  timer.op_begin(forward_op_id(3));  // ops 0..2 were not begun (e.g. recorded on the CPU)
  fake.launch(1000);
  timer.op_end(forward_op_id(3));
  std::vector<double> cupti;
  ASSERT_TRUE(timer.end_step(&cupti, nullptr));
  ASSERT_EQ(cupti.size(), 4u);
  EXPECT_EQ(cupti[0], -1);
  EXPECT_EQ(cupti[2], -1);
  EXPECT_DOUBLE_EQ(cupti[3], 1.0);
}

TEST(DeviceTimer, IncompleteRecordsGiveNoCuptiTimes) {
  FakeCupti fake;
  fake.complete = false;
  DeviceTimer timer(&fake, false);
  ASSERT_TRUE(timer.begin_step());
  timer.op_begin(0);
  fake.launch(1000);
  timer.op_end(0);
  std::vector<double> cupti;
  timer.end_step(&cupti, nullptr);
  EXPECT_TRUE(std::all_of(cupti.begin(), cupti.end(), [](double t) { return t < 0; }));
}

TEST(DeviceTimer, TracerThatFailsToEnable) {
  FakeCupti fake;
  fake.enable_ok = false;
  DeviceTimer timer(&fake, false);
  EXPECT_FALSE(timer.begin_step());  // no tracer, no events: nothing to time
  timer.op_begin(0);                 // no-ops, no crash
  timer.op_end(0);
  EXPECT_EQ(fake.depth(), 0u);
  std::vector<double> cupti{1, 2};
  EXPECT_FALSE(timer.end_step(&cupti, nullptr));
  EXPECT_TRUE(cupti.empty());
}

TEST(DeviceTimer, CallsOutsideAStepAreNoOps) {
  FakeCupti fake;
  DeviceTimer timer(&fake, false);
  timer.op_begin(0);
  timer.op_end(0);
  EXPECT_EQ(fake.depth(), 0u);
  EXPECT_FALSE(timer.end_step(nullptr, nullptr));
  EXPECT_EQ(fake.enables, 0);
}

TEST(DeviceTimer, UnpairedEndDoesNotPopBelowTheStep) {
  FakeCupti fake;
  DeviceTimer timer(&fake, false);
  ASSERT_TRUE(timer.begin_step());
  timer.op_end(0);  // an end whose begin came before the step
  EXPECT_EQ(fake.depth(), 0u);
  timer.op_begin(1);
  fake.launch(2000);
  timer.op_end(1);
  std::vector<double> cupti;
  ASSERT_TRUE(timer.end_step(&cupti, nullptr));
  EXPECT_DOUBLE_EQ(cupti.at(1), 2.0);
}

// The autograd engine wraps each node's callbacks in its own ("autograd::engine::evaluate_
// function: X"): the agent may call op_end for both ends; the second is ignored.
TEST(DeviceTimer, RepeatedEndIsIgnored) {
  FakeCupti fake;
  DeviceTimer timer(&fake, false);
  ASSERT_TRUE(timer.begin_step());
  timer.op_begin(backward_op_id(0));
  fake.launch(1000);
  timer.op_end(backward_op_id(0));
  timer.op_end(backward_op_id(0));
  EXPECT_EQ(fake.depth(), 0u);
  std::vector<double> bc;
  ASSERT_TRUE(timer.end_step(nullptr, nullptr, &bc, nullptr));
  EXPECT_DOUBLE_EQ(bc.at(0), 1.0);
}

// An inner op whose end never came is closed with its outer one: the tracer's stack stays in
// step with ours, and later kernels go to the right op.
TEST(DeviceTimer, MissedEndIsClosedByTheOuterEnd) {
  FakeCupti fake;
  DeviceTimer timer(&fake, false);
  ASSERT_TRUE(timer.begin_step());
  timer.op_begin(0);
  timer.op_begin(1);
  fake.launch(1000);  // op 1
  timer.op_end(0);    // op 1's end was missed
  EXPECT_EQ(fake.depth(), 0u);
  timer.op_begin(2);
  fake.launch(3000);
  timer.op_end(2);
  std::vector<double> cupti;
  ASSERT_TRUE(timer.end_step(&cupti, nullptr));
  EXPECT_DOUBLE_EQ(cupti.at(1), 1.0);
  EXPECT_DOUBLE_EQ(cupti.at(0), 0.0);
  EXPECT_DOUBLE_EQ(cupti.at(2), 3.0);
}

TEST(DeviceTimer, OpsStillOpenAtEndStepArePopped) {
  FakeCupti fake;
  DeviceTimer timer(&fake, false);
  ASSERT_TRUE(timer.begin_step());
  timer.op_begin(0);
  fake.launch(1000);
  std::vector<double> cupti;
  ASSERT_TRUE(timer.end_step(&cupti, nullptr));
  EXPECT_EQ(fake.depth(), 0u);
  EXPECT_DOUBLE_EQ(cupti.at(0), 1.0);
}

TEST(DeviceTimer, SeveralSteps) {
  FakeCupti fake;
  DeviceTimer timer(&fake, false);
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(timer.begin_step());
    timer.op_begin(0);
    fake.launch(1000 * step);
    timer.op_end(0);
    std::vector<double> cupti;
    ASSERT_TRUE(timer.end_step(&cupti, nullptr));
    EXPECT_DOUBLE_EQ(cupti.at(0), step);
  }
  EXPECT_EQ(fake.enables, 3);
  EXPECT_EQ(fake.disables, 3);
}

// No GPU here: the real tracer and the events stay off, and nothing throws or aborts.
TEST(DeviceTimer, RealTracerWithoutADevice) {
  DeviceTimer timer;  // CUPTI + events
  const bool started = timer.begin_step();
  if (started) GTEST_SKIP() << "a CUDA device is present: covered by tools/gpu_check.sh";
  timer.op_begin(0);
  timer.op_end(0);
  std::vector<double> cupti, events;
  EXPECT_FALSE(timer.end_step(&cupti, &events));
}

#else

TEST(DeviceTimer, StubWithoutCuda) {
  FakeCupti fake;
  DeviceTimer timer(&fake);
  EXPECT_FALSE(timer.begin_step());
  timer.op_begin(0);
  timer.op_end(0);
  std::vector<double> cupti;
  EXPECT_FALSE(timer.end_step(&cupti, nullptr));
}

#endif

}  // namespace
}  // namespace memplan
