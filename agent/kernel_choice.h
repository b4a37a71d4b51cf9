// The process-wide settings that choose which kernels a composite op runs: the scaled-dot-product
// attention backends enabled and their priority order (torch.nn.attention.sdpa_kernel), math
// SDPA's reduced-precision reduction, cuDNN and oneDNN on or off, deterministic, cuDNN's
// benchmark mode (torch.backends.cudnn.flags(), torch.backends.mkldnn.flags()). Not the float32
// precision settings (TF32): their getters resolve defaults a setter would then pin.
//
// A script may set them around its forward only (`with sdpa_kernel(SDPBackend.MATH):`). A re-run
// in backward, outside that scope, then took another kernel: on the CPU, SDPA's flash kernel
// instead of the math decomposition, which saves other tensors, and backward raised "batch1 must
// be a 3D tensor". A recipe keeps the choice its op ran under and the re-run runs under it.
//
// These are globals, not thread-local: while a re-run runs under another choice, another thread's
// op would see it too. Re-runs run on the training thread, in its forward or backward.
#pragma once

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>

#include <array>
#include <cstdint>
#include <tuple>
#include <vector>

namespace memplan {

struct KernelChoice {
  std::array<at::SDPBackend, at::num_sdp_backends> sdp_order{};
  bool flash = true, fa3 = false, mem_efficient = true, math = true, cudnn_sdp = true, overrideable = true;
  bool math_reduced_precision = false;
  bool cudnn = true, mkldnn = true;
  bool cudnn_benchmark = false, cudnn_deterministic = false, mkldnn_deterministic = false;

  // Cost: fifteen reads of the global context (no lock), once per op that gets a recipe.
  static KernelChoice now() {
    at::Context& c = at::globalContext();  // sDPPriorityOrder is not const
    KernelChoice k;
    k.sdp_order = c.sDPPriorityOrder();
    k.flash = c.userEnabledFlashSDP();
    k.fa3 = c.userEnabledFA3SDP();
    k.mem_efficient = c.userEnabledMemEfficientSDP();
    k.math = c.userEnabledMathSDP();
    k.cudnn_sdp = c.userEnabledCuDNNSDP();
    k.overrideable = c.userEnabledOverrideableSDP();
    k.math_reduced_precision = c.allowFP16BF16ReductionMathSDP();
    k.cudnn = c.userEnabledCuDNN();
    k.mkldnn = c.userEnabledMkldnn();
    k.cudnn_benchmark = c.benchmarkCuDNN();
    k.cudnn_deterministic = c.deterministicCuDNN();
    k.mkldnn_deterministic = c.deterministicMkldnn();
    return k;
  }

  void apply() const {
    at::Context& c = at::globalContext();
    std::vector<int64_t> order;
    for (at::SDPBackend b : sdp_order) order.push_back(static_cast<int64_t>(b));
    c.setSDPPriorityOrder(order);
    c.setSDPUseFlash(flash);
    c.setSDPUseFA3(fa3);
    c.setSDPUseMemEfficient(mem_efficient);
    c.setSDPUseMath(math);
    c.setSDPUseCuDNN(cudnn_sdp);
    c.setSDPUseOverrideable(overrideable);
    c.setAllowFP16BF16ReductionMathSDP(math_reduced_precision);
    c.setUserEnabledCuDNN(cudnn);
    c.setUserEnabledMkldnn(mkldnn);
    c.setBenchmarkCuDNN(cudnn_benchmark);
    c.setDeterministicCuDNN(cudnn_deterministic);
    c.setDeterministicMkldnn(mkldnn_deterministic);
  }

  // Every field, for the comparisons: one list to extend with a new setting.
  auto fields() const {
    return std::tie(sdp_order, flash, fa3, mem_efficient, math, cudnn_sdp, overrideable, math_reduced_precision, cudnn,
                    mkldnn, cudnn_benchmark, cudnn_deterministic, mkldnn_deterministic);
  }
  bool operator==(const KernelChoice& o) const { return fields() == o.fields(); }
  bool operator!=(const KernelChoice& o) const { return !(*this == o); }
};

// For its scope, `recorded` is the choice; the one before it is put back at the end. Cost: now()
// and a compare when they are the same (the common case); else two apply().
class KernelChoiceScope {
 public:
  explicit KernelChoiceScope(const KernelChoice& recorded) : before_(KernelChoice::now()) {
    changed_ = before_ != recorded;
    if (changed_) recorded.apply();
  }
  ~KernelChoiceScope() {
    if (changed_) before_.apply();
  }
  KernelChoiceScope(const KernelChoiceScope&) = delete;
  KernelChoiceScope& operator=(const KernelChoiceScope&) = delete;

 private:
  KernelChoice before_;
  bool changed_ = false;
};

}  // namespace memplan
