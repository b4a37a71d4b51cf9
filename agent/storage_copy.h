// A copy of a tensor together with the rest of its storage.
//
// A rebuild re-runs an in-place op on a copy of its argument when the real one must not be
// written (Replayer::run_op). Where that argument is a slice of a storage the step made
// (`m[:, :k] = False`), what the op writes is later read through the whole storage (`m`), which
// the rebuild re-views from the slice's (Replayer::source_of). A plain clone is the slice alone,
// packed: no whole to re-view. This copies the storage and views the copy as the slice was.
#pragma once

#include <ATen/core/Tensor.h>

namespace memplan {

// A tensor laid out as `t` (sizes, strides, storage offset, dtype) within a new storage holding a
// copy of all of `t`'s storage; not requiring grad. Undefined where a plain clone is that already
// (`t` covers its storage, densely), or where `t` is no strided tensor with a storage.
// Cost: a copy of the storage.
at::Tensor copy_with_storage(const at::Tensor& t);

}  // namespace memplan
