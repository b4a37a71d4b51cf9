#include "planner/plan_builder.h"

#include <algorithm>
#include <map>
#include <set>

namespace memplan::planner {

namespace {

struct Builder {
  const Graph& g;
  std::vector<char> evicted, checkpoint, kept;
  int keep_byproducts = 0;  // keep evicted values an action recreates anyway (see .h)
  std::vector<int64_t> hold_until, last_read, keep_point;

  explicit Builder(const Graph& graph) : g(graph) {
    const size_t nv = g.prof->values.size();
    evicted.assign(nv, 0);
    checkpoint.assign(nv, 0);
    kept.assign(nv, 0);
    hold_until.assign(nv, -1);
    last_read.assign(nv, -1);
    keep_point.assign(nv, -1);
  }

  // Is u usable by the action before node j without rerunning its producer? Records why.
  bool available(int64_t u, int64_t j) {
    if (g.persistent[u]) return true;
    if (kept[u]) {
      last_read[u] = std::max(last_read[u], j);
      return true;
    }
    if (evicted[u]) return false;
    if (g.natural_end[u] >= g.n_fwd + j) return true;
    if (checkpoint[u]) {
      hold_until[u] = std::max(hold_until[u], j);
      return true;
    }
    return false;
  }

  // An op that saved an input saved the tensor it read: a view of `v` (flatten before a
  // classifier's linear) is re-made by re-running the op that made that view.
  void add_saved_views(int64_t v, int64_t j, std::set<int64_t>* ops) {
    for (int64_t s : g.prof->values[v].saved_by)
      for (const Dep& d : g.deps[s])
        if (d.value == v && d.src > g.producer(v)) add_op(d.src, j, ops);
  }

