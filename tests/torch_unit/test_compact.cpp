// Compact dropout masks (agent/compact.h): bit-exact round trips of the tensors aten::dropout
// saves on the CPU, and refusal of everything that is not such a mask.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include <cmath>
#include <limits>

#include "agent/compact.h"

using memplan::CompactMask;
using memplan::compact_mask;
using memplan::expand_mask;

namespace {

// The bits, so that -0.0 vs +0.0 and NaN payloads count as different.
at::Tensor bits(const at::Tensor& t) {
  switch (t.element_size()) {
    case 2: return t.view(at::kShort);
    case 8: return t.view(at::kLong);
    default: return t.view(at::kInt);
  }
}

// What aten::dropout saves on the CPU (Dropout.cpp, the non-fused path).
at::Tensor dropout_noise(at::IntArrayRef shape, at::ScalarType dtype, double p) {
  return at::empty(shape, at::TensorOptions().dtype(dtype)).bernoulli_(1 - p).div_(1 - p);
}

}  // namespace

TEST(Compact, DropoutNoiseRoundTripsBitForBit) {
  at::manual_seed(0);
  for (at::ScalarType dt : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    // 300 Ki elements: several parallel chunks.
    for (double p : {0.1, 0.5, 0.9}) {
      const at::Tensor noise = dropout_noise({3, 100, 1024}, dt, p);
      CompactMask c;
      ASSERT_TRUE(compact_mask(noise, &c)) << dt << " p=" << p;
      EXPECT_EQ(c.mask.scalar_type(), at::kByte);
      EXPECT_EQ(c.mask.nbytes(), (noise.numel() + 7) / 8);  // one bit per element
      EXPECT_EQ(c.mask.nbytes(), memplan::compact_mask_bytes(noise.numel()));
      const at::Tensor back = expand_mask(c);
      EXPECT_EQ(back.scalar_type(), dt);
      EXPECT_EQ(back.sizes(), noise.sizes());
      EXPECT_EQ(back.strides(), noise.strides());
      EXPECT_TRUE(at::equal(bits(back), bits(noise))) << dt << " p=" << p;
    }
  }
}

// Element counts that are no multiple of 8 (the last byte is partial) and tiny tensors, across the
// parallel grain (4 Ki bytes = 32 Ki elements per task).
TEST(Compact, AnyElementCountRoundTrips) {
  at::manual_seed(3);
  for (int64_t n : {1, 7, 8, 9, 15, 17, 1000, 32767, 32768, 32769, 65543}) {
    const at::Tensor noise = dropout_noise({n}, at::kFloat, 0.5);
    CompactMask c;
    ASSERT_TRUE(compact_mask(noise, &c)) << n;
    EXPECT_EQ(c.mask.numel(), (n + 7) / 8) << n;
    EXPECT_TRUE(at::equal(bits(expand_mask(c)), bits(noise))) << n;
    if (n < 2) continue;
    // A stray value in the last (partial) byte is seen: the scale first, then another value.
    at::Tensor bad = noise.clone();
    bad[0] = 2.0f;
    bad[n - 1] = 3.0f;
    EXPECT_FALSE(compact_mask(bad, &c)) << n;
  }
}

// torchvision's ViT drops out MultiheadAttention's transposed output: aten::dropout's noise is
// made by empty_like, so it is transposed too. It compacts and comes back with its strides.
TEST(Compact, ATransposedMaskKeepsItsLayout) {
  at::manual_seed(2);
  const at::Tensor noise = at::empty({65, 8, 64}).transpose(0, 1).bernoulli_(0.9).div_(0.9);
  ASSERT_FALSE(noise.is_contiguous());
  CompactMask c;
  ASSERT_TRUE(compact_mask(noise, &c));
  const at::Tensor back = expand_mask(c);
  EXPECT_EQ(back.sizes(), noise.sizes());
  EXPECT_EQ(back.strides(), noise.strides());
  EXPECT_TRUE(at::equal(bits(back), bits(noise)));
  EXPECT_FALSE(memplan::tail_matches(at::randn({8, 65, 64}), c, at::randn({8, 65, 64})));  // not the mask's layout
}

TEST(Compact, AllZeroAndNoZeroTensorsRoundTrip) {
  for (const at::Tensor& t : {at::zeros({7, 5}), at::full({7, 5}, 1.25f), at::full({4}, 1.25f).to(at::kHalf)}) {
    CompactMask c;
    ASSERT_TRUE(compact_mask(t, &c));
    EXPECT_TRUE(at::equal(bits(expand_mask(c)), bits(t)));
  }
}

