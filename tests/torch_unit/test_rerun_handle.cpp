// rng_device: which device's generator a random op's re-run must restore. On a GPU a dropout's
// input is a CUDA tensor made in the step; the CUDA generator is the one that draws its mask.
// No GPU here: a meta tensor stands for "a tensor not on the CPU", and a CUDA Device value
// needs no device to exist.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "profiler/rerun_handle.h"

using memplan::rng_device;

namespace {
std::vector<c10::IValue> args(std::initializer_list<c10::IValue> l) { return std::vector<c10::IValue>(l); }
}  // namespace

TEST(RngDevice, CpuTensorsAndScalarsDrawOnTheCpu) {
  EXPECT_EQ(rng_device(args({at::ones({2}), 0.5, true})), c10::Device(c10::kCPU));
  EXPECT_EQ(rng_device(args({})), c10::Device(c10::kCPU));
}

TEST(RngDevice, ATensorNotOnTheCpuDecidesWhereverItIs) {
  const at::Tensor meta = at::empty({2}, at::TensorOptions().device(c10::kMeta));
  // A dropout: its one tensor input (made in the step, so no "external" the recipe holds).
  EXPECT_EQ(rng_device(args({meta, 0.1, true})), c10::Device(c10::kMeta));
  // After a CPU tensor (a 0-dim scalar tensor beside a device one).
  EXPECT_EQ(rng_device(args({at::ones({}), meta})), c10::Device(c10::kMeta));
  // Inside a tensor list.
  EXPECT_EQ(rng_device(args({c10::IValue(std::vector<at::Tensor>{at::ones({1}), meta})})), c10::Device(c10::kMeta));
}

TEST(RngDevice, ADeviceArgumentDecidesWhenNoTensorDoes) {
  // randn(size, dtype, layout, device, pin_memory): the device argument.
  const c10::Device cuda1("cuda:1");
  EXPECT_EQ(rng_device(args({c10::IValue(std::vector<int64_t>{2, 3}), c10::IValue(), c10::IValue(), cuda1, false})),
            cuda1);
  EXPECT_EQ(rng_device(args({c10::IValue(std::vector<int64_t>{2}), c10::Device(c10::kCPU)})), c10::Device(c10::kCPU));
}
