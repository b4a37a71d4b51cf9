// Did an op draw random numbers? Seen from the default generators' state around the op.
//
// The recorder knows random ops by their schema (a Generator? argument, a dropout probability);
// an op that draws through the default generator without saying so (a custom op, a fused
// attention kernel with dropout we did not list) would be re-run with other random numbers, so
// while profiling every op that the schema calls deterministic is watched: the CPU generator's
// Mersenne Twister state (position and words) and, for an op on a CUDA tensor, that device's
// Philox offset, before and after. An op that changed either is random from then on.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>

#include <array>
#include <cstdint>
#include <optional>

namespace memplan {

class RngWatch {
 public:
  // Snapshot before the op runs. Cost: one copy of the CPU engine (~2.5 KB) under its mutex, and
  // one virtual call per CUDA op; only in fully recorded (warm-up) steps.
  void before(c10::ArrayRef<c10::IValue> inputs);
  // After the op: did any watched generator move since before()?
  bool drew();

 private:
  struct CpuMark {
    uint64_t seed = 0;
    int left = 0;
    uint32_t next = 0;
    std::array<uint32_t, 624> words{};
    std::optional<float> normal_f;
    std::optional<double> normal_d;
    bool operator==(const CpuMark& o) const {
      return seed == o.seed && left == o.left && next == o.next && words == o.words && normal_f == o.normal_f &&
             normal_d == o.normal_d;
    }
  };
  static CpuMark cpu_mark();
  CpuMark cpu_;
  std::optional<at::Generator> cuda_;  // the op's CUDA device generator, if it has a CUDA tensor
  uint64_t cuda_offset_ = 0;
};

}  // namespace memplan
