// The profile of one training step (forward + backward): plain structs, no torch.
//
// This is the contract between the recorder (profiler/, torch side) and the planner (planner/,
// pure C++) and every offline tool. On disk it is JSON (profile_io.h); the schema is documented in
// docs/profile-schema.md and versioned by kProfileVersion. Indices, not pointers, link the parts so
// the struct can be copied, serialised and validated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memplan {

inline constexpr int kProfileVersion = 1;

// What a value (a tensor storage) is, as far as the step can tell.
enum class ValueKind {
  Activation,  // produced by a forward op during the step
  Parameter,   // requires grad and is a leaf (nn.Parameter); persistent
  Input,       // existed before the step and is not a parameter (batch, buffers, constants)
  Gradient,    // produced by a backward node
  Other,
};

const char* to_string(ValueKind k);
bool parse_value_kind(const std::string& s, ValueKind* out);

// A tensor as an op saw it: the value (storage) it lives in plus its own metadata.
struct TensorRef {
  int64_t value = -1;               // index into Profile::values, -1 if not tracked (undefined tensor)
  std::vector<int64_t> shape;
  std::string dtype;                // c10 name: "Float", "Long", ...
  int64_t from = -1;                // forward op inputs: the earlier op that output this very tensor
                                    // (its value's maker, a view op, an in-place op); -1 if none did
};

// One top-level forward op (what the user dispatched with autograd) or one backward node.
struct Op {
  std::string name;                 // "aten::linear", or the node name "AddmmBackward0"
  std::string overload;             // schema overload name ("" for the default), forward ops only
  int64_t seq_nr = -1;              // autograd sequence number (fwd op seqNr == its grad_fn's)
  uint64_t thread = 0;              // forward thread id; a backward node reports its forward's
  std::vector<TensorRef> inputs;
  std::vector<TensorRef> outputs;
  std::vector<int64_t> packs;       // forward ops: values its autograd node saved, in pack order
                                    // (a value saved twice appears twice)
  int64_t fwd_op = -1;              // backward nodes: index of the forward op that created it
  double start_us = 0;              // since step start, monotonic clock
  double time_us = 0;               // the op's cost the planner uses: CPU wall time on CPU; on
                                    // CUDA the longer of that and its device time (CUPTI, else
                                    // CUDA events; apply_device_times in kernel_times.h)
  double cpu_us = -1;               // CPU wall time (-1 = not measured)
  double cupti_us = -1;             // sum of its kernels' durations from CUPTI (-1 = not measured)
  double event_us = -1;             // CUDA-event elapsed time around the op (-1 = not measured)
  int64_t live_before = 0;          // allocated bytes (absolute) when the op started
  int64_t live_after = 0;           // ... when it ended
  int64_t peak = 0;                 // highest allocated bytes while it ran (>= both of the above)
  bool random = false;              // draws from an RNG (has a Generator? argument, or dropout)
  bool rerunnable = true;           // forward ops: a rebuild can call it again (rerun_handle.h);
                                    // false for a Python autograd.Function (CompiledFunction)
  bool side_stream = false;         // forward ops: ran on a stream other than its device's default
                                    // (`with torch.cuda.stream(s)`): not re-run, and nothing it
                                    // reads is evicted (planner/graph.cpp)
  bool dispatch_mode = false;       // forward ops: ran under a TorchDispatchMode of the script's
                                    // (under_script_mode): not re-run (rerun_handle.h)
  std::vector<int64_t> writes;      // forward ops: input values its schema lets it write in place
                                    // (relu_'s self, batch_norm's running stats; op_writes.h)
};

