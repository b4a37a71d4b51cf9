#include "planner/report.h"

#include <algorithm>

#include <fmt/format.h>

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

}  // namespace memplan::planner
