// op_determinism: which forward ops a rebuild must not re-run, by device and by
// torch.use_deterministic_algorithms mode.
#include "profiler/op_determinism.h"

#include <gtest/gtest.h>

namespace memplan {
namespace {

constexpr DeterminismMode kOff{false, false};
constexpr DeterminismMode kOn{true, false};
constexpr DeterminismMode kWarnOnly{true, true};
constexpr OpCall kGpu{true, false};
constexpr OpCall kCpu{false, false};

TEST(OpDeterminism, AtomicsOnAnAcceleratorOnlyWithoutTheMode) {
  for (const char* op : {"aten::index_add_", "aten::index_add", "aten::scatter_add_", "aten::cumsum"}) {
    EXPECT_TRUE(may_differ_on_rerun(op, kGpu, kOff)) << op;
    EXPECT_FALSE(may_differ_on_rerun(op, kCpu, kOff)) << op;  // CPU kernels: no atomics
    EXPECT_FALSE(may_differ_on_rerun(op, kGpu, kOn)) << op;        // the deterministic kernel
    EXPECT_FALSE(may_differ_on_rerun(op, kGpu, kWarnOnly)) << op;  // has one: warn_only selects it too
  }
}

TEST(OpDeterminism, WritesInNoSetOrderOnTheCpuToo) {
  for (const char* op : {"aten::index_put_", "aten::_index_put_impl_", "aten::index_copy_", "aten::put_"}) {
    EXPECT_TRUE(may_differ_on_rerun(op, kCpu, kOff)) << op;
    EXPECT_TRUE(may_differ_on_rerun(op, kGpu, kOff)) << op;
    EXPECT_FALSE(may_differ_on_rerun(op, kCpu, kOn)) << op;
  }
}

TEST(OpDeterminism, WarnOnlyLeavesTheOpsWithNoDeterministicKernel) {
  // With warn_only=True an op with no deterministic kernel warns and runs its usual one.
  for (const char* op : {"aten::histc", "aten::bincount", "aten::scatter_reduce_", "aten::put_"}) {
    EXPECT_TRUE(may_differ_on_rerun(op, kGpu, kWarnOnly)) << op;
    EXPECT_FALSE(may_differ_on_rerun(op, kGpu, kOn)) << op;  // it raised: there is no re-run
  }
  EXPECT_FALSE(may_differ_on_rerun("aten::histc", kCpu, kWarnOnly));  // deterministic on the CPU
  EXPECT_FALSE(may_differ_on_rerun("aten::index_copy_", kCpu, kWarnOnly));
}

TEST(OpDeterminism, EverythingElseReruns) {
  for (const char* op : {"aten::linear", "aten::convolution", "aten::dropout", "aten::index_select", "aten::gather",
                         "aten::embedding", "aten::nll_loss_forward", "aten::index_add_x", "index_add_", ""}) {
    EXPECT_FALSE(may_differ_on_rerun(op, kGpu, kOff)) << op;
    EXPECT_FALSE(has_nondeterministic_kernel(op)) << op;
  }
  EXPECT_TRUE(has_nondeterministic_kernel("aten::index_copy"));
  EXPECT_TRUE(has_nondeterministic_kernel("aten::scatter_add_"));
}

// `x[mask] = v`: boolean-mask indices write each element once, whatever the order.
TEST(OpDeterminism, IndexPutThroughMasksOnlyIsDeterministic) {
  for (const char* op : {"aten::index_put_", "aten::index_put", "aten::_index_put_impl_", "aten::_unsafe_index_put"}) {
    EXPECT_FALSE(may_differ_on_rerun(op, OpCall{false, true}, kOff)) << op;
    EXPECT_FALSE(may_differ_on_rerun(op, OpCall{true, true}, kOff)) << op;
    EXPECT_TRUE(may_differ_on_rerun(op, kCpu, kOff)) << op;
  }
  // Other ops ignore it.
  EXPECT_TRUE(may_differ_on_rerun("aten::index_copy_", OpCall{false, true}, kOff));
  EXPECT_TRUE(may_differ_on_rerun("aten::index_add_", OpCall{true, true}, kOff));
}

// The planner's note suggests deterministic algorithms only where they give the op a kernel; for
// the others the mode makes the op raise.
TEST(OpDeterminism, WhichOpsTheModeGivesADeterministicKernel) {
  for (const char* op : {"aten::index_add_", "aten::index_copy", "aten::cumsum", "aten::linear"})
    EXPECT_TRUE(has_deterministic_kernel(op)) << op;
  for (const char* op : {"aten::histc", "aten::put_", "aten::scatter_reduce", "aten::max_unpool2d", "aten::kthvalue",
                         "aten::cross_entropy_loss"})
    EXPECT_FALSE(has_deterministic_kernel(op)) << op;
}

}  // namespace
}  // namespace memplan
