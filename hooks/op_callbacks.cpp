#include "hooks/op_callbacks.h"

#include <atomic>

namespace memplan {
namespace {

std::atomic<OpSink*> g_sink{nullptr};
// Two callbacks so that boxing stays where it is needed: forward ops (needs inputs/outputs, can be
// paused for backward) and backward nodes (no inputs, always on while installed).
at::CallbackHandle g_ops = 0;
at::CallbackHandle g_nodes = 0;
bool g_ops_paused = false;
thread_local int tl_depth = 0;       // nesting of autograd-level ops on this thread
thread_local int tl_agent_scope = 0;

// Hot path: called for every op while installed. A composite op (aten::linear) re-enters the
// dispatcher for its children (aten::t, aten::addmm) with seqNr >= 0 too: only depth 0 is the op
// the user dispatched. Ops called inside kernels (addmm's internal expand/copy_) have seqNr -1
// and are ignored (design.md 3b.2).
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (tl_agent_scope) return nullptr;
  OpSink* sink = g_sink.load(std::memory_order_acquire);
  if (sink == nullptr) return nullptr;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    sink->node_start(fn);
    return nullptr;
  }
  if (fn.seqNr() < 0) return nullptr;
  if (tl_depth++ == 0) sink->op_start(fn);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (tl_agent_scope) return;
  OpSink* sink = g_sink.load(std::memory_order_acquire);
  if (sink == nullptr) return;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    sink->node_end(fn);
    return;
  }
  if (fn.seqNr() < 0) return;
  if (tl_depth > 0 && --tl_depth == 0) sink->op_end(fn);
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
}

void remove_op_callbacks() {
  for (at::CallbackHandle* h : {&g_ops, &g_nodes}) {
    if (*h != 0) at::removeCallback(*h);
    *h = 0;
  }
  g_ops_paused = false;
  g_sink.store(nullptr, std::memory_order_release);
}

void pause_forward_ops(bool paused) {
  if (g_ops == 0 || paused == g_ops_paused) return;
  if (paused) at::disableCallback(g_ops);
  else at::reenableCallback(g_ops);
  g_ops_paused = paused;
}

AgentScope::AgentScope() { ++tl_agent_scope; }
AgentScope::~AgentScope() { --tl_agent_scope; }
bool AgentScope::active() { return tl_agent_scope > 0; }

}  // namespace memplan
