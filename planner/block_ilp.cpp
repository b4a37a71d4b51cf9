#include "planner/block_ilp.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace memplan::planner {

BlockProblem make_block_problem(const Graph& g, const Block& b, int64_t out_separator) {
  const Profile& p = *g.prof;
  BlockProblem bp;
  bp.n_ops = static_cast<int>(b.last - b.first + 1);
  std::map<int64_t, int> cand_index;
  for (int64_t v : b.cand) {
    cand_index[v] = static_cast<int>(bp.cand_bytes.size());
    bp.cand_bytes.push_back(g.bytes(v));
    bp.cand_op.push_back(static_cast<int>(g.producer(v) - b.first));
  }
  for (int64_t i = b.first; i <= b.last; ++i) {
    const int o = static_cast<int>(i - b.first);
    bp.time.push_back(p.forward[i].time_us);
    bp.rerunnable.push_back(g.rerunnable[i]);
    bp.out_bytes.push_back(g.out_bytes[i]);
    bp.fwd_time += p.forward[i].time_us;
    for (const Dep& d : g.deps[i]) {
      // Block input, persistent, or earlier: available (never stale: make_blocks keeps a read
      // of what a later write replaced in one block with its maker).
      if (d.src < b.first) continue;
      const int s = static_cast<int>(d.src - b.first);
      if (d.src != g.producer(d.value) || d.stale) {
        // a view/in-place op re-exposed it, or a write replaced it: rerun that op too
        bp.must.push_back({o, s});
        continue;
      }
      auto it = cand_index.find(d.value);
      if (it != cand_index.end())
        bp.cond.push_back({o, s, it->second});
      else if (!(g.stuck[d.src] && g.natural_end[d.value] >= g.n_fwd))
        bp.must.push_back({o, s});
      // else: its maker cannot re-run, but autograd keeps it into backward: read where it is
      // (Graph::stuck; the simulator checks it is still there)
    }
  }
  // Backward of the block: its nodes' times and how far memory grows above the level it starts at.
  int64_t start_live = -1, top = 0;
  for (int64_t j = 0; j < g.n_bwd; ++j) {
    const Op& n = p.backward[j];
    if (n.fwd_op < b.first || n.fwd_op > b.last) continue;
    bp.bwd_time += n.time_us;
    if (start_live < 0) start_live = n.live_before;
    top = std::max(top, n.peak);
  }
  if (start_live >= 0) bp.bwd_growth = std::max<int64_t>(0, top - start_live);

  // No-grad forward: run the ops, free each created value at its last use inside the block,
  // keep only the output separator.
  std::map<int64_t, int64_t> last_use;
  for (int64_t i = b.first; i <= b.last; ++i)
    for (const Dep& d : g.deps[i]) last_use[d.value] = i;
  int64_t cur = 0, peak = 0;
  std::vector<std::vector<int64_t>> frees(bp.n_ops);
  for (int64_t i = b.first; i <= b.last; ++i)
    for (int64_t v : g.produces[i]) {
      if (v == out_separator) continue;
      auto it = last_use.find(v);
      int64_t at = it == last_use.end() ? i : std::max(i, it->second);
      frees[at - b.first].push_back(v);
    }
  for (int64_t i = b.first; i <= b.last; ++i) {
    cur += g.out_bytes[i];
    peak = std::max(peak, cur + g.workspace[i]);
    for (int64_t v : frees[i - b.first]) cur -= g.bytes(v);
  }
  const int64_t out_b = out_separator >= 0 ? g.bytes(out_separator) : 0;
  bp.ff_overhead = std::max<int64_t>(0, peak - out_b);
  return bp;
}

namespace {

void fill_numbers(const BlockProblem& bp, BlockOption* o) {
  o->time_fwd = bp.fwd_time;
  o->time_bwd = bp.bwd_time;
  int64_t rebuilt = 0;
  for (int i = 0; i < bp.n_ops; ++i)
    if (o->rerun[i]) {
      o->time_bwd += bp.time[i];
      rebuilt += bp.out_bytes[i];
    }
  o->size_a_bar = 0;
  for (size_t c = 0; c < bp.cand_bytes.size(); ++c)
    if (!o->evict[c]) o->size_a_bar += bp.cand_bytes[c];
  o->overhead_fwd = bp.ff_overhead;
  o->overhead_bwd = rebuilt + bp.bwd_growth;
}

// Evicting a candidate whose producer reruns anyway costs no time: do it.
void evict_free_riders(const BlockProblem& bp, BlockOption* o) {
  for (size_t c = 0; c < bp.cand_op.size(); ++c)
    if (o->rerun[bp.cand_op[c]]) o->evict[c] = 1;
}

}  // namespace

