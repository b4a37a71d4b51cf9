#include "profiler/profile_io.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "profiler/text_file.h"

namespace memplan {

using nlohmann::json;

const char* to_string(ValueKind k) {
  switch (k) {
    case ValueKind::Activation: return "activation";
    case ValueKind::Parameter: return "parameter";
    case ValueKind::Input: return "input";
    case ValueKind::Gradient: return "gradient";
    case ValueKind::Other: return "other";
  }
  return "other";
}

bool parse_value_kind(const std::string& s, ValueKind* out) {
  for (ValueKind k : {ValueKind::Activation, ValueKind::Parameter, ValueKind::Input,
                      ValueKind::Gradient, ValueKind::Other}) {
    if (s == to_string(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

int64_t first_other_op(const std::vector<Op>& a, const std::vector<Op>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i].name != b[i].name) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

int64_t Profile::saved_for_backward_bytes() const {
  int64_t total = 0;
  for (const Value& v : values) total += v.saved_bytes;
  return total;
}

namespace {

json tensor_to_json(const TensorRef& t) {
  json j{{"value", t.value}, {"shape", t.shape}, {"dtype", t.dtype}};
  if (t.from >= 0) j["from"] = t.from;
  return j;
}

json op_to_json(const Op& op) {
  json j{{"name", op.name},         {"overload", op.overload},       {"seq_nr", op.seq_nr},
         {"thread", op.thread},     {"fwd_op", op.fwd_op},           {"start_us", op.start_us},
         {"time_us", op.time_us},   {"cpu_us", op.cpu_us},           {"cupti_us", op.cupti_us},
         {"event_us", op.event_us}, {"live_before", op.live_before}, {"live_after", op.live_after},
         {"peak", op.peak},         {"random", op.random}};
  j["inputs"] = json::array();
  for (const auto& t : op.inputs) j["inputs"].push_back(tensor_to_json(t));
  j["outputs"] = json::array();
  for (const auto& t : op.outputs) j["outputs"].push_back(tensor_to_json(t));
  if (!op.packs.empty()) j["packs"] = op.packs;
  if (!op.rerunnable) j["rerunnable"] = false;
  if (op.side_stream) j["side_stream"] = true;
  if (op.dispatch_mode) j["dispatch_mode"] = true;
  if (!op.writes.empty()) j["writes"] = op.writes;
  return j;
}

json value_to_json(const Value& v) {
  return json{{"bytes", v.bytes},          {"kind", to_string(v.kind)},
              {"producer", v.producer},    {"consumers", v.consumers},
              {"saved_by", v.saved_by},    {"unpacked_by", v.unpacked_by},
              {"saved_bytes", v.saved_bytes}, {"held_outside", v.held_outside}, {"held_until", v.held_until},
              {"dies_after", v.dies_after}, {"written", v.written},
              {"written_before_node", v.written_before_node}};
}

// Reading: nlohmann throws on type mismatch; the whole parse runs under one try so a bad file
// becomes one message. `where` names the element being read for that message.
void tensor_from_json(const json& j, TensorRef* t) {
  t->value = j.at("value").get<int64_t>();
  t->shape = j.at("shape").get<std::vector<int64_t>>();
  t->dtype = j.at("dtype").get<std::string>();
  t->from = j.value("from", int64_t{-1});
}

void op_from_json(const json& j, Op* op) {
  op->name = j.at("name").get<std::string>();
  op->overload = j.value("overload", std::string());
  op->seq_nr = j.value("seq_nr", int64_t{-1});
  op->thread = j.value("thread", uint64_t{0});
  op->fwd_op = j.value("fwd_op", int64_t{-1});
  op->start_us = j.value("start_us", 0.0);
  op->time_us = j.at("time_us").get<double>();
  op->cpu_us = j.value("cpu_us", -1.0);
  op->cupti_us = j.value("cupti_us", -1.0);
  op->event_us = j.value("event_us", -1.0);
  op->live_before = j.at("live_before").get<int64_t>();
  op->live_after = j.at("live_after").get<int64_t>();
  op->peak = j.at("peak").get<int64_t>();
  op->random = j.value("random", false);
  op->rerunnable = j.value("rerunnable", true);
  op->side_stream = j.value("side_stream", false);
  op->dispatch_mode = j.value("dispatch_mode", false);
  for (const auto& t : j.value("inputs", json::array())) tensor_from_json(t, &op->inputs.emplace_back());
  for (const auto& t : j.value("outputs", json::array())) tensor_from_json(t, &op->outputs.emplace_back());
  op->packs = j.value("packs", std::vector<int64_t>());
  op->writes = j.value("writes", std::vector<int64_t>());
}

bool in_range(int64_t i, size_t n) { return i >= 0 && static_cast<size_t>(i) < n; }

bool check_op(const Op& op, const std::string& where, size_t nvalues, std::string* error) {
  if (op.time_us < 0) {
    *error = fmt::format("{}: negative time_us {}", where, op.time_us);
    return false;
  }
  if (op.live_before < 0 || op.live_after < 0 || op.peak < 0) {
    *error = fmt::format("{}: negative memory (live_before {}, live_after {}, peak {})", where,
                         op.live_before, op.live_after, op.peak);
    return false;
  }
  for (const auto* list : {&op.inputs, &op.outputs}) {
    for (const TensorRef& t : *list) {
      if (t.value != -1 && !in_range(t.value, nvalues)) {
        *error = fmt::format("{}: tensor refers to value {} but there are {} values", where,
                             t.value, nvalues);
        return false;
      }
    }
  }
  for (int64_t v : op.packs) {
    if (!in_range(v, nvalues)) {
      *error = fmt::format("{}: packs value {} but there are {} values", where, v, nvalues);
      return false;
    }
  }
  for (int64_t v : op.writes) {
    if (v < 0 || std::none_of(op.inputs.begin(), op.inputs.end(), [&](const TensorRef& t) { return t.value == v; })) {
      *error = fmt::format("{}: writes value {}, which is none of its inputs", where, v);
      return false;
    }
  }
  return true;
}

}  // namespace

std::string profile_to_json(const Profile& p, int indent) {
  json j{{"format", "memplan-profile"}, {"version", p.version},        {"device", p.device},
         {"rank", p.rank},              {"step", p.step},              {"op_hash", p.op_hash},
         {"baseline_bytes", p.baseline_bytes}, {"peak_bytes", p.peak_bytes},
         {"end_bytes", p.end_bytes},    {"forward_us", p.forward_us},  {"backward_us", p.backward_us},
         {"overhead_us", p.overhead_us}, {"rng_state_bytes", p.rng_state_bytes},
         {"graph_kept", p.graph_kept}};
  j["forward"] = json::array();
  for (const auto& op : p.forward) j["forward"].push_back(op_to_json(op));
  j["backward"] = json::array();
  for (const auto& op : p.backward) j["backward"].push_back(op_to_json(op));
  j["values"] = json::array();
  for (const auto& v : p.values) j["values"].push_back(value_to_json(v));
  return j.dump(indent);
}

bool validate_profile(const Profile& p, std::string* error) {
  if (p.version != kProfileVersion) {
    *error = fmt::format("unknown profile version {} (this build reads version {})", p.version,
                         kProfileVersion);
    return false;
  }
  if (p.baseline_bytes < 0 || p.peak_bytes < 0 || p.end_bytes < 0 || p.rng_state_bytes < 0) {
    *error = "negative baseline_bytes, peak_bytes, end_bytes or rng_state_bytes";
    return false;
  }
  if (p.peak_bytes < p.baseline_bytes) {
    *error = fmt::format("peak_bytes {} is below baseline_bytes {}", p.peak_bytes, p.baseline_bytes);
    return false;
  }
  const size_t nv = p.values.size();
  for (size_t i = 0; i < p.forward.size(); ++i) {
    if (!check_op(p.forward[i], fmt::format("forward op {}", i), nv, error)) return false;
    for (const TensorRef& t : p.forward[i].inputs) {
      if (t.from < -1 || t.from >= static_cast<int64_t>(i)) {
        *error = fmt::format("forward op {}: an input from op {}, which is no earlier op", i, t.from);
        return false;
      }
    }
  }
  for (size_t i = 0; i < p.backward.size(); ++i) {
    const Op& op = p.backward[i];
    if (!check_op(op, fmt::format("backward node {}", i), nv, error)) return false;
    if (op.fwd_op != -1 && !in_range(op.fwd_op, p.forward.size())) {
      *error = fmt::format("backward node {} links to forward op {} but there are {}", i, op.fwd_op,
                           p.forward.size());
      return false;
    }
  }
  for (size_t i = 0; i < nv; ++i) {
    const Value& v = p.values[i];
    if (v.bytes < 0 || v.saved_bytes < 0) {
      *error = fmt::format("value {}: negative size ({} bytes, {} saved)", i, v.bytes, v.saved_bytes);
      return false;
    }
    if (v.producer != -1 && !in_range(v.producer, p.forward.size())) {
      *error = fmt::format("value {}: producer {} is not a forward op", i, v.producer);
      return false;
    }
    if (v.held_until != -1 && !in_range(v.held_until, p.forward.size())) {
      *error = fmt::format("value {}: held until {}, which is not a forward op", i, v.held_until);
      return false;
    }
    if (v.dies_after != -1 && (!in_range(v.dies_after, p.forward.size()) || v.producer != -1)) {
      *error = fmt::format("value {}: dies after {}, which is not a forward op (or it is no input)", i,
                           v.dies_after);
      return false;
    }
    if (v.written_before_node < -1 || v.written_before_node > static_cast<int64_t>(p.backward.size()) ||
        (v.written_before_node != -1 && !v.written)) {
      *error = fmt::format("value {}: written before backward node {}, which is no node (or it is not written)",
                           i, v.written_before_node);
      return false;
    }
    if (v.kind == ValueKind::Activation && v.producer == -1) {
      *error = fmt::format("value {}: an activation with no producer", i);
      return false;
    }
    for (int64_t c : v.consumers) {
      if (!in_range(c, p.forward.size())) {
        *error = fmt::format("value {}: consumer {} is not a forward op", i, c);
        return false;
      }
    }
    for (int64_t s : v.saved_by) {
      if (!in_range(s, p.forward.size())) {
        *error = fmt::format("value {}: saved by {} which is not a forward op", i, s);
        return false;
      }
    }
    for (int64_t u : v.unpacked_by) {
      if (!in_range(u, p.backward.size())) {
        *error = fmt::format("value {}: unpacked by {} which is not a backward node", i, u);
        return false;
      }
    }
  }
  return true;
}

bool profile_from_json(const std::string& text, Profile* out, std::string* error) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = "not valid JSON (truncated or corrupt file?)";
    return false;
  }
  Profile p;
  std::string where = "header";
  try {
    if (!j.is_object() || j.value("format", std::string()) != "memplan-profile") {
      *error = "not a memplan profile (missing \"format\": \"memplan-profile\")";
      return false;
    }
    p.version = j.at("version").get<int>();
    if (p.version != kProfileVersion) {
      *error = fmt::format("unknown profile version {} (this build reads version {})", p.version,
                           kProfileVersion);
      return false;
    }
    p.device = j.value("device", std::string("cpu"));
    p.rank = j.value("rank", 0);
    p.step = j.value("step", int64_t{0});
    p.op_hash = j.value("op_hash", std::string());
    p.baseline_bytes = j.at("baseline_bytes").get<int64_t>();
    p.peak_bytes = j.at("peak_bytes").get<int64_t>();
    p.end_bytes = j.value("end_bytes", int64_t{0});
    p.forward_us = j.value("forward_us", 0.0);
    p.backward_us = j.value("backward_us", 0.0);
    p.overhead_us = j.value("overhead_us", 0.0);
    p.rng_state_bytes = j.value("rng_state_bytes", int64_t{0});
    p.graph_kept = j.value("graph_kept", false);
    const auto& fwd = j.at("forward");
    for (size_t i = 0; i < fwd.size(); ++i) {
      where = fmt::format("forward op {}", i);
      op_from_json(fwd[i], &p.forward.emplace_back());
    }
    const auto& bwd = j.at("backward");
    for (size_t i = 0; i < bwd.size(); ++i) {
      where = fmt::format("backward node {}", i);
      op_from_json(bwd[i], &p.backward.emplace_back());
    }
    const auto& vals = j.at("values");
    for (size_t i = 0; i < vals.size(); ++i) {
      where = fmt::format("value {}", i);
      const json& jv = vals[i];
      Value& v = p.values.emplace_back();
      v.bytes = jv.at("bytes").get<int64_t>();
      if (!parse_value_kind(jv.at("kind").get<std::string>(), &v.kind)) {
        *error = fmt::format("{}: unknown kind \"{}\"", where, jv.at("kind").get<std::string>());
        return false;
      }
      v.producer = jv.value("producer", int64_t{-1});
      v.consumers = jv.value("consumers", std::vector<int64_t>{});
      v.saved_by = jv.value("saved_by", std::vector<int64_t>{});
      v.unpacked_by = jv.value("unpacked_by", std::vector<int64_t>{});
      v.saved_bytes = jv.value("saved_bytes", int64_t{0});
      v.held_outside = jv.value("held_outside", false);
      v.held_until = jv.value("held_until", int64_t{-1});
      v.dies_after = jv.value("dies_after", int64_t{-1});
      v.written = jv.value("written", false);
      v.written_before_node = jv.value("written_before_node", int64_t{-1});
    }
  } catch (const std::exception& e) {
    *error = fmt::format("{}: {}", where, e.what());
    return false;
  }
  if (!validate_profile(p, error)) return false;
  *out = std::move(p);
  return true;
}

bool write_profile_file(const std::string& path, const Profile& p, std::string* error) {
  return write_text_file(path, profile_to_json(p), error);
}

bool read_profile_file(const std::string& path, Profile* out, std::string* error) {
  std::string text;
  return read_text_file(path, &text, error) && profile_from_json(text, out, error);
}

}  // namespace memplan
