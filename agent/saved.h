// The handle autograd keeps instead of a saved tensor while the default saved-tensor hooks are
// ours. It holds a tensor_data() alias (same storage and version counter, no autograd meta) so
// there is no Node -> SavedVariable -> handle -> tensor -> grad_fn cycle (design.md 3b.3).
// Replay may drop that alias (evict) and put a rebuilt tensor back before backward reads it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "agent/compact.h"

namespace memplan {

// Where a tensor of the current step can be rebuilt from.
struct TensorSource {
  enum class Kind : uint8_t {
    None,      // unknown: never evicted
    Slot,      // output `index` of forward op `op` (then viewed, if `view`)
    Internal,  // the `index`-th tensor op `op` packed, produced inside it (layer_norm's rstd)
    External,  // existed before the step or made by an unrecorded op: held as is
  };
  Kind kind = Kind::None;
  int64_t op = -1;
  int64_t index = -1;
  bool view = false;  // as_strided(sizes, strides, offset) over the slot's storage
  c10::SmallVector<int64_t, 6> sizes, strides;  // inline up to rank 6: no allocation per view
  int64_t offset = 0;
  at::Tensor external;
  uint32_t external_version = 0;  // External: its version when captured (a re-run needs that value)
};

struct SavedState {
  at::Tensor tensor;                              // empty while evicted
  int64_t value = -1;                             // value id in the step record, -1 if none
  int64_t step = -1;                              // step whose forward saved it
  int64_t op = -1;                                // forward op during which it was packed
  int64_t ordinal = -1;                           // its rank among that op's packs
  uint32_t version = 0;                           // version at pack: the in-place check
  c10::VariableVersion counter{c10::VariableVersion::DISABLED};  // the live tensor's counter
  c10::weak_intrusive_ptr<torch::autograd::Node> grad_fn{c10::intrusive_ptr<torch::autograd::Node>()};
  uint32_t output_nr = 0;
  TensorSource source;
  bool evicted = false;
  bool compact = false;  // evicted into `mask` (a dropout mask, compact.h): expanded at unpack
  CompactMask mask;
  // Kept when evicting, for autograd's in-place error message.
  c10::SmallVector<int64_t, 6> meta_sizes;
  at::ScalarType meta_dtype = at::kFloat;
  bool meta_cuda = false;
};

// What Python holds: a shared pointer, so the replay engine can reach the state of handles that
// autograd still owns (it keeps weak pointers) without keeping them alive.
struct Saved {
  std::shared_ptr<SavedState> s;
};

}  // namespace memplan
