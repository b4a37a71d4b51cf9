#include "hooks/device_timer.h"

#include <algorithm>
#include <string>

#include "agent/log.h"

#if MEMPLAN_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include "hooks/cupti_activity.h"
#endif

namespace memplan {

#if MEMPLAN_HAVE_CUDA

namespace {
bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  cudaGetLastError();  // clear the runtime's last error: torch's next check must not see ours
  log_once(std::string("device-timer:") + what, LogLevel::Warn,
           std::string(what) + " failed (" + cudaGetErrorString(e) + "): CUDA-event op times unavailable");
  return false;
}

bool torch_profiler_active() {
  try {
    return torch::profiler::impl::profilerEnabled();
  } catch (...) {
    return false;
  }
}

// The vector (forward or backward) and index an op id maps to, grown with -1 up to it.
double* slot(uint64_t id, std::vector<double>* fwd, std::vector<double>* bwd) {
  std::vector<double>* v = id >= kBackwardOpBase ? bwd : fwd;
  if (!v) return nullptr;
  const uint64_t i = id >= kBackwardOpBase ? id - kBackwardOpBase : id;
  if (i >= v->size()) v->resize(i + 1, -1.0);
  return &(*v)[i];
}
void set(uint64_t id, double t, std::vector<double>* fwd, std::vector<double>* bwd) {
  if (double* p = slot(id, fwd, bwd)) *p = t;
}
// An id timed twice (not expected) gets the sum.
void add(uint64_t id, double t, std::vector<double>* fwd, std::vector<double>* bwd) {
  if (double* p = slot(id, fwd, bwd)) *p = *p < 0 ? t : *p + t;
}
}  // namespace

ActivityApi* default_activity_api() { return cupti_activity(); }

DeviceTimer::DeviceTimer(ActivityApi* tracer, bool events) : tracer_(tracer), want_events_(events) {}