BlockOption closure_option(const BlockProblem& bp, const std::vector<char>& evict) {
  BlockOption o;
  o.evict = evict;
  o.rerun.assign(bp.n_ops, 0);
  std::vector<std::vector<int>> need(bp.n_ops);  // o -> ops it needs when rerun
  for (auto [a, s] : bp.must) need[a].push_back(s);
  for (const auto& c : bp.cond)
    if (evict[c[2]]) need[c[0]].push_back(c[1]);
  std::vector<int> work;
  for (size_t c = 0; c < evict.size(); ++c)
    if (evict[c]) work.push_back(bp.cand_op[c]);
  while (!work.empty()) {
    int x = work.back();
    work.pop_back();
    if (o.rerun[x]) continue;
    o.rerun[x] = 1;
    for (int y : need[x]) work.push_back(y);
  }
  fill_numbers(bp, &o);
  o.source = "closure";
  return o;
}

MilpStatus solve_block_point(const BlockProblem& bp, MilpSolver& solver, int64_t save_budget,
                             int64_t all_budget, const MilpLimits& limits, BlockOption* out,
                             bool* clock_stopped) {
  const int nc = static_cast<int>(bp.cand_bytes.size());
  auto op_ok = [&](int o) { return o >= 0 && o < bp.n_ops; };
  bool sane = bp.cand_op.size() == bp.cand_bytes.size() && static_cast<int>(bp.time.size()) == bp.n_ops &&
              static_cast<int>(bp.out_bytes.size()) == bp.n_ops;
  for (int o : bp.cand_op) sane = sane && op_ok(o);
  for (auto [o, p] : bp.must) sane = sane && op_ok(o) && op_ok(p);
  for (const auto& k : bp.cond) sane = sane && op_ok(k[0]) && op_ok(k[1]) && k[2] >= 0 && k[2] < nc;
  if (!sane) return MilpStatus::Error;
  // Bytes are scaled to keep CBC's coefficients moderate.
  double scale = 1;
  int64_t big = std::max<int64_t>({1, save_budget, all_budget});
  while (big / scale > 1e7) scale *= 1024;
  MilpProblem m;
  std::vector<int> e(nc), r(bp.n_ops);
  for (int c = 0; c < nc; ++c) e[c] = m.add_var(0, 0, 1, true);
  for (int o = 0; o < bp.n_ops; ++o)
    r[o] = m.add_var(bp.time[o] + 1e-6, 0, o < static_cast<int>(bp.rerunnable.size()) && !bp.rerunnable[o] ? 0 : 1, true);
  for (int c = 0; c < nc; ++c) m.add_row({{e[c], r[bp.cand_op[c]]}, {1, -1}, -1e30, 0});
  for (auto [o, p] : bp.must) m.add_row({{r[o], r[p]}, {1, -1}, -1e30, 0});
  for (const auto& k : bp.cond) m.add_row({{r[k[0]], r[k[1]], e[k[2]]}, {1, -1, 1}, -1e30, 1});
  // Kept bytes = total - sum e_c bytes_c.
  double total = 0;
  for (int64_t b : bp.cand_bytes) total += b / scale;
  MilpRow save, all;
  for (int c = 0; c < nc; ++c) {
    save.idx.push_back(e[c]);
    save.coef.push_back(-bp.cand_bytes[c] / scale);
    all.idx.push_back(e[c]);
    all.coef.push_back(-bp.cand_bytes[c] / scale);
  }
  for (int o = 0; o < bp.n_ops; ++o) {
    all.idx.push_back(r[o]);
    all.coef.push_back(bp.out_bytes[o] / scale);
  }
  save.hi = save_budget / scale - total + 1e-9;
  all.hi = all_budget / scale - total + 1e-9;
  m.add_row(save);
  m.add_row(all);
  MilpResult res = solver.solve(m, limits);
  if (clock_stopped != nullptr) *clock_stopped = res.clock_stopped;
  if (!res.has_solution()) return res.status;
  BlockOption o;
  o.evict.assign(nc, 0);
  o.rerun.assign(bp.n_ops, 0);
  for (int c = 0; c < nc; ++c) o.evict[c] = res.x[e[c]] > 0.5;
  for (int k = 0; k < bp.n_ops; ++k) o.rerun[k] = res.x[r[k]] > 0.5;
  evict_free_riders(bp, &o);
  fill_numbers(bp, &o);
  o.source = "ilp";
  *out = std::move(o);
  return res.status;
}

// Pareto: drop duplicates and options no better in any of time, kept bytes, backward overhead;
// sorted by kept bytes, largest first; at most max_options, both ends and evenly spaced between.
static std::vector<BlockOption> pareto_front(const std::vector<BlockOption>& all, int max_options) {
  auto dominated = [](const BlockOption& a, const BlockOption& b) {  // b dominates a
    return b.time_bwd <= a.time_bwd && b.size_a_bar <= a.size_a_bar &&
           b.overhead_bwd <= a.overhead_bwd &&
           (b.time_bwd < a.time_bwd || b.size_a_bar < a.size_a_bar || b.overhead_bwd < a.overhead_bwd);
  };
  std::vector<BlockOption> front;
  for (size_t i = 0; i < all.size(); ++i) {
    bool drop_it = false;
    for (size_t j = 0; j < all.size() && !drop_it; ++j) {
      if (i == j) continue;
      if (dominated(all[i], all[j])) drop_it = true;
      if (j < i && all[j].time_bwd == all[i].time_bwd && all[j].size_a_bar == all[i].size_a_bar &&
          all[j].overhead_bwd == all[i].overhead_bwd)
        drop_it = true;
    }
    if (!drop_it) front.push_back(all[i]);
  }
  std::sort(front.begin(), front.end(), [](const BlockOption& a, const BlockOption& b) {
    return a.size_a_bar != b.size_a_bar ? a.size_a_bar > b.size_a_bar : a.time_bwd < b.time_bwd;
  });
  if (static_cast<int>(front.size()) > max_options) {
    // Keep both ends and evenly spaced ones between (sorted by kept bytes).
    std::vector<BlockOption> few;
    const int n = static_cast<int>(front.size()), k = max_options;
    for (int i = 0; i < k; ++i) few.push_back(front[static_cast<size_t>(i) * (n - 1) / (k - 1)]);
    front.swap(few);
  }
  return front;
}