// A tensor storage seen during the step. Views share their base's value.
struct Value {
  int64_t bytes = 0;                // storage size
  ValueKind kind = ValueKind::Other;
  int64_t producer = -1;            // forward op index that created it, -1 if it existed before
  std::vector<int64_t> consumers;   // forward op indices that read it, in order
  std::vector<int64_t> saved_by;    // forward op indices whose autograd node saved it (none if
                                    // its storage was gone at the forward's end: nodes that died)
  std::vector<int64_t> unpacked_by; // backward node indices that unpacked it, in order
  int64_t saved_bytes = 0;          // bytes autograd saved of it (0 unless saved_by is non-empty)
  bool held_outside = false;        // something besides autograd still referenced it after forward,
                                    // or (made inside an op) after that op: autocast's weight cache
                                    // (evicting it frees nothing, or nothing during forward)
  int64_t held_until = -1;          // the last forward op during which something besides autograd
                                    // still held it after it was saved (a Python variable that
                                    // outlives its last use: `h = f(g(h))`); evicting it frees
                                    // memory only after that op. -1: nothing did
  int64_t dies_after = -1;          // an input the script frees during the forward (the raw batch
                                    // after `x = normalize(x)`): the last forward op before its
                                    // storage was gone. -1: alive through the forward
  bool written = false;             // an input or parameter written in place during the step,
                                    // forward or backward (a buffer a backward hook updates, a
                                    // parameter an optimizer step in backward updates), or whose
                                    // storage was released (FSDP2 frees unsharded parameters)
  int64_t written_before_node = -1; // written: the first backward node that began after the
                                    // write was seen (backward.size(): after the last one began).
                                    // A re-run before that node reads it as captured; one from
                                    // that node on needs a copy taken when captured. -1 (the
                                    // default; older profiles): not known, so always the copy
};

struct Profile {
  int version = kProfileVersion;
  std::string device = "cpu";       // "cpu" or "cuda:N"
  int rank = 0;
  int64_t step = 0;                 // which iteration this is (0-based)
  std::string op_hash;              // hex hash of (name, overload, input shapes/dtypes) of fwd ops
  // In-process only, not written: the fwd ops' identity hashes folded in order (op_hash.h,
  // fold_signature). Known for light records too, which have no op list to hash.
  uint64_t signature = 0;
  // The same over the ops' structure hashes (no sizes: OpHasher::add_op_structure).
  uint64_t structure_signature = 0;
  int64_t baseline_bytes = 0;       // allocated when the step began (params, grads, optimizer state)
  int64_t peak_bytes = 0;           // highest allocated during the step (absolute)
  int64_t end_bytes = 0;            // allocated when the step ended
  double forward_us = 0;            // wall time of the forward
  double backward_us = 0;           // wall time of the backward
  double overhead_us = 0;           // recording cost measured in the callbacks themselves
  // Bytes of the step's accounted memory one RNG snapshot takes: a recipe of a random op that a
  // rebuild may re-run keeps the generator's state (a CPU tensor: 5056 bytes for the CPU
  // generator in torch 2.14) until the step ends. 0 where that memory is not the step's (a CUDA
  // step: its budget is device memory), and in older profiles (not counted).
  int64_t rng_state_bytes = 0;
  // The step's backward kept its graph for another (retain_graph / create_graph): what autograd
  // saved outlives the nodes that read it, to the step's end and beyond.
  bool graph_kept = false;
  // In-process only, not written: allocated when the backward began minus when the last
  // forward op ended (negative: what the script freed between them, zero_grad before
  // backward). Measured in light records too, which have no ops to read it from. Null: the step
  // had no backward, or a record read from a file.
  std::optional<int64_t> gap_bytes;
  std::vector<Op> forward;
  std::vector<Op> backward;
  std::vector<Value> values;

  // Activation memory as torch.compile's activation_memory_budget counts it.
  int64_t activation_bytes() const { return peak_bytes - baseline_bytes; }
  int64_t saved_for_backward_bytes() const;
};

// The first position at which `a` and `b` name another op (the shorter one's length when one
// is a prefix of the other), or -1 when they name the same ops: whether two records of a step
// line up op for op (profiler/kind_profile.cpp, memplan-plan --against).
int64_t first_other_op(const std::vector<Op>& a, const std::vector<Op>& b);

}  // namespace memplan
