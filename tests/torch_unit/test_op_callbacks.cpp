// RecordFunction interposition (hooks/op_callbacks.h): the sink sees each top-level op once,
// its children skip RecordFunction only while nobody else observes them, and a quiet stretch
// (an optimizer step) hides its ops from the sink and from RecordFunction, never from another
// observer.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/autograd/generated/variable_factories.h>

#include "hooks/op_callbacks.h"

namespace {

struct CountingSink : memplan::OpSink {
  std::vector<std::string> started, ended;
  std::vector<bool> rf_enabled_inside;  // at::isRecordFunctionEnabled() seen in op_start
  bool throw_at_start = false;  // op_start throws, as a tensor the recorder cannot describe made it
  std::vector<std::string> failures;
  void op_start(const at::RecordFunction& fn) override {
    started.emplace_back(fn.name());
    rf_enabled_inside.push_back(at::isRecordFunctionEnabled());
    if (throw_at_start) throw std::runtime_error("cannot describe it");
  }
  void callback_failed(const std::exception& e) override { failures.emplace_back(e.what()); }
  void op_end(const at::RecordFunction& fn) override { ended.emplace_back(fn.name()); }
  void node_start(const at::RecordFunction&) override {}
  void node_end(const at::RecordFunction&) override {}
  std::vector<std::string> untracked;
  void untracked_op(const at::RecordFunction& fn) override { untracked.emplace_back(fn.name()); }
  int unwound = 0;
  void quiet_stretch_unwound() override {
    ++unwound;
    memplan::quiet_ops_end();  // what the agent does (its optimizer_step_end)
  }
};

// A user-scope range around `body`, as `torch.autograd.profiler.record_function` makes one
// (Optimizer.step's); its destructor ends it, as the Python context manager's exit does on an
// exception too.
template <typename F>
void user_scope(const char* name, F body) {
  at::RecordFunction rf(at::RecordScope::USER_SCOPE);
  rf.before(name);
  body();
}

// Another observer (a user's profiler): counts every FUNCTION-scope op named `name`.
std::atomic<int> g_other_seen{0};
const char* g_other_name = "aten::addmm";
at::CallbackHandle add_other_observer() {
  g_other_seen = 0;
  at::RecordFunctionCallback cb(
      [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::strcmp(fn.name(), g_other_name) == 0) ++g_other_seen;
        return nullptr;
      },
      nullptr);
  cb.scopes({at::RecordScope::FUNCTION});
  return at::addThreadLocalCallback(cb);
}

// aten::linear with a weight that requires grad: a top-level autograd op whose children
// (aten::t, aten::addmm) also go through the dispatcher.
at::Tensor run_linear() {
  at::Tensor x, w, b;
  {
    memplan::AgentScope hidden;  // the inputs' factories are not the op under test
    x = at::randn({4, 8});
    w = at::randn({3, 8}).requires_grad_(true);
    b = at::randn({3}).requires_grad_(true);
  }
  return at::linear(x, w, b);
}

class OpCallbacks : public ::testing::Test {
 protected:
  void SetUp() override { memplan::install_op_callbacks(&sink_, memplan::CallbackNeeds{true, true}); }
  void TearDown() override {
    memplan::quiet_ops_end();
    memplan::remove_op_callbacks();
    at::enableRecordFunction(true);
  }
  CountingSink sink_;
};

}  // namespace

TEST_F(OpCallbacks, TopLevelOpOnceAndChildrenSkipRecordFunctionWhenAlone) {
  run_linear();
  ASSERT_EQ(sink_.started, std::vector<std::string>{"aten::linear"});
  EXPECT_EQ(sink_.ended, std::vector<std::string>{"aten::linear"});
  EXPECT_FALSE(sink_.rf_enabled_inside[0]);  // off for linear's children
  EXPECT_TRUE(at::isRecordFunctionEnabled());  // and back on after it
}

TEST_F(OpCallbacks, WhatTheSinkThrowsGoesBackToItAndTheOpStillEnds) {
  sink_.throw_at_start = true;
  run_linear();  // nothing reaches RecordFunction (which would print it for every op after)
  EXPECT_EQ(sink_.failures, std::vector<std::string>{"cannot describe it"});
  EXPECT_EQ(sink_.ended, std::vector<std::string>{"aten::linear"});
  EXPECT_TRUE(at::isRecordFunctionEnabled());  // the children's silence ended with the op
}

TEST_F(OpCallbacks, NoGradOpsReachTheSinkAsUntrackedOnly) {
  at::Tensor buf;
  {
    memplan::AgentScope hidden;
    buf = at::zeros({4});
  }
  {
    at::NoGradGuard no_grad;
    buf.mul_(2);
  }
  EXPECT_TRUE(sink_.started.empty());
  ASSERT_FALSE(sink_.untracked.empty());
  EXPECT_EQ(sink_.untracked.front(), "aten::mul_");
  // With grad mode on, neither the op nor its children are untracked.
  sink_.untracked.clear();
  run_linear();
  EXPECT_TRUE(sink_.untracked.empty());
  EXPECT_EQ(sink_.started, std::vector<std::string>{"aten::linear"});
}

TEST_F(OpCallbacks, AnotherObserverStillSeesTheChildren) {
  const at::CallbackHandle other = add_other_observer();
  run_linear();
  at::removeCallback(other);
  ASSERT_EQ(sink_.started, std::vector<std::string>{"aten::linear"});
  EXPECT_TRUE(sink_.rf_enabled_inside[0]);
  EXPECT_EQ(g_other_seen.load(), 1);  // linear's addmm
}

