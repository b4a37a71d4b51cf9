#include "profiler/profile_io.h"

#include <cstdio>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace memplan {
namespace {

// A small consistent profile: x (input) -> linear -> h (activation, saved) -> relu -> y.
Profile sample() {
  Profile p;
  p.device = "cuda:0";
  p.rank = 1;
  p.step = 3;
  p.op_hash = "abc123";
  p.baseline_bytes = 1000;
  p.peak_bytes = 5000;
  p.end_bytes = 1200;
  p.forward_us = 12.5;
  p.backward_us = 30.25;
  p.overhead_us = 0.5;
  p.rng_state_bytes = 5056;
  p.graph_kept = true;

  Value x{400, ValueKind::Input, -1, {0}, {}, {}, 0, true};
  Value h{800, ValueKind::Activation, 0, {1}, {0, 1}, {0}, 800, false};
  Value y{800, ValueKind::Activation, 1, {}, {}, {}, 0, false};
  Value g{400, ValueKind::Gradient, -1, {}, {}, {}, 0, false};
  h.held_until = 1;  // a Python variable held it while relu ran
  x.dies_after = 0;  // the script dropped it after linear
  x.written = true;  // and wrote it in place first
  x.written_before_node = 0;  // ... before backward node 0 began
  p.values = {x, h, y, g};

  Op lin;
  lin.name = "aten::linear";
  lin.seq_nr = 7;
  lin.thread = 99;
  lin.inputs = {{0, {4, 25}, "Float"}, {-1, {}, ""}};
  lin.writes = {0};  // as an op with an (a!) argument
  lin.outputs = {{1, {4, 50}, "Float"}};
  lin.packs = {0, 1, 0};
  lin.start_us = 1;
  lin.time_us = 5;
  lin.live_before = 1400;
  lin.live_after = 2200;
  lin.peak = 2400;
  Op relu;
  relu.name = "aten::relu";
  relu.overload = "default";
  relu.seq_nr = 8;
  relu.inputs = {{1, {4, 50}, "Float", 0}};  // the tensor op 0 output
  relu.outputs = {{2, {4, 50}, "Float"}};
  relu.time_us = 1;
  relu.live_before = 2200;
  relu.live_after = 3000;
  relu.peak = 3000;
  relu.random = true;
  relu.rerunnable = false;  // as a custom autograd.Function would be
  lin.dispatch_mode = true;  // as under FlopCounterMode
  lin.side_stream = true;
  p.forward = {lin, relu};

  Op bw;
  bw.name = "AddmmBackward0";
  bw.seq_nr = 7;
  bw.fwd_op = 0;
  bw.inputs = {{1, {4, 50}, "Float"}};
  bw.outputs = {{3, {4, 25}, "Float"}};
  bw.time_us = 9;
  bw.live_before = 3000;
  bw.live_after = 3400;
  bw.peak = 5000;
  p.backward = {bw};
  return p;
}

void expect_tensor_eq(const TensorRef& a, const TensorRef& b) {
  EXPECT_EQ(a.value, b.value);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.from, b.from);
}

void expect_op_eq(const Op& a, const Op& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.overload, b.overload);
  EXPECT_EQ(a.seq_nr, b.seq_nr);
  EXPECT_EQ(a.thread, b.thread);
  EXPECT_EQ(a.fwd_op, b.fwd_op);
  EXPECT_DOUBLE_EQ(a.start_us, b.start_us);
  EXPECT_DOUBLE_EQ(a.time_us, b.time_us);
  EXPECT_EQ(a.live_before, b.live_before);
  EXPECT_EQ(a.live_after, b.live_after);
  EXPECT_EQ(a.peak, b.peak);
  EXPECT_EQ(a.random, b.random);
  EXPECT_EQ(a.rerunnable, b.rerunnable);
  EXPECT_EQ(a.side_stream, b.side_stream);
  EXPECT_EQ(a.dispatch_mode, b.dispatch_mode);
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  for (size_t i = 0; i < a.inputs.size(); ++i) expect_tensor_eq(a.inputs[i], b.inputs[i]);
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (size_t i = 0; i < a.outputs.size(); ++i) expect_tensor_eq(a.outputs[i], b.outputs[i]);
  EXPECT_EQ(a.packs, b.packs);
  EXPECT_EQ(a.writes, b.writes);
}

