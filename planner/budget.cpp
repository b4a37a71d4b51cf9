#include "planner/budget.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace memplan::planner {


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
