#include "planner/refine.h"

#include "planner/plan_builder.h"

namespace memplan::planner {

Refined refine_evictions(const Graph& g, const std::vector<Block>& blocks, const Plan& start,
                         double start_time_us, int64_t budget, const RefineOptions& opt) {
  Refined out;
  if (!opt.enabled || g.n_fwd > opt.max_ops || start.empty()) return out;
  const int64_t max_sims = g.per_op_share(opt.max_sims, opt.sim_ops);
  const size_t nv = g.prof->values.size();
  const std::vector<int64_t> cands = g.eviction_candidates();
  const std::vector<int64_t> masks = g.compaction_candidates();
  const std::vector<char> no_hold(nv, 0);
  std::vector<char> cur(nv, 0), cmp(nv, 0);  // evicted / kept compact (evicted wins)
  for (const Eviction& e : start.evictions) {
    if (e.value >= 0 && static_cast<size_t>(e.value) < nv) cur[e.value] = 1;
  }
  for (int64_t v : start.compactions) {
    if (v >= 0 && static_cast<size_t>(v) < nv) cmp[v] = 1;
  }
  double best_time = start_time_us;
  // Tries one state; keeps it as the round's best move when it fits and beats everything so far.
  std::vector<char> move, move_cmp;
  Plan move_plan;
  SimResult move_sim;
  auto consider = [&](const std::vector<char>& set, const std::vector<char>& compact) {
    ++out.sims;
    Plan p;
    build_eviction_actions(g, blocks, set, no_hold, /*keep_byproducts=*/1, &p);
    add_compactions(g, &compact, &p);
    SimResult s = simulate(g, p);
    if (!s.ok || s.peak > budget || s.time_us >= best_time - 1e-6) return;
    best_time = s.time_us;
    move = set;
    move_cmp = compact;
    move_plan = std::move(p);
    move_sim = std::move(s);
  };
  while (out.sims < max_sims) {
    move.clear();
    for (int64_t v : cands) {
      if (out.sims >= max_sims) break;
      std::vector<char> set = cur;
      set[v] ^= 1;
      consider(set, cmp);
      if (cur[v] && g.compact_bytes[v] > 0 && !cmp[v] && out.sims < max_sims) {
        std::vector<char> compact = cmp;  // an evicted mask kept compact instead, in one move
        compact[v] = 1;
        consider(set, compact);
      }
    }
    for (int64_t v : masks) {
      if (out.sims >= max_sims) break;
      std::vector<char> compact = cmp;
      compact[v] ^= 1;
      if (!cur[v]) consider(cur, compact);
    }
    if (move.empty()) {  // no single change helps: try swaps
      for (int64_t a : cands) {
        if (!cur[a]) continue;
        for (int64_t b : cands) {
          if (cur[b] || out.sims >= max_sims) continue;
          std::vector<char> set = cur;
          set[a] = 0;
          set[b] = 1;
          consider(set, cmp);
        }
      }
    }
    if (move.empty()) break;
    cur = move;
    cmp = move_cmp;
    out.improved = true;
    out.plan = move_plan;
    out.sim = move_sim;
  }
  return out;
}

}  // namespace memplan::planner
