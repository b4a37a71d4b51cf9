// RngWatch (profiler/rng_watch.h): an op that draws from the default CPU generator moves its
// state, one that does not leaves it alone; a seed reset counts as a move too.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <vector>

#include "profiler/rng_watch.h"

namespace {

std::vector<c10::IValue> args_of(const at::Tensor& t) { return {c10::IValue(t)}; }

TEST(RngWatch, DeterministicOpsDrawNothing) {
  at::Tensor x = at::ones({64});
  memplan::RngWatch w;
  const auto args = args_of(x);
  w.before(args);
  at::Tensor y = at::add(x, x).mul(3).tanh();
  EXPECT_FALSE(w.drew());
}

TEST(RngWatch, DrawsAreSeen) {
  at::Tensor x = at::ones({64});
  memplan::RngWatch w;
  const auto args = args_of(x);
  w.before(args);
  at::Tensor r = at::rand_like(x);
  EXPECT_TRUE(w.drew());
  w.before(args);
  at::Tensor b = at::bernoulli(x, 0.5);
  EXPECT_TRUE(w.drew());
  // One normal sample: the generator caches the Box-Muller pair's second value.
  w.before(args);
  at::Tensor n = at::randn({1});
  EXPECT_TRUE(w.drew());
}

TEST(RngWatch, AFullTurnOfTheTwisterIsStillADraw) {
  // 624 32-bit draws bring the position back where it was; the words differ.
  memplan::RngWatch w;
  const std::vector<c10::IValue> none;
  w.before(none);
  at::Tensor r = at::randint(0, 1 << 20, {624}, at::TensorOptions().dtype(at::kInt));
  EXPECT_TRUE(w.drew());
}

}  // namespace
