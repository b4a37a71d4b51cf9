// RecordFunction interposition: registers global callbacks and forwards top-level autograd
// ops (seqNr >= 0, depth 0 on this thread), ops run under no_grad outside them, and backward
// nodes to a sink. No decisions here.
#pragma once

#include <ATen/record_function.h>

#include <exception>

namespace memplan {

class OpSink {
 public:
  virtual ~OpSink() = default;
  virtual void op_start(const at::RecordFunction& fn) = 0;  // inputs() valid only here
  virtual void op_end(const at::RecordFunction& fn) = 0;
  virtual void node_start(const at::RecordFunction& fn) = 0;
  virtual void node_end(const at::RecordFunction& fn) = 0;
  // An op under no_grad, outside any recorded op (its children come too: the dispatcher gives
  // them no sequence number either). Inputs valid only here.
  virtual void untracked_op(const at::RecordFunction& fn) = 0;
  // A quiet stretch (quiet_ops_begin) outlived the user-scope RecordFunction it began in: an
  // optimizer step raised after its pre hook, so its post hook (quiet_ops_end) never runs. The
  // stretch is still on; the sink ends it.
  virtual void quiet_stretch_unwound() {}
  // One of the calls above threw (caught here: an exception that reaches RecordFunction is only
  // printed, with a stack trace, for every op after it). May come from any thread that runs ops
  // or nodes.
  virtual void callback_failed(const std::exception& e) = 0;
};

struct CallbackNeeds {
  bool inputs = false;   // boxes every argument of every op: only while recording
  bool outputs = false;
};

// (Re)installs the callback with the given needs; replaces a previous installation.
void install_op_callbacks(OpSink* sink, CallbackNeeds needs);
void remove_op_callbacks();

// Stops / resumes observing forward ops (backward nodes stay observed). While paused the
// dispatcher no longer boxes every op's arguments for us: the agent pauses for the whole of each
// backward pass, whose aten ops it ignores anyway. Not thread-safe against install/remove (the
// agent calls all three from the thread that runs the step). Cost: a global callback-table update
// (a mutex and a version bump), twice per step.
void pause_forward_ops(bool paused);
// Stops (or restarts) the backward node callbacks, while nothing needs them: a replayed step
// whose planned actions run from hooks on the nodes themselves (the engine then builds no
// RecordFunction, and no node-name string, per node). Same cost and threading as above.
void pause_backward_nodes(bool paused);

// Turns RecordFunction off on this thread for a stretch whose ops the agent never records (an
// optimizer step: hundreds of no-grad ops that would otherwise each construct a RecordFunction
// and box their arguments for our observer). Only while our callbacks are installed and are the
// only observers (a user's torch.profiler keeps seeing everything). Returns whether it did;
// quiet_ops_end() undoes it. Cost: one copy of the thread's callback list, one TLS write.
// A stretch that begins inside a user-scope RecordFunction (Optimizer.step's) and is still on when
// that one ends is reported to the sink (quiet_stretch_unwound): RecordFunctions cannot start while
// it is on, so the first user-scope end seen is the enclosing one's, on exception or not.
bool quiet_ops_begin();
void quiet_ops_end();
bool quiet_ops_active();

// Thread-local guard: while alive, this thread's ops are invisible to the sink (the agent's own
// work: recompute, copies). Cost: one TLS increment.
class AgentScope {
 public:
  AgentScope();
  ~AgentScope();
  AgentScope(const AgentScope&) = delete;
  AgentScope& operator=(const AgentScope&) = delete;
  static bool active();
};

}  // namespace memplan
