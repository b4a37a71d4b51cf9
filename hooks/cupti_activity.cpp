#include "hooks/cupti_activity.h"

#include <cupti.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "agent/log.h"

namespace memplan {
namespace {

// Kineto's buffer size: a kernel record is ~200 bytes, so one buffer holds ~20k kernels.
constexpr size_t kBufferBytes = size_t{4} << 20;
constexpr size_t kAlign = 8;  // CUPTI requires 8-byte aligned buffers
// Cap on buffers held by CUPTI at once (256 MiB): past it CUPTI drops records, which we report.
constexpr int kMaxBuffers = 64;
constexpr CUpti_ExternalCorrelationKind kKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;

// One line per distinct failing call; the hot-path calls must not log every time.
bool ok(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* s = nullptr;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown error";
  log_once(std::string("cupti:") + what, LogLevel::Warn,
           std::string("CUPTI ") + what + " failed (" + s + "): CUPTI kernel times unavailable");
  return false;
}

class Cupti final : public ActivityApi {
 public:
  bool enable() override {
    // Again on each enable: torch.profiler may have registered its own callbacks since.
    if (!ok(cuptiActivityRegisterCallbacks(&Cupti::requested, &Cupti::completed), "cuptiActivityRegisterCallbacks"))
      return false;
    if (!ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)"))
      return false;
    if (!ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), "cuptiActivityEnable(EXTERNAL_CORRELATION)")) {
      cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      return false;
    }
    lost_ = false;
    return true;
  }

  void disable() override {
    ok(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable(CONCURRENT_KERNEL)");
    ok(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), "cuptiActivityDisable(EXTERNAL_CORRELATION)");
  }

  // A push/pop is a CUPTI per-thread stack operation (~0.1 µs); nothing of ours allocates.
  void push_external_id(uint64_t id) override {
    ok(cuptiActivityPushExternalCorrelationId(kKind, id), "cuptiActivityPushExternalCorrelationId");
  }
  void pop_external_id() override {
    uint64_t last = 0;
    ok(cuptiActivityPopExternalCorrelationId(kKind, &last), "cuptiActivityPopExternalCorrelationId");
  }

  bool flush(std::vector<KernelRecord>* kernels, std::vector<ExternalCorrelation>* corr) override {
    // FORCED also hands back buffers that are not full; completed() runs before this returns.
    const bool flushed = ok(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    std::lock_guard<std::mutex> lock(mu_);
    if (kernels) kernels->insert(kernels->end(), std::make_move_iterator(kernels_.begin()),
                                 std::make_move_iterator(kernels_.end()));
    if (corr) corr->insert(corr->end(), corr_.begin(), corr_.end());
    kernels_.clear();
    corr_.clear();
    const bool complete = flushed && !lost_.exchange(false);
    return complete;
  }

  static Cupti& get() {
    static Cupti* c = new Cupti();  // never destroyed: CUPTI may call back during exit
    return *c;
  }

 private:
  static void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    Cupti& self = get();
    *buffer = nullptr;
    *size = 0;
    *max_records = 0;  // as many as fit
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      if (static_cast<int>(self.mine_.size()) >= kMaxBuffers) {
        self.lost_ = true;  // CUPTI drops records when given no buffer
        return;
      }
    }
    auto* b = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
    if (!b) {
      self.lost_ = true;
      return;
    }
    std::lock_guard<std::mutex> lock(self.mu_);
    self.mine_.insert(b);
    *buffer = b;
    *size = kBufferBytes;
  }

  static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t /*size*/, size_t valid) {
    Cupti& self = get();
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      if (!buffer || self.mine_.count(buffer) == 0) {
        log_once("cupti:foreign-buffer", LogLevel::Warn,
                 "CUPTI returned a buffer memplan did not allocate (torch.profiler running at the "
                 "same time?): left alone; CUPTI kernel times of this step may be incomplete");
        self.lost_ = true;
        return;
      }
    }
    std::vector<KernelRecord> kernels;
    std::vector<ExternalCorrelation> corr;
    CUpti_Activity* rec = nullptr;
    for (;;) {
      const CUptiResult r = cuptiActivityGetNextRecord(buffer, valid, &rec);
      if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // end of the valid records
      if (!ok(r, "cuptiActivityGetNextRecord")) {
        self.lost_ = true;
        break;
      }
      if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        kernels.push_back(KernelRecord{k->correlationId, k->start, k->end, k->streamId, k->name ? k->name : ""});
      } else if (rec->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
        const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(rec);
        if (e->externalKind == kKind) corr.push_back(ExternalCorrelation{e->correlationId, e->externalId});
      }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped > 0) {
      log_once("cupti:dropped", LogLevel::Warn,
               "CUPTI dropped " + std::to_string(dropped) + " activity records: kernel times incomplete");
      self.lost_ = true;
    }
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      self.mine_.erase(buffer);  // before free: a new buffer may reuse the address at once
      self.kernels_.insert(self.kernels_.end(), std::make_move_iterator(kernels.begin()),
                           std::make_move_iterator(kernels.end()));
      self.corr_.insert(self.corr_.end(), corr.begin(), corr.end());
    }
    std::free(buffer);
  }

  std::mutex mu_;                       // guards everything below but lost_
  std::unordered_set<uint8_t*> mine_;   // buffers handed to CUPTI and not yet returned
  std::vector<KernelRecord> kernels_;
  std::vector<ExternalCorrelation> corr_;
  std::atomic<bool> lost_{false};       // records were dropped or not delivered to us
};

}  // namespace

ActivityApi* cupti_activity() { return &Cupti::get(); }

}  // namespace memplan
