#include "planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "planner/chain_dp.h"
#include "planner/whole_graph.h"
#include "planner/plan_builder.h"
#include "profiler/bytes.h"

namespace memplan::planner {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string sweep_key(const std::vector<Sweep>& sw) {
  std::string k;
  for (const Sweep& s : sw) {
    k += fmt::format("[{}-{}:", s.first, s.last);
    for (const SweepStep& st : s.steps) k += fmt::format("{}{}{},", st.block, to_string(st.mode), st.option);
    k += "]";
  }
  return k;
}

}  // namespace

bool Planner::prepare(const Profile& p, const PlannerOptions& opt, std::string* error) {
  try {
    prof_ = p;
    if (!build_graph(prof_, &graph_, error)) return false;
    if (!opt.compact_masks) {
      std::fill(graph_.compact_bytes.begin(), graph_.compact_bytes.end(), 0);
      std::fill(graph_.op_mask.begin(), graph_.op_mask.end(), -1);
    }
    const Graph& g = graph_;
    blocks_ = make_blocks(g, opt.blocks);
    const size_t L = blocks_.size();
    stats_ = PlannerStats{};
    stats_.blocks = static_cast<int>(L);

    // Option menus, one solve per distinct block.
    auto t0 = Clock::now();
    auto solver = make_cbc_solver();
    const double ilp_total =
        opt.ilp_total_s >= 0 ? opt.ilp_total_s : std::min(20.0, 1.0 + 0.0015 * static_cast<double>(g.n_fwd));
    menus_.assign(L, {});
    std::vector<BlockProblem> problems(L);
    std::vector<BlockSolves> solves(L);
    for (size_t i = 0; i < L; ++i) {
      if (blocks_[i].shape_id != static_cast<int>(i)) continue;
      ++stats_.distinct_blocks;
      const int64_t out_sep = i + 1 < L ? blocks_[i + 1].input : -1;
      problems[i] = make_block_problem(g, blocks_[i], out_sep);
      solves[i] = start_block(problems[i]);
    }
    // Every block's coarse grid first, then the fine points while time is left.
    IlpOptions io = opt.ilp;
    io.deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ilp_total));
    for (bool coarse_pass : {true, false}) {
      if (!coarse_pass && g.n_fwd > opt.fine_max_ops) break;
      for (size_t i = 0; i < L; ++i)
        if (blocks_[i].shape_id == static_cast<int>(i)) solve_grid(problems[i], *solver, io, coarse_pass, &solves[i]);
    }
    for (size_t i = 0; i < L; ++i) {
      if (blocks_[i].shape_id != static_cast<int>(i)) continue;
      menus_[i] = make_menu(problems[i], solves[i], opt.ilp);
      stats_.ilp_solves += menus_[i].solves;
      stats_.ilp_optimal += menus_[i].optimal;
      stats_.ilp_timeouts += menus_[i].timeouts;
    }
    stats_.ilp_s = since(t0);

    // The chain in memory units.
    t0 = Clock::now();
    // The unit is set by the coarse options (all of them where a menu has no flags), so that the
    // coarse chain below is the one a coarse menu alone would give; `worst` (for the slots) is
    // over every option.
    int64_t total = 0, worst_coarse = 0, worst = 0;
    for (size_t i = 0; i < L; ++i) {
      const BlockMenu& mu = menus_[blocks_[i].shape_id];
      int64_t smax = 0;
      const int64_t next_c = i + 1 < L ? blocks_[i + 1].input_bytes : 0;
      worst_coarse = std::max(worst_coarse, next_c + mu.ff_overhead);
      worst = std::max(worst, next_c + mu.ff_overhead);
      for (size_t k = 0; k < mu.options.size(); ++k) {
        const BlockOption& o = mu.options[k];
        const int64_t peak = std::max(next_c + o.size_a_bar + o.overhead_fwd, o.size_a_bar + o.overhead_bwd);
        worst = std::max(worst, peak);
        if (k < mu.coarse.size() && !mu.coarse[k]) continue;
        smax = std::max(smax, o.size_a_bar);
        worst_coarse = std::max(worst_coarse, peak);
      }
      total += blocks_[i].input_bytes + smax;
    }
    const int slots = std::max(10, opt.mem_slots);
    const int64_t unit = std::max<int64_t>(1, (total + worst_coarse + slots - 1) / slots);
    stats_.unit_bytes = unit;
    auto units = [&](int64_t b) { return static_cast<int>((b + unit - 1) / unit); };
    // Two chains: every option of each menu, and the coarse grid's options alone
    // (BlockMenu::coarse: the finer menu can steer the DP's rounded model to schedules the
    // simulator finds slower). `index[i][k]`: chain option k of block i in its menu.
    struct IndexedChain {
      Chain ch;
      std::vector<std::vector<int>> index;
    };
    auto make_chain = [&](bool coarse_only) {
      IndexedChain ic;
      Chain& ch = ic.ch;
      ch.c.assign(L + 1, 0);
      for (size_t i = 0; i < L; ++i) ch.c[i] = units(blocks_[i].input_bytes);
      ch.c[0] = 0;  // the chain's input is persistent or absent
      ch.opts.resize(L);
      ic.index.resize(L);
      ch.rerun.assign(L, 1);
      for (size_t i = 0; i < L; ++i) {
        for (int64_t o = blocks_[i].first; o <= blocks_[i].last; ++o) ch.rerun[i] = ch.rerun[i] && g.rerunnable[o];
        const BlockMenu& mu = menus_[blocks_[i].shape_id];
        ch.ff.push_back(mu.ff_time);
        ch.off.push_back(units(mu.ff_overhead));
        for (size_t k = 0; k < mu.options.size(); ++k) {
          if (coarse_only && !(k < mu.coarse.size() && mu.coarse[k])) continue;
          const BlockOption& o = mu.options[k];
          ch.opts[i].push_back({o.time_fwd, o.time_bwd, units(o.size_a_bar), units(o.overhead_fwd),
                                units(o.overhead_bwd)});
          ic.index[i].push_back(static_cast<int>(k));
        }
      }
      return ic;
    };
    bool has_coarse = false;  // some menu has options beyond the coarse ones
    for (size_t i = 0; i < L; ++i) {
      const BlockMenu& mu = menus_[blocks_[i].shape_id];
      has_coarse = has_coarse || std::count(mu.coarse.begin(), mu.coarse.end(), 1) <
                                     static_cast<std::ptrdiff_t>(mu.options.size());
    }
    // The coarse chain first: a schedule only the full menus give is marked `fine` below.
    std::vector<IndexedChain> chains;
    if (has_coarse) chains.push_back(make_chain(true));
    chains.push_back(make_chain(false));
    // Enough slots for the keep-everything schedule even after every size was rounded up, and for
    // every option's peak.
    int M = units(worst) + 2;
    for (size_t i = 0; i < L; ++i) {
      int smax = 0;
      for (const ChainOption& o : chains.back().ch.opts[i]) smax = std::max(smax, o.s);
      M += chains.back().ch.c[i + 1] + smax;
    }
    std::vector<DpTable> tables;
    for (const IndexedChain& ic : chains) tables.push_back(dp_fill(ic.ch, M));
    stats_.dp_s = since(t0);

    // Candidates: the empty plan, and the plan of every distinct schedule over all slots.
    t0 = Clock::now();
    cands_.clear();
    Plan empty;
    for (const Block& b : blocks_) empty.schedule.push_back({b.first, b.last, Mode::Fe, 0});
    SimResult es = simulate(g, empty);
    unplanned_peak_ = std::max(prof_.peak_bytes, es.ok ? es.peak : 0);
    cands_.push_back({empty, es.ok ? es.peak : prof_.peak_bytes, g.step_time_us, -1});
    std::set<std::string> seen;
    std::vector<Sweep> sweeps;
    for (size_t t = 0; t < chains.size(); ++t) {
      for (int m = 0; m <= M; ++m) {
        if (!dp_schedule(chains[t].ch, tables[t], m, &sweeps)) continue;
        for (Sweep& sw : sweeps)
          for (SweepStep& st : sw.steps)
            if (st.mode == Mode::Fe) st.option = chains[t].index[st.block][st.option];
        if (!seen.insert(sweep_key(sweeps)).second) continue;
        Candidate c;
        c.slot = m;
        c.fine = has_coarse && t + 1 == chains.size();
        build_actions(g, blocks_, menus_, sweeps, &c.plan);
        SimResult s = simulate(g, c.plan);
        if (!s.ok) continue;  // cannot happen by construction; never emit such a plan
        c.peak = s.peak;
        c.time_us = s.time_us;
        cands_.push_back(std::move(c));
      }
    }
    // Whole-graph eviction plans (no block structure): more candidates for the same pick.
    // Below the lowest block/DP plan only those that recompute at most one forward pass' worth:
    // lower ones cascade into rebuilds of rebuilds (+400-800% on the recorded profiles). Long
    // skips (a U-Net's) leave the chain few cuts and the DP little to choose from: there these
    // plans are the useful ones (U-Net probe: minimum 81% of activations -> 44%, at +35%).
    // (The coarse menus' lowest: the fine menus' own schedules move no whole-graph plan in or out.)
    int64_t dp_min = cands_.front().peak;
    for (const Candidate& c : cands_)
      if (!c.fine) dp_min = std::min(dp_min, c.peak);
    const double cascade_us = g.step_time_us + g.fwd_time_us;
    // With dropout masks, solved as the replay would run: masks compact (whole_graph.h). Solving
    // both views found no better plans on the GPT-2 profile and doubled this stage (8 s vs 5 s).
    const bool has_masks = !g.compaction_candidates().empty();
    for (WholeGraphPlan& w : whole_graph_plans(g, blocks_, *solver, opt.whole_graph, has_masks)) {
      if (w.peak < dp_min && w.time_us > cascade_us) continue;
      Candidate c;
      c.slot = -2;
      c.plan = std::move(w.plan);
      c.peak = w.peak;
      c.time_us = w.time_us;
      cands_.push_back(std::move(c));
    }
    // Every candidate again with each dropout mask it does not evict kept compact (compaction.md):
    // far cheaper per byte than re-running dropout, so it usually replaces evictions; the pick
    // (and the local search) decides.
    if (has_masks) {
      const size_t n = cands_.size();
      for (size_t k = 0; k < n; ++k) {
        if (!cands_[k].plan.compactions.empty()) continue;  // made with masks compact already
        Candidate c;
        c.slot = cands_[k].slot == -1 ? -4 : cands_[k].slot;
        c.fine = cands_[k].fine;
        c.plan = cands_[k].plan;
        add_compactions(g, nullptr, &c.plan);
        if (c.plan.compactions.empty()) continue;
        SimResult s = simulate(g, c.plan);
        if (!s.ok) continue;
        c.peak = s.peak;
        c.time_us = s.time_us;
        // The masks it evicts kept compact too: dropouts it re-runs become `input x mask`.
        std::vector<char> evict(g.prof->values.size(), 0);
        bool evicts_mask = false;
        for (const Eviction& e : cands_[k].plan.evictions) {
          evict[e.value] = g.compact_bytes[e.value] > 0 ? 0 : 1;
          evicts_mask = evicts_mask || g.compact_bytes[e.value] > 0;
        }
        if (evicts_mask) {
          Candidate t;
          t.slot = -5;
          t.fine = cands_[k].fine;
          build_eviction_actions(g, blocks_, evict, std::vector<char>(evict.size(), 0), 1, &t.plan);
          add_compactions(g, nullptr, &t.plan);
          SimResult ts = simulate(g, t.plan);
          if (ts.ok) {
            t.peak = ts.peak;
            t.time_us = ts.time_us;
            cands_.push_back(std::move(t));
          }
        }
        cands_.push_back(std::move(c));
      }
    }
    auto by_peak = [](const Candidate& a, const Candidate& b) {
      return a.peak != b.peak ? a.peak < b.peak : a.time_us < b.time_us;
    };
    std::stable_sort(cands_.begin(), cands_.end(), by_peak);
    // Local search (refine.h) from the best candidate at a grid of budgets between the minimum
    // and the un-planned peak; what it finds joins the candidates. Done here, not per budget, so
    // that a budget's pick stays the fastest fitting candidate of one fixed set: predicted time
    // never grows with the budget.
    if (opt.refine.enabled && g.n_fwd <= opt.refine.max_ops && opt.refine.levels > 0) {
      // The levels start at the lowest peak of the candidates that are not the fine menus' own,
      // so that those menus move no level (a level's search is greedy: moved, it can end slower),
      // plus one at the lowest peak of all where that is lower.
      const int64_t lo_all = cands_.front().peak;
      int64_t lo = lo_all;
      for (const Candidate& c : cands_)
        if (!c.fine) {
          lo = c.peak;
          break;
        }
      const int levels = static_cast<int>(g.per_op_share(opt.refine.levels, opt.refine.level_ops));
      std::vector<int64_t> grid;
      if (lo_all < lo) grid.push_back(lo_all);
      for (int k = 0; k < levels; ++k) grid.push_back(lo + (unplanned_peak_ - lo) * k / levels);
      std::vector<Candidate> found;
      for (const int64_t level : grid) {
        // From the fastest candidate that fits, and from the fastest without the fine menus'
        // schedules when that is another: a search is greedy, and a faster start can end slower
        // (transformer3 profile at 42%: +10.9% from a fine schedule, +9.8% from a coarse one).
        const Candidate* best = nullptr;
        const Candidate* best_coarse = nullptr;
        for (const Candidate& c : cands_) {
          if (c.peak > level) continue;
          if (!best || c.time_us < best->time_us) best = &c;
          if (!c.fine && (!best_coarse || c.time_us < best_coarse->time_us)) best_coarse = &c;
        }
        for (const Candidate* from : {best, best_coarse == best ? nullptr : best_coarse}) {
          if (from == nullptr || from->slot == -1) continue;
          Refined rf = refine_evictions(g, blocks_, from->plan, from->time_us, level, opt.refine);
          stats_.refine_sims += rf.sims;
          if (!rf.improved) continue;
          Candidate c;
          c.slot = -3;
          c.plan = std::move(rf.plan);
          c.peak = rf.sim.peak;
          c.time_us = rf.sim.time_us;
          found.push_back(std::move(c));
        }
      }
      for (Candidate& c : found) cands_.push_back(std::move(c));
      std::stable_sort(cands_.begin(), cands_.end(), by_peak);
    }
    stats_.candidates = static_cast<int>(cands_.size());
    stats_.candidates_s = since(t0);
    return true;
  } catch (const std::exception& e) {
    *error = fmt::format("planner failed: {}", e.what());
    return false;
  } catch (...) {
    *error = "planner failed";
    return false;
  }
}

