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

// rerun_handle on real ops: an op whose re-run may give other bits (op_determinism.h) gets no
// handle unless deterministic algorithms are on. index_copy_ is nondeterministic on the CPU too;
// index_add_ only off the CPU (a meta tensor stands for a GPU one).
namespace {

struct Seen {
  std::string name;
  std::vector<bool> handled;  // rerun_handle(fn).has_value(), per call of `name`
};
thread_local Seen* tl_seen = nullptr;

std::unique_ptr<at::ObserverContext> see(const at::RecordFunction& fn) {
  if (tl_seen && tl_seen->name == fn.name()) tl_seen->handled.push_back(memplan::rerun_handle(fn).has_value());
  return nullptr;
}

// Runs `f` with deterministic algorithms set to (on, warn_only); what rerun_handle said of `name`.
template <typename F>
std::vector<bool> handles_of(const char* name, bool on, bool warn_only, F f) {
  auto& ctx = at::globalContext();
  const bool was_on = ctx.deterministicAlgorithms(), was_warn = ctx.deterministicAlgorithmsWarnOnly();
  ctx.setDeterministicAlgorithms(on, warn_only);
  Seen seen{name, {}};
  tl_seen = &seen;
  const auto h = at::addThreadLocalCallback(at::RecordFunctionCallback(&see).needsInputs(true));
  f();
  at::removeCallback(h);
  tl_seen = nullptr;
  ctx.setDeterministicAlgorithms(was_on, was_warn);
  return seen.handled;
}

}  // namespace

TEST(RerunHandle, ANondeterministicKernelIsNotRerunWithoutTheMode) {
  const auto copy = [] {
    at::Tensor x = at::zeros({4, 3});
    x.index_copy_(0, at::tensor({0, 2}, at::kLong), at::ones({2, 3}));
  };
  EXPECT_EQ(handles_of("aten::index_copy_", /*on=*/false, false, copy), std::vector<bool>{false});
  EXPECT_EQ(handles_of("aten::index_copy_", /*on=*/true, false, copy), std::vector<bool>{true});
  // Ops not on the list are re-run whatever the mode.
  EXPECT_EQ(handles_of("aten::add", false, false, [] { (void)at::add(at::ones({2}), at::ones({2})); }),
            std::vector<bool>{true});
}

TEST(RerunHandle, AtomicsOnlyOffTheCpu) {
  const auto add_on = [](c10::Device d) {
    return [d] {
      const auto opt = at::TensorOptions().device(d);
      at::Tensor x = at::zeros({4, 3}, opt);
      x.index_add_(0, at::zeros({2}, opt.dtype(at::kLong)), at::ones({2, 3}, opt));
    };
  };
  EXPECT_EQ(handles_of("aten::index_add_", false, false, add_on(c10::kCPU)), std::vector<bool>{true});
  EXPECT_EQ(handles_of("aten::index_add_", false, false, add_on(c10::kMeta)), std::vector<bool>{false});
  EXPECT_EQ(handles_of("aten::index_add_", true, false, add_on(c10::kMeta)), std::vector<bool>{true});
  EXPECT_EQ(handles_of("aten::index_add_", true, true, add_on(c10::kMeta)), std::vector<bool>{true});
}

// `x[mask] = v` writes each element once: re-run whatever the mode. Integer indices may repeat.
TEST(RerunHandle, IndexPutThroughABooleanMaskIsRerun) {
  const auto put = [](bool masks) {
    return [masks] {
      at::Tensor x = at::zeros({4});
      const at::Tensor idx = masks ? at::tensor({1, 0, 1, 0}).to(at::kBool) : at::tensor({0, 2, 2}, at::kLong);
      x.index_put_({idx}, at::ones({masks ? 2 : 3}));
    };
  };
  EXPECT_EQ(handles_of("aten::index_put_", false, false, put(true)), std::vector<bool>{true});
  EXPECT_EQ(handles_of("aten::index_put_", false, false, put(false)), std::vector<bool>{false});
  EXPECT_EQ(handles_of("aten::index_put_", true, false, put(false)), std::vector<bool>{true});
}
