// What a run tells when it ends: the profile and trace files, the JSON report (MEMPLAN_REPORT) and
// the summary on stderr, one part per plan.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/log.h"
#include "agent/options.h"
#include "profiler/bytes.h"
#include "profiler/profile_io.h"
#include "profiler/summary.h"
#include "profiler/trace_export.h"

namespace memplan {

namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}
}  // namespace

void Agent::write_outputs() {
  if (outputs_written_ || profiles_.empty()) return;
  outputs_written_ = true;
  std::string error;
  if (!profile_path_.empty() && !write_profile_file(profile_path_, profiles_.back(), &error)) {
    warn("profile not written: {}", error);
    profile_path_.clear();
  }
  if (!trace_path_.empty() && !write_trace_file(trace_path_, profiles_, &error)) {
    warn("trace not written: {}", error);
    trace_path_.clear();
  }
}

void Agent::finish() {
  if (inert_ || finished_) return;
  finished_ = true;
  if (phase_ == Phase::Warmup) {
    remove_op_callbacks();
    write_outputs();
  }
  if (replay_profile_ && !trace_path_.empty()) {
    // The trace again, now with the first replayed step and the actions injected into it.
    std::vector<Profile> steps = profiles_;
    steps.push_back(*replay_profile_);
    std::string error;
    if (!write_trace_file(trace_path_, steps, &error, replay_actions_)) warn("trace not written: {}", error);
  }
  // A process that never ran a training step (torchrun's launcher, which imports torch too) has
  // nothing to report; writing anyway would, with one rank (no .rankN suffix), replace the rank's
  // report with an empty one as the launcher exits last.
  if (!options().report.empty() && steps_ > 0) {
    write_report(rank_path(options().report, env_rank(), env_world_size()));
  }
  if (!options().summary || profiles_.empty()) return;
  SummaryInputs in;
  in.profile_path = profile_path_;
  in.trace_path = trace_path_;
  in.warmup_steps = static_cast<int>(profiles_.size());
  in.recorded_step_us = median(iteration_us_[0]);
  in.plain_step_us = median(iteration_us_[1]);
  std::string text = format_summary(profiles_.back(), in);
  std::vector<const PlanRecord*> shown;
  for (const PlanRecord& rec : plans_) {
    if (rec.replayer || !rec.info.source.empty()) shown.push_back(&rec);
  }
  for (size_t i = 0; i < shown.size(); ++i) {
    const PlanRecord& rec = *shown[i];
    const std::string source = rec.info.source.empty() ? "none" : rec.info.source;
    text += replay_summary(rec, shown.size() == 1 ? fmt::format("plan ({})", source)
                                                  : fmt::format("plan {} of {} ({}; step kind {:016x})", i + 1,
                                                                shown.size(), source, rec.kind));
  }
  if (plans_.size() > 1 || kinds_.misses() > 0) {  // not for a first step that differed
    text += fmt::format("[memplan] step kinds: {} different op sequences seen, {} planned; {} step(s) ran "
                        "other ops than predicted\n",
                        kinds_.kinds(), plans_.size(), kinds_.misses());
  }
  std::fputs(text.c_str(), stderr);
}

