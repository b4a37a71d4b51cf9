#include "hooks/op_callbacks.h"

#include <ATen/core/grad_mode.h>

#include <atomic>
#include <cstring>
#include <utility>

namespace memplan {
namespace {

std::atomic<OpSink*> g_sink{nullptr};
// Two callbacks so that boxing stays where it is needed: forward ops (needs inputs/outputs, can be
// paused for backward) and backward nodes (no inputs, always on while installed).
at::CallbackHandle g_ops = 0;
at::CallbackHandle g_nodes = 0;
at::CallbackHandle g_user = 0;  // user-scope ends, for quiet stretches an exception unwound
bool g_ops_paused = false;
bool g_nodes_paused = false;
thread_local int tl_depth = 0;       // nesting of autograd-level ops on this thread
thread_local int tl_agent_scope = 0;
thread_local bool tl_children_off = false;  // RecordFunction off for the current op's children
thread_local bool tl_quiet = false;         // RecordFunction off for a quiet stretch
thread_local const at::RecordFunction* tl_unnumbered = nullptr;  // the running top-level op, if unnumbered

// Runs one sink call; what it throws goes to the sink, not to RecordFunction. Cost: none unless
// it throws (zero-cost exception tables).
template <typename Call>
void guarded(OpSink* sink, Call&& call) {
  try {
    call();
  } catch (const std::exception& e) {
    sink->callback_failed(e);
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);

// Whether every FUNCTION-scope observer active on this thread is ours. Then nothing else watches
// the children of a top-level op (linear's t and addmm, dropout's bernoulli_, the kernels' own
// empty/copy_), and they can skip RecordFunction altogether. Cost: one copy of the thread's
// callback list (a small vector, usually one entry).
bool only_ours() {
  const auto cbs = at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION);
  if (!cbs) return true;
  for (const auto& p : cbs->callbacks_) {
    if (p.start_ != &on_start) return false;
  }
  return true;
}

// The one way this file switches RecordFunction off on this thread: only while nothing but us
// observes it. `*off` says whether it did, for restore() to undo exactly that.
void silence_if_alone(bool* off) {
  if (only_ours()) {
    at::enableRecordFunction(false);
    *off = true;
  }
}

void restore(bool* off) {
  if (!*off) return;
  at::enableRecordFunction(true);
  *off = false;
}

// Hot path: called for every op while installed. A composite op (aten::linear) re-enters the
// dispatcher for its children (aten::t, aten::addmm) with seqNr >= 0 too: only depth 0 is the op
// the user dispatched. Ops called inside kernels (addmm's internal expand/copy_) have seqNr -1
// and are ignored (design.md 3b.2).
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (tl_agent_scope) return nullptr;
  OpSink* sink = g_sink.load(std::memory_order_acquire);
  if (sink == nullptr) return nullptr;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    guarded(sink, [&] { sink->node_start(fn); });
    return nullptr;
  }
  if (fn.seqNr() < 0) {
    // The dispatcher numbers an op only with grad mode on and an autograd kernel to run: this is
    // a child of a recorded op (tl_depth tells), a no_grad op, or, with grad mode on, a top-level
    // op autograd has no kernel for: a factory, whose tensor a later op may fill in place
    // (gumbel_softmax's empty_like, then exponential_). Left out, what it made would be an input
    // from nowhere, which a rebuild could only have as a copy kept from before that write.
    if (tl_depth > 0) return nullptr;
    if (!at::GradMode::is_enabled()) {
      guarded(sink, [&] { sink->untracked_op(fn); });
      return nullptr;
    }
    // Another library's: a c10d collective (never re-run), or a range that is no op at all
    // (torch.compile's "Torch-Compiled Region", "TorchDynamo Cache Lookup": the ops inside it are
    // the step's). Passed over as before, its children seen as they come.
    if (std::strncmp(fn.name(), "aten::", 6) != 0) return nullptr;
    // Recorded, like any op: aten's factories, made like a tensor (empty_like, zeros_like,
    // randn_like, new_zeros: the step's sizes) or from their arguments alone (torch.zeros, full,
    // arange, randn: a buffer the forward fills through a slice, a constant, a batch drawn in the
    // step). Left out, what one made would be an input from nowhere, held by every recipe that
    // reads it to the step's end; recorded, a rebuild makes it again (a random one with the
    // random numbers it drew). Their children (zeros_like's empty_like and zero_, randn's
    // normal_) are not: the depth is taken as for any op.
    tl_unnumbered = &fn;
  }
  if (tl_depth++ == 0) {
    // The op's children are never recorded (depth > 0, or seqNr -1): with no other observer,
    // turn RecordFunction off on this thread until the op ends, so they do not construct one or
    // box their arguments. Measured on a dispatch-bound GPT-2 step: ~380 such children per step
    // against 72 top-level ops (most other unrecorded ops are the optimizer's: quiet_ops_begin).
    // A started RecordFunction keeps its callbacks, so this op's end still reaches on_end.
    silence_if_alone(&tl_children_off);
    guarded(sink, [&] { sink->op_start(fn); });
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (tl_agent_scope) return;
  OpSink* sink = g_sink.load(std::memory_order_acquire);
  if (sink == nullptr) return;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    guarded(sink, [&] { sink->node_end(fn); });
    return;
  }
  if (fn.seqNr() < 0) {
    if (&fn != tl_unnumbered) return;  // a child's end: only the op that began the depth ends it
    tl_unnumbered = nullptr;
  }
  if (tl_depth > 0 && --tl_depth == 0) {
    restore(&tl_children_off);
    guarded(sink, [&] { sink->op_end(fn); });
  }
}

