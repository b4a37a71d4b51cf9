// plan-bench: planning time on synthetic transformer-like and ResNet-like profiles of about 100,
// 1,000 and 10,000 forward ops, at budgets 100/70/50/33% of activation memory and the minimum.
//   plan-bench                      the table
//   plan-bench --max-ops N          skip sizes above N (--min-ops N: below N)
//   Each size also prints where its preparing went: ILP solves, the DP, the candidates.
//   plan-bench --write-profile transformer|resnet UNITS OUT.json   write one synthetic profile
#include <chrono>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "planner/planner.h"
#include "planner/synth.h"
#include "profiler/profile_io.h"

using namespace memplan;
using namespace memplan::planner;

int main(int argc, char** argv) {
  int64_t max_ops = 20000, min_ops = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--write-profile" && i + 3 < argc) {
      const std::string kind = argv[i + 1];
      const int n = std::atoi(argv[i + 2]);
      Profile p = kind == "resnet" ? synth_resnet(n) : synth_transformer(n);
      std::string err;
      if (!write_profile_file(argv[i + 3], p, &err)) {
        fmt::print(stderr, "{}\n", err);
        return 1;
      }
      return 0;
    }
    if (a == "--max-ops" && i + 1 < argc) max_ops = std::atoll(argv[++i]);
    if (a == "--min-ops" && i + 1 < argc) min_ops = std::atoll(argv[++i]);
  }
  using Clock = std::chrono::steady_clock;
  struct Case { const char* kind; int units; };
  const Case cases[] = {{"transformer", 7},   {"resnet", 10},   {"transformer", 76},
                        {"resnet", 110},      {"transformer", 768}, {"resnet", 1110}};
  fmt::print("{:<12} {:>6} {:>7} {:>9} {:>8} {:>9} {:>10} {:>10} {:>9}\n", "profile", "ops", "blocks",
             "distinct", "budget", "plan_s", "prepare_s", "peak%act", "time+%");
  for (const Case& c : cases) {
    Profile p = std::string(c.kind) == "resnet" ? synth_resnet(c.units) : synth_transformer(c.units);
    if (static_cast<int64_t>(p.forward.size()) > max_ops || static_cast<int64_t>(p.forward.size()) < min_ops)
      continue;
    // Budget-independent work once (what the agent does), then each budget end to end.
    auto t0 = Clock::now();
    Planner pl;
    std::string err;
    if (!pl.prepare(p, PlannerOptions{}, &err)) {
      fmt::print("{}: {}\n", c.kind, err);
      continue;
    }
    const double prep = std::chrono::duration<double>(Clock::now() - t0).count();
    const PlannerStats& st = pl.stats();
    fmt::print("{:<12} {:>6}   prepare: ILP {:.2f} s ({} solves, {} stopped by the clock), DP {:.2f} s, "
               "candidates {:.2f} s ({} local-search simulations)\n",
               c.kind, p.forward.size(), st.ilp_s, st.ilp_solves, st.ilp_timeouts, st.dp_s, st.candidates_s,
               st.refine_sims);
    const double min_pct = 100.0 * (pl.min_feasible() - p.baseline_bytes) / p.activation_bytes();
    struct B { const char* name; double pct; };
    const B budgets[] = {{"100%", 100}, {"70%", 70}, {"50%", 50}, {"33%", 33}, {"min", min_pct}};
    for (const B& b : budgets) {
      auto t1 = Clock::now();
      PlanResult r = make_plan(p, Budget{Budget::Kind::Percent, 0, b.pct});
      const double s = std::chrono::duration<double>(Clock::now() - t1).count();
      const double peak = 100.0 * (r.plan.predicted_peak_bytes - p.baseline_bytes) / p.activation_bytes();
      const double over = 100.0 * (r.plan.predicted_time_us / r.plan.unplanned_time_us - 1);
      fmt::print("{:<12} {:>6} {:>7} {:>9} {:>8} {:>9.3f} {:>10.3f} {:>9.1f}% {:>8.1f}%{}\n", c.kind,
                 p.forward.size(), pl.stats().blocks, pl.stats().distinct_blocks, b.name, s, prep, peak,
                 over, r.plan.feasible ? "" : " (infeasible)");
    }
  }
  return 0;
}