void Agent::write_report(const std::string& path) const {
  nlohmann::json j;
  j["format"] = "memplan-report";
  j["version"] = 1;
  j["phase"] = to_string(phase_);
  j["steps"] = steps_;
  j["rank"] = env_rank();
  if (!profiles_.empty()) {
    const Profile& p = profiles_.back();
    j["profile"] = {{"step", p.step}, {"op_hash", p.op_hash}, {"baseline_bytes", p.baseline_bytes},
                    {"peak_bytes", p.peak_bytes}, {"forward_ops", p.forward.size()},
                    {"backward_nodes", p.backward.size()}, {"step_us", p.forward_us + p.backward_us}};
  }
  // "index": the plan's place among all made (PlanRecord); "replaces": the plan of the same kind
  // it was made to replace (check_gradient_credit), or -1; "variant_of": the plan whose steps that
  // begin without gradients it replays (plan_without_gradients), or -1; "remade_from": the plan
  // of its kind it replaced after a step of that one freed less between forward and backward and
  // peaked over its prediction, or three in a row freed more and peaked under (check_gap), or -1;
  // "in_use": its kind's plan at the end.
  auto plan_json = [this](const PlanRecord& rec) {
    const PlanInfo& i = rec.info;
    const int index = static_cast<int>(&rec - plans_.data());
    return nlohmann::json{{"source", i.source}, {"budget_bytes", i.budget}, {"baseline_bytes", i.baseline},
                          {"unplanned_peak_bytes", i.unplanned_peak}, {"predicted_peak_bytes", i.predicted_peak},
                          {"min_feasible_bytes", i.min_feasible}, {"feasible", i.feasible},
                          {"predicted_time_us", i.predicted_time_us}, {"unplanned_time_us", i.unplanned_time_us},
                          {"evictions", i.evictions}, {"recomputes", i.recomputes}, {"rerun_ops", i.rerun_ops},
                          {"planning_s", i.planning_s},
                          {"kind", fmt::format("{:016x}", rec.kind)}, {"actions", rec.replayer != nullptr},
                          {"index", index}, {"replaces", rec.grads.credited}, {"variant_of", rec.grads.variant_of},
                          {"remade_from", rec.remade_from}, {"headroom_bytes", i.headroom},
                          {"in_use", kinds_.plan_of(rec.kind) == index}};
  };
  // "plan": the latest plan made (the only one, unless the script runs several kinds of step);
  // "plans": every plan, one per kind of step (StepKinds), in the order they were made.
  nlohmann::json plans = nlohmann::json::array();
  for (const PlanRecord& rec : plans_) {
    if (!rec.info.source.empty()) plans.push_back(plan_json(rec));
  }
  if (!plans.empty()) j["plan"] = plans.back();
  j["plans"] = plans;
  j["step_kinds"] = {{"kinds", kinds_.kinds()}, {"misses", kinds_.misses()}};
  // Per kind of step whose sizes follow from data, the steps it ran plainly (records, steps under a
  // plan without actions) and the least and most they peaked above their baselines (sizes_settled).
  nlohmann::json sizes = nlohmann::json::object();
  for (const PlanRecord& rec : plans_) {
    const auto it = sizes_.find(rec.kind);
    if (!rec.data_dependent || it == sizes_.end()) continue;
    sizes[fmt::format("{:016x}", rec.kind)] = {
        {"steps", it->second.steps}, {"low_bytes", it->second.low}, {"high_bytes", it->second.high}};
  }
  j["data_dependent_sizes"] = sizes;
  nlohmann::json reps = nlohmann::json::array();
  auto add = [&](const PlanRecord& rec) {
    const ReplayStats& st = rec.replayer->stats();
    reps.push_back({{"kind", fmt::format("{:016x}", rec.kind)}, {"plan", &rec - plans_.data()},
                    {"steps", st.steps}, {"evicted", st.evicted},
                    {"rebuilt", st.rebuilt}, {"on_demand", st.on_demand}, {"ops_rerun", st.ops_rerun},
                    {"not_rebuildable", st.not_rebuildable}, {"divergences", st.divergences},
                    {"ops_hooked", st.ops_hooked}, {"ops_unhooked", st.ops_unhooked},
                    {"compacted", st.compacted}, {"compact_refused", st.compact_refused},
                    {"expanded", st.expanded}, {"tail_reruns", st.tail_reruns},
                    {"measured_peak_bytes", st.measured_peak}, {"measured_baseline_bytes", st.measured_baseline},
                    {"callback_us", st.callback_us}, {"callback_steps", st.callback_steps},
                    {"light_steps", st.light_steps},
                    {"node_hooks", st.node_hooks}, {"snapshots", st.snapshots}, {"drifted", st.drifted},
                    {"family_steps", st.family_steps}, {"family_peak_bytes", st.family_peak},
                    {"family_baseline_bytes", st.family_baseline},
                    {"gapped_steps", st.gapped_steps}, {"gapped_peak_bytes", st.gapped_peak},
                    {"gapped_baseline_bytes", st.gapped_baseline},
                    {"other_kind_peak_bytes", st.other_kind_peak},
                    {"other_kind_baseline_bytes", st.other_kind_baseline}});
  };
  for (const PlanRecord& rec : plans_) {
    if (rec.replayer) add(rec);
  }
  j["replay"] = reps;
  std::ofstream f(path);
  if (!f || !(f << j.dump(1) << "\n")) warn("report not written to {}", path);
}

