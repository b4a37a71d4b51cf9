// KernelChoice (agent/kernel_choice.h): a re-run takes the kernels its forward op took, and the
// script's choice is back after it.
#include <gtest/gtest.h>

#include <ATen/Context.h>

#include "agent/kernel_choice.h"

namespace memplan {
namespace {

TEST(KernelChoice, AScopeRunsUnderTheRecordedChoiceAndPutsTheScriptsBack) {
  at::Context& c = at::globalContext();
  const KernelChoice script = KernelChoice::now();
  // As under sdpa_kernel(SDPBackend.MATH) and cudnn.flags(enabled=False) in the forward.
  c.setSDPUseFlash(false);
  c.setSDPUseMemEfficient(false);
  c.setSDPUseCuDNN(false);
  c.setUserEnabledCuDNN(false);
  c.setDeterministicCuDNN(!c.deterministicCuDNN());
  const KernelChoice forward = KernelChoice::now();
  EXPECT_NE(forward, script);
  script.apply();  // the forward's scope ended
  EXPECT_EQ(KernelChoice::now(), script);
  {
    KernelChoiceScope rerun(forward);
    EXPECT_FALSE(c.userEnabledFlashSDP());
    EXPECT_FALSE(c.userEnabledMemEfficientSDP());
    EXPECT_TRUE(c.userEnabledMathSDP());
    EXPECT_FALSE(c.userEnabledCuDNN());
    EXPECT_NE(c.deterministicCuDNN(), script.cudnn_deterministic);
    EXPECT_EQ(KernelChoice::now(), forward);
  }
  EXPECT_EQ(KernelChoice::now(), script);
  {
    KernelChoiceScope same(script);  // the common case: nothing to change
    EXPECT_EQ(KernelChoice::now(), script);
  }
  EXPECT_EQ(KernelChoice::now(), script);
}

TEST(KernelChoice, ThePriorityOrderIsPartOfTheChoice) {
  at::Context& c = at::globalContext();
  const KernelChoice script = KernelChoice::now();
  std::vector<int64_t> math_first;
  math_first.push_back(static_cast<int64_t>(at::SDPBackend::math));
  for (at::SDPBackend b : script.sdp_order)
    if (b != at::SDPBackend::math) math_first.push_back(static_cast<int64_t>(b));
  c.setSDPPriorityOrder(math_first);
  const KernelChoice forward = KernelChoice::now();
  EXPECT_NE(forward, script);
  script.apply();
  {
    KernelChoiceScope rerun(forward);
    EXPECT_EQ(c.sDPPriorityOrder()[0], at::SDPBackend::math);
  }
  EXPECT_EQ(KernelChoice::now(), script);
}

}  // namespace
}  // namespace memplan