  void add_op(int64_t o, int64_t j, std::set<int64_t>* ops) {
    if (!ops->insert(o).second) return;
    for (const Dep& d : g.deps[o]) {
      // What the op read, alive as it was read (also through a view or an in-place result: the
      // replay views its storage again), is read where it is; otherwise the op that made or
      // exposed it runs again, also when a later write replaced it.
      if (d.src >= 0 && (d.stale || !available(d.value, j))) add_op(d.src, j, ops);
    }
  }
};

void emit_actions(const Graph& g, Builder& B, std::map<int64_t, std::vector<int64_t>>& targets,
                  Plan* plan);

}  // namespace

void build_actions(const Graph& g, const std::vector<Block>& blocks,
                   const std::vector<BlockMenu>& menus, const std::vector<Sweep>& sweeps,
                   Plan* plan) {
  Builder B(g);
  const size_t L = blocks.size();
  auto option = [&](size_t i, int k) -> const BlockOption& {
    return menus[blocks[i].shape_id].options[k];
  };
  std::vector<int64_t> owner(g.prof->values.size(), -1);
  for (size_t i = 0; i < L; ++i) {
    for (int64_t v : blocks[i].cand) owner[v] = static_cast<int64_t>(i);
    if (blocks[i].input >= 0) owner[blocks[i].input] = static_cast<int64_t>(i);
  }

  // The user's forward (sweep 0): what each block evicts, which inputs are checkpoints.
  plan->schedule.assign(L, {});
  for (size_t i = 0; i < L; ++i) plan->schedule[i] = {blocks[i].first, blocks[i].last, Mode::Fe, 0};
  if (!sweeps.empty()) {
    for (const SweepStep& s : sweeps[0].steps) {
      const Block& b = blocks[s.block];
      plan->schedule[s.block].mode = s.mode;
      plan->schedule[s.block].option = s.option;
      for (size_t c = 0; c < b.cand.size(); ++c)
        if (s.mode != Mode::Fe || option(s.block, s.option).evict[c]) B.evicted[b.cand[c]] = 1;
      if (b.input >= 0) {
        if (s.mode == Mode::Fn)
          B.evicted[b.input] = g.evictable[b.input];
        else
          B.checkpoint[b.input] = 1;
      }
    }
  }

  // Targets of each recompute point (a backward node index).
  std::map<int64_t, std::vector<int64_t>> targets;
  for (size_t s = 1; s < sweeps.size(); ++s) {
    const Sweep& sw = sweeps[s];
    auto& t = targets[blocks[sw.last].anchor];
    for (const SweepStep& st : sw.steps) {
      const Block& b = blocks[st.block];
      if (st.mode == Mode::Fn) continue;
      if (st.block > sw.first && b.input >= 0) t.push_back(b.input);
      if (st.mode == Mode::Fe)
        for (size_t c = 0; c < b.cand.size(); ++c)
          if (!option(st.block, st.option).evict[c]) t.push_back(b.cand[c]);
    }
  }
  for (size_t v = 0; v < B.evicted.size(); ++v) {
    if (!B.evicted[v]) continue;
    int64_t at = g.first_unpack[v];
    if (owner[v] >= 0) at = std::min(at, blocks[owner[v]].anchor);
    targets[at].push_back(static_cast<int64_t>(v));
  }
  emit_actions(g, B, targets, plan);
}

void build_eviction_actions(const Graph& g, const std::vector<Block>& blocks,
                            const std::vector<char>& evict, const std::vector<char>& checkpoint,
                            int keep_byproducts, Plan* plan) {
  Builder B(g);
  B.keep_byproducts = keep_byproducts;
  plan->schedule.clear();
  for (const Block& b : blocks) plan->schedule.push_back({b.first, b.last, Mode::Fe, 0});
  std::map<int64_t, std::vector<int64_t>> targets;
  for (size_t v = 0; v < evict.size() && v < B.evicted.size(); ++v) {
    if (!evict[v] || !g.evictable[v]) continue;
    B.evicted[v] = 1;
    targets[g.first_unpack[v]].push_back(static_cast<int64_t>(v));
  }
  for (size_t v = 0; v < checkpoint.size() && v < B.checkpoint.size(); ++v)
    if (checkpoint[v] && !g.persistent[v] && !B.evicted[v]) B.checkpoint[v] = 1;
  emit_actions(g, B, targets, plan);
}

namespace {

void emit_actions(const Graph& g, Builder& B, std::map<int64_t, std::vector<int64_t>>& targets,
                  Plan* plan) {
  for (auto& [j, want] : targets) {
    std::set<int64_t> ops;
    std::vector<int64_t> keep;
    for (int64_t v : want) {
      if (std::find(keep.begin(), keep.end(), v) != keep.end() || B.available(v, j)) continue;
      B.add_op(g.producer(v), j, &ops);
      B.add_saved_views(v, j, &ops);
      keep.push_back(v);
    }
    if (ops.empty()) continue;
    if (B.keep_byproducts) {
      int64_t lo = g.n_fwd;  // the earliest producer among this action's own targets
      for (int64_t v : keep) lo = std::min(lo, g.producer(v));
      std::vector<int64_t> byproducts;
      for (int64_t o : ops)
        for (int64_t v : g.produces[o])
          if (B.evicted[v] && !B.kept[v] && g.first_unpack[v] > j &&
              (B.keep_byproducts == 1 || o >= lo) &&
              std::find(keep.begin(), keep.end(), v) == keep.end())
            byproducts.push_back(v);
      // Kept as any target is, so with the views its savers read (Mixtral's router linear saves
      // a reshape of the normed hidden states: the replay re-ran that reshape unpriced).
      for (int64_t v : byproducts) {
        B.add_saved_views(v, j, &ops);
        keep.push_back(v);
      }
    }
    for (int64_t v : keep) {
      B.kept[v] = 1;
      B.keep_point[v] = j;
    }
    std::sort(keep.begin(), keep.end());
    plan->recomputes.push_back({j, std::vector<int64_t>(ops.begin(), ops.end()), keep});
  }

  // Releases. A kept value autograd still unpacks later is freed by autograd after its last
  // unpack; otherwise (a checkpoint, or read by a recompute after that) the agent drops it after
  // its last reader. A kept value nobody reads or unpacks is not kept at all.
  for (Recompute& r : plan->recomputes) {
    std::vector<int64_t> keep;
    for (int64_t v : r.keep) {
      const bool unpacked_later = g.last_unpack[v] >= r.before_bwd;
      if (!unpacked_later && B.last_read[v] < 0) {
        B.kept[v] = 0;
        continue;
      }
      keep.push_back(v);
      if (B.last_read[v] >= 0 && (!unpacked_later || B.last_read[v] > g.last_unpack[v]))
        plan->releases.push_back({v, B.last_read[v]});
    }
    r.keep.swap(keep);
  }
  for (size_t v = 0; v < B.hold_until.size(); ++v) {
    if (B.hold_until[v] < 0) continue;
    const int64_t val = static_cast<int64_t>(v);
    plan->holds.push_back({val, g.producer(val), B.hold_until[v]});
    plan->releases.push_back({val, B.hold_until[v]});
  }
  for (size_t v = 0; v < B.evicted.size(); ++v)
    if (B.evicted[v])
      plan->evictions.push_back({static_cast<int64_t>(v), g.last_fwd_use[v]});
  std::sort(plan->releases.begin(), plan->releases.end(), [](const Release& a, const Release& b) {
    return a.after_bwd != b.after_bwd ? a.after_bwd < b.after_bwd : a.value < b.value;
  });
}

}  // namespace

void add_compactions(const Graph& g, const std::vector<char>* want, Plan* plan) {
  std::vector<char> busy(g.prof->values.size(), 0);
  for (const Eviction& e : plan->evictions) busy[e.value] = 1;
  for (const Hold& h : plan->holds) busy[h.value] = 1;
  for (const Recompute& rc : plan->recomputes)
    for (int64_t v : rc.keep) busy[v] = 1;
  for (int64_t v : g.compaction_candidates())
    if (!busy[v] && (want == nullptr || (*want)[v])) plan->compactions.push_back(v);
}

}  // namespace memplan::planner
