#include "agent/pack_hooks.h"

#include <ATen/SavedTensorHooks.h>
#include <c10/core/SafePyObject.h>

#include <utility>

namespace memplan {
namespace pack_hooks {

namespace {
using Pair = std::pair<c10::SafePyObject, c10::SafePyObject>;
// Never destroyed: releasing a Python object after the interpreter is gone would crash at exit.
Pair* g_ours = nullptr;

const void* ptr(const c10::SafePyObject& o) { return o.ptr(&o.pyinterpreter()); }

// The pack hook on top of this thread's stack, or null. Reads the pointer only: no reference
// count changes, no GIL needed.
const void* top_pack() {
  const auto& tls = at::SavedTensorDefaultHooks::get_tls_state();
  return tls.stack.empty() ? nullptr : ptr(tls.stack.top().first);
}
}  // namespace

void remember() {
  const auto& tls = at::SavedTensorDefaultHooks::get_tls_state();
  if (tls.stack.empty()) return;
  if (g_ours != nullptr && ptr(g_ours->first) == ptr(tls.stack.top().first)) return;
  g_ours = new Pair(tls.stack.top());  // a leak of one pair per distinct push (one per process)
}

bool on_top() { return g_ours != nullptr && top_pack() == ptr(g_ours->first); }

OnTop::OnTop() : prev_tracing_(at::SavedTensorDefaultHooks::set_tracing(false)) {
  if (g_ours != nullptr && !on_top() && at::SavedTensorDefaultHooks::is_enabled()) {
    at::SavedTensorDefaultHooks::push_hooks(g_ours->first, g_ours->second);
    pushed_ = true;
  }
}

OnTop::~OnTop() {
  if (pushed_) at::SavedTensorDefaultHooks::pop_hooks();
  at::SavedTensorDefaultHooks::set_tracing(prev_tracing_);
}

}  // namespace pack_hooks
}  // namespace memplan
