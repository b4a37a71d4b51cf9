// op_determinism: which forward ops a rebuild must not re-run, by device and by
// torch.use_deterministic_algorithms mode.
#include "profiler/op_determinism.h"

#include <gtest/gtest.h>

namespace memplan {
namespace {

constexpr DeterminismMode kOff{false, false};
constexpr DeterminismMode kOn{true, false};
constexpr DeterminismMode kWarnOnly{true, true};

TEST(OpDeterminism, AtomicsOnAnAcceleratorOnlyWithoutTheMode) {
  for (const char* op : {"aten::index_add_", "aten::index_add", "aten::scatter_add_", "aten::cumsum"}) {
    EXPECT_TRUE(may_differ_on_rerun(op, /*accelerator=*/true, kOff)) << op;
    EXPECT_FALSE(may_differ_on_rerun(op, /*accelerator=*/false, kOff)) << op;  // CPU kernels: no atomics
    EXPECT_FALSE(may_differ_on_rerun(op, true, kOn)) << op;        // the deterministic kernel
    EXPECT_FALSE(may_differ_on_rerun(op, true, kWarnOnly)) << op;  // has one: warn_only selects it too
  }
}

TEST(OpDeterminism, WritesInNoSetOrderOnTheCpuToo) {
  for (const char* op : {"aten::index_put_", "aten::_index_put_impl_", "aten::index_copy_", "aten::put_"}) {
    EXPECT_TRUE(may_differ_on_rerun(op, false, kOff)) << op;
    EXPECT_TRUE(may_differ_on_rerun(op, true, kOff)) << op;
    EXPECT_FALSE(may_differ_on_rerun(op, false, kOn)) << op;
  }
}

TEST(OpDeterminism, WarnOnlyLeavesTheOpsWithNoDeterministicKernel) {
  // With warn_only=True an op with no deterministic kernel warns and runs its usual one.
  for (const char* op : {"aten::histc", "aten::bincount", "aten::scatter_reduce_", "aten::put_"}) {
    EXPECT_TRUE(may_differ_on_rerun(op, true, kWarnOnly)) << op;
    EXPECT_FALSE(may_differ_on_rerun(op, true, kOn)) << op;  // it raised: there is no re-run
  }
  EXPECT_FALSE(may_differ_on_rerun("aten::histc", false, kWarnOnly));  // deterministic on the CPU
  EXPECT_FALSE(may_differ_on_rerun("aten::index_copy_", false, kWarnOnly));
}

TEST(OpDeterminism, EverythingElseReruns) {
  for (const char* op : {"aten::linear", "aten::convolution", "aten::dropout", "aten::index_select", "aten::gather",
                         "aten::embedding", "aten::nll_loss_forward", "aten::index_add_x", "index_add_", ""}) {
    EXPECT_FALSE(may_differ_on_rerun(op, true, kOff)) << op;
    EXPECT_FALSE(has_nondeterministic_kernel(op)) << op;
  }
  EXPECT_TRUE(has_nondeterministic_kernel("aten::index_copy"));
  EXPECT_TRUE(has_nondeterministic_kernel("aten::scatter_add_"));
}

}  // namespace
}  // namespace memplan
