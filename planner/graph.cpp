#include "planner/graph.h"

#include <algorithm>

#include <fmt/format.h>

#include "planner/rerun_ops.h"
#include "profiler/bytes.h"
#include "profiler/op_determinism.h"

namespace memplan::planner {

namespace {

int64_t float_size(const std::string& dtype) {
  if (dtype == "Float") return 4;
  if (dtype == "Double") return 8;
  if (dtype == "Half" || dtype == "BFloat16") return 2;
  return 0;
}

// Dropout masks that can be kept compact (docs/compaction.md). aten::dropout on the CPU (every
// device but those with the fused kernel: CUDA, XPU...) computes `input * noise` with
// noise = bernoulli_(1-p).div_(1-p), and the multiplication saves `noise`: a float tensor of the
// input's shape whose elements are all +0 or one scale. It is packed inside the op and is none of its outputs. The fused kernel saves a
// one-byte mask already (and its bytes are not input numel x float size, so the rule skips it).
// Cost: compacting is about one pass over the tensor, expanding another; both are priced as two
// elementwise passes at the profile's own median rate for add/mul/sub/div (time per output byte)
// over ops of at least kRateMinBytes: a small op's time is the dispatcher's fixed cost, not a rate
// (a GAN step's only add, of two scalar losses, gave 1.2 us per byte and priced compacting a 256 KiB
// mask at 0.6 s). Never more than the dropout op itself, which makes the mask and uses it.
constexpr int64_t kRateMinBytes = 64 * 1024;

void find_masks(const Profile& p, Graph* g) {
  const size_t nv = p.values.size();
  g->compact_bytes.assign(nv, 0);
  g->compact_us.assign(nv, 0);
  g->op_mask.assign(p.forward.size(), -1);
  if (p.device != "cpu") return;  // the replay compacts CPU tensors only (agent/compact.h)
  std::vector<double> rates;
  for (size_t i = 0; i < p.forward.size(); ++i) {
    const std::string& n = p.forward[i].name;
    if ((n == "aten::add" || n == "aten::mul" || n == "aten::sub" || n == "aten::div") &&
        g->out_bytes[i] >= kRateMinBytes && p.forward[i].time_us > 0)
      rates.push_back(p.forward[i].time_us / static_cast<double>(g->out_bytes[i]));
  }
  double rate = -1;
  if (!rates.empty()) {
    std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
    rate = rates[rates.size() / 2];
  }
  for (size_t v = 0; v < nv; ++v) {
    const Value& val = p.values[v];
    if (!g->evictable[v] || val.producer < 0) continue;
    const Op& op = p.forward[val.producer];
    if (op.name != "aten::dropout" || op.inputs.empty()) continue;
    if (val.saved_by.size() != 1 || val.saved_by[0] != val.producer) continue;
    bool is_output = false;
    for (const TensorRef& t : op.outputs) is_output = is_output || t.value == static_cast<int64_t>(v);
    if (is_output) continue;
    const TensorRef& in = op.inputs[0];
    const int64_t es = float_size(in.dtype);
    int64_t numel = 1;
    for (int64_t d : in.shape) numel *= d;
    if (es == 0 || numel <= 0 || val.bytes != numel * es) continue;
    g->compact_bytes[v] = compact_mask_bytes(numel);  // one bit per element
    g->compact_us[v] = rate > 0 ? std::min(2 * rate * static_cast<double>(val.bytes), op.time_us) : 0.05 * op.time_us;
    g->op_mask[val.producer] = static_cast<int64_t>(v);
  }
}

// Op `op` cannot be re-run and wrote value `v` in place without returning it (a custom
// Function's mark_dirty: its RecordFunction has no outputs; Recorder::note_hidden_writes).
bool hidden_write(const Op& op, int64_t v) {
  return !op.rerunnable && std::find(op.writes.begin(), op.writes.end(), v) != op.writes.end();
}

// No value is evictable whose rebuild would need an op that cannot be re-run (Op::rerunnable):
// rebuilding a candidate re-runs its producer, and transitively the op behind every input that
// is not a candidate itself or that a later op re-exposed (block_ilp.h's must edges; a candidate
// input is kept or rebuilt by its own rule, the cond edges). An input whose maker is stuck
// (Graph::stuck) may still be read where it is: autograd keeps a saved value until its last
// unpack, so the rebuild may read it if it runs by then (at the latest at the candidate's first
// unpack; the simulator checks the actual schedule). Dropping a candidate turns edges to it into
// must edges, so this repeats until nothing changes. Cost: O(ops + inputs) per round; none at all
// when every op can be re-run.
void drop_unrebuildable(Graph* g) {
  g->stuck.assign(g->n_fwd, 0);
  if (std::all_of(g->rerunnable.begin(), g->rerunnable.end(), [](char r) { return r != 0; })) return;
  auto candidate = [&](int64_t v) { return g->evictable[v] && g->first_unpack[v] >= 0; };
  const int64_t always = g->end_pos();
  for (bool changed = true; changed;) {
    changed = false;
    // until[i]: re-running op i reads, where they are, values alive up to this position at most
    std::vector<int64_t> until(g->n_fwd, always);
    for (int64_t i = 0; i < g->n_fwd; ++i) {
      bool bad = !g->rerunnable[i];
      for (const Dep& d : g->deps[i]) {
        if (d.src < 0) continue;
        const bool made = d.src == g->producer(d.value);
        if (made && candidate(d.value)) continue;
        if (made && !d.stale && g->stuck[d.src] && g->natural_end[d.value] >= g->n_fwd) {
          until[i] = std::min(until[i], g->natural_end[d.value]);
          continue;
        }
        bad = bad || g->stuck[d.src];
        until[i] = std::min(until[i], until[d.src]);
      }
      g->stuck[i] = bad ? 1 : 0;
    }
    for (size_t v = 0; v < g->evictable.size(); ++v) {
      if (!candidate(static_cast<int64_t>(v))) continue;
      for (int64_t o : g->providers[v])
        if (g->stuck[o] || until[o] < g->n_fwd + g->first_unpack[v]) {
          g->evictable[v] = 0;
          g->unrebuildable_bytes += g->bytes(static_cast<int64_t>(v));
          changed = true;
          break;
        }
    }
  }
}

}  // namespace

bool build_graph(const Profile& p, Graph* g, std::string* error) {
  const int64_t nf = static_cast<int64_t>(p.forward.size());
  const int64_t nb = static_cast<int64_t>(p.backward.size());
  const int64_t nv = static_cast<int64_t>(p.values.size());
  Graph& G = *g;
  G = Graph{};
  G.prof = &p;
  G.n_fwd = nf;
  G.n_bwd = nb;
  G.persistent.assign(nv, 0);
  G.evictable.assign(nv, 0);
  G.last_fwd_use.assign(nv, -1);
  G.first_unpack.assign(nv, -1);
  G.last_unpack.assign(nv, -1);
  G.natural_end.assign(nv, G.end_pos());
  G.held_until.assign(nv, -1);
  G.dies_after.assign(nv, -1);
  for (int64_t v = 0; v < nv; ++v) {
    G.held_until[v] = p.values[v].held_until;
    G.dies_after[v] = p.values[v].dies_after;
    G.any_dies = G.any_dies || G.dies_after[v] >= 0;
    G.any_written = G.any_written || p.values[v].written;
  }
  G.providers = value_providers(p);
  G.unseen.assign(nv, 0);
  for (int64_t i = 0; i < nf; ++i)
    for (const TensorRef& t : p.forward[i].inputs) {
      if (t.value < 0 || t.value >= nv || p.values[t.value].producer < 0) continue;
      const Op& prod = p.forward[p.values[t.value].producer];
      const auto& prov = G.providers[t.value];
      // Read as an op that cannot be re-run wrote it (hidden_write): the slot of its maker is at
      // an older version, so the reader's recipe takes it as an external too.
      const bool written_unseen = t.from >= 0 && t.from < i && hidden_write(p.forward[t.from], t.value);
      if (written_unseen ||
          std::any_of(prov.begin(), prov.end(), [&](int64_t o) { return !p.forward[o].rerunnable; })) {
        // The replay registers no output of such an op; one that writes the value in place
        // (index_put_) also leaves its producer's output stale: a reader captures it either way.
        G.unseen[t.value] = G.any_unseen = true;
      } else if (prov.size() == 1) {  // only its producer, which did not output it
        bool output = false;
        for (const TensorRef& o : prod.outputs) output = output || o.value == t.value;
        if (!output) G.unseen[t.value] = G.any_unseen = true;
      }
    }
  G.produces.assign(nf, {});
  G.deps.assign(nf, {});
  G.out_bytes.assign(nf, 0);
  G.workspace.assign(nf, 0);
  G.bwd_workspace.assign(nb, 0);

  for (int64_t v = 0; v < nv; ++v) {
    const Value& val = p.values[v];
    if (val.producer < 0) {
      G.persistent[v] = 1;
    } else {
      G.produces[val.producer].push_back(v);
      G.out_bytes[val.producer] += val.bytes;
      G.last_fwd_use[v] = val.producer;
    }
    for (int64_t c : val.consumers) {
      if (val.producer >= 0 && c < val.producer) {
        *error = fmt::format("value {}: consumed by forward op {} before its producer {}", v, c,
                             val.producer);
        return false;
      }
      G.last_fwd_use[v] = std::max(G.last_fwd_use[v], c);
    }
    for (int64_t s : val.saved_by) {
      if (val.producer >= 0 && s < val.producer) {
        *error = fmt::format("value {}: saved by forward op {} before its producer {}", v, s,
                             val.producer);
        return false;
      }
      // Saved after its last read: a TorchScript graph's DifferentiableGraphBackward saves what
      // its ops made once its last op is done (the pack counts for that op). It lives to there,
      // and an eviction before the pack finds nothing to evict (a jit.script activation: the
      // plan's evictions of those values were all skipped, +76% over the prediction).
      G.last_fwd_use[v] = std::max(G.last_fwd_use[v], s);
    }
    if (!val.unpacked_by.empty() && val.saved_by.empty()) {
      *error = fmt::format("value {}: unpacked in backward but saved by no forward op", v);
      return false;
    }
    for (int64_t u : val.unpacked_by) {
      G.first_unpack[v] = G.first_unpack[v] < 0 ? u : std::min(G.first_unpack[v], u);
      G.last_unpack[v] = std::max(G.last_unpack[v], u);
    }
    // When does the un-planned run free it? Autograd holds saved values until the last node that
    // unpacks them; something outside autograd may hold it to the end; otherwise its last use.
    if (G.persistent[v] || val.held_outside) {
      G.natural_end[v] = G.end_pos();
    } else if (!val.saved_by.empty()) {
      // A kept graph keeps them past it, to the step's end (a compact mask stays compact there).
      G.natural_end[v] = val.unpacked_by.empty() || p.graph_kept ? G.end_pos() : nf + G.last_unpack[v];
    } else {
      G.natural_end[v] = G.last_fwd_use[v];
    }
  }

  // Inputs: which op output each tensor before op i: its producer, or a view/in-place op. The
  // recorder says (TensorRef::from); where it does not (a profile from before it, a tensor no
  // recorded op output), the last op that exposed the same storage with the same shape: that
  // keeps `W` apart from an earlier `W.t()`, though not q from k, two same-shaped views of one
  // projection.
  struct Exposure { int64_t op; const std::vector<int64_t>* shape; };
  std::vector<std::vector<Exposure>> exposed(nv);
  for (int64_t i = 0; i < nf; ++i) {
    const Op& op = p.forward[i];
    for (const TensorRef& t : op.inputs) {
      if (t.value < 0) continue;
      const Value& val = p.values[t.value];
      if (val.producer >= i) {
        *error = fmt::format("forward op {} reads value {} which op {} produces later", i, t.value,
                             val.producer);
        return false;
      }
      int64_t src = val.producer;
      const auto& ex = exposed[t.value];
      const bool told = t.from >= val.producer && t.from < i &&
                        std::any_of(ex.begin(), ex.end(), [&](const Exposure& e) { return e.op == t.from; });
      if (told) {
        src = t.from;
      } else {
        for (auto it = ex.rbegin(); it != ex.rend(); ++it) {
          if (*it->shape == t.shape) {
            src = it->op;
            break;
          }
        }
      }
      auto& d = G.deps[i];
      if (std::none_of(d.begin(), d.end(), [&](const Dep& x) { return x.value == t.value && x.src == src; }))
        d.push_back({t.value, src});
    }
    for (const TensorRef& t : op.outputs) {
      if (t.value >= 0 && p.values[t.value].producer <= i) exposed[t.value].push_back({i, &t.shape});
    }
    // What an op that cannot be re-run wrote in place without returning it (hidden_write), later
    // ops read from this op (TensorRef::from), which a rebuild cannot run, so what they made is
    // kept (drop_unrebuildable).
    for (const TensorRef& t : op.inputs) {
      if (t.value >= 0 && hidden_write(op, t.value)) exposed[t.value].push_back({i, &t.shape});
    }
    G.workspace[i] = std::max<int64_t>(0, op.peak - std::max(op.live_before, op.live_after));
    G.fwd_time_us += op.time_us;
  }
  // Writes in place: a dep is stale if an op after its src writes its value.
  std::vector<int64_t> last_write(nv, -1);
  G.fwd_written_at.assign(nv, -1);
  for (int64_t i = 0; i < nf; ++i)
    for (int64_t v : p.forward[i].writes) {
      if (v < 0 || v >= nv) continue;
      last_write[v] = i;
      const Value& val = p.values[v];
      if (val.producer >= 0 || G.fwd_written_at[v] >= 0) continue;
      if (std::any_of(val.consumers.begin(), val.consumers.end(), [&](int64_t o) { return o < i; }))
        G.fwd_written_at[v] = i, G.any_fwd_written = true;
    }
  for (int64_t i = 0; i < nf; ++i)
    for (Dep& d : G.deps[i]) d.stale = d.src >= 0 && last_write[d.value] > d.src;
  for (int64_t j = 0; j < nb; ++j) {
    const Op& n = p.backward[j];
    G.bwd_workspace[j] = std::max<int64_t>(0, n.peak - std::max(n.live_before, n.live_after));
    G.bwd_time_us += n.time_us;
  }

  // An op that makes no value (FSDP2's RegisterPostBackwardFunction passes its inputs through)
  // is never run by a rebuild, which runs only what a wanted value needs: no obstacle, and a
  // block holding it may still be re-forwarded. Unless it wrote one (a custom Function's
  // mark_dirty): what later ops read of that value only it can make.
  G.rerunnable.assign(nf, 1);
  for (int64_t i = 0; i < nf; ++i)
    G.rerunnable[i] = p.forward[i].rerunnable ||
                              (G.produces[i].empty() && p.forward[i].outputs.empty() && p.forward[i].writes.empty())
                          ? 1
                          : 0;

  // Evictable: an activation autograd saved and a later backward node unpacks, that nothing else
  // holds, that no op modifies in place after its producer (re-running that op would clobber it),
  // and that a rebuild can make (drop_unrebuildable: a CompiledFunction's saved tensors can only
  // be kept).
  std::vector<char> mutated(nv, 0);
  for (int64_t i = 0; i < nf; ++i) {
    const Op& op = p.forward[i];
    for (int64_t v : op.writes) mutated[v] = 1;
    // A profile from before Op::writes: aten's in-place ops end in '_'.
    bool inplace = !op.name.empty() && op.name.back() == '_';
    if (!inplace) continue;
    for (const TensorRef& t : op.outputs)
      if (t.value >= 0) mutated[t.value] = 1;
  }
  for (int64_t v = 0; v < nv; ++v) {
    const Value& val = p.values[v];
    G.evictable[v] = !G.persistent[v] && val.kind == ValueKind::Activation && !val.held_outside &&
                     !mutated[v] && val.bytes > 0 && !val.saved_by.empty() &&
                     !val.unpacked_by.empty();
  }
  // Nor is a value an op on a side stream reads: freed after its last forward use, its memory
  // could go to the default stream while that op's kernels still read it on theirs (rerun_handle.h
  // side_stream_of). What such an op makes cannot be rebuilt (not rerunnable: drop_unrebuildable).
  for (int64_t i = 0; i < nf; ++i) {
    if (!p.forward[i].side_stream) continue;
    for (const TensorRef& t : p.forward[i].inputs)
      if (t.value >= 0 && t.value < nv && G.evictable[t.value]) {
        G.evictable[t.value] = 0;
        G.side_stream_bytes += G.bytes(t.value);
      }
  }
  drop_unrebuildable(&G);
  find_masks(p, &G);
  G.step_time_us = (p.forward_us + p.backward_us > 0) ? p.forward_us + p.backward_us
                                                      : G.fwd_time_us + G.bwd_time_us;
  return true;
}

std::string unrebuildable_note(const Graph& g) {
  bool any_side = false;  // a side stream's ops are named apart: their names say nothing of why
  for (int64_t i = 0; i < g.n_fwd; ++i) any_side = any_side || g.prof->forward[i].side_stream;
  const std::string side =
      any_side ? fmt::format("forward ops run on a side stream (torch.cuda.stream) are not re-run, and what they "
                             "read is not freed early ({} of saved activations kept for that alone)",
                             format_bytes(g.side_stream_bytes))
               : "";
  if (g.unrebuildable_bytes == 0) return g.side_stream_bytes > 0 ? side : "";
  // So are the ops run under a TorchDispatchMode of the script's: aten ops, named for no reason.
  int64_t moded = 0;
  std::vector<std::string> names;
  for (int64_t i = 0; i < g.n_fwd; ++i) {
    const Op& op = g.prof->forward[i];
    if (g.rerunnable[i] || op.side_stream) continue;
    if (op.dispatch_mode) {
      ++moded;
    } else if (std::find(names.begin(), names.end(), op.name) == names.end()) {
      names.push_back(op.name);
    }
  }
  std::string apart = side;
  if (moded > 0) {
    apart += fmt::format("{}{} forward op(s) run under a TorchDispatchMode the script entered (its own, "
                         "FlopCounterMode, selective activation checkpointing's) are not re-run: the mode may change "
                         "what they compute",
                         apart.empty() ? "" : "; ", moded);
  }
  if (names.empty())  // only ops named apart stand in the way
    return fmt::format("{} of saved activations cannot be evicted: rebuilding them would need forward ops memplan "
                       "does not re-run; {}",
                       format_bytes(g.unrebuildable_bytes), apart);
  std::string list;
  for (size_t k = 0; k < names.size() && k < 3; ++k) list += (k ? ", " : "") + names[k];
  if (names.size() > 3) list += fmt::format(" and {} more", names.size() - 3);
  auto has = [&](const char* n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  std::string hints;  // what the user can do about the well-known ones
  if (has("CompiledFunction"))
    hints += "; torch.compile has its own budget: torch._functorch.config.activation_memory_budget";
  if (has("CheckpointFunction"))
    hints += "; CheckpointFunction is torch.utils.checkpoint(use_reentrant=True), which recomputes its region itself";
  const auto nondet = std::find_if(names.begin(), names.end(), [](const std::string& n) {
    return has_nondeterministic_kernel(n);
  });
  if (nondet != names.end()) {
    // Only where the mode gives the op a deterministic kernel: for the others it makes them raise.
    hints += has_deterministic_kernel(*nondet)
                 ? fmt::format("; {} runs a nondeterministic kernel here, whose re-run could give other bits: "
                               "torch.use_deterministic_algorithms(True) lets memplan re-run it", *nondet)
                 : fmt::format("; {} runs a nondeterministic kernel here, whose re-run could give other bits, "
                               "and PyTorch has no deterministic one for it", *nondet);
  }
  const bool only_nondet = std::all_of(names.begin(), names.end(), [](const std::string& n) {
    return has_nondeterministic_kernel(n);
  });
  return fmt::format(
      "{} of saved activations cannot be evicted: forward ops memplan cannot re-run make them, or "
      "rebuilding them would need those ops ({}{}){}",
      format_bytes(g.unrebuildable_bytes), list,
      only_nondet              ? ""
      : nondet != names.end()  ? ": a torch.compile'd graph, a custom autograd.Function or a nondeterministic kernel"
                               : ": a torch.compile'd graph or a custom autograd.Function",
      hints) + (apart.empty() ? "" : "; " + apart);
}

std::vector<int64_t> Graph::compaction_candidates() const {
  std::vector<int64_t> out;
  for (size_t v = 0; v < compact_bytes.size(); ++v) {
    if (compact_bytes[v] > 0) out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

std::vector<int64_t> Graph::eviction_candidates() const {
  std::vector<int64_t> out;
  for (size_t v = 0; v < evictable.size(); ++v) {
    if (evictable[v] && first_unpack[v] >= 0) out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

int64_t Graph::per_op_share(int64_t cap, int64_t work) const {
  return std::max<int64_t>(1, std::min(cap, work / std::max<int64_t>(1, n_fwd)));
}

}  // namespace memplan::planner
