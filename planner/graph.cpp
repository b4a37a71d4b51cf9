#include "planner/graph.h"

#include <algorithm>

#include <fmt/format.h>

namespace memplan::planner {

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
      G.natural_end[v] = val.unpacked_by.empty() ? G.end_pos() : nf + G.last_unpack[v];
    } else {
      G.natural_end[v] = G.last_fwd_use[v];
    }
  }

  // Inputs: which op last exposed each tensor (same storage and shape) before op i: its producer,
  // or a view/in-place op. Matching the shape keeps `W` apart from an earlier `W.t()`.
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
      for (auto it = ex.rbegin(); it != ex.rend(); ++it) {
        if (*it->shape == t.shape) {
          src = it->op;
          break;
        }
      }
      auto& d = G.deps[i];
      if (std::none_of(d.begin(), d.end(), [&](const Dep& x) { return x.value == t.value && x.src == src; }))
        d.push_back({t.value, src});
    }
    for (const TensorRef& t : op.outputs) {
      if (t.value >= 0 && p.values[t.value].producer <= i) exposed[t.value].push_back({i, &t.shape});
    }
    G.workspace[i] = std::max<int64_t>(0, op.peak - std::max(op.live_before, op.live_after));
    G.fwd_time_us += op.time_us;
  }
  for (int64_t j = 0; j < nb; ++j) {
    const Op& n = p.backward[j];
    G.bwd_workspace[j] = std::max<int64_t>(0, n.peak - std::max(n.live_before, n.live_after));
    G.bwd_time_us += n.time_us;
  }

  // Evictable: an activation autograd saved and a later backward node unpacks, that nothing else
  // holds, that no op modifies in place after its producer (re-running that op would clobber it).
  std::vector<char> mutated(nv, 0);
  for (int64_t i = 0; i < nf; ++i) {
    const Op& op = p.forward[i];
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
  G.step_time_us = (p.forward_us + p.backward_us > 0) ? p.forward_us + p.backward_us
                                                      : G.fwd_time_us + G.bwd_time_us;
  return true;
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
