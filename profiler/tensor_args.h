// The tensors of an op argument or result, in order: one traversal for everyone who walks a
// RecordFunction's inputs or outputs (the recorder's Op records and light hashes, the replayer's
// write guard), so they all see the same tensors in the same order.
#pragma once

#include <ATen/core/ivalue.h>

namespace memplan {

// Calls f on each defined tensor of `iv`: a tensor, or the tensors of a list (a tensor list, or a
// list of optional tensors). Cost: no allocation.
template <typename F>
void for_each_tensor(const c10::IValue& iv, F f) {
  if (iv.isTensor()) {
    if (iv.toTensor().defined()) f(iv.toTensor());
  } else if (iv.isList()) {
    for (const c10::IValue& e : iv.toListRef()) {
      if (e.isTensor() && e.toTensor().defined()) f(e.toTensor());
    }
  }
}

}  // namespace memplan
