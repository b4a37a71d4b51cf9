// Lossless compact form of a dropout mask (docs/compaction.md). aten::dropout on the CPU saves
// `noise = bernoulli_(1-p).div_(1-p)` for backward: a float tensor whose elements are all +0 or
// one value. Kept as one bit per element plus that value's bit pattern, it takes a 32nd of the
// memory (a 64th for double, a 16th for half) and expands back bit for bit.
//
// Both directions work on raw bits (the tensor's storage read as a same-width integer type), so
// "equal" is bitwise: -0.0, NaN payloads and denormals are reproduced exactly or refused. Every
// compaction checks its input in the same pass: a tensor that is not such a mask stays as it was.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "planner/plan.h"

namespace memplan {

struct CompactMask {
  // uint8, (numel + 7) / 8 bytes: bit i % 8 of byte i / 8 says whether the i-th element in memory
  // order is non-zero (the tensor covered its storage, densely, so memory order is storage order).
  at::Tensor mask;
  std::vector<int64_t> sizes, strides;  // the tensor's layout, given back by expand_mask
  int64_t numel = 0;
  int64_t bits = 0;     // the bit pattern of every non-zero element
  at::ScalarType dtype = at::kFloat;
};

// The bytes compact_mask keeps for a tensor of `numel` elements: planner::compact_mask_bytes, the
// size the planner counts.
using planner::compact_mask_bytes;

// The compact form of `t`, or false when `t` does not qualify: not a dense (non-overlapping, in
// any dimension order) CPU tensor of a floating type covering its whole storage, or elements other
// than +0 and one value.
// Cost: one pass (read the tensor, write the bits), split over the intra-op threads; ~38 us for
// 128 Ki floats on one core of the 2-core CI CPU (the byte masks before: ~31 us), where re-running
// that dropout costs 0.7-1.5 ms of RNG.
bool compact_mask(const at::Tensor& t, CompactMask* out);

// Same shape, dtype and bits (so -0.0 != 0.0 and a NaN equals the same NaN). One pass.
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b);

// Whether `input * expand_mask(mask)` equals `out` bit for bit, checked in chunks of 4 Ki elements
// so that it holds two chunks, not two tensors, at a time. False unless all three have the same
// shape, dtype and strides, dense in one memory order (contiguous, channels-last, transposed: the
// product's layout then is `out`'s, and element i in memory order of each is the same element).
bool tail_matches(const at::Tensor& input, const CompactMask& mask, const at::Tensor& out);

// Whether `input` can take the dropout tail of `mask`: dense, with the mask's shape, strides and
// dtype (so `input * expand_mask(mask)` has that layout, as the dropout's output had).
bool tail_fits(const at::Tensor& input, const CompactMask& mask);

// The tensor back, bit-identical to the one compact_mask was given: one pass, ~14 us for 128 Ki
// floats on one core (byte masks: ~10 us).
at::Tensor expand_mask(const CompactMask& c);

}  // namespace memplan