void expect_profile_eq(const Profile& a, const Profile& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.op_hash, b.op_hash);
  EXPECT_EQ(a.baseline_bytes, b.baseline_bytes);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.end_bytes, b.end_bytes);
  EXPECT_DOUBLE_EQ(a.forward_us, b.forward_us);
  EXPECT_DOUBLE_EQ(a.backward_us, b.backward_us);
  EXPECT_DOUBLE_EQ(a.overhead_us, b.overhead_us);
  EXPECT_EQ(a.rng_state_bytes, b.rng_state_bytes);
  EXPECT_EQ(a.graph_kept, b.graph_kept);
  ASSERT_EQ(a.forward.size(), b.forward.size());
  for (size_t i = 0; i < a.forward.size(); ++i) expect_op_eq(a.forward[i], b.forward[i]);
  ASSERT_EQ(a.backward.size(), b.backward.size());
  for (size_t i = 0; i < a.backward.size(); ++i) expect_op_eq(a.backward[i], b.backward[i]);
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    const Value& x = a.values[i];
    const Value& y = b.values[i];
    EXPECT_EQ(x.bytes, y.bytes) << i;
    EXPECT_EQ(x.kind, y.kind) << i;
    EXPECT_EQ(x.producer, y.producer) << i;
    EXPECT_EQ(x.consumers, y.consumers) << i;
    EXPECT_EQ(x.saved_by, y.saved_by) << i;
    EXPECT_EQ(x.unpacked_by, y.unpacked_by) << i;
    EXPECT_EQ(x.saved_bytes, y.saved_bytes) << i;
    EXPECT_EQ(x.held_outside, y.held_outside) << i;
    EXPECT_EQ(x.held_until, y.held_until) << i;
    EXPECT_EQ(x.dies_after, y.dies_after) << i;
    EXPECT_EQ(x.written, y.written) << i;
    EXPECT_EQ(x.written_before_node, y.written_before_node) << i;
  }
}

TEST(ProfileIO, SampleIsValid) {
  std::string error;
  EXPECT_TRUE(validate_profile(sample(), &error)) << error;
}

TEST(ProfileIO, FileRoundTrip) {
  const Profile p = sample();
  const std::string path = ::testing::TempDir() + "profile." + std::to_string(getpid()) + ".json";
  std::string error;
  ASSERT_TRUE(write_profile_file(path, p, &error)) << error;
  Profile q;
  ASSERT_TRUE(read_profile_file(path, &q, &error)) << error;
  std::remove(path.c_str());
  expect_profile_eq(p, q);
  EXPECT_EQ(q.activation_bytes(), 4000);
  EXPECT_EQ(q.saved_for_backward_bytes(), 800);
}

TEST(ProfileIO, StringRoundTripIsStable) {
  const Profile p = sample();
  const std::string text = profile_to_json(p, 2);
  Profile q;
  std::string error;
  ASSERT_TRUE(profile_from_json(text, &q, &error)) << error;
  expect_profile_eq(p, q);
  EXPECT_EQ(profile_to_json(q, 2), text);
}

// Parses `text`; expects rejection with a message containing `what`, and `out` untouched.
void expect_rejected(const std::string& text, const std::string& what) {
  Profile out;
  out.op_hash = "untouched";
  std::string error;
  EXPECT_FALSE(profile_from_json(text, &out, &error)) << what;
  EXPECT_NE(error.find(what), std::string::npos) << "error: " << error;
  EXPECT_EQ(out.op_hash, "untouched");
}

TEST(ProfileIO, RejectsTruncatedJson) {
  const std::string text = profile_to_json(sample());
  for (size_t cut : {size_t{0}, size_t{1}, text.size() / 2, text.size() - 1}) {
    expect_rejected(text.substr(0, cut), "not valid JSON");
  }
}

TEST(ProfileIO, RejectsNegativeSizes) {
  nlohmann::json j = nlohmann::json::parse(profile_to_json(sample()));
  j["values"][1]["bytes"] = -8;
  expect_rejected(j.dump(), "negative size");
  j = nlohmann::json::parse(profile_to_json(sample()));
  j["baseline_bytes"] = -1;
  expect_rejected(j.dump(), "negative");
  j = nlohmann::json::parse(profile_to_json(sample()));
  j["forward"][0]["peak"] = -1;
  expect_rejected(j.dump(), "negative memory");
}

