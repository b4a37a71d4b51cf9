#include "profiler/op_hash.h"

#include <fmt/format.h>

#include <set>

namespace memplan {

std::string OpHasher::hex() const { return fmt::format("{:016x}", h_); }

void OpHasher::add_op(const Op& op) {
  add(op.name.c_str());
  add(op.overload.c_str());
  for (const TensorRef& t : op.inputs) add_input(t.dtype.c_str(), t.shape.data(), t.shape.size());
  if (op.side_stream) add_side_stream();
}

void OpHasher::add_op_structure(const Op& op) {
  add(op.name.c_str());
  add(op.overload.c_str());
  for (const TensorRef& t : op.inputs) add_input_structure(t.dtype.c_str(), t.shape.size());
  if (op.side_stream) add_side_stream();  // no drift: another stream is another op
}

bool data_dependent_shape(const Op& op) {
  static const std::set<std::string> kAlways = {
      "aten::nonzero",         "aten::nonzero_numpy", "aten::argwhere",         "aten::masked_select",
      "aten::unique_dim",      "aten::_unique",       "aten::_unique2",         "aten::unique_consecutive",
      "aten::unique_dim_consecutive", "aten::bincount"};
  if (kAlways.count(op.name)) return true;
  if (op.name == "aten::where") return op.inputs.size() == 1;  // where(cond): nonzero
  if (op.name == "aten::repeat_interleave") return op.overload.find("Tensor") != std::string::npos;
  if (op.name == "aten::index") {  // a boolean mask among the indices
    for (size_t i = 1; i < op.inputs.size(); ++i) {
      if (op.inputs[i].dtype == "Bool" || op.inputs[i].dtype == "Byte") return true;
    }
  }
  return false;
}

uint64_t identity_of(const Op& op) {
  OpHasher h;
  h.add_op(op);
  return h.value();
}

uint64_t structure_of(const Op& op) {
  OpHasher h;
  h.add_op_structure(op);
  return h.value();
}

namespace {

// Each op's `hash` (identity_of or structure_of), folded in order.
uint64_t fold_ops(const std::vector<Op>& ops, uint64_t (*hash)(const Op&)) {
  uint64_t sig = kSignatureSeed;
  for (const Op& op : ops) sig = fold_signature(sig, hash(op));
  return sig;
}

}  // namespace

uint64_t signature_of(const std::vector<Op>& ops) { return fold_ops(ops, identity_of); }

uint64_t structure_signature_of(const std::vector<Op>& ops) { return fold_ops(ops, structure_of); }

std::string hash_forward_ops(const std::vector<Op>& ops) {
  OpHasher h;
  for (const Op& op : ops) h.add_op(op);
  return h.hex();
}

}  // namespace memplan
