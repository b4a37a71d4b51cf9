#include "planner/report.h"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "planner/simulate.h"
#include "profiler/bytes.h"

namespace memplan::planner {

std::string format_summary(const Planner& pl, const PlanResult& r, bool list_blocks) {
  const Profile& p = pl.profile();
  const Plan& plan = r.plan;
  std::string s;
  s += fmt::format("profile: {} forward ops, {} backward nodes, {} values; baseline {}, peak {} "
                   "(activation {})\n",
                   p.forward.size(), p.backward.size(), p.values.size(), format_bytes(p.baseline_bytes),
                   format_bytes(p.peak_bytes), format_bytes(p.activation_bytes()));
  s += fmt::format("budget: {} ({:.1f}% of activation memory); minimum feasible {} ({:.1f}%)\n",
                   format_bytes(plan.budget_bytes), activation_percent(plan.budget_bytes, p),
                   format_bytes_up(plan.min_feasible_bytes), activation_percent(plan.min_feasible_bytes, p));
  const PlannerStats& st = pl.stats();
  s += fmt::format("blocks: {} ({} distinct), {} candidate plans\n", st.blocks, st.distinct_blocks,
                   st.candidates);
  const bool blocks = r.origin == "blocks";
  if (r.origin == "mask compaction")
    s += "schedule: dropout masks kept compact, nothing evicted (block modes unused)\n";
  else if (!blocks)
    s += fmt::format("schedule: per-value evictions from the {} (block modes unused)\n", r.origin);
  if (list_blocks && blocks) {
    s += "  block  ops          input        candidates  options  mode\n";
    for (size_t i = 0; i < pl.blocks().size(); ++i) {
      const Block& b = pl.blocks()[i];
      int64_t cand = 0;
      for (int64_t v : b.cand) cand += pl.graph().bytes(v);
      const BlockChoice& c = plan.schedule[i];
      std::string mode = c.mode == Mode::Fe ? fmt::format("Fe{}", c.option) : to_string(c.mode);
      s += fmt::format("  {:<6} {:<12} {:<12} {:<11} {:<8} {}\n", i, fmt::format("{}-{}", b.first, b.last),
                       b.input >= 0 ? format_bytes(b.input_bytes) : "-", format_bytes(cand),
                       pl.menu(i).options.size(), mode);
    }
  }
  size_t rec_ops = 0;
  for (const Recompute& rc : plan.recomputes) rec_ops += rc.ops.size();
  s += fmt::format("actions: {} evictions, {} holds, {} recomputes ({} ops), {} releases\n",
                   plan.evictions.size(), plan.holds.size(), plan.recomputes.size(), rec_ops,
                   plan.releases.size());
  if (!plan.compactions.empty()) {
    int64_t full = 0, small = 0;
    for (int64_t v : plan.compactions) {
      full += pl.graph().bytes(v);
      small += pl.graph().compact_bytes[v];
    }
    s += fmt::format("compact: {} dropout masks, {} kept as {}\n", plan.compactions.size(),
                     format_bytes(full), format_bytes(small));
  }
  const double over = plan.unplanned_time_us > 0
                          ? 100.0 * (plan.predicted_time_us / plan.unplanned_time_us - 1.0)
                          : 0.0;
  s += fmt::format("predicted peak {} ({:.1f}%) vs un-planned {}; time {:.1f} us vs {:.1f} us "
                   "(+{:.1f}%){}\n",
                   format_bytes(plan.predicted_peak_bytes), activation_percent(plan.predicted_peak_bytes, p),
                   format_bytes(plan.unplanned_peak_bytes), plan.predicted_time_us, plan.unplanned_time_us,
                   over, plan.feasible ? "" : "  [INFEASIBLE: budget below minimum]");
  for (const std::string& m : r.messages) s += "note: " + m + "\n";
  return s;
}

std::string format_sweep(const Planner& pl, int rows) {
  const Profile& p = pl.profile();
  std::string s = "  budget      % act   predicted peak   time overhead\n";
  const double lo = activation_percent(pl.min_feasible(), p);
  for (int k = 0; k < rows; ++k) {
    const double pct = rows > 1 ? lo + (100.0 - lo) * k / (rows - 1) : 100.0;
    Budget b{Budget::Kind::Percent, 0, std::min(100.0, pct)};
    PlanResult r = pl.plan_for(b);
    if (!r.ok) {
      s += fmt::format("  {:>6.1f}%  error: {}\n", pct, r.error);
      continue;
    }
    const double over = 100.0 * (r.plan.predicted_time_us / r.plan.unplanned_time_us - 1.0);
    s += fmt::format("  {:<11} {:>5.1f}   {:<16} +{:.1f}%\n", format_bytes(r.plan.budget_bytes), pct,
                     format_bytes(r.plan.predicted_peak_bytes), over);
  }
  return s;
}

bool format_timeline_diff(const Profile& prof, const Plan& plan, const Profile& replay, int64_t step_bytes,
                          std::string* out, std::string* error) {
  if (replay.forward.size() != prof.forward.size() || replay.backward.size() != prof.backward.size()) {
    *error = fmt::format("the replayed step has {} forward ops and {} backward nodes, the profile {} and {}",
                         replay.forward.size(), replay.backward.size(), prof.forward.size(), prof.backward.size());
    return false;
  }
  for (const auto& [what, mine, theirs] : {std::tuple{"forward op", &prof.forward, &replay.forward},
                                           std::tuple{"backward node", &prof.backward, &replay.backward}}) {
    if (const int64_t i = first_other_op(*mine, *theirs); i >= 0) {
      *error = fmt::format("{} {} is {} in the replayed step, {} in the profile", what, i, (*theirs)[i].name,
                           (*mine)[i].name);
      return false;
    }
  }
  Graph g;
  if (!build_graph(prof, &g, error)) return false;
  const SimResult sim = simulate(g, plan);
  if (!sim.ok) {
    *error = "the plan fails the simulator: " + sim.error;
    return false;
  }
  // Compared with the recorder's convention for a recompute's memory (the op or node before).
  std::vector<int64_t> fwd_pred, bwd_pred;
  recorded_peaks(plan, sim, &fwd_pred, &bwd_pred);
  // Measured numbers are put on the profile's baseline, as the report's measured peaks are.
  const int64_t shift = prof.baseline_bytes - replay.baseline_bytes;
  std::string text = fmt::format("{:>5} {:<44} {:>12} {:>12} {:>12} {:>12}\n", "", "op", "live diff",
                                 "peak diff", "predicted", "measured");
  int64_t last_live = 0, last_peak = 0, top_measured = 0, top_predicted = 0, excess = 0;
  std::string top_measured_at, top_predicted_at, excess_at = "-";
  auto row = [&](const std::string& where, const Op& op, int64_t pred_live, int64_t pred_peak) {
    const int64_t live = op.live_after + shift, peak = std::max({op.peak, op.live_before, op.live_after}) + shift;
    const int64_t dl = live - pred_live, dp = peak - pred_peak;
    if (peak > top_measured) top_measured = peak, top_measured_at = where;
    if (pred_peak > top_predicted) top_predicted = pred_peak, top_predicted_at = where;
    if (dp > excess) excess = dp, excess_at = where;
    if (std::llabs(dl - last_live) <= step_bytes && std::llabs(dp - last_peak) <= step_bytes) return;
    text += fmt::format("{:>5} {:<44} {:>+12} {:>+12} {:>12} {:>12}\n", where, op.name.substr(0, 44), dl, dp,
                        format_bytes(pred_peak), format_bytes(peak));
    last_live = dl;
    last_peak = dp;
  };
  for (size_t i = 0; i < prof.forward.size(); ++i) {
    row(fmt::format("f{}", i), replay.forward[i], sim.fwd_live[i], fwd_pred[i]);
  }
  for (size_t j = 0; j < prof.backward.size(); ++j) {
    row(fmt::format("b{}", j), replay.backward[j], sim.bwd_live[j], bwd_pred[j]);
  }
  *out = fmt::format("measured peak {} at {}, predicted {} at {} ({:+.1f}%); largest excess over the predicted "
                     "peak of an op or node: {} B at {}\nrows where measured minus predicted changes by more "
                     "than {} B (live after the op, peak during it):\n",
                     format_bytes(top_measured), top_measured_at, format_bytes(top_predicted), top_predicted_at,
                     top_predicted > 0 ? 100.0 * (static_cast<double>(top_measured) / top_predicted - 1) : 0.0,
                     excess, excess_at, step_bytes) +
         text;
  return true;
}

}  // namespace memplan::planner
