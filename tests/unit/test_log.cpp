#include "agent/log.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace memplan {
namespace {

std::vector<std::string>* g_lines = nullptr;

struct Capture {
  std::vector<std::string> lines;
  Capture() {
    g_lines = &lines;
    set_log_sink([](const std::string& l) { g_lines->push_back(l); });
  }
  ~Capture() {
    set_log_sink(nullptr);
    g_lines = nullptr;
  }
};

// A type whose formatter throws: the log call must swallow it.
struct Exploding {};

}  // namespace
}  // namespace memplan

template <>
struct fmt::formatter<memplan::Exploding> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx>
  auto format(const memplan::Exploding&, Ctx& ctx) const -> decltype(ctx.out()) {
    throw fmt::format_error("boom");
  }
};

namespace memplan {
namespace {

// The process-wide level comes from MEMPLAN_LOG (unset under ctest: info); the checks follow it.
TEST(Log, PrefixAndLevels) {
  Capture c;
  const LogLevel level = options().log;
  warn("budget {} below {}", "1 GiB", 2);
  info("hello {}", 42);
  debug("details {}", 1.5);
  error("bad");
  std::vector<std::string> want;
  if (level >= LogLevel::Warn) want.push_back("[memplan] warning: budget 1 GiB below 2\n");
  if (level >= LogLevel::Info) want.push_back("[memplan] hello 42\n");
  if (level >= LogLevel::Debug) want.push_back("[memplan] details 1.5\n");
  want.push_back("[memplan] error: bad\n");
  EXPECT_EQ(c.lines, want);
}

TEST(Log, Once) {
  Capture c;
  EXPECT_TRUE(log_once("test-key", LogLevel::Error, "first"));
  EXPECT_FALSE(log_once("test-key", LogLevel::Error, "second"));
  EXPECT_TRUE(log_once("other-key", LogLevel::Error, "third"));
  ASSERT_EQ(c.lines.size(), 2u);
  EXPECT_EQ(c.lines[0], "[memplan] error: first\n");
  EXPECT_EQ(c.lines[1], "[memplan] error: third\n");
}

TEST(Log, FormatErrorDoesNotThrow) {
  Capture c;
  EXPECT_NO_THROW(error("value {}", Exploding{}));
  ASSERT_EQ(c.lines.size(), 1u);
  EXPECT_NE(c.lines[0].find("log format error"), std::string::npos) << c.lines[0];
}

TEST(Log, PlainStringNotFormatted) {
  Capture c;
  log(LogLevel::Error, "braces {} stay");
  ASSERT_EQ(c.lines.size(), 1u);
  EXPECT_EQ(c.lines[0], "[memplan] error: braces {} stay\n");
}

}  // namespace
}  // namespace memplan
