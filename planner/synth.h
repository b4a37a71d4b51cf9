// Synthetic profiles for tests, golden files and the benchmark: valid Profile JSON that
// profile_from_json accepts, with a memory timeline computed the way autograd behaves (saved
// values live until their last unpacking node, others until their last forward use).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/profile.h"

namespace memplan::planner {

// Transformer-like chain: embedding, `layers` x (LayerNorm, attention, add, LayerNorm, MLP, add),
// final LayerNorm, logits, cross-entropy. About 13 ops per layer.
Profile synth_transformer(int layers, int64_t tokens = 512, int64_t hidden = 256, int64_t seq = 128);

// ResNet-like chain: stem, `blocks` basic blocks with skip connections in four stages (the first
// block of stages 2-4 downsamples through a 1x1 conv), pooling, linear, loss. ~7.5 ops per block.
Profile synth_resnet(int blocks, int64_t pixels = 4096, int64_t channels = 64);

// A small builder the generators use (also handy in tests for hand-made profiles).
class SynthBuilder {
 public:
  SynthBuilder();
  int64_t param(int64_t bytes);
  int64_t input(int64_t bytes);
  struct Out {
    int64_t bytes = 0;         // a new value of this size ...
    int64_t view_of = -1;      // ... or a view of this existing value (bytes ignored)
    int64_t written = -1;      // ... or this input, written in place (relu_: same shape, Op::writes)
  };
  // Adds a forward op; returns its output values. `saved` lists values (inputs or outputs) its
  // backward node will unpack. Every op gets a backward node (in reverse order) unless no_grad.
  std::vector<int64_t> op(const std::string& name, const std::vector<int64_t>& in,
                          const std::vector<Out>& out, const std::vector<int64_t>& saved,
                          double time_us, int64_t workspace = 0, bool random = false);
  std::vector<int64_t> op_saving_outputs(const std::string& name, const std::vector<int64_t>& in,
                                         const std::vector<Out>& out, const std::vector<int64_t>& saved_in,
                                         const std::vector<int>& saved_out, double time_us,
                                         int64_t workspace = 0, bool random = false);
  void hold_outside(int64_t v);
  Profile finish();  // backward nodes, timeline, hash

 private:
  Profile p_;
  std::vector<std::vector<int64_t>> saved_;  // per forward op
  std::vector<int64_t> shape_of(int64_t v) const;
};

}  // namespace memplan::planner
