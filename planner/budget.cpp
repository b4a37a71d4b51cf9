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

}  // namespace memplan::planner
