#include "planner/blocks.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace memplan::planner {

namespace {

// Whether a value made in the step can cross a cut: one that something besides autograd holds
// past the forward (the batch and targets a script draws in the step, with torch.randint: ops of
// the step, read by the first op and by the loss) is alive wherever a re-run reads it, as an
// input from before the step is; counted, the targets alone would cross every cut of the chain.
bool crosses(const Graph& g, int64_t v) {
  const Value& val = g.prof->values[v];
  return val.producer >= 0 && !val.held_outside;
}

// crossing[i] = non-persistent values live across the cut after op i (produced <= i, read > i).
std::vector<int> crossings(const Graph& g) {
  std::vector<int> diff(g.n_fwd + 1, 0);
  const auto& vals = g.prof->values;
  for (size_t v = 0; v < vals.size(); ++v) {
    int64_t p = vals[v].producer;
    if (!crosses(g, static_cast<int64_t>(v)) || g.last_fwd_use[v] <= p) continue;
    diff[p] += 1;
    diff[g.last_fwd_use[v]] -= 1;
  }
  std::vector<int> c(g.n_fwd, 0);
  int run = 0;
  for (int64_t i = 0; i < g.n_fwd; ++i) c[i] = (run += diff[i]);
  return c;
}

// The one value crossing the cut after op i (when crossing[i] == 1).
int64_t crossing_value(const Graph& g, int64_t i) {
  const auto& vals = g.prof->values;
  for (int64_t v = 0; v < static_cast<int64_t>(vals.size()); ++v) {
    int64_t p = vals[v].producer;
    if (crosses(g, v) && p <= i && g.last_fwd_use[v] > i) return v;
  }
  return -1;
}

// Canonical text of a block: op names, shapes, sizes and the local wiring. Values produced inside
// are named by (local op, output slot); the block input is "in"; other values by size only.
std::string signature(const Graph& g, const Block& b) {
  const Profile& p = *g.prof;
  std::map<int64_t, std::string> local;
  for (int64_t i = b.first; i <= b.last; ++i)
    for (size_t k = 0; k < g.produces[i].size(); ++k)
      local[g.produces[i][k]] = fmt::format("{}.{}", i - b.first, k);
  auto name = [&](int64_t v) -> std::string {
    if (v == b.input) return "in";
    auto it = local.find(v);
    if (it != local.end()) return it->second;
    return fmt::format("x{}", g.bytes(v));
  };
  std::string s;
  for (int64_t i = b.first; i <= b.last; ++i) {
    const Op& op = p.forward[i];
    s += fmt::format("{}.{}(", op.name, op.overload);
    for (const Dep& d : g.deps[i])
      s += fmt::format("{}@{}{},", name(d.value), d.src >= b.first ? fmt::format("{}", d.src - b.first) : "-",
                       d.stale ? "!" : "");
    s += ")->";
    for (int64_t v : g.produces[i]) {
      const Value& val = p.values[v];
      s += fmt::format("{}:{}:{}:{},", val.bytes, g.evictable[v] ? 1 : 0,
                       val.saved_by.empty() ? 0 : 1,
                       g.last_unpack[v] >= b.anchor ? 1 : 0);
    }
    s += fmt::format("w{};", g.workspace[i]);
  }
  s += fmt::format("|in{}|c", b.input_bytes);
  for (int64_t v : b.cand) s += name(v) + ",";
  return s;
}

}  // namespace