std::unique_ptr<at::ObserverContext> on_user_start(const at::RecordFunction&) { return nullptr; }

// Every user-scope RecordFunction's end (`torch.autograd.profiler.record_function`: DataLoader's
// next, Optimizer.step and zero_grad, a script's own ranges). Cost: one TLS read, outside a quiet
// stretch; no allocation, no lock.
void on_user_end(const at::RecordFunction&, at::ObserverContext*) {
  if (!tl_quiet || tl_agent_scope) return;
  OpSink* sink = g_sink.load(std::memory_order_acquire);
  if (sink != nullptr) sink->quiet_stretch_unwound();
}

}  // namespace

void install_op_callbacks(OpSink* sink, CallbackNeeds needs) {
  remove_op_callbacks();
  g_sink.store(sink, std::memory_order_release);
  at::RecordFunctionCallback ops(&on_start, &on_end);
  ops.needsInputs(needs.inputs).needsOutputs(needs.outputs);
  ops.scopes({at::RecordScope::FUNCTION});
  g_ops = at::addGlobalCallback(ops);
  g_ops_paused = false;
  at::RecordFunctionCallback nodes(&on_start, &on_end);
  nodes.scopes({at::RecordScope::BACKWARD_FUNCTION});
  g_nodes = at::addGlobalCallback(nodes);
  g_nodes_paused = false;
  at::RecordFunctionCallback user(&on_user_start, &on_user_end);
  user.scopes({at::RecordScope::USER_SCOPE});
  g_user = at::addGlobalCallback(user);
}

void remove_op_callbacks() {
  for (at::CallbackHandle* h : {&g_ops, &g_nodes, &g_user}) {
    if (*h != 0) at::removeCallback(*h);
    *h = 0;
  }
  g_ops_paused = false;
  g_nodes_paused = false;
  g_sink.store(nullptr, std::memory_order_release);
}

void pause_forward_ops(bool paused) {
  if (g_ops == 0 || paused == g_ops_paused) return;
  if (paused) at::disableCallback(g_ops);
  else at::reenableCallback(g_ops);
  g_ops_paused = paused;
}

void pause_backward_nodes(bool paused) {
  if (g_nodes == 0 || paused == g_nodes_paused) return;
  if (paused) at::disableCallback(g_nodes);
  else at::reenableCallback(g_nodes);
  g_nodes_paused = paused;
}

bool quiet_ops_begin() {
  if (tl_quiet || g_ops == 0 || g_ops_paused || g_sink.load(std::memory_order_acquire) == nullptr) return false;
  if (!at::isRecordFunctionEnabled()) return false;
  silence_if_alone(&tl_quiet);
  return tl_quiet;
}

void quiet_ops_end() { restore(&tl_quiet); }

bool quiet_ops_active() { return tl_quiet; }

AgentScope::AgentScope() { ++tl_agent_scope; }
AgentScope::~AgentScope() { --tl_agent_scope; }
bool AgentScope::active() { return tl_agent_scope > 0; }

}  // namespace memplan
