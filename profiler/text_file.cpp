#include "profiler/text_file.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace memplan {

bool write_text_file(const std::string& path, const std::string& text, std::string* error) {
  std::ofstream f(path);
  if (!f) {
    *error = fmt::format("cannot open {} for writing", path);
    return false;
  }
  f << text << "\n";
  if (!f) {
    *error = fmt::format("write to {} failed", path);
    return false;
  }
  return true;
}

bool read_text_file(const std::string& path, std::string* text, std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = fmt::format("cannot open {}", path);
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  *text = ss.str();
  return true;
}

}  // namespace memplan
