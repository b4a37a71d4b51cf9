#include "planner/plan_io.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "planner/graph.h"
#include "planner/simulate.h"
#include "profiler/text_file.h"

namespace memplan::planner {

using nlohmann::json;

std::string plan_to_json(const Plan& p, int indent) {
  json j{{"format", "memplan-plan"},
         {"version", p.version},
         {"profile_hash", p.profile_hash},
         {"budget_bytes", p.budget_bytes},
         {"baseline_bytes", p.baseline_bytes},
         {"unplanned_peak_bytes", p.unplanned_peak_bytes},
         {"predicted_peak_bytes", p.predicted_peak_bytes},
         {"min_feasible_bytes", p.min_feasible_bytes},
         {"predicted_time_us", p.predicted_time_us},
         {"unplanned_time_us", p.unplanned_time_us},
         {"feasible", p.feasible}};
  j["schedule"] = json::array();
  for (const BlockChoice& b : p.schedule)
    j["schedule"].push_back({{"first_op", b.first_op}, {"last_op", b.last_op},
                             {"mode", to_string(b.mode)}, {"option", b.option}});
  j["evictions"] = json::array();
  for (const Eviction& e : p.evictions) j["evictions"].push_back({{"value", e.value}, {"after_fwd", e.after_fwd}});
  j["holds"] = json::array();
  for (const Hold& h : p.holds)
    j["holds"].push_back({{"value", h.value}, {"from_fwd", h.from_fwd}, {"until_bwd", h.until_bwd}});
  j["recomputes"] = json::array();
  for (const Recompute& r : p.recomputes)
    j["recomputes"].push_back({{"before_bwd", r.before_bwd}, {"ops", r.ops}, {"keep", r.keep}});
  j["releases"] = json::array();
  for (const Release& r : p.releases) j["releases"].push_back({{"value", r.value}, {"after_bwd", r.after_bwd}});
  j["compactions"] = p.compactions;
  return j.dump(indent);
}

bool plan_from_json(const std::string& text, Plan* out, std::string* error) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = "not valid JSON (truncated or corrupt file?)";
    return false;
  }
  Plan p;
  std::string where = "header";
  try {
    if (!j.is_object() || j.value("format", std::string()) != "memplan-plan") {
      *error = "not a memplan plan (missing \"format\": \"memplan-plan\")";
      return false;
    }
    p.version = j.at("version").get<int>();
    if (p.version != kPlanVersion) {
      *error = fmt::format("unknown plan version {} (this build reads version {})", p.version, kPlanVersion);
      return false;
    }
    p.profile_hash = j.at("profile_hash").get<std::string>();
    p.budget_bytes = j.at("budget_bytes").get<int64_t>();
    p.baseline_bytes = j.at("baseline_bytes").get<int64_t>();
    p.unplanned_peak_bytes = j.at("unplanned_peak_bytes").get<int64_t>();
    p.predicted_peak_bytes = j.at("predicted_peak_bytes").get<int64_t>();
    p.min_feasible_bytes = j.at("min_feasible_bytes").get<int64_t>();
    p.predicted_time_us = j.at("predicted_time_us").get<double>();
    p.unplanned_time_us = j.at("unplanned_time_us").get<double>();
    p.feasible = j.at("feasible").get<bool>();
    auto nonneg = [&](int64_t x, const char* what) {
      if (x < 0) throw std::runtime_error(fmt::format("negative {}", what));
      return x;
    };
    const auto& sched = j.at("schedule");
    for (size_t i = 0; i < sched.size(); ++i) {
      where = fmt::format("schedule[{}]", i);
      BlockChoice b;
      b.first_op = nonneg(sched[i].at("first_op").get<int64_t>(), "first_op");
      b.last_op = nonneg(sched[i].at("last_op").get<int64_t>(), "last_op");
      const std::string m = sched[i].at("mode").get<std::string>();
      if (m == "Fn") b.mode = Mode::Fn;
      else if (m == "Fc") b.mode = Mode::Fc;
      else if (m == "Fe") b.mode = Mode::Fe;
      else throw std::runtime_error(fmt::format("unknown mode \"{}\" (Fn, Fc or Fe)", m));
      b.option = sched[i].value("option", 0);
      if (b.last_op < b.first_op) throw std::runtime_error("last_op before first_op");
      p.schedule.push_back(b);
    }
    const auto& ev = j.at("evictions");
    for (size_t i = 0; i < ev.size(); ++i) {
      where = fmt::format("evictions[{}]", i);
      p.evictions.push_back({nonneg(ev[i].at("value").get<int64_t>(), "value"),
                             nonneg(ev[i].at("after_fwd").get<int64_t>(), "after_fwd")});
    }
    const auto& ho = j.at("holds");
    for (size_t i = 0; i < ho.size(); ++i) {
      where = fmt::format("holds[{}]", i);
      p.holds.push_back({nonneg(ho[i].at("value").get<int64_t>(), "value"),
                         nonneg(ho[i].at("from_fwd").get<int64_t>(), "from_fwd"),
                         nonneg(ho[i].at("until_bwd").get<int64_t>(), "until_bwd")});
    }
    const auto& rc = j.at("recomputes");
    for (size_t i = 0; i < rc.size(); ++i) {
      where = fmt::format("recomputes[{}]", i);
      Recompute r;
      r.before_bwd = nonneg(rc[i].at("before_bwd").get<int64_t>(), "before_bwd");
      r.ops = rc[i].at("ops").get<std::vector<int64_t>>();
      r.keep = rc[i].at("keep").get<std::vector<int64_t>>();
      for (int64_t o : r.ops) nonneg(o, "op index");
      for (int64_t v : r.keep) nonneg(v, "value index");
      p.recomputes.push_back(std::move(r));
    }
    const auto& rl = j.at("releases");
    for (size_t i = 0; i < rl.size(); ++i) {
      where = fmt::format("releases[{}]", i);
      p.releases.push_back({nonneg(rl[i].at("value").get<int64_t>(), "value"),
                            nonneg(rl[i].at("after_bwd").get<int64_t>(), "after_bwd")});
    }
    if (j.contains("compactions")) {  // optional: plans written before compaction have none
      where = "compactions";
      p.compactions = j.at("compactions").get<std::vector<int64_t>>();
      for (int64_t v : p.compactions) nonneg(v, "value index");
    }
  } catch (const std::exception& e) {
    *error = fmt::format("{}: {}", where, e.what());
    return false;
  }
  *out = std::move(p);
  return true;
}

bool write_plan_file(const std::string& path, const Plan& p, std::string* error) {
  return write_text_file(path, plan_to_json(p), error);
}

bool read_plan_file(const std::string& path, Plan* out, std::string* error) {
  std::string text;
  return read_text_file(path, &text, error) && plan_from_json(text, out, error);
}

bool validate_plan(const Plan& plan, const Profile& prof, std::string* error) {
  if (plan.profile_hash != prof.op_hash) {
    *error = fmt::format("plan is for profile hash '{}' but the profile's is '{}'", plan.profile_hash,
                         prof.op_hash);
    return false;
  }
  Graph g;
  if (!build_graph(prof, &g, error)) return false;
  for (const BlockChoice& b : plan.schedule)
    if (b.last_op >= g.n_fwd) {
      *error = fmt::format("schedule block {}..{} is beyond the {} forward ops", b.first_op, b.last_op, g.n_fwd);
      return false;
    }
  SimResult s = simulate(g, plan);
  if (!s.ok) {
    *error = s.error;
    return false;
  }
  return true;
}

}  // namespace memplan::planner
