#include "agent/storage_copy.h"

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>

namespace memplan {

at::Tensor copy_with_storage(const at::Tensor& t) {
  if (!t.defined() || t.layout() != at::kStrided || !t.has_storage()) return at::Tensor();
  const int64_t item = static_cast<int64_t>(t.element_size());
  const int64_t elements = item > 0 ? static_cast<int64_t>(t.storage().nbytes()) / item : 0;
  if (elements == 0 || (t.storage_offset() == 0 && t.numel() == elements && t.is_non_overlapping_and_dense()))
    return at::Tensor();
  c10::NoGradGuard no_grad;
  at::Tensor all = at::empty({0}, t.options().requires_grad(false));
  all.set_(t.storage(), 0, {elements}, {1});
  return all.clone().as_strided(t.sizes(), t.strides(), t.storage_offset());
}

}  // namespace memplan