BlockSolves start_block(const BlockProblem& bp) {
  BlockSolves sv;
  const size_t nc = bp.cand_bytes.size();
  BlockOption keep = closure_option(bp, std::vector<char>(nc, 0));
  keep.source = "keep-all";
  BlockOption drop = closure_option(bp, std::vector<char>(nc, 1));
  drop.source = "evict-all";
  sv.all.push_back(std::move(keep));
  sv.all.push_back(std::move(drop));
  sv.on_coarse.assign(2, 1);
  return sv;
}

void solve_grid(const BlockProblem& bp, MilpSolver& solver, const IlpOptions& opt, bool coarse_pass,
                BlockSolves* sv) {
  const size_t nc = bp.cand_bytes.size();
  if (!opt.use_ilp || nc == 0) return;
  const int64_t total_c = std::accumulate(bp.cand_bytes.begin(), bp.cand_bytes.end(), int64_t{0});
  const int64_t total_out = std::accumulate(bp.out_bytes.begin(), bp.out_bytes.end(), int64_t{0});
  const int64_t a_max = total_c + total_out;
  for (int i = 0; i < opt.grid_save; ++i) {
    const int64_t s = opt.grid_save > 1 ? total_c * i / (opt.grid_save - 1) : total_c;
    const bool coarse_s = opt.grid_save <= 1 || opt.coarse_save <= 1
                              ? i == opt.grid_save - 1
                              : (i * (opt.coarse_save - 1)) % (opt.grid_save - 1) == 0;
    for (int k = 1; k <= opt.grid_all; ++k) {
      const int64_t a = a_max * k / opt.grid_all;
      const bool coarse = coarse_s && opt.coarse_all > 0 && (k * opt.coarse_all) % opt.grid_all == 0;
      if (coarse != coarse_pass) continue;
      const double left =
          std::chrono::duration<double>(opt.deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return;
      BlockOption o;
      MilpStatus st =
          solve_block_point(bp, solver, s, a, MilpLimits{std::max(0.01, std::min(opt.solve_time_s, left))}, &o);
      ++sv->solves;
      if (st == MilpStatus::Optimal) ++sv->optimal;
      if (st == MilpStatus::Feasible || st == MilpStatus::NoSolution) ++sv->timeouts;
      if (st == MilpStatus::Optimal || st == MilpStatus::Feasible) {
        sv->all.push_back(std::move(o));
        sv->on_coarse.push_back(coarse ? 1 : 0);
      }
    }
  }
}

BlockMenu make_menu(const BlockProblem& bp, const BlockSolves& sv, const IlpOptions& opt) {
  BlockMenu menu;
  menu.ff_time = bp.fwd_time;
  menu.ff_overhead = bp.ff_overhead;
  menu.solves = sv.solves;
  menu.optimal = sv.optimal;
  menu.timeouts = sv.timeouts;
  const std::vector<BlockOption>& all = sv.all;
  const std::vector<char>& on_coarse = sv.on_coarse;
  std::vector<BlockOption> fine = pareto_front(all, opt.max_options);
  std::vector<BlockOption> coarse_all;
  for (size_t i = 0; i < all.size(); ++i)
    if (on_coarse[i]) coarse_all.push_back(all[i]);
  std::vector<BlockOption> coarse = pareto_front(coarse_all, std::max(2, opt.max_options / 2));
  // The menu: the fine front, then each coarse option it lacks; flags say which are coarse.
  auto same = [](const BlockOption& a, const BlockOption& b) {
    return a.evict == b.evict && a.rerun == b.rerun;
  };
  menu.options = std::move(fine);
  menu.coarse.assign(menu.options.size(), 0);
  for (BlockOption& c : coarse) {
    size_t j = 0;
    while (j < menu.options.size() && !same(menu.options[j], c)) ++j;
    if (j == menu.options.size()) {
      menu.options.push_back(std::move(c));
      menu.coarse.push_back(1);
    } else {
      menu.coarse[j] = 1;
    }
  }
  return menu;
}

BlockMenu solve_block(const BlockProblem& bp, MilpSolver& solver, const IlpOptions& opt) {
  BlockSolves sv = start_block(bp);
  solve_grid(bp, solver, opt, true, &sv);
  solve_grid(bp, solver, opt, false, &sv);
  return make_menu(bp, sv, opt);
}

}  // namespace memplan::planner
