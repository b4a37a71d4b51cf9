#include "profiler/nvtx_ranges.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>

#if MEMPLAN_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace memplan {

namespace {

std::atomic<bool> g_enabled{true};

#if MEMPLAN_HAVE_NVTX
// Every range_push of this thread, emitted or not (flag off), so each pop matches its own push:
// bit i of t_emitted says whether the push at depth i reached NVTX. Past 64 levels the bit is
// lost and a pop is emitted iff the flag is on; nothing in memplan nests that deep.
thread_local int t_depth = 0;
thread_local uint64_t t_emitted = 0;

nvtxDomainHandle_t domain() {
  // The first call also makes NVTX3 look for a tool (NVTX_INJECTION64_PATH).
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("memplan");
  return d;
}

nvtxEventAttributes_t attributes(const char* name) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name ? name : "";
  return a;
}

void note_push(bool emitted) {
  if (t_depth < 64) {
    const uint64_t bit = uint64_t{1} << t_depth;
    t_emitted = emitted ? (t_emitted | bit) : (t_emitted & ~bit);
  }
  ++t_depth;
}

bool push(const char* name) {
  const bool on = g_enabled.load(std::memory_order_relaxed);
  if (on) {
    const nvtxEventAttributes_t a = attributes(name);
    nvtxDomainRangePushEx(domain(), &a);
  }
  note_push(on);
  return on;
}

void pop() {
  if (t_depth <= 0) return;  // unbalanced pop: ignore rather than close someone else's range
  --t_depth;
  const bool emitted = t_depth < 64 ? ((t_emitted >> t_depth) & 1) != 0
                                    : g_enabled.load(std::memory_order_relaxed);
  if (emitted) nvtxDomainRangePop(domain());
}
#else
bool push(const char*) { return false; }
void pop() {}
#endif

}  // namespace

void set_nvtx_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool nvtx_enabled() { return g_enabled.load(std::memory_order_relaxed); }

bool nvtx_tool_attached() {
#if MEMPLAN_HAVE_NVTX
  static const bool attached = std::getenv("NVTX_INJECTION64_PATH") != nullptr;
  return attached && g_enabled.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

namespace nvtx {

void range_push(const char* name) { push(name); }

void range_pop() { pop(); }

void mark(const char* name) {
#if MEMPLAN_HAVE_NVTX
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  const nvtxEventAttributes_t a = attributes(name);
  nvtxDomainMarkEx(domain(), &a);
#else
  (void)name;
#endif
}

ScopedRange::ScopedRange(const char* name) { push(name); }

ScopedRange::~ScopedRange() { pop(); }

}  // namespace nvtx
}  // namespace memplan
