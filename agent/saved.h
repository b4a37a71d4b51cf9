// The handle autograd keeps instead of a saved tensor while the default saved-tensor hooks are
// ours. It holds a tensor_data() alias (same storage and version counter, no autograd meta) so
// there is no Node -> SavedVariable -> handle -> tensor -> grad_fn cycle (design.md 3b.3).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>

namespace memplan {

struct Saved {
  at::Tensor tensor;                               // empty while evicted
  int64_t value = -1;                              // value id in the step record, -1 if none
  int64_t step = -1;                               // step whose forward saved it
  uint32_t version = 0;                            // version at pack: the in-place check
  c10::weak_intrusive_ptr<torch::autograd::Node> grad_fn{c10::intrusive_ptr<torch::autograd::Node>()};  // for the error message
  uint32_t output_nr = 0;
};

}  // namespace memplan
