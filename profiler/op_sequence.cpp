#include "profiler/op_sequence.h"

#include "profiler/op_hash.h"

namespace memplan {

OpSequence::OpSequence(const std::vector<Op>& forward) {
  hashes_.reserve(forward.size());
  structures_.reserve(forward.size());
  for (const Op& op : forward) {
    if (first_data_dependent_ < 0 && data_dependent_shape(op)) {
      first_data_dependent_ = static_cast<int64_t>(hashes_.size());
      first_data_dependent_name_ = op.name;
    }
    hashes_.push_back(identity_of(op));
    structures_.push_back(structure_of(op));
    int64_t n = 0;
    for (const TensorRef& t : op.inputs) {
      int64_t e = 1;
      for (int64_t d : t.shape) e *= d;
      n += e;
    }
    numels_.push_back(n);
  }
}

bool OpSequence::within(const OpSequence& larger) const {
  if (hashes_.empty() || larger.hashes_.empty() || hashes_[0] != larger.hashes_[0]) return false;
  size_t j = 0;
  for (uint64_t h : hashes_) {
    while (j < larger.hashes_.size() && larger.hashes_[j] != h) ++j;
    if (j == larger.hashes_.size()) return false;
    ++j;
  }
  return true;
}

}  // namespace memplan