std::vector<Block> make_blocks(const Graph& g, const BlockOptions& opt) {
  std::vector<Block> out;
  if (g.n_fwd == 0) return out;
  std::vector<int> cross = crossings(g);
  // No cut between an op and a later one that reads what it made after a write replaced it
  // (relu_ of a BatchNorm output, the cut between them a separator): the block's re-run could
  // not remake that input from the block's own ops, and a checkpoint of it holds the written one.
  std::vector<int> split(g.n_fwd + 1, 0);
  for (int64_t o = 0; o < g.n_fwd; ++o)
    for (const Dep& d : g.deps[o])
      if (d.stale && d.src < o) {
        ++split[d.src];
        --split[o];
      }
  // Atomic segments end at every separator.
  std::vector<int64_t> ends;
  for (int64_t i = 0, inside = 0; i + 1 < g.n_fwd; ++i)
    if ((inside += split[i]) == 0 && cross[i] <= 1) ends.push_back(i);
  ends.push_back(g.n_fwd - 1);

  // Merge: first to at least min_ops ops, then evenly to at most max_blocks.
  std::vector<int64_t> merged;
  int64_t start = 0;
  for (int64_t e : ends) {
    if (e - start + 1 >= opt.min_ops || e == g.n_fwd - 1) {
      merged.push_back(e);
      start = e + 1;
    }
  }
  if (merged.size() > 1 && merged.size() >= 2) {
    // A short tail joins its predecessor.
    int64_t prev = merged[merged.size() - 2];
    if (merged.back() - prev < opt.min_ops) merged.erase(merged.end() - 2);
  }
  if (static_cast<int64_t>(merged.size()) > opt.max_blocks) {
    const double target = static_cast<double>(g.n_fwd) / opt.max_blocks;
    std::vector<int64_t> coarse;
    int64_t s = 0;
    for (int64_t e : merged) {
      if (e - s + 1 >= target || e == g.n_fwd - 1) {
        coarse.push_back(e);
        s = e + 1;
      }
    }
    merged.swap(coarse);
  }

  int64_t first = 0;
  for (int64_t e : merged) {
    Block b;
    b.first = first;
    b.last = e;
    if (first > 0 && cross[first - 1] == 1) {
      b.input = crossing_value(g, first - 1);
      b.input_bytes = g.bytes(b.input);
    }
    out.push_back(b);
    first = e + 1;
  }

  // Anchors: the first backward node that belongs to the block or unpacks what it owns; then a
  // prefix minimum so that a later block's anchor never comes after an earlier block's (the
  // backward visits blocks in reverse; a recompute sweep over blocks a..b runs at b's anchor and
  // must precede every block it serves).
  const Profile& p = *g.prof;
  std::vector<int64_t> block_of(g.n_fwd, 0);
  for (size_t k = 0; k < out.size(); ++k)
    for (int64_t i = out[k].first; i <= out[k].last; ++i) block_of[i] = static_cast<int64_t>(k);
  std::vector<int64_t> t(out.size(), g.n_bwd);
  for (int64_t j = 0; j < g.n_bwd; ++j) {
    int64_t f = p.backward[j].fwd_op;
    if (f >= 0) t[block_of[f]] = std::min(t[block_of[f]], j);
  }
  for (int64_t v = 0; v < static_cast<int64_t>(p.values.size()); ++v) {
    if (g.first_unpack[v] < 0 || g.persistent[v]) continue;
    int64_t k = block_of[g.producer(v)];
    t[k] = std::min(t[k], g.first_unpack[v]);
  }
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k].input >= 0 && g.first_unpack[out[k].input] >= 0)
      t[k] = std::min(t[k], g.first_unpack[out[k].input]);
  }
  int64_t run = g.n_bwd;
  for (size_t k = 0; k < out.size(); ++k) out[k].anchor = run = std::min(run, t[k]);

  // Candidates: evictable values produced in the block, except its output separator, that are
  // still needed at (or after) the anchor.
  for (size_t k = 0; k < out.size(); ++k) {
    Block& b = out[k];
    int64_t next_in = k + 1 < out.size() ? out[k + 1].input : -1;
    for (int64_t i = b.first; i <= b.last; ++i)
      for (int64_t v : g.produces[i])
        if (g.evictable[v] && v != next_in && g.first_unpack[v] >= b.anchor) b.cand.push_back(v);
  }
  std::map<std::string, int> ids;
  for (size_t k = 0; k < out.size(); ++k) {
    out[k].signature = signature(g, out[k]);
    auto [it, fresh] = ids.emplace(out[k].signature, static_cast<int>(k));
    out[k].shape_id = it->second;
    (void)fresh;
  }
  return out;
}

}  // namespace memplan::planner
