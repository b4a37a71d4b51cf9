#include "agent/options.h"

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "profiler/bytes.h"

namespace memplan {
namespace {

constexpr int64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024, TiB = GiB * 1024;

int64_t size_of(const std::string& s) {
  int64_t b = -12345;
  EXPECT_TRUE(parse_size(s, &b)) << "'" << s << "'";
  return b;
}

bool size_fails(const std::string& s) {
  int64_t b = -12345;
  const bool ok = parse_size(s, &b);
  EXPECT_EQ(b, -12345) << "output touched for '" << s << "'";
  return !ok;
}

TEST(ParseSize, EveryUnit) {
  EXPECT_EQ(size_of("123456"), 123456);
  EXPECT_EQ(size_of("123456B"), 123456);
  EXPECT_EQ(size_of("0"), 0);
  EXPECT_EQ(size_of("1KiB"), KiB);
  EXPECT_EQ(size_of("1MiB"), MiB);
  EXPECT_EQ(size_of("12GiB"), 12 * GiB);
  EXPECT_EQ(size_of("2TiB"), 2 * TiB);
  EXPECT_EQ(size_of("1KB"), 1000);
  EXPECT_EQ(size_of("1MB"), 1000 * 1000);
  EXPECT_EQ(size_of("3GB"), int64_t{3} * 1000 * 1000 * 1000);
  EXPECT_EQ(size_of("1TB"), int64_t{1000} * 1000 * 1000 * 1000);
  EXPECT_EQ(size_of("4K"), 4 * KiB);
  EXPECT_EQ(size_of("4M"), 4 * MiB);
  EXPECT_EQ(size_of("4G"), 4 * GiB);
  EXPECT_EQ(size_of("4T"), 4 * TiB);
}

TEST(ParseSize, CaseAndWhitespace) {
  EXPECT_EQ(size_of("300mib"), 300 * MiB);
  EXPECT_EQ(size_of("300MIB"), 300 * MiB);
  EXPECT_EQ(size_of("  300 MiB  "), 300 * MiB);
  EXPECT_EQ(size_of("\t5gb\n"), int64_t{5} * 1000 * 1000 * 1000);
  EXPECT_EQ(size_of("7 b"), 7);
}

TEST(ParseSize, Decimals) {
  EXPECT_EQ(size_of("1.5GiB"), GiB + GiB / 2);
  EXPECT_EQ(size_of("1.5GB"), int64_t{1500} * 1000 * 1000);
  EXPECT_EQ(size_of("0.5KiB"), 512);
  EXPECT_EQ(size_of(".25MiB"), MiB / 4);
  EXPECT_EQ(size_of("2.MiB"), 2 * MiB);
  EXPECT_EQ(size_of("1.0"), 1);  // a zero fraction of bytes is fine
}

TEST(ParseSize, Rejects) {
  for (const char* bad : {"", "   ", "-1", "-1GiB", "+1GiB", "12XB", "GiB", "abc", "1.5",
                          "1.5B", "1..5GiB", "1e9", "0x10", "1 2", "12GiB extra", ".", "%",
                          "99999999999TiB", "9223372036854775808", "99999999999999999999999"}) {
    EXPECT_TRUE(size_fails(bad)) << "accepted '" << bad << "'";
  }
}

TEST(ParseSize, Limits) {
  EXPECT_EQ(size_of("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(size_of("8388607TiB"), 8388607 * TiB);  // largest whole TiB count in int64
  EXPECT_TRUE(size_fails("8388608TiB"));
}

TEST(ParseBudget, SizesAndPercents) {
  Budget b;
  ASSERT_TRUE(parse_budget("12GiB", &b));
  EXPECT_EQ(b.kind, Budget::Kind::Bytes);
  EXPECT_EQ(b.bytes, 12 * GiB);
  ASSERT_TRUE(parse_budget("60%", &b));
  EXPECT_EQ(b.kind, Budget::Kind::Percent);
  EXPECT_DOUBLE_EQ(b.percent, 60);
  EXPECT_EQ(b.bytes, 0);
  ASSERT_TRUE(parse_budget(" 12.5 % ", &b));
  EXPECT_DOUBLE_EQ(b.percent, 12.5);
  ASSERT_TRUE(parse_budget("1000%", &b));
  EXPECT_DOUBLE_EQ(b.percent, 1000);
  ASSERT_TRUE(parse_budget("0.1%", &b));
  EXPECT_DOUBLE_EQ(b.percent, 0.1);
  ASSERT_TRUE(parse_budget("123456", &b));
  EXPECT_EQ(b.kind, Budget::Kind::Bytes);
  EXPECT_EQ(b.bytes, 123456);
}

TEST(ParseBudget, Rejects) {
  for (const char* bad : {"", "%", "0%", "0.0%", "2000%", "1000.5%", "-5%", "abc%", "5%%",
                          "0", "0GiB", "-1GiB", "12XB", "99999999999TiB", "50 percent"}) {
    Budget b;
    b.kind = Budget::Kind::Bytes;
    b.bytes = 7;
    EXPECT_FALSE(parse_budget(bad, &b)) << "accepted '" << bad << "'";
    EXPECT_EQ(b.kind, Budget::Kind::Bytes);
    EXPECT_EQ(b.bytes, 7);
  }
}

TEST(ParseBool, Words) {
  for (const char* t : {"1", "true", "TRUE", "yes", "Yes", "on", " on "}) {
    bool v = false;
    EXPECT_TRUE(parse_bool(t, &v)) << t;
    EXPECT_TRUE(v) << t;
  }
  for (const char* f : {"0", "false", "False", "no", "NO", "off"}) {
    bool v = true;
    EXPECT_TRUE(parse_bool(f, &v)) << f;
    EXPECT_FALSE(v) << f;
  }
  for (const char* bad : {"", "2", "y", "n", "enable", "tru"}) {
    bool v = true;
    EXPECT_FALSE(parse_bool(bad, &v)) << bad;
    EXPECT_TRUE(v);
  }
}

// parse_options from a map, collecting warnings.
struct Env {
  std::map<std::string, std::string> vars;
  std::vector<std::string> warnings;
  Options parse() {
    warnings.clear();
    return parse_options(
        [this](const char* n) -> const char* {
          auto it = vars.find(n);
          return it == vars.end() ? nullptr : it->second.c_str();
        },
        &warnings);
  }
};

TEST(ParseOptions, DefaultsWhenUnset) {
  Env env;
  const Options o = env.parse();
  EXPECT_TRUE(env.warnings.empty());
  EXPECT_FALSE(o.disable);
  EXPECT_EQ(o.budget.kind, Budget::Kind::None);
  EXPECT_EQ(o.warmup, 2);
  EXPECT_EQ(o.trace, "memplan-trace.json");
  EXPECT_EQ(o.profile_out, "memplan-profile.json");
  EXPECT_EQ(o.plan, "");
  EXPECT_EQ(o.plan_cache, "");
  EXPECT_EQ(o.log, LogLevel::Info);
  EXPECT_TRUE(o.summary);
  EXPECT_TRUE(o.nvtx);
  EXPECT_EQ(o.train_thread, TrainThread::Import);
}

TEST(ParseOptions, GoodValues) {
  Env env;
  env.vars = {{"MEMPLAN_DISABLE", "yes"},     {"MEMPLAN_BUDGET", "300MiB"},
              {"MEMPLAN_WARMUP", "5"},        {"MEMPLAN_TRACE", "out/t.json"},
              {"MEMPLAN_PROFILE_OUT", "off"}, {"MEMPLAN_PLAN", "p.json"},
              {"MEMPLAN_PLAN_CACHE", "/tmp/c"}, {"MEMPLAN_LOG", "DEBUG"},
              {"MEMPLAN_SUMMARY", "0"},       {"MEMPLAN_NVTX", "off"},
              {"MEMPLAN_TRAIN_THREAD", " Backward "}};
  const Options o = env.parse();
  EXPECT_TRUE(env.warnings.empty()) << env.warnings.front();
  EXPECT_TRUE(o.disable);
  EXPECT_EQ(o.budget.kind, Budget::Kind::Bytes);
  EXPECT_EQ(o.budget.bytes, 300 * MiB);
  EXPECT_EQ(o.warmup, 5);
  EXPECT_EQ(o.trace, "out/t.json");
  EXPECT_EQ(o.profile_out, "");
  EXPECT_EQ(o.plan, "p.json");
  EXPECT_EQ(o.plan_cache, "/tmp/c");
  EXPECT_EQ(o.log, LogLevel::Debug);
  EXPECT_FALSE(o.summary);
  EXPECT_FALSE(o.nvtx);
  EXPECT_EQ(o.train_thread, TrainThread::FirstBackward);
}

TEST(ParseOptions, TrainThreadWords) {
  TrainThread t = TrainThread::FirstBackward;
  EXPECT_TRUE(parse_train_thread("import", &t));
  EXPECT_EQ(t, TrainThread::Import);
  EXPECT_TRUE(parse_train_thread("FIRST-BACKWARD", &t));
  EXPECT_EQ(t, TrainThread::FirstBackward);
  for (const char* bad : {"", "main", "backwards", "1"}) {
    t = TrainThread::Import;
    EXPECT_FALSE(parse_train_thread(bad, &t)) << bad;
    EXPECT_EQ(t, TrainThread::Import) << bad;  // untouched
  }
}

TEST(ParseOptions, PathsOffAndOn) {
  Env env;
  for (const char* off : {"", "0", "off", "none", "false", "  "}) {
    env.vars = {{"MEMPLAN_TRACE", off}};
    EXPECT_EQ(env.parse().trace, "") << "'" << off << "'";
  }
  env.vars = {{"MEMPLAN_TRACE", "1"}};  // "yes": keep the default path
  EXPECT_EQ(env.parse().trace, "memplan-trace.json");
  EXPECT_TRUE(env.warnings.empty());
}

TEST(ParseOptions, WarmupBounds) {
  Env env;
  env.vars = {{"MEMPLAN_WARMUP", "1"}};
  EXPECT_EQ(env.parse().warmup, 1);
  env.vars = {{"MEMPLAN_WARMUP", "1000"}};
  EXPECT_EQ(env.parse().warmup, 1000);
  env.vars = {{"MEMPLAN_WARMUP", " 7 "}};
  EXPECT_EQ(env.parse().warmup, 7);
  for (const char* bad : {"0", "1001", "-1", "abc", "", "2.5", "3x", "99999999999999999999"}) {
    env.vars = {{"MEMPLAN_WARMUP", bad}};
    EXPECT_EQ(env.parse().warmup, 2) << bad;
    EXPECT_EQ(env.warnings.size(), 1u) << bad;
  }
}

TEST(ParseOptions, WarningFormat) {
  Env env;
  env.vars = {{"MEMPLAN_WARMUP", "abc"}};
  env.parse();
  ASSERT_EQ(env.warnings.size(), 1u);
  EXPECT_EQ(env.warnings[0],
            "memplan: ignoring MEMPLAN_WARMUP='abc': expected an integer 1..1000; using 2");
}

// Each variable with a bad value: exactly one warning naming it, the value and what is
// accepted; that field keeps its default and the other (good) variables still apply.
TEST(ParseOptions, EachBadValueOneWarningAndDefault) {
  const std::map<std::string, std::string> bad = {
      {"MEMPLAN_DISABLE", "maybe"}, {"MEMPLAN_BUDGET", "12XB"}, {"MEMPLAN_WARMUP", "0"},
      {"MEMPLAN_LOG", "loud"},      {"MEMPLAN_SUMMARY", "2"},   {"MEMPLAN_NVTX", "sometimes"},
      {"MEMPLAN_TRAIN_THREAD", "worker"}};
  const Options defaults;
  for (const auto& [name, value] : bad) {
    Env env;
    env.vars = {{name, value}, {"MEMPLAN_PLAN", "keep.json"}};
    const Options o = env.parse();
    ASSERT_EQ(env.warnings.size(), 1u) << name;
    const std::string& w = env.warnings[0];
    EXPECT_NE(w.find(name + "='" + value + "'"), std::string::npos) << w;
    const OptionInfo* info = nullptr;
    for (const auto& i : option_table()) {
      if (name == i.name) info = &i;
    }
    ASSERT_NE(info, nullptr) << name;
    EXPECT_NE(w.find(std::string("expected ") + info->accepted), std::string::npos) << w;
    EXPECT_NE(w.find(std::string("using ") + info->default_text), std::string::npos) << w;
    EXPECT_EQ(o.plan, "keep.json");
    EXPECT_EQ(o.disable, defaults.disable);
    EXPECT_EQ(o.budget.kind, defaults.budget.kind);
    EXPECT_EQ(o.warmup, defaults.warmup);
    EXPECT_EQ(o.log, defaults.log);
    EXPECT_EQ(o.summary, defaults.summary);
    EXPECT_EQ(o.nvtx, defaults.nvtx);
    EXPECT_EQ(o.train_thread, defaults.train_thread);
  }
}

TEST(ParseOptions, BadBudgetsWarn) {
  for (const char* bad : {"-1GiB", "12XB", "", "%", "0%", "2000%", "99999999999TiB"}) {
    Env env;
    env.vars = {{"MEMPLAN_BUDGET", bad}};
    const Options o = env.parse();
    EXPECT_EQ(o.budget.kind, Budget::Kind::None) << bad;
    ASSERT_EQ(env.warnings.size(), 1u) << bad;
    EXPECT_NE(env.warnings[0].find("MEMPLAN_BUDGET='" + std::string(bad) + "'"), std::string::npos);
  }
}

TEST(ParseOptions, NullWarningsAndNullLookup) {
  const Options o = parse_options([](const char*) { return "junk"; }, nullptr);
  EXPECT_EQ(o.warmup, 2);
  EXPECT_EQ(parse_options(nullptr, nullptr).warmup, 2);
}

TEST(OptionTable, EveryRowComplete) {
  const auto& t = option_table();
  EXPECT_EQ(t.size(), 12u);  // one row per MEMPLAN_* option (README and docs/options.md list them)
  for (const auto& i : t) {
    EXPECT_EQ(std::string(i.name).rfind("MEMPLAN_", 0), 0u);
    EXPECT_STRNE(i.default_text, "");
    EXPECT_STRNE(i.accepted, "");
    EXPECT_STRNE(i.help, "");
  }
}

TEST(UnknownVars, TyposAreNamed) {
  std::vector<std::string> storage = {"PATH=/bin",          "MEMPLAN_BUGDET=1GiB",
                                      "MEMPLAN_BUDGET=1GiB", "MEMPLAN_NVTX_LOG=/tmp/x",
                                      "MEMPLAN_WHATEVER_ELSE=1", "XMEMPLAN_FOO=1"};
  std::vector<char*> env;
  for (auto& s : storage) env.push_back(s.data());
  env.push_back(nullptr);
  const auto w = unknown_memplan_vars(env.data());
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0], "memplan: unknown variable MEMPLAN_BUGDET (did you mean MEMPLAN_BUDGET?)");
  EXPECT_EQ(w[1], "memplan: unknown variable MEMPLAN_WHATEVER_ELSE");
  EXPECT_TRUE(unknown_memplan_vars(nullptr).empty());
}

TEST(RankPath, Cases) {
  EXPECT_EQ(rank_path("trace.json", 1, 2), "trace.rank1.json");
  EXPECT_EQ(rank_path("out/trace", 1, 2), "out/trace.rank1");
  EXPECT_EQ(rank_path("out.d/trace", 3, 4), "out.d/trace.rank3");
  EXPECT_EQ(rank_path("out.d/trace.json", 0, 4), "out.d/trace.rank0.json");
  EXPECT_EQ(rank_path(".trace", 1, 2), ".trace.rank1");
  EXPECT_EQ(rank_path("dir/.trace", 1, 2), "dir/.trace.rank1");
  EXPECT_EQ(rank_path("trace.json", 0, 1), "trace.json");  // single process: unchanged
  EXPECT_EQ(rank_path("trace.json", 5, 0), "trace.json");
  EXPECT_EQ(rank_path("", 1, 2), "");
}

TEST(RankPath, FromEnvironment) {
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  unsetenv("WORLD_SIZE");
  EXPECT_EQ(env_rank(), 0);
  EXPECT_EQ(env_world_size(), 1);
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  EXPECT_EQ(env_rank(), 3);
  EXPECT_EQ(env_world_size(), 8);
  setenv("RANK", "x", 1);
  setenv("LOCAL_RANK", "2", 1);
  setenv("WORLD_SIZE", "-4", 1);
  EXPECT_EQ(env_rank(), 2);  // bad RANK: LOCAL_RANK
  EXPECT_EQ(env_world_size(), 1);
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  unsetenv("WORLD_SIZE");
}

TEST(FormatBytes, Cases) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(GiB + GiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(300 * MiB), "300.0 MiB");
  EXPECT_EQ(format_bytes(12 * GiB), "12.0 GiB");
  EXPECT_EQ(format_bytes(3 * TiB), "3.00 TiB");
  EXPECT_EQ(format_bytes(-512), "-512 B");
  EXPECT_EQ(format_bytes(-2 * MiB), "-2.00 MiB");
  EXPECT_EQ(format_bytes(INT64_MAX), "8.00 EiB");
  EXPECT_EQ(format_bytes(INT64_MIN), "-8.00 EiB");
}

// The minimum feasible budget is printed rounded up, so that pasting it back as MEMPLAN_BUDGET is
// enough: "budget 14.6 MiB is below the minimum feasible 14.6 MiB" read as nonsense before.
TEST(FormatBytes, UpNeverBelowTheValue) {
  EXPECT_EQ(format_bytes(15 * MiB), "15.0 MiB");
  EXPECT_EQ(format_bytes_up(15 * MiB), "15.0 MiB");
  EXPECT_EQ(format_bytes(15 * MiB + 1), "15.0 MiB");
  EXPECT_EQ(format_bytes_up(15 * MiB + 1), "15.1 MiB");
  EXPECT_EQ(format_bytes_up(2 * GiB + 1), "2.01 GiB");
  EXPECT_EQ(format_bytes_up(1000), "1000 B");
  for (int64_t b = 1000; b < 64 * GiB; b = b * 13 / 7 + 12345) {
    EXPECT_GE(size_of(format_bytes_up(b)), b) << format_bytes_up(b);
    EXPECT_LE(size_of(format_bytes_up(b)), b + b / 90) << format_bytes_up(b);  // one displayed digit
  }
}

}  // namespace
}  // namespace memplan

#ifdef MEMPLAN_SOURCE_DIR
#include <fstream>
#include <sstream>

namespace memplan {
namespace {

// docs/options.md is written by hand from the table: catch a variable missing from it.
TEST(OptionTable, DocumentedInDocsOptionsMd) {
  std::ifstream f(std::string(MEMPLAN_SOURCE_DIR) + "/docs/options.md");
  ASSERT_TRUE(f) << "docs/options.md missing";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const auto& i : option_table()) {
    EXPECT_NE(doc.find(std::string("| `") + i.name + "` |"), std::string::npos) << i.name;
  }
}

}  // namespace
}  // namespace memplan
#endif
