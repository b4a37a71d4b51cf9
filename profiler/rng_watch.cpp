#include "profiler/rng_watch.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace memplan {

RngWatch::CpuMark RngWatch::cpu_mark() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  const auto data = impl->engine().data();
  CpuMark m;
  m.seed = data.seed_;
  m.left = data.left_;
  m.next = data.next_;
  static_assert(sizeof(m.words) == sizeof(data.state_));
  std::copy(data.state_.begin(), data.state_.end(), m.words.begin());
  m.normal_f = impl->next_float_normal_sample();
  m.normal_d = impl->next_double_normal_sample();
  return m;
}

void RngWatch::before(c10::ArrayRef<c10::IValue> inputs) {
  cpu_ = cpu_mark();
  cuda_.reset();
  for (const c10::IValue& iv : inputs) {
    if (!iv.isTensor() || !iv.toTensor().defined() || !iv.toTensor().is_cuda()) continue;
    // The tensor lives on CUDA, so CUDA is initialised: asking for the generator starts nothing.
    cuda_ = at::globalContext().defaultGenerator(iv.toTensor().device());
    std::lock_guard<std::mutex> lock(cuda_->mutex());
    cuda_offset_ = cuda_->get_offset();
    break;
  }
}

bool RngWatch::drew() {
  if (!(cpu_mark() == cpu_)) return true;
  if (cuda_) {
    std::lock_guard<std::mutex> lock(cuda_->mutex());
    if (cuda_->get_offset() != cuda_offset_) return true;
  }
  return false;
}

}  // namespace memplan