TEST(Compact, RefusesWhatIsNotAZeroOrOneValueMask) {
  CompactMask c;
  at::Tensor two = at::zeros({200000});
  two[0] = 2.0f;
  two[199999] = 3.0f;  // a second value, in the last parallel chunk
  EXPECT_FALSE(compact_mask(two, &c));
  at::Tensor neg_zero = at::full({16}, 1.25f);
  neg_zero[3] = -0.0f;  // equal to 0.0 as a float, not as bits
  EXPECT_FALSE(compact_mask(neg_zero, &c));
  at::Tensor nan = at::zeros({16});
  nan[1] = std::numeric_limits<float>::quiet_NaN();
  nan[2] = 1.0f;
  EXPECT_FALSE(compact_mask(nan, &c));
  EXPECT_FALSE(compact_mask(at::randn({8, 8}), &c));
  EXPECT_FALSE(compact_mask(at::ones({8, 4}, at::kLong), &c));     // not floating
  EXPECT_FALSE(compact_mask(at::ones({8, 4}).t().narrow(0, 1, 2), &c));  // not dense
  EXPECT_FALSE(compact_mask(at::ones({8, 4}).expand({3, 8, 4}), &c));   // overlapping
  EXPECT_FALSE(compact_mask(at::ones({8, 4}).narrow(0, 1, 2), &c));  // part of a storage
  EXPECT_FALSE(compact_mask(at::ones({0}), &c));
  EXPECT_FALSE(compact_mask(at::Tensor(), &c));
}

TEST(Compact, BitwiseEqualComparesBits) {
  const at::Tensor a = at::tensor({0.0f, 1.5f});
  EXPECT_TRUE(memplan::bitwise_equal(a, a.clone()));
  EXPECT_FALSE(memplan::bitwise_equal(a, at::tensor({-0.0f, 1.5f})));  // == as floats
  const at::Tensor nan = at::full({3}, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(memplan::bitwise_equal(nan, nan.clone()));                // != as floats
  EXPECT_FALSE(memplan::bitwise_equal(a, a.to(at::kDouble)));
  EXPECT_FALSE(memplan::bitwise_equal(a, at::tensor({0.0f, 1.5f, 2.0f})));
}

// aten::dropout(x, p) in training, and (in *noise) the noise it multiplied by: the same draw
// again from the generator's state before it, made as aten::dropout makes it (empty_like x).
static at::Tensor dropout_and_noise(const at::Tensor& x, double p, at::Tensor* noise) {
  at::Generator rng = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(rng.mutex());
    state = rng.get_state();
  }
  at::Tensor out = at::dropout(x, p, /*train=*/true);
  {
    std::lock_guard<std::mutex> lock(rng.mutex());
    rng.set_state(state);
  }
  *noise = at::empty_like(x).bernoulli_(1 - p).div_(1 - p);
  return out;
}

// The dropout tail: input x mask is what aten::dropout returned, checked chunk by chunk.
TEST(Compact, TailMatchesWhatDropoutReturned) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({3, 100, 200});  // several 4 Ki chunks, the last one partial
  at::Tensor noise;
  const at::Tensor out = dropout_and_noise(x, 0.3, &noise);
  CompactMask c;
  ASSERT_TRUE(compact_mask(noise, &c));
  EXPECT_TRUE(memplan::tail_matches(x, c, out));
  at::Tensor wrong = out.clone();
  wrong.view({-1})[x.numel() - 1] += 1;  // the last chunk
  EXPECT_FALSE(memplan::tail_matches(x, c, wrong));
  EXPECT_FALSE(memplan::tail_matches(x.transpose(1, 2).contiguous().transpose(1, 2), c, out));  // layout
}


// The same in a dense layout that is not contiguous: a channels-last CNN's dropout (its noise is
// empty_like, channels-last too), or ViT's transposed one. Each of input, noise and output is read
// in memory order; input x mask then ran as the re-run's tail, not a dropout with the RNG put back.
TEST(Compact, TailMatchesInAnyDenseLayoutItsMaskHas) {
  at::manual_seed(3);
  const std::vector<at::Tensor> inputs = {
      at::randn({4, 16, 9, 11}).contiguous(at::MemoryFormat::ChannelsLast),
      at::randn({65, 8, 64}).transpose(0, 1)};
  for (const at::Tensor& x : inputs) {
    ASSERT_FALSE(x.is_contiguous());
    at::Tensor noise;
    const at::Tensor out = dropout_and_noise(x, 0.2, &noise);
    ASSERT_EQ(noise.strides(), x.strides());
    ASSERT_EQ(out.strides(), x.strides());
    CompactMask c;
    ASSERT_TRUE(compact_mask(noise, &c));
    EXPECT_TRUE(memplan::tail_fits(x, c));
    EXPECT_TRUE(memplan::tail_matches(x, c, out));
    EXPECT_TRUE(at::equal(bits(at::mul(x, expand_mask(c))), bits(out)));  // what the re-run's tail computes
    at::Tensor wrong = out.clone();
    wrong.as_strided({wrong.numel()}, {1}).select(0, 5) += 1;
    EXPECT_FALSE(memplan::tail_matches(x, c, wrong));
    EXPECT_FALSE(memplan::tail_fits(x.contiguous(), c));  // another layout than the mask's
    EXPECT_FALSE(memplan::tail_matches(x.contiguous(), c, out.contiguous()));
  }
}
