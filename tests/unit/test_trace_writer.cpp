#include "profiler/trace_writer.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace memplan {
namespace {

using nlohmann::json;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + name + "." + std::to_string(getpid());
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());  // throws (fails the test) on invalid JSON
}

TEST(TraceWriter, RoundTrip) {
  TraceBuilder t(4242);
  t.process_name("memplan train.py");
  t.track_name(1, "forward");
  t.complete("aten::add_", "op", 10.5, 2.25, 1, json{{"bytes", 1024}, {"recompute", true}});
  t.instant("evict \"x\"", "plan", 13, 1);
  t.counter("memory", 14, {{"allocated", 1.5e9}, {"reserved", 2e9}});
  t.complete("step", "step", 0, 100, 0);
  t.set_other("budget", "12 GiB");
  EXPECT_EQ(t.size(), 4u);

  const std::string path = temp_path("trace.json");
  std::string error;
  ASSERT_TRUE(t.write(path, &error)) << error;
  const json j = read_json(path);
  std::remove(path.c_str());

  EXPECT_EQ(j["displayTimeUnit"], "ms");
  EXPECT_EQ(j["otherData"]["tool"], "memplan");
  EXPECT_EQ(j["otherData"]["budget"], "12 GiB");
  const json& ev = j["traceEvents"];
  ASSERT_EQ(ev.size(), 7u);  // 3 metadata + 4 events

  // Metadata first.
  EXPECT_EQ(ev[0]["ph"], "M");
  EXPECT_EQ(ev[0]["name"], "process_name");
  EXPECT_EQ(ev[0]["args"]["name"], "memplan train.py");
  EXPECT_EQ(ev[1]["name"], "thread_name");
  EXPECT_EQ(ev[1]["tid"], 1);
  EXPECT_EQ(ev[1]["args"]["name"], "forward");
  EXPECT_EQ(ev[2]["name"], "thread_sort_index");
  EXPECT_EQ(ev[2]["args"]["sort_index"], 1);
  for (const auto& e : ev) EXPECT_EQ(e["pid"], 4242);

  // Then the events in insertion order.
  EXPECT_EQ(ev[3]["ph"], "X");
  EXPECT_EQ(ev[3]["name"], "aten::add_");
  EXPECT_EQ(ev[3]["cat"], "op");
  EXPECT_EQ(ev[3]["tid"], 1);
  EXPECT_DOUBLE_EQ(ev[3]["ts"].get<double>(), 10.5);
  EXPECT_DOUBLE_EQ(ev[3]["dur"].get<double>(), 2.25);
  EXPECT_EQ(ev[3]["args"]["bytes"], 1024);
  EXPECT_EQ(ev[3]["args"]["recompute"], true);

  EXPECT_EQ(ev[4]["ph"], "i");
  EXPECT_EQ(ev[4]["name"], "evict \"x\"");
  EXPECT_EQ(ev[4]["s"], "t");
  EXPECT_FALSE(ev[4].contains("dur"));
  EXPECT_FALSE(ev[4].contains("args"));

  EXPECT_EQ(ev[5]["ph"], "C");
  EXPECT_EQ(ev[5]["name"], "memory");
  EXPECT_DOUBLE_EQ(ev[5]["args"]["allocated"].get<double>(), 1.5e9);
  EXPECT_DOUBLE_EQ(ev[5]["args"]["reserved"].get<double>(), 2e9);

  EXPECT_EQ(ev[6]["name"], "step");
  EXPECT_EQ(ev[6]["tid"], 0);
}

TEST(TraceWriter, EscapesOddNames) {
  const std::string odd[] = {"aten::add_", "quote \" inside", "back\\slash", "new\nline",
                             "tab\there", std::string("nul\0byte", 8), "ctl\x01\x1f",
                             "utf8 \xc3\xa9\xe2\x82\xac", "bad utf8 \xff\xfe end",
                             "truncated \xe2\x82", "{\"json\": [1]}"};
  TraceBuilder t(1);
  for (const auto& n : odd) t.complete(n, n, 0, 1, 0);
  t.track_name(0, "track \"0\"\n");
  const json j = json::parse(t.to_json());
  const json& ev = j["traceEvents"];
  ASSERT_EQ(ev.size(), 2u + std::size(odd));
  EXPECT_EQ(ev[0]["args"]["name"], "track \"0\"\n");
  for (size_t i = 0; i < std::size(odd); ++i) {
    const std::string& want = odd[i];
    const std::string got = ev[2 + i]["name"].get<std::string>();
    EXPECT_EQ(ev[2 + i]["cat"].get<std::string>(), got);
    if (want.find('\xff') != std::string::npos) {
      EXPECT_EQ(got, "bad utf8 \xef\xbf\xbd\xef\xbf\xbd end");  // U+FFFD each
    } else if (want.rfind("truncated", 0) == 0) {
      EXPECT_EQ(got, "truncated \xef\xbf\xbd\xef\xbf\xbd");
    } else {
      EXPECT_EQ(got, want);
    }
  }
}

TEST(TraceWriter, NonFiniteAndNonObjectArgs) {
  TraceBuilder t(1);
  t.counter("c", NAN, {{"good", 3}, {"nan", NAN}, {"inf", INFINITY}});
  t.complete("a", "c", 1, -5, 0, json(7));  // negative duration clamps to 0
  t.complete("b", "c", 1, 1, 0, json(nullptr));
  const json ev = json::parse(t.to_json())["traceEvents"];
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0]["ts"], 0);
  EXPECT_EQ(ev[0]["args"].size(), 1u);
  EXPECT_EQ(ev[0]["args"]["good"], 3);
  EXPECT_EQ(ev[1]["dur"], 0);
  EXPECT_EQ(ev[1]["args"]["value"], 7);
  EXPECT_FALSE(ev[2].contains("args"));
}

TEST(TraceWriter, EmptyIsValid) {
  const TraceBuilder t(9);
  const json j = json::parse(t.to_json());
  EXPECT_TRUE(j["traceEvents"].is_array());
  EXPECT_TRUE(j["traceEvents"].empty());
}

TEST(TraceWriter, WriteFailsCleanly) {
  TraceBuilder t(1);
  t.complete("x", "c", 0, 1, 0);
  std::string error;
  EXPECT_FALSE(t.write("/nonexistent-dir/sub/trace.json", &error));
  EXPECT_NE(error.find("/nonexistent-dir/sub/trace.json"), std::string::npos) << error;
}

// ~1e5 events stream through the 1 MiB buffer and come back intact.
TEST(TraceWriter, ManyEvents) {
  TraceBuilder t(1);
  constexpr int n = 100000;
  t.reserve(n + n / 10);
  for (int i = 0; i < n; ++i) {
    t.complete("aten::mm", "op", i * 2.0, 1.5, i % 4);
    if (i % 10 == 0) t.counter("memory", i * 2.0, {{"allocated", double(i)}});
  }
  const std::string path = temp_path("big.json");
  std::string error;
  ASSERT_TRUE(t.write(path, &error)) << error;
  const json j = read_json(path);
  std::remove(path.c_str());
  const json& ev = j["traceEvents"];
  ASSERT_EQ(ev.size(), size_t(n + n / 10));
  EXPECT_DOUBLE_EQ(ev.back()["ts"].get<double>(), (n - 1) * 2.0);
  // The last counter (i = n - 10) is followed by the 9 spans after it.
  const json& last_counter = ev[ev.size() - 10];
  EXPECT_EQ(last_counter["ph"], "C");
  EXPECT_EQ(last_counter["args"]["allocated"], n - 10);
}

}  // namespace
}  // namespace memplan