// What Python's torch.empty_like, torch.zeros_like, torch.randn run (torch:: factories): the aten
// op below autograd (no node, no sequence number), then autograd::make_variable.
// With grad mode on, each is a top-level op like any other, made like a tensor (gumbel_softmax
// fills its empty_like with exponential_) or from its arguments alone (torch.zeros: a buffer the
// forward fills through a slice; randn: a batch drawn in the step), and its children (zeros_like's
// empty_like and zero_, randn's normal_, which has a tensor argument) are not.
TEST_F(OpCallbacks, FactoriesAreTopLevelOpsAndTheirChildrenAreNot) {
  at::Tensor like;
  {
    memplan::AgentScope hidden;
    like = at::randn({4, 8});
  }
  torch::empty_like(like);
  torch::randn({4, 8});
  torch::zeros_like(like);
  const std::vector<std::string> made{"aten::empty_like", "aten::randn", "aten::zeros_like"};
  EXPECT_EQ(sink_.started, made);
  EXPECT_EQ(sink_.ended, made);
  ASSERT_EQ(sink_.rf_enabled_inside.size(), 3u);
  EXPECT_FALSE(sink_.rf_enabled_inside[1]);  // off for randn's children (normal_)
  EXPECT_FALSE(sink_.rf_enabled_inside[2]);  // and for zeros_like's
  EXPECT_TRUE(at::isRecordFunctionEnabled());  // and back on after them
  EXPECT_TRUE(sink_.untracked.empty());
  // Under no_grad they are untracked ops, as before.
  sink_.started.clear();
  {
    at::NoGradGuard no_grad;
    torch::zeros_like(like);
  }
  EXPECT_TRUE(sink_.started.empty());
  ASSERT_FALSE(sink_.untracked.empty());
  EXPECT_EQ(sink_.untracked.front(), "aten::zeros_like");
}

// With another observer the children reach RecordFunction: zeros_like's empty_like, unnumbered
// too, ends before zeros_like does and must not end it; nor must randn's normal_ begin an op.
TEST_F(OpCallbacks, AnUnnumberedChildDoesNotEndItsParentOrBeginAnOp) {
  at::Tensor like;
  {
    memplan::AgentScope hidden;
    like = at::randn({4, 8});
  }
  g_other_name = "aten::empty_like";
  const at::CallbackHandle other = add_other_observer();
  torch::zeros_like(like);
  torch::randn({4, 8});
  run_linear();
  at::removeCallback(other);
  g_other_name = "aten::addmm";
  EXPECT_EQ(g_other_seen.load(), 1);  // the child ran, observed
  const std::vector<std::string> ops{"aten::zeros_like", "aten::randn", "aten::linear"};
  EXPECT_EQ(sink_.started, ops);
  EXPECT_EQ(sink_.ended, ops);
}

// torch.compile wraps its region in a FUNCTION-scope range with no sequence number ("Torch-Compiled
// Region: 0/0"): no op, and no parent of the ops inside it, which are the step's.
TEST_F(OpCallbacks, AnUnnumberedRangeThatIsNoOpHidesNothingInside) {
  {
    at::RecordFunction region(at::RecordScope::FUNCTION);
    region.before("Torch-Compiled Region: 0/0");
    run_linear();
  }
  EXPECT_EQ(sink_.started, std::vector<std::string>{"aten::linear"});
  EXPECT_EQ(sink_.ended, std::vector<std::string>{"aten::linear"});
}

TEST_F(OpCallbacks, QuietStretchHidesOpsUntilItEnds) {
  ASSERT_TRUE(memplan::quiet_ops_begin());
  EXPECT_TRUE(memplan::quiet_ops_active());
  EXPECT_FALSE(memplan::quiet_ops_begin());  // not nested
  run_linear();
  EXPECT_TRUE(sink_.started.empty());
  memplan::quiet_ops_end();
  EXPECT_FALSE(memplan::quiet_ops_active());
  EXPECT_TRUE(at::isRecordFunctionEnabled());
  run_linear();
  EXPECT_EQ(sink_.started, std::vector<std::string>{"aten::linear"});
}

TEST_F(OpCallbacks, NoQuietStretchWhileAnotherObserverWatches) {
  const at::CallbackHandle other = add_other_observer();
  EXPECT_FALSE(memplan::quiet_ops_begin());
  run_linear();
  at::removeCallback(other);
  EXPECT_EQ(sink_.started.size(), 1u);
  EXPECT_EQ(g_other_seen.load(), 1);
}

TEST_F(OpCallbacks, NoQuietStretchWithoutOurCallbacks) {
  memplan::remove_op_callbacks();
  EXPECT_FALSE(memplan::quiet_ops_begin());
  EXPECT_TRUE(at::isRecordFunctionEnabled());
}

TEST_F(OpCallbacks, AQuietStretchThatOutlivesItsUserScopeIsReportedOnce) {
  // An optimizer step whose pre hook began the stretch, then raised: no post hook ends it.
  user_scope("Optimizer.step#SGD.step", [] { ASSERT_TRUE(memplan::quiet_ops_begin()); });
  EXPECT_EQ(sink_.unwound, 1);
  EXPECT_FALSE(memplan::quiet_ops_active());
  EXPECT_TRUE(at::isRecordFunctionEnabled());
  run_linear();  // the next forward is seen
  EXPECT_EQ(sink_.started, std::vector<std::string>{"aten::linear"});
  // A step whose post hook ended the stretch, and a range outside any stretch: nothing to report.
  user_scope("Optimizer.step#SGD.step", [] {
    ASSERT_TRUE(memplan::quiet_ops_begin());
    memplan::quiet_ops_end();
  });
  user_scope("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", [] {});
  EXPECT_EQ(sink_.unwound, 1);
}
