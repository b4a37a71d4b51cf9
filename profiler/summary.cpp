#include "profiler/summary.h"

#include "profiler/bytes.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

namespace memplan {

namespace {

struct Row {
  std::string name;
  double time_us = 0;
  int64_t count = 0;
};

}  // namespace

std::string peak_location(const Profile& p) {
  int64_t best = -1;
  std::string where = "step start";
  for (size_t i = 0; i < p.forward.size(); ++i) {
    if (p.forward[i].peak > best) {
      best = p.forward[i].peak;
      where = fmt::format("forward op {} {}", i, p.forward[i].name);
    }
  }
  for (size_t i = 0; i < p.backward.size(); ++i) {
    if (p.backward[i].peak > best) {
      best = p.backward[i].peak;
      where = fmt::format("backward node {} {}", i, p.backward[i].name);
    }
  }
  return where;
}

std::string format_summary(const Profile& p, const SummaryInputs& in) {
  std::string out;
  auto line = [&](const std::string& s) { out += "[memplan] " + s + "\n"; };
  line(fmt::format("===== profile of step {} ({} warm-up step(s) recorded, rank {}, {}) =====", p.step,
                   in.warmup_steps, p.rank, p.device));
  line(fmt::format("ops per step: {} forward, {} backward nodes   (op sequence hash {})",
                   p.forward.size(), p.backward.size(), p.op_hash));

  int64_t saved = 0, saved_act = 0, saved_held = 0, nsaved = 0;
  for (const Value& v : p.values) {
    if (v.saved_bytes == 0) continue;
    ++nsaved;
    saved += v.saved_bytes;
    if (v.kind == ValueKind::Activation) saved_act += v.saved_bytes;
    if (v.kind == ValueKind::Activation && v.held_outside) saved_held += v.saved_bytes;
  }
  line(fmt::format("saved for backward: {} in {} storages ({} activations, of which {} also held "
                   "outside autograd; {} parameters/inputs)",
                   format_bytes(saved), nsaved, format_bytes(saved_act), format_bytes(saved_held), format_bytes(saved - saved_act)));
  line(fmt::format("memory: {} allocated at step start, peak {} (activations {}) at {}",
                   format_bytes(p.baseline_bytes), format_bytes(p.peak_bytes), format_bytes(p.activation_bytes()),
                   peak_location(p)));
  line(fmt::format("time: forward {:.2f} ms, backward {:.2f} ms", p.forward_us / 1000.0,
                   p.backward_us / 1000.0));

  std::map<std::string, Row> by_name;
  for (const auto* ops : {&p.forward, &p.backward}) {
    for (const Op& op : *ops) {
      Row& r = by_name[op.name];
      r.name = op.name;
      r.time_us += op.time_us;
      ++r.count;
    }
  }
  std::vector<Row> rows;
  for (auto& kv : by_name) rows.push_back(kv.second);
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.time_us > b.time_us; });
  line("top 5 ops by time (all calls in the step):");
  for (size_t i = 0; i < rows.size() && i < 5; ++i) {
    line(fmt::format("  {:>9.3f} ms  {:>4}x  {}", rows[i].time_us / 1000.0, rows[i].count, rows[i].name));
  }

  struct Mem {
    std::string what;
    int64_t grow;
  };
  std::vector<Mem> mem;
  for (size_t i = 0; i < p.forward.size(); ++i) {
    const Op& op = p.forward[i];
    mem.push_back({fmt::format("forward op {} {}", i, op.name), op.peak - op.live_before});
  }
  for (size_t i = 0; i < p.backward.size(); ++i) {
    const Op& op = p.backward[i];
    mem.push_back({fmt::format("backward node {} {}", i, op.name), op.peak - op.live_before});
  }
  std::sort(mem.begin(), mem.end(), [](const Mem& a, const Mem& b) { return a.grow > b.grow; });
  line("top 5 ops by memory (peak inside the op minus allocated when it began):");
  for (size_t i = 0; i < mem.size() && i < 5; ++i) {
    line(fmt::format("  {:>10}  {}", format_bytes(mem[i].grow), mem[i].what));
  }

  const size_t calls = p.forward.size() + p.backward.size();
  const double step_us = p.forward_us + p.backward_us;
  if (calls > 0 && step_us > 0) {
    line(fmt::format("recording overhead: {:.2f} us per op ({:.2f} ms in callbacks = {:.1f}% of the "
                     "recorded step)",
                     p.overhead_us / static_cast<double>(calls), p.overhead_us / 1000.0,
                     100.0 * p.overhead_us / step_us));
  }
  if (in.recorded_step_us > 0 && in.plain_step_us > 0) {
    line(fmt::format("iteration wall time: {:.2f} ms while recording vs {:.2f} ms after (median): "
                     "profiling costs {:+.1f}%",
                     in.recorded_step_us / 1000.0, in.plain_step_us / 1000.0,
                     100.0 * (in.recorded_step_us / in.plain_step_us - 1.0)));
  }
  line(fmt::format("profile: {}", in.profile_path.empty() ? "(not written)" : in.profile_path));
  line(fmt::format("trace:   {}", in.trace_path.empty() ? "(not written)" : in.trace_path));
  return out;
}

}  // namespace memplan
