// The planner's view of one profiled step: what each forward op reads and produces, when each
// value dies in the un-planned run, and which values may be evicted. Derived once from a Profile;
// every later stage (blocks, ILP, plan builder, simulator) reads this instead of the raw profile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/profile.h"

namespace memplan::planner {

// One distinct input of a forward op: the value and the op whose output tensor it read. `src` is
// the value's producer, or a later view/in-place op that re-exposed the same storage (rerunning
// the consumer then needs that op rerun too, to rebuild the tensor object), or -1 if the tensor
// existed before the step.
struct Dep {
  int64_t value = -1;
  int64_t src = -1;
  // A forward op after `src` writes the value in place (Op::writes; the op itself, relu_ of a
  // BatchNorm output, or a later one): the tensor alive in backward no longer holds what `src`
  // left, so a re-run of the op needs `src` re-run before it, though autograd keeps the written
  // tensor. Otherwise a value still alive is read where it is, also through a view (the replay
  // views its storage again).
  bool stale = false;
};

// Timeline positions: forward op i is position i, backward node j is position n_fwd + j. A value
// "ends" at a position: it is alive during it and freed right after.
struct Graph {
  const Profile* prof = nullptr;
  int64_t n_fwd = 0, n_bwd = 0;
  std::vector<char> persistent;         // per value: existed before the step (no producer)
  std::vector<char> evictable;          // per value: dropping autograd's hold frees its bytes
  std::vector<char> rerunnable;         // per fwd op: Op::rerunnable, or it makes no value (a
                                        // rebuild never needs to run it)
  int64_t unrebuildable_bytes = 0;      // saved activations not evictable for want of such ops
  int64_t side_stream_bytes = 0;        // saved activations not evictable: an op on a side stream
                                        // reads them (Op::side_stream)
  // per fwd op: re-running it would re-run an op that cannot be, for an input nothing keeps (not
  // saved for backward) or that a view re-exposed. A saved input made by a stuck op is read where
  // it is instead (alive to its last unpack).
  std::vector<char> stuck;
  std::vector<int64_t> last_fwd_use;    // per value: last forward op touching it (>= producer)
  std::vector<int64_t> first_unpack;    // per value: first backward node unpacking it, -1 if none
  std::vector<int64_t> last_unpack;     // per value: last ..., -1 if none
  std::vector<int64_t> natural_end;     // per value: position where the un-planned run frees it
  std::vector<int64_t> held_until;      // per value: Value::held_until (an eviction frees after it)
  std::vector<int64_t> dies_after;      // per value: Value::dies_after (an input freed mid-forward)
  bool any_dies = false;                // some value has dies_after >= 0
  // per value: made in the step but output by no op (a Python autograd.Function's result: its
  // RecordFunction has no outputs), or made or written in place by an op that cannot be re-run
  // (Op::rerunnable false: the replay registers none of its outputs, Replayer::opaque_). The
  // replay cannot tell it from an input from before the step, so a recipe that captures it holds
  // it to the step's end.
  std::vector<char> unseen;
  bool any_unseen = false;
  bool any_written = false;             // some value has Value::written (see copied_when_captured)
  // per value from before the step (input or parameter): the first forward op that writes it in
  // place after an earlier op read it (a weight written through `.data` after its layer ran), -1
  // if none. The replay's write guard copies it there when a recipe captured it before.
  std::vector<int64_t> fwd_written_at;
  bool any_fwd_written = false;
  std::vector<std::vector<int64_t>> providers;  // per value: value_providers (rerun_ops.h)
  std::vector<std::vector<int64_t>> produces;  // per fwd op: values it created
  std::vector<std::vector<Dep>> deps;   // per fwd op: distinct inputs
  std::vector<int64_t> out_bytes;       // per fwd op: bytes of the values it created
  std::vector<int64_t> workspace;       // per fwd op: peak - max(live_before, live_after)
  std::vector<int64_t> bwd_workspace;   // per bwd node: same
  // per value: bytes of its compact form when it is a 0/scale dropout mask (compact.h), else 0
  std::vector<int64_t> compact_bytes;
  std::vector<double> compact_us;       // per value: estimated time to compact and expand it
  // per fwd op: the dropout mask it saves (a compaction candidate), or -1. While that mask is kept
  // compact, re-running the op is `input * expanded mask`: priced like compact_us, not the op.
  std::vector<int64_t> op_mask;
  double fwd_time_us = 0, bwd_time_us = 0;  // sums of op / node times
  double step_time_us = 0;              // measured step time (forward_us + backward_us, or sums)

  int64_t end_pos() const { return n_fwd + n_bwd; }
  // Values a whole-step plan may evict: dropping autograd's hold frees them, and backward
  // unpacks them (so there is something to rebuild for).
  std::vector<int64_t> eviction_candidates() const;
  // Values that may be kept compact instead (compact_bytes > 0).
  std::vector<int64_t> compaction_candidates() const;
  // A work bound that shrinks as the step grows: at most `cap`, at most `work` / forward ops,
  // at least 1.
  int64_t per_op_share(int64_t cap, int64_t work) const;
  int64_t bytes(int64_t v) const { return prof->values[v].bytes; }
  int64_t producer(int64_t v) const { return prof->values[v].producer; }
};

// Checks what the planner relies on beyond validate_profile (orders, links between ops and
// values) and fills `g`. False and one line in `error` when the profile is inconsistent.
bool build_graph(const Profile& p, Graph* g, std::string* error);

// One line for the user when some saved activations cannot be evicted because an op that makes
// them (or their inputs) cannot be re-run (torch.compile's CompiledFunction, a custom
// autograd.Function), or because an op on a side stream reads them (Op::side_stream); "" when
// there are none.
std::string unrebuildable_note(const Graph& g);

}  // namespace memplan::planner
