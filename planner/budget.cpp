#include "planner/budget.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace memplan::planner {

bool parse_budget_arg(const std::string& text, Budget* out, std::string* error) {
  std::string s;
  for (char ch : text)
    if (!std::isspace(static_cast<unsigned char>(ch))) s += ch;
  const std::string accepted =
      "expected bytes with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 300MiB, "
      "or a percentage of activation memory, e.g. 50%";
  auto bad = [&]() {
    *error = fmt::format("bad budget '{}': {}", text, accepted);
    return false;
  };
  if (s.empty()) return bad();
  size_t n = 0;
  while (n < s.size() && (std::isdigit(static_cast<unsigned char>(s[n])) || s[n] == '.')) ++n;
  if (n == 0) return bad();
  char* end = nullptr;
  const std::string num = s.substr(0, n);
  const double x = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(x) || x <= 0) return bad();
  std::string unit;
  for (size_t i = n; i < s.size(); ++i) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
  if (unit == "%") {
    if (x > 1000) return bad();
    *out = Budget{Budget::Kind::Percent, 0, x};
    return true;
  }
  double mult = 0;
  struct U { const char* name; double m; };
  static const U units[] = {{"", 1},          {"b", 1},          {"kib", 1024.0},     {"k", 1024.0},
                            {"mib", 1048576.0}, {"m", 1048576.0}, {"gib", 1073741824.0},
                            {"g", 1073741824.0}, {"tib", 1099511627776.0}, {"t", 1099511627776.0},
                            {"kb", 1e3},        {"mb", 1e6},       {"gb", 1e9},          {"tb", 1e12}};
  for (const U& u : units)
    if (unit == u.name) mult = u.m;
  if (mult == 0) return bad();
  const double bytes = x * mult;
  if (bytes > 9.0e18 || bytes < 1) return bad();
  *out = Budget{Budget::Kind::Bytes, static_cast<int64_t>(std::llround(bytes)), 0};
  return true;
}

int64_t budget_bytes(const Budget& b, const Profile& p) {
  switch (b.kind) {
    case Budget::Kind::Bytes: return b.bytes;
    case Budget::Kind::Percent:
      return p.baseline_bytes +
             static_cast<int64_t>(std::floor(b.percent / 100.0 * static_cast<double>(p.activation_bytes())));
    case Budget::Kind::None: break;
  }
  return p.peak_bytes;
}

double activation_percent(int64_t bytes, const Profile& p) {
  if (p.activation_bytes() <= 0) return 100.0;
  return 100.0 * static_cast<double>(bytes - p.baseline_bytes) / static_cast<double>(p.activation_bytes());
}

std::string format_bytes(int64_t b) {
  const double x = static_cast<double>(b);
  if (std::llabs(b) >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", x / (1 << 30));
  if (std::llabs(b) >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", x / (1 << 20));
  if (std::llabs(b) >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", x / (1 << 10));
  return fmt::format("{} B", b);
}

}  // namespace memplan::planner