TEST(ProfileIO, RejectsHeldUntilBeyondTheForward) {
  nlohmann::json j = nlohmann::json::parse(profile_to_json(sample()));
  j["values"][1]["held_until"] = 2;  // two forward ops: 0 and 1
  expect_rejected(j.dump(), "held until 2");
  j = nlohmann::json::parse(profile_to_json(sample()));
  j["values"][1]["dies_after"] = 0;  // an activation, not an input
  expect_rejected(j.dump(), "dies after 0");
}

TEST(ProfileIO, RejectsAWriteBeforeANodeThatIsNone) {
  nlohmann::json j = nlohmann::json::parse(profile_to_json(sample()));
  j["values"][0]["written_before_node"] = static_cast<int64_t>(j["backward"].size()) + 1;
  expect_rejected(j.dump(), "written before backward node");
  j = nlohmann::json::parse(profile_to_json(sample()));
  j["values"][1]["written_before_node"] = 0;  // not written
  expect_rejected(j.dump(), "written before backward node 0");
  j = nlohmann::json::parse(profile_to_json(sample()));
  j["values"][0]["written_before_node"] = static_cast<int64_t>(j["backward"].size());  // after the last began
  std::string error;
  Profile q;
  EXPECT_TRUE(profile_from_json(j.dump(), &q, &error)) << error;
}

TEST(ProfileIO, RejectsUnknownVersion) {
  nlohmann::json j = nlohmann::json::parse(profile_to_json(sample()));
  j["version"] = kProfileVersion + 1;
  expect_rejected(j.dump(), "unknown profile version");
  Profile p = sample();
  p.version = 0;
  std::string error;
  EXPECT_FALSE(validate_profile(p, &error));
}

TEST(ProfileIO, RejectsActivationWithoutProducer) {
  nlohmann::json j = nlohmann::json::parse(profile_to_json(sample()));
  j["values"][2]["producer"] = -1;
  expect_rejected(j.dump(), "activation with no producer");
}

TEST(ProfileIO, RejectsOtherInconsistencies) {
  auto mutate = [](auto f) {
    nlohmann::json j = nlohmann::json::parse(profile_to_json(sample()));
    f(j);
    return j.dump();
  };
  expect_rejected("[1,2]", "not a memplan profile");
  expect_rejected(mutate([](auto& j) { j.erase("format"); }), "not a memplan profile");
  expect_rejected(mutate([](auto& j) { j["values"][0]["kind"] = "weird"; }), "unknown kind");
  expect_rejected(mutate([](auto& j) { j["forward"][0]["outputs"][0]["value"] = 99; }), "value 99");
  expect_rejected(mutate([](auto& j) { j["backward"][0]["fwd_op"] = 5; }), "forward op 5");
  expect_rejected(mutate([](auto& j) { j["forward"][0]["packs"] = {0, 42}; }), "packs value 42");
  expect_rejected(mutate([](auto& j) { j["forward"][1]["writes"] = {2}; }), "writes value 2, which is none of its inputs");
  expect_rejected(mutate([](auto& j) { j["forward"][1]["inputs"][0]["from"] = 1; }), "from op 1, which is no earlier op");
  expect_rejected(mutate([](auto& j) { j["values"][1]["unpacked_by"] = {4}; }), "unpacked by 4");
  expect_rejected(mutate([](auto& j) { j["peak_bytes"] = 10; }), "below baseline_bytes");
  expect_rejected(mutate([](auto& j) { j["forward"][0]["time_us"] = "slow"; }), "forward op 0");
}

TEST(ProfileIO, MissingFile) {
  Profile p;
  std::string error;
  EXPECT_FALSE(read_profile_file("/nonexistent/profile.json", &p, &error));
  EXPECT_NE(error.find("/nonexistent/profile.json"), std::string::npos);
}

TEST(ProfileOps, FirstOtherOp) {
  auto ops = [](std::initializer_list<const char*> names) {
    std::vector<Op> v;
    for (const char* n : names) v.emplace_back().name = n;
    return v;
  };
  EXPECT_EQ(first_other_op(ops({"a", "b"}), ops({"a", "b"})), -1);
  EXPECT_EQ(first_other_op(ops({"a", "b"}), ops({"a", "c"})), 1);
  EXPECT_EQ(first_other_op(ops({"a", "b"}), ops({"a"})), 1);  // a prefix
  EXPECT_EQ(first_other_op(ops({}), ops({"a"})), 0);
  EXPECT_EQ(first_other_op(ops({}), ops({})), -1);
}

}  // namespace
}  // namespace memplan