std::string Agent::replay_summary(const PlanRecord& rec, const std::string& title) const {
  const PlanInfo& p = rec.info;
  std::string out;
  auto line = [&](const std::string& l) { out += "[memplan] " + l + "\n"; };
  const int64_t act = p.unplanned_peak - p.baseline;
  auto pct = [&](int64_t abs) { return act > 0 ? 100.0 * static_cast<double>(abs - p.baseline) / act : 100.0; };
  line(fmt::format("===== {} =====", title));
  line(fmt::format("budget {} ({:.0f}% of activations); un-planned peak {}; predicted peak {} ({:.0f}%){}",
                   format_bytes(p.budget), pct(p.budget), format_bytes(p.unplanned_peak),
                   format_bytes(p.predicted_peak), pct(p.predicted_peak),
                   p.feasible                           ? ""
                   : p.min_feasible >= p.unplanned_peak ? std::string("; no plan lowers the peak")
                                                        : fmt::format("; below the minimum feasible {}",
                                                                      format_bytes_up(p.min_feasible))));
  if (p.unplanned_time_us > 0) {
    line(fmt::format("predicted step time {:.2f} ms vs {:.2f} ms un-planned ({:+.1f}%); {} evictions, {} "
                     "recompute points; planning took {:.2f} s",
                     p.predicted_time_us / 1000, p.unplanned_time_us / 1000,
                     100.0 * (p.predicted_time_us / p.unplanned_time_us - 1.0), p.evictions, p.recomputes,
                     p.planning_s));
  }
  const Replayer* r = rec.replayer.get();
  if (r == nullptr) return out;
  ReplayStats st = const_cast<Replayer*>(r)->stats();
  // Each step's peak is taken relative to its own start (what the script holds outside the step
  // may grow), then put on the profile's baseline to compare with the prediction.
  std::vector<int64_t> peaks;
  for (size_t i = 0; i < st.measured_peak.size(); ++i) {
    peaks.push_back(st.measured_peak[i] - st.measured_baseline[i] + p.baseline);
  }
  if (!peaks.empty()) {
    std::sort(peaks.begin(), peaks.end());
    const int64_t med = peaks[peaks.size() / 2];
    line(fmt::format("replayed {} step(s): measured peak {} (median, on the profile's baseline; {:.0f}% of "
                     "activations), predicted {} (error {:+.1f}%)",
                     st.steps - static_cast<int64_t>(st.family_peak.size() + st.gapped_peak.size()),
                     format_bytes(med), pct(med),
                     format_bytes(p.predicted_peak),
                     p.predicted_peak > 0 ? 100.0 * (static_cast<double>(med) / p.predicted_peak - 1.0) : 0.0));
  }
  // Steps measured apart (not of the plan's own ops): how many, and the highest peak.
  auto apart = [&](const std::vector<int64_t>& peak, const std::vector<int64_t>& baseline, const char* what) {
    if (peak.empty()) return;
    int64_t worst = 0;
    for (size_t i = 0; i < peak.size(); ++i) worst = std::max(worst, peak[i] - baseline[i] + p.baseline);
    line(fmt::format("and {} step(s) {}: measured peak at most {} (on the profile's baseline; {:.0f}% of this "
                     "plan's activations)",
                     peak.size(), what, format_bytes(worst), pct(worst)));
  };
  apart(st.family_peak, st.family_baseline, "of the same ops at other sizes, with no plan of their own");
  apart(st.gapped_peak, st.gapped_baseline,
        "that left out some of its ops (a layer skipped, or its last ops) and replayed the rest");
  if (!rec.iteration_us.empty()) {
    line(fmt::format("replayed iterations: {:.2f} ms (median wall time, optimizer and data included), of which "
                     "{:.3f} ms in the agent's callbacks (recording, replay, planned rebuilds)",
                     median(rec.iteration_us) / 1000, median(st.callback_us) / 1000));
  }
  line(fmt::format("saved tensors evicted {}, rebuilt {} ({} on demand), forward ops re-run {}, kept "
                   "(no recipe) {}, divergences {}",
                   st.evicted, st.rebuilt, st.on_demand, st.ops_rerun, st.not_rebuildable, st.divergences));
  line(fmt::format("forward ops through our saved-tensor hooks {} ({:.0f}%), left to autograd {}", st.ops_hooked,
                   100.0 * st.ops_hooked / std::max<int64_t>(1, st.ops_hooked + st.ops_unhooked), st.ops_unhooked));
  if (st.compacted + st.compact_refused > 0) {
    line(fmt::format("dropout masks kept compact {} (expanded at unpack {}), refused (not 0/scale) {}; dropout "
                     "re-runs done as input x mask {}",
                     st.compacted, st.expanded, st.compact_refused, st.tail_reruns));
  }
  return out;
}

}  // namespace memplan
