// Where a kind's plan comes from: the user's plan file (MEMPLAN_PLAN), the plan cache
// (MEMPLAN_PLAN_CACHE), or the planner, aimed a little under the budget; and the facts the report
// and the summary tell of it (PlanInfo).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "agent/agent.h"
#include "agent/log.h"
#include "agent/options.h"
#include "planner/budget.h"
#include "planner/plan_io.h"
#include "planner/planner.h"
#include "profiler/bytes.h"
#include "profiler/nvtx_ranges.h"
#include "profiler/op_hash.h"

namespace memplan {

// A plan for `p`, and its summary facts. `variant` tells apart in the plan cache plans for
// records of the same ops (the same op hash).
Agent::PlanRecord Agent::make_plan(const Profile& p, const std::string& variant) {
  PlanRecord rec;
  rec.kind = p.signature;
  rec.record_step = p.step;
  rec.structure = p.structure_signature;
  rec.data_dependent = std::any_of(p.forward.begin(), p.forward.end(), data_dependent_shape);
  rec.ops = OpSequence(p.forward);
  rec.planned = std::make_shared<const Profile>(p);
  const auto t0 = std::chrono::steady_clock::now();
  {
    nvtx::ScopedRange range("memplan/plan");
    std::optional<planner::Plan> plan = obtain_plan(p, &rec.info, variant);
    if (plan && !plan->empty()) rec.replayer = std::make_unique<Replayer>(p, std::move(*plan));
  }
  // Planning is reported on its own ("planning took"), kept out of the iteration's wall time (it
  // runs at a backward's end, or once at a step's first op: plan_without_gradients).
  last_backward_end_ += std::chrono::steady_clock::now() - t0;
  return rec;
}

namespace {
constexpr int64_t kReplayMargin = 2;  // percent of the activation memory, see obtain_plan

std::string budget_key(const Budget& b) {
  if (b.kind == Budget::Kind::Bytes) return fmt::format("b{}", b.bytes);
  if (b.kind == Budget::Kind::Percent) return fmt::format("p{:g}", b.percent);
  return "none";
}
}  // namespace

// A plan for `profile`: MEMPLAN_PLAN's file if it belongs to this profile, else the cache's,
// else a fresh one (then cached). Never throws; nullopt means run without one.
std::optional<planner::Plan> Agent::obtain_plan(const Profile& profile, PlanInfo* out, const std::string& variant) {
  const Options& opt = options();
  std::string error;
  *out = PlanInfo{};
  out->baseline = profile.baseline_bytes;
  out->unplanned_peak = profile.peak_bytes;
  // A kind whose steps ran over their prediction with other sizes (check_sizes): planned that much
  // under the budget, predicted that much over the record's simulation. Never a user's plan file.
  const auto room = headroom_.find(profile.signature);
  const int64_t headroom = opt.plan.empty() && room != headroom_.end() ? room->second : 0;
  auto accept = [&](planner::Plan plan, const std::string& from) -> std::optional<planner::Plan> {
    out->budget = plan.budget_bytes;
    out->headroom = headroom;
    out->predicted_peak = plan.predicted_peak_bytes + headroom;
    out->predicted_time_us = plan.predicted_time_us;
    out->unplanned_time_us = plan.unplanned_time_us;
    out->feasible = plan.feasible;
    out->min_feasible = plan.min_feasible_bytes;
    out->source = from;
    out->evictions = static_cast<int64_t>(plan.evictions.size());
    out->recomputes = static_cast<int64_t>(plan.recomputes.size());
    out->rerun_ops = 0;
    for (const planner::Recompute& r : plan.recomputes) out->rerun_ops += static_cast<int64_t>(r.ops.size());
    return plan;
  };
  if (!opt.plan.empty()) {
    planner::Plan plan;
    if (!planner::read_plan_file(opt.plan, &plan, &error)) {
      warn("MEMPLAN_PLAN={}: {}; planning from the profile instead", opt.plan, error);
    } else if (plan.profile_hash != profile.op_hash) {
      warn("MEMPLAN_PLAN={} is for another op sequence (profile hash {} vs {}); planning from the "
           "profile instead",
           opt.plan, plan.profile_hash, profile.op_hash);
    } else {
      // A plan the user gave is honoured even if the simulator disagrees with it: correctness
      // never depends on the plan (a tensor needed before its recompute is rebuilt on demand).
      if (!planner::validate_plan(plan, profile, &error)) {
        warn("MEMPLAN_PLAN={} fails the simulator ({}); using it as given", opt.plan, error);
      }
      return accept(std::move(plan), opt.plan);
    }
  }
  if (opt.budget.kind == Budget::Kind::None) return std::nullopt;
  std::string cache;
  if (!opt.plan_cache.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opt.plan_cache, ec);
    cache = fmt::format("{}/plan-{}-{}-rank{}{}{}.json", opt.plan_cache, profile.op_hash, budget_key(opt.budget),
                        profile.rank, variant, headroom > 0 ? fmt::format("-headroom-{}", headroom) : "");
    planner::Plan plan;
    if (std::filesystem::exists(cache, ec)) {
      if (planner::read_plan_file(cache, &plan, &error) && planner::validate_plan(plan, profile, &error)) {
        info("plan loaded from the cache: {}", cache);
        return accept(std::move(plan), cache);
      }
      warn("ignoring cached plan {}: {}", cache, error);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  // Aim a little under the budget: what the simulator cannot see (allocator rounding, tensors the
  // script allocates differently from one step to the next) measured under 0.5% of the
  // activation memory on the demo model; 2% keeps the measured peak under the budget. Fall back
  // to the budget itself when the margin makes it infeasible.
  // The budget-independent work (blocks, ILP menus, candidates) is done once for both tries.
  planner::Planner pl;
  if (!pl.prepare(profile, {}, &error)) {
    warn("no plan ({}); running plain PyTorch", error);
    return std::nullopt;
  }
  const int64_t requested_bytes = planner::budget_bytes(opt.budget, profile);
  planner::Budget target;  // the budget less the kind's headroom, if any
  target.kind = planner::Budget::Kind::Bytes;
  target.bytes = requested_bytes - headroom;
  planner::PlanResult r;
  if (target.bytes < profile.peak_bytes) {
    planner::Budget aimed = target;
    aimed.bytes -= kReplayMargin * (profile.peak_bytes - profile.baseline_bytes) / 100;
    r = pl.plan_for(aimed);
  }
  if (!r.ok || !r.plan.feasible) r = pl.plan_for(target);
  r.plan.budget_bytes = requested_bytes;
  out->planning_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.ok) {
    warn("no plan ({}); running plain PyTorch", r.error);
    return std::nullopt;
  }
  // Why less can be taken away than the user may expect (a torch.compile'd model): said once.
  if (!unrebuildable_said_) {
    const std::string note = planner::unrebuildable_note(pl.graph());
    if (!note.empty()) {
      warn("{}", note);
      unrebuildable_said_ = true;
    }
  }
  // The planner's own messages speak of the aimed budget; the user's budget is reported here.
  if (!r.plan.feasible && r.plan.min_feasible_bytes >= profile.peak_bytes) {
    warn("budget {} is below the minimum feasible for this step, its un-planned peak {}: no plan lowers it; "
         "it runs as it is",
         format_bytes(r.plan.budget_bytes), format_bytes(profile.peak_bytes));
  } else if (!r.plan.feasible) {
    warn("budget {}{} is below the minimum feasible {} for this step; running the minimum-memory plan",
         format_bytes(r.plan.budget_bytes),
         headroom > 0 ? fmt::format(" less {} for the sizes its steps took", format_bytes(headroom)) : "",
         format_bytes_up(r.plan.min_feasible_bytes));
  }
  if (!cache.empty() && !planner::write_plan_file(cache, r.plan, &error)) warn("plan not cached: {}", error);
  return accept(std::move(r.plan), "planned");
}

}  // namespace memplan