PlanResult Planner::plan_for(const Budget& b) const {
  PlanResult r;
  try {
    const int64_t budget = budget_bytes(b, prof_);
    const Candidate* pick = nullptr;
    if (b.kind == Budget::Kind::None || budget >= unplanned_peak_) {
      for (const Candidate& c : cands_)
        if (c.slot == -1) pick = &c;
      r.messages.push_back(b.kind == Budget::Kind::None
                               ? "no budget: the empty plan"
                               : fmt::format("budget {} is at or above the un-planned peak {}: the empty plan",
                                             format_bytes(budget), format_bytes(unplanned_peak_)));
    } else {
      for (const Candidate& c : cands_)  // sorted by peak: the fastest that fits, lowest peak on ties
        if (c.peak <= budget && (!pick || c.time_us < pick->time_us)) pick = &c;
    }
    const std::string unrebuildable = unrebuildable_note(graph_);
    if (!unrebuildable.empty()) r.messages.push_back(unrebuildable);
    bool feasible = pick != nullptr;
    if (!pick) {
      pick = &cands_.front();
      r.messages.push_back(fmt::format(
          "budget {} ({:.1f}% of activation memory) is below the minimum feasible {} ({:.1f}%); "
          "using the minimum-memory plan",
          format_bytes(budget), activation_percent(budget, prof_), format_bytes_up(pick->peak),
          activation_percent(pick->peak, prof_)));
    }
    r.plan = pick->plan;
    r.origin = pick->slot == -2   ? "whole-graph ILP"
               : pick->slot == -3 ? "local search"
               : pick->slot == -4 ? "mask compaction"
               : pick->slot == -5 ? "eviction set of a candidate with its masks compact"
                                  : "blocks";
    Plan& pl = r.plan;
    pl.version = kPlanVersion;
    pl.profile_hash = prof_.op_hash;
    pl.budget_bytes = budget;
    pl.baseline_bytes = prof_.baseline_bytes;
    pl.unplanned_peak_bytes = unplanned_peak_;
    pl.unplanned_time_us = graph_.step_time_us;
    pl.min_feasible_bytes = min_feasible();
    pl.feasible = feasible;
    r.sim = simulate(graph_, pl);
    if (!r.sim.ok) {
      r.error = "internal: the chosen plan fails the simulator: " + r.sim.error;
      return r;
    }
    pl.predicted_peak_bytes = r.sim.peak;
    pl.predicted_time_us = r.sim.time_us;
    r.ok = true;
  } catch (const std::exception& e) {
    r.error = fmt::format("planner failed: {}", e.what());
  } catch (...) {
    r.error = "planner failed";
  }
  return r;
}

PlanResult make_plan(const Profile& p, const Budget& b, const PlannerOptions& opt) {
  Planner pl;
  PlanResult r;
  if (!pl.prepare(p, opt, &r.error)) return r;
  return pl.plan_for(b);
}

}  // namespace memplan::planner
