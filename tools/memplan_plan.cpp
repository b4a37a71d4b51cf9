// memplan-plan PROFILE [--budget B] [--sweep] [-o plan.json] [--no-blocks] [--no-whole-graph] [--no-local-search] [--no-compaction]
// memplan-plan PROFILE --plan PLAN --against REPLAYED [--step BYTES]
// Offline planning: prints the blocks, the chosen schedule and predicted peak/time vs the
// un-planned step. With --against: where a replayed step's recorded memory (MEMPLAN_LOG=debug
// writes them beside the profile, .replayN.json) departs from the simulator's timeline for PLAN.
// Exit status: 0 ok (also when the budget is below the minimum: the minimum-memory plan is
// printed and flagged), 2 bad arguments or a malformed profile, 3 internal.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "agent/options.h"
#include "planner/budget.h"
#include "planner/plan_io.h"
#include "planner/planner.h"
#include "planner/report.h"
#include "profiler/profile_io.h"

using namespace memplan;
using namespace memplan::planner;

namespace {

const char* kUsage =
    "usage: memplan-plan PROFILE [--budget B] [--sweep] [-o plan.json] [--no-blocks] [--no-whole-graph] [--no-local-search] [--no-compaction]\n"
    "       memplan-plan PROFILE --plan PLAN --against REPLAYED_STEP [--step BYTES]\n"
    "  B: bytes with a unit (300MiB, 1.5GB, 123456) or a percentage of activation memory (50%)\n"
    "  --against: where REPLAYED_STEP's memory (a record MEMPLAN_LOG=debug writes, .replayN.json) departs\n"
    "    from the simulator's timeline for PLAN (the plan it replayed); rows where the difference changes\n"
    "    by more than BYTES (default 4096)\n";

int usage(const std::string& why) {
  fmt::print(stderr, "memplan-plan: {} (see --help)\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, out, budget_text, plan_path, against_path;
  int64_t step_bytes = 4096;
  bool sweep = false, blocks = true;
  PlannerOptions popt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--budget" || a == "-b") {
      if (++i >= argc) return usage("--budget needs a value");
      budget_text = argv[i];
    } else if (a.rfind("--budget=", 0) == 0) {
      budget_text = a.substr(9);
    } else if (a == "-o" || a == "--output") {
      if (++i >= argc) return usage("-o needs a path");
      out = argv[i];
    } else if (a == "--plan" || a == "--against" || a == "--step") {
      if (++i >= argc) return usage(a + " needs a value");
      if (a == "--plan") {
        plan_path = argv[i];
      } else if (a == "--against") {
        against_path = argv[i];
      } else {
        char* end = nullptr;
        step_bytes = std::strtoll(argv[i], &end, 10);
        if (end == argv[i] || *end != '\0' || step_bytes < 0) return usage("--step needs a byte count");
      }
    } else if (a == "--sweep") {
      sweep = true;
    } else if (a == "--no-blocks") {
      blocks = false;
    } else if (a == "--no-whole-graph") {
      popt.whole_graph.enabled = false;
    } else if (a == "--no-local-search") {
      popt.refine.enabled = false;
    } else if (a == "--no-compaction") {
      popt.compact_masks = false;
    } else if (a == "-h" || a == "--help") {
      fmt::print("{}", kUsage);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      return usage(fmt::format("unknown option {}", a));
    } else if (path.empty()) {
      path = a;
    } else {
      return usage(fmt::format("unexpected argument {}", a));
    }
  }
  if (path.empty()) return usage("no profile given");
  Budget budget;
  std::string err;
  if (!budget_text.empty() && !memplan::parse_budget(budget_text, &budget)) {
    return usage(fmt::format("bad budget '{}': expected bytes with an optional unit (B, KiB, MiB, GiB, "
                             "TiB, KB, MB, GB, TB), e.g. 300MiB, or a percentage of activation memory, "
                             "e.g. 50%",
                             budget_text));
  }

  Profile prof;
  if (!read_profile_file(path, &prof, &err)) {
    fmt::print(stderr, "memplan-plan: {}: {}\n", path, err);
    return 2;
  }
  if (!against_path.empty() || !plan_path.empty()) {
    if (against_path.empty() || plan_path.empty()) return usage("--plan and --against go together");
    Plan plan;
    Profile replay;
    std::string text;
    if (!read_plan_file(plan_path, &plan, &err) || !read_profile_file(against_path, &replay, &err)) {
      fmt::print(stderr, "memplan-plan: {}\n", err);
      return 2;
    }
    if (!format_timeline_diff(prof, plan, replay, step_bytes, &text, &err)) {
      fmt::print(stderr, "memplan-plan: {}\n", err);
      return 2;
    }
    fmt::print("{}", text);
    return 0;
  }
  Planner pl;
  if (!pl.prepare(prof, popt, &err)) {
    fmt::print(stderr, "memplan-plan: {}: {}\n", path, err);
    return 2;
  }
  PlanResult r = pl.plan_for(budget);
  if (!r.ok) {
    fmt::print(stderr, "memplan-plan: {}\n", r.error);
    return 3;
  }
  fmt::print("{}", format_summary(pl, r, blocks));
  if (sweep) fmt::print("sweep (minimum to 100% of activation memory):\n{}", format_sweep(pl));
  if (!out.empty()) {
    if (!write_plan_file(out, r.plan, &err)) {
      fmt::print(stderr, "memplan-plan: {}\n", err);
      return 3;
    }
    fmt::print("wrote {}\n", out);
  }
  return 0;
}
