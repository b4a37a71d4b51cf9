#include "profiler/bytes.h"

#include <fmt/format.h>

#include <cmath>

namespace memplan {
namespace {

std::string format(int64_t bytes, bool up) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const char* sign = bytes < 0 ? "-" : "";
  // Through double: -INT64_MIN does not fit an int64_t.
  double v = std::fabs(static_cast<double>(bytes));
  if (v < 1024) return fmt::format("{}{} B", sign, static_cast<int64_t>(v));
  size_t u = 0;
  while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
    v /= 1024;
    ++u;
  }
  const int digits = v < 10 ? 2 : 1;
  if (up && bytes > 0) {
    const double scale = digits == 2 ? 100.0 : 10.0;
    v = std::ceil(v * scale) / scale;
  }
  return fmt::format("{}{:.{}f} {}", sign, v, digits, units[u]);
}

}  // namespace

std::string format_bytes(int64_t bytes) { return format(bytes, false); }
std::string format_bytes_up(int64_t bytes) { return format(bytes, true); }

}  // namespace memplan
