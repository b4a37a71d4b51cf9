#include "profiler/op_hash.h"

#include <fmt/format.h>

namespace memplan {

std::string OpHasher::hex() const { return fmt::format("{:016x}", h_); }

void OpHasher::add_op(const Op& op) {
  add(op.name.c_str());
  add(op.overload.c_str());
  for (const TensorRef& t : op.inputs) add_input(t.dtype.c_str(), t.shape.data(), t.shape.size());
}

uint64_t signature_of(const std::vector<Op>& ops) {
  uint64_t sig = kSignatureSeed;
  for (const Op& op : ops) {
    OpHasher h;
    h.add_op(op);
    sig = fold_signature(sig, h.value());
  }
  return sig;
}

std::string hash_forward_ops(const std::vector<Op>& ops) {
  OpHasher h;
  for (const Op& op : ops) h.add_op(op);
  return h.hex();
}

}  // namespace memplan
