// Identity of a step's op sequence: FNV-1a over each forward op's name, overload, input shapes
// and dtypes, and whether it ran on a side stream. The same running hash is fed op by op during
// replay to catch divergence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/profile.h"

namespace memplan {

class OpHasher {
 public:
  void add(const char* s) {
    for (; *s; ++s) byte(static_cast<uint8_t>(*s));
    byte(0xff);
  }
  void add(int64_t x) {
    for (int i = 0; i < 8; ++i) byte(static_cast<uint8_t>(x >> (8 * i)));
  }
  uint64_t value() const { return h_; }
  std::string hex() const;
  // One op: name, overload, then each input's dtype and shape, then add_side_stream if it ran on one.
  void add_op(const Op& op);
  // The op ran on a side stream (Op::side_stream; nothing is added for the default stream, so
  // the hashes of steps without side streams are what they were). In the structure too: a call
  // that moved to or from a side stream is another op, never the same op at other sizes.
  void add_side_stream() { add("side_stream"); }
  // One input of an op, as add_op feeds it (for hashing without building an Op).
  void add_input(const char* dtype, const int64_t* shape, size_t ndim) {
    add_input_structure(dtype, ndim);
    for (size_t i = 0; i < ndim; ++i) add(shape[i]);
  }
  // The op's structure: the same without the sizes (dtype and rank of each input). Two calls
  // alike but for sizes that follow from data (after a boolean mask) share it.
  void add_op_structure(const Op& op);
  void add_input_structure(const char* dtype, size_t ndim) {
    add(dtype);
    add(static_cast<int64_t>(ndim));
  }

 private:
  void byte(uint8_t b) {
    h_ ^= b;
    h_ *= 0x100000001b3ull;
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

std::string hash_forward_ops(const std::vector<Op>& ops);

// One op's identity hash (OpHasher::add_op) and structure hash (add_op_structure).
uint64_t identity_of(const Op& op);
uint64_t structure_of(const Op& op);

// Whether op's output shape follows from its inputs' values, not only their shapes: a boolean
// mask index (`x[mask]`), nonzero, masked_select, unique, repeat_interleave by a tensor,
// bincount. The ops after one may see other sizes from step to step with nothing else changed.
bool data_dependent_shape(const Op& op);

// A step's signature (Profile::signature): each kept op's identity hash (OpHasher::add_op, as the
// replay's divergence check uses) folded in order, so a light record, which keeps no ops, gets
// the same value as a full one. Start from kSignatureSeed.
constexpr uint64_t kSignatureSeed = 0x6d656d706c616e31ull;
inline uint64_t fold_signature(uint64_t sig, uint64_t op_hash) {
  return (sig ^ op_hash) * 0x9e3779b97f4a7c15ull + (sig >> 29);
}
uint64_t signature_of(const std::vector<Op>& ops);
uint64_t structure_signature_of(const std::vector<Op>& ops);

}  // namespace memplan