DeviceTimer::~DeviceTimer() {
  for (void* e : pool_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

bool DeviceTimer::begin_step(int device) {
  cupti_ = events_ = false;
  used_ = 0;
  spans_.clear();
  open_.clear();
  seen_.clear();
  device_ = -1;
  const int n = c10::cuda::device_count();
  if (n > 0) {
    int dev = device;
    if (dev < 0 && !cuda_ok(cudaGetDevice(&dev), "cudaGetDevice")) dev = -1;
    device_ = dev < n ? dev : -1;
  }
  events_ = want_events_ && device_ >= 0;
  if (events_ && device_ != pool_device_) {  // events belong to one device
    for (void* e : pool_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    pool_.clear();
    pool_device_ = device_;
  }
  // The real tracer is useless without a device; a fake (tests) is not.
  const bool tracer_usable = tracer_ && (device_ >= 0 || tracer_ != default_activity_api());
  if (tracer_usable) {
    if (torch_profiler_active()) {
      log_once("device-timer:kineto", LogLevel::Info,
               "torch.profiler is active: memplan times ops with CUDA events, not CUPTI");
    } else {
      cupti_ = tracer_->enable();
      if (cupti_) {
        std::vector<KernelRecord> k;  // drop anything left from before the step
        std::vector<ExternalCorrelation> c;
        tracer_->flush(&k, &c);
      }
    }
  }
  if (seen_.capacity() == 0) {  // the first step's growth, reused after
    spans_.reserve(4096);
    open_.reserve(64);
    seen_.reserve(4096);
    pool_.reserve(8192);
  }
  return cupti_ || events_;
}

uint32_t DeviceTimer::take_event() {
  if (used_ < pool_.size()) return used_++;
  // An event belongs to the device current when it is created: the step's device.
  int prev = -1;
  if (!cuda_ok(cudaGetDevice(&prev), "cudaGetDevice")) return kNoEvent;
  if (prev != device_ && !cuda_ok(cudaSetDevice(device_), "cudaSetDevice")) return kNoEvent;
  cudaEvent_t e = nullptr;
  const bool made = cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
  if (prev != device_) cudaSetDevice(prev);
  if (!made) return kNoEvent;
  pool_.push_back(e);
  return used_++;
}

void DeviceTimer::op_begin(uint64_t id) {
  if (!cupti_ && !events_) return;
  seen_.push_back(id);
  Open o{id, kNoSpan, false};
  if (cupti_) {
    tracer_->push_external_id(id);
    o.pushed = true;
  }
  if (events_) {
    const uint32_t s = take_event();
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    if (s != kNoEvent && cuda_ok(cudaEventRecord(static_cast<cudaEvent_t>(pool_[s]), stream), "cudaEventRecord")) {
      spans_.push_back(Span{id, s, kNoEvent});
      o.span = static_cast<uint32_t>(spans_.size() - 1);
    }
  }
  open_.push_back(o);
}

void DeviceTimer::op_end(uint64_t id) {
  // Normally the innermost open op. An id not open (an end whose begin was not timed) is
  // ignored; ops above the match missed their end: closed unmeasured, popping what they pushed,
  // so the CUPTI stack always matches ours.
  auto it = std::find_if(open_.rbegin(), open_.rend(), [&](const Open& o) { return o.id == id; });
  if (it == open_.rend()) return;
  const Open o = *it;
  const size_t keep = static_cast<size_t>(open_.rend() - it) - 1;
  for (size_t i = open_.size(); i-- > keep;) {
    if (open_[i].pushed) tracer_->pop_external_id();
  }
  open_.resize(keep);
  if (o.span == kNoSpan) return;
  const uint32_t e = take_event();
  if (e == kNoEvent) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  if (cuda_ok(cudaEventRecord(static_cast<cudaEvent_t>(pool_[e]), stream), "cudaEventRecord")) spans_[o.span].end = e;
}

bool DeviceTimer::end_step(std::vector<double>* cupti_us, std::vector<double>* event_us,
                           std::vector<double>* bwd_cupti_us, std::vector<double>* bwd_event_us) {
  for (auto* v : {cupti_us, event_us, bwd_cupti_us, bwd_event_us}) {
    if (v) v->clear();
  }
  if (!cupti_ && !events_) return false;
  // CUPTI writes a kernel's record only once it has run; events need their end reached.
  if (device_ >= 0) {  // the step's device, which need not be the current one
    int prev = -1;
    const bool switch_device = cuda_ok(cudaGetDevice(&prev), "cudaGetDevice") && prev != device_;
    if (switch_device) cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (switch_device) cudaSetDevice(prev);
  }
  if (cupti_) finish_cupti(cupti_us, bwd_cupti_us);
  open_.clear();
  if (events_) finish_events(event_us, bwd_event_us);
  const bool measured = (cupti_ || events_) && !seen_.empty();
  cupti_ = events_ = false;
  return measured;
}

void DeviceTimer::finish_cupti(std::vector<double>* fwd, std::vector<double>* bwd) {
  if (!open_.empty()) {
    log_once("device-timer:unbalanced", LogLevel::Warn,
             "ops still open at the end of a timed step: their kernels may be misattributed");
    for (size_t i = open_.size(); i-- > 0;) {
      if (open_[i].pushed) tracer_->pop_external_id();
    }
    open_.clear();
  }
  std::vector<KernelRecord> kernels;
  std::vector<ExternalCorrelation> corr;
  const bool complete = tracer_->flush(&kernels, &corr);
  tracer_->disable();
  if (!complete || torch_profiler_active()) {
    log_once("device-timer:cupti-incomplete", LogLevel::Warn,
             "CUPTI records of a step were incomplete (dropped, or taken by torch.profiler): that step's "
             "CUPTI op times are left out");
    return;
  }
  KernelJoinStats stats;
  const auto us = device_us_by_op(kernels, corr, &stats);
  for (uint64_t id : seen_) {
    auto it = us.find(id);
    set(id, it == us.end() ? 0.0 : it->second, fwd, bwd);  // no kernel: 0, not unmeasured
  }
  debug("CUPTI: {} kernels attributed to ops, {} outside any op, {} duplicates, {} conflicts", stats.kernels,
        stats.unmatched, stats.duplicates, stats.conflicts);
}

void DeviceTimer::finish_events(std::vector<double>* fwd, std::vector<double>* bwd) {
  for (const Span& s : spans_) {
    if (s.end == kNoEvent) continue;
    float ms = 0;
    if (!cuda_ok(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(pool_[s.start]),
                                      static_cast<cudaEvent_t>(pool_[s.end])),
                 "cudaEventElapsedTime"))
      continue;
    add(s.id, static_cast<double>(ms) * 1000.0, fwd, bwd);
  }
}

#else  // no CUDA: a stub

ActivityApi* default_activity_api() { return nullptr; }
DeviceTimer::DeviceTimer(ActivityApi* tracer, bool events) : tracer_(tracer), want_events_(events) {}
DeviceTimer::~DeviceTimer() = default;
bool DeviceTimer::begin_step(int) { return false; }
uint32_t DeviceTimer::take_event() { return kNoEvent; }
void DeviceTimer::op_begin(uint64_t) {}
void DeviceTimer::op_end(uint64_t) {}
bool DeviceTimer::end_step(std::vector<double>* cupti_us, std::vector<double>* event_us,
                           std::vector<double>* bwd_cupti_us, std::vector<double>* bwd_event_us) {
  for (auto* v : {cupti_us, event_us, bwd_cupti_us, bwd_event_us}) {
    if (v) v->clear();
  }
  return false;
}
void DeviceTimer::finish_cupti(std::vector<double>*, std::vector<double>*) {}
void DeviceTimer::finish_events(std::vector<double>*, std::vector<double>*) {}

#endif

}  // namespace memplan
