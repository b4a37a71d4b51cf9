#include "profiler/trace_export.h"

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace memplan {

namespace {
constexpr int64_t kStepTrack = 1, kForwardTrack = 2, kBackwardTrack = 3, kActionTrack = 4;

nlohmann::json shapes(const std::vector<TensorRef>& ts) {
  nlohmann::json a = nlohmann::json::array();
  for (const TensorRef& t : ts) a.push_back(fmt::format("{}{}", t.dtype, fmt::join(t.shape, "x")));
  return a;
}
}  // namespace

void add_profiles_to_trace(const std::vector<Profile>& steps, TraceBuilder* trace,
                           const std::vector<TraceAction>& actions) {
  trace->process_name(steps.empty() ? "memplan" : fmt::format("memplan rank {}", steps[0].rank));
  trace->track_name(kStepTrack, "steps");
  trace->track_name(kForwardTrack, "forward ops");
  trace->track_name(kBackwardTrack, "backward nodes");
  if (!actions.empty()) trace->track_name(kActionTrack, "memplan actions");
  double offset = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    const Profile& p = steps[s];
    const double len = p.forward_us + p.backward_us;
    const bool replayed = !actions.empty() && s + 1 == steps.size();
    trace->complete(fmt::format("memplan/{} step {}", replayed ? "replay" : "warmup", p.step), "phase", offset,
                    len, kStepTrack,
                    nlohmann::json{{"ops", p.forward.size()}, {"nodes", p.backward.size()},
                                   {"peak_bytes", p.peak_bytes}, {"op_hash", p.op_hash}});
    auto emit = [&](const std::vector<Op>& ops, int64_t track, const char* cat) {
      for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        nlohmann::json args{{"index", i}, {"live_before", op.live_before}, {"live_after", op.live_after},
                            {"peak", op.peak}, {"seq_nr", op.seq_nr}};
        if (!op.inputs.empty()) args["inputs"] = shapes(op.inputs);
        if (op.fwd_op >= 0) args["fwd_op"] = op.fwd_op;
        trace->complete(op.name, cat, offset + op.start_us, op.time_us, track, args);
        trace->counter("allocated bytes", offset + op.start_us, {{"allocated", double(op.live_before)}});
        trace->counter("allocated bytes", offset + op.start_us + op.time_us,
                       {{"allocated", double(op.live_after)}});
      }
    };
    emit(p.forward, kForwardTrack, "forward");
    emit(p.backward, kBackwardTrack, "backward");
    if (replayed) {
      for (const TraceAction& a : actions) {
        if (a.dur_us > 0) {
          trace->complete(a.name, "action", offset + a.ts_us, a.dur_us, kActionTrack);
        } else {
          trace->instant(a.name, "action", offset + a.ts_us, kActionTrack);
        }
      }
    }
    offset += len + 1.0;
  }
}

bool write_trace_file(const std::string& path, const std::vector<Profile>& steps, std::string* error,
                      const std::vector<TraceAction>& actions) {
  TraceBuilder trace(static_cast<int64_t>(getpid()));
  add_profiles_to_trace(steps, &trace, actions);
  return trace.write(path, error);
}

}  // namespace memplan
