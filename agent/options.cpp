#include "agent/options.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <fmt/format.h>

extern char** environ;

namespace memplan {

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// An unsigned decimal "123", "1.5", ".5", "2." split into its integer digits and the fraction, so
// large integers stay exact (a double would round 2^63-ish sizes). Stops at the first other char.
struct Decimal {
  uint64_t whole = 0;
  long double frac = 0;  // in [0, 1)
  bool any_frac = false; // a non-zero fractional digit was seen
};

bool parse_decimal(const std::string& s, size_t* pos, Decimal* d) {
  size_t i = *pos;
  bool digits = false;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
    const uint64_t digit = static_cast<uint64_t>(s[i] - '0');
    if (d->whole > (std::numeric_limits<uint64_t>::max() - digit) / 10) return false;  // overflow
    d->whole = d->whole * 10 + digit;
    digits = true;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    long double scale = 0.1L;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
      d->frac += (s[i] - '0') * scale;
      if (s[i] != '0') d->any_frac = true;
      scale /= 10;
      digits = true;
    }
  }
  *pos = i;
  return digits;
}

bool unit_multiplier(const std::string& unit, int64_t* mult) {
  static const struct { const char* name; int64_t mult; } units[] = {
      {"", 1},
      {"b", 1},
      {"k", int64_t{1} << 10},  {"ki", int64_t{1} << 10}, {"kib", int64_t{1} << 10},
      {"m", int64_t{1} << 20},  {"mi", int64_t{1} << 20}, {"mib", int64_t{1} << 20},
      {"g", int64_t{1} << 30},  {"gi", int64_t{1} << 30}, {"gib", int64_t{1} << 30},
      {"t", int64_t{1} << 40},  {"ti", int64_t{1} << 40}, {"tib", int64_t{1} << 40},
      {"kb", 1000},
      {"mb", 1000 * 1000},
      {"gb", int64_t{1000} * 1000 * 1000},
      {"tb", int64_t{1000} * 1000 * 1000 * 1000},
  };
  const std::string u = lower(unit);
  for (const auto& e : units) {
    if (u == e.name) {
      *mult = e.mult;
      return true;
    }
  }
  return false;
}

bool parse_int(const std::string& text, long lo, long hi, int* out) {
  const std::string s = trim(text);
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse_log_level(const std::string& text, LogLevel* out) {
  const std::string s = lower(trim(text));
  if (s == "error") *out = LogLevel::Error;
  else if (s == "warn" || s == "warning") *out = LogLevel::Warn;
  else if (s == "info") *out = LogLevel::Info;
  else if (s == "debug") *out = LogLevel::Debug;
  else return false;
  return true;
}

// Output paths: any text is a path; the usual "no" words mean none and the "yes" words keep the
// default, so MEMPLAN_TRACE=0 and MEMPLAN_TRACE=1 both do what one expects.
bool parse_path(const std::string& text, std::string* out) {
  const std::string s = trim(text);
  const std::string l = lower(s);
  bool b = false;
  if (s.empty() || l == "none" || (parse_bool(l, &b) && !b)) {
    out->clear();
  } else if (!parse_bool(l, &b)) {
    *out = s;
  }  // a "yes" word: leave the default
  return true;
}

// One row per variable: the public info plus how to apply a value.
struct Row {
  OptionInfo info;
  bool (*apply)(const std::string& text, Options* o);
};

const Row kRows[] = {
    {{"MEMPLAN_DISABLE", "0", "1/0, true/false, yes/no, on/off",
      "Turn the agent off entirely: no hooks, no profiling, no output."},
     [](const std::string& t, Options* o) { return parse_bool(t, &o->disable); }},
    {{"MEMPLAN_BUDGET", "unset (profile only)",
      "a size such as 12GiB, 300MiB, 1.5GB, 123456 (bytes), or a percentage 0%..1000% such as 60%",
      "Memory budget for the training step. A size caps everything allocated during the step; "
      "N% is N percent of the un-planned step's activation memory (its peak minus what was "
      "allocated when it began). Unset: profile only, no recomputation."},
     [](const std::string& t, Options* o) { return parse_budget(t, &o->budget); }},
    {{"MEMPLAN_WARMUP", "2", "an integer 1..1000",
      "Number of training iterations to profile before planning."},
     [](const std::string& t, Options* o) { return parse_int(t, 1, 1000, &o->warmup); }},
    {{"MEMPLAN_TRACE", "memplan-trace.json", "a file path, or \"\"/0/off/none for no trace",
      "Chrome/Perfetto trace of the profiled and replayed steps (open in ui.perfetto.dev). "
      "With several ranks, .rankN is inserted before the extension."},
     [](const std::string& t, Options* o) { return parse_path(t, &o->trace); }},
    {{"MEMPLAN_PROFILE_OUT", "memplan-profile.json",
      "a file path, or \"\"/0/off/none for no profile file",
      "Where the step profile (JSON, docs/profile-schema.md) is written. Per-rank like "
      "MEMPLAN_TRACE."},
     [](const std::string& t, Options* o) { return parse_path(t, &o->profile_out); }},
    {{"MEMPLAN_PLAN", "unset", "a plan file path",
      "Load this plan instead of planning from the profile."},
     [](const std::string& t, Options* o) { return parse_path(t, &o->plan); }},
    {{"MEMPLAN_PLAN_CACHE", "unset", "a directory path, or \"\"/0/off/none for no cache",
      "Directory where plans are cached by profile hash, so a rerun of the same model skips "
      "planning."},
     [](const std::string& t, Options* o) { return parse_path(t, &o->plan_cache); }},
    {{"MEMPLAN_REPORT", "unset", "a file path, or \"\"/0/off/none for none",
      "JSON report written at exit: the plan (budget, predicted peak and time; `plans` has one per "
      "kind of step) and, per replayed step, the measured peak and baseline; for benchmarks and "
      "tests."},
     [](const std::string& t, Options* o) { return parse_path(t, &o->report); }},
    {{"MEMPLAN_LOG", "info", "error, warn, info or debug (case-insensitive)",
      "How much the agent prints to stderr (prefix \"[memplan] \")."},
     [](const std::string& t, Options* o) { return parse_log_level(t, &o->log); }},
    {{"MEMPLAN_SUMMARY", "1", "1/0, true/false, yes/no, on/off",
      "Print the end-of-run summary (budget, peak, recomputed ops, overhead)."},
     [](const std::string& t, Options* o) { return parse_bool(t, &o->summary); }},
    {{"MEMPLAN_NVTX", "1", "1/0, true/false, yes/no, on/off",
      "Emit NVTX ranges (domain \"memplan\") for Nsight Systems."},
     [](const std::string& t, Options* o) { return parse_bool(t, &o->nvtx); }},
    {{"MEMPLAN_TRAIN_THREAD", "import", "import or backward (case-insensitive)",
      "Which thread trains: import, the thread that imported torch (a script's main thread); "
      "backward, the first thread that calls backward (a framework that runs the training "
      "function on a thread of its own), whose first step then runs unobserved. Other threads' "
      "ops are never observed."},
     [](const std::string& t, Options* o) { return parse_train_thread(t, &o->train_thread); }},
};

// Not options, but legitimately named MEMPLAN_*: never reported as typos.
const char* const kHelperVars[] = {"MEMPLAN_NVTX_LOG", "MEMPLAN_VENV", "MEMPLAN_PYTHON", "MEMPLAN_BUILD",
                                   "MEMPLAN_BOOT_DIR", "MEMPLAN_AGENT"};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const std::vector<OptionInfo>& option_table() {
  static const std::vector<OptionInfo> table = [] {
    std::vector<OptionInfo> t;
    for (const Row& r : kRows) t.push_back(r.info);
    return t;
  }();
  return table;
}

bool parse_train_thread(const std::string& text, TrainThread* out) {
  const std::string s = lower(trim(text));
  if (s == "import") *out = TrainThread::Import;
  else if (s == "backward" || s == "first-backward") *out = TrainThread::FirstBackward;
  else return false;
  return true;
}

bool parse_bool(const std::string& text, bool* out) {
  const std::string s = lower(trim(text));
  if (s == "1" || s == "true" || s == "yes" || s == "on") *out = true;
  else if (s == "0" || s == "false" || s == "no" || s == "off") *out = false;
  else return false;
  return true;
}

bool parse_size(const std::string& text, int64_t* bytes) {
  const std::string s = trim(text);
  size_t pos = 0;
  Decimal d;
  if (!parse_decimal(s, &pos, &d)) return false;  // empty, a sign, or garbage first
  int64_t mult = 1;
  if (!unit_multiplier(trim(s.substr(pos)), &mult)) return false;
  if (mult == 1 && d.any_frac) return false;  // "1.5" bytes means nothing
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const uint64_t m = static_cast<uint64_t>(mult);
  if (d.whole > kMax / m) return false;
  const uint64_t whole = d.whole * m;
  const uint64_t part = static_cast<uint64_t>(std::llround(static_cast<double>(d.frac * m)));
  if (part > kMax - whole) return false;
  *bytes = static_cast<int64_t>(whole + part);
  return true;
}

bool parse_budget(const std::string& text, Budget* out) {
  const std::string s = trim(text);
  if (!s.empty() && s.back() == '%') {
    const std::string num = trim(s.substr(0, s.size() - 1));
    size_t pos = 0;
    Decimal d;
    if (!parse_decimal(num, &pos, &d) || pos != num.size()) return false;
    if (d.whole > 1000) return false;
    const double pct = static_cast<double>(d.whole) + static_cast<double>(d.frac);
    if (!(pct > 0 && pct <= 1000)) return false;
    out->kind = Budget::Kind::Percent;
    out->percent = pct;
    out->bytes = 0;
    return true;
  }
  int64_t bytes = 0;
  if (!parse_size(s, &bytes) || bytes <= 0) return false;  // a zero budget cannot be met
  out->kind = Budget::Kind::Bytes;
  out->bytes = bytes;
  out->percent = 0;
  return true;
}

Options parse_options(const std::function<const char*(const char*)>& lookup,
                      std::vector<std::string>* warnings) {
  Options o;
  for (const Row& r : kRows) {
    const char* value = lookup ? lookup(r.info.name) : nullptr;
    if (value == nullptr) continue;
    // Parse into a copy so a rejected value can never leave a half-written field behind.
    Options next = o;
    if (r.apply(value, &next)) {
      o = std::move(next);
    } else if (warnings) {
      warnings->push_back(fmt::format("memplan: ignoring {}='{}': expected {}; using {}",
                                      r.info.name, value, r.info.accepted, r.info.default_text));
    }
  }
  return o;
}

std::vector<std::string> unknown_memplan_vars(char** env) {
  std::vector<std::string> out;
  if (env == nullptr) return out;
  for (char** e = env; *e != nullptr; ++e) {
    if (std::strncmp(*e, "MEMPLAN_", 8) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    const std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    bool known = false;
    for (const Row& r : kRows) known = known || name == r.info.name;
    for (const char* h : kHelperVars) known = known || name == h;
    if (known) continue;
    const char* best = nullptr;
    size_t best_d = 4;  // farther than 3 edits is not a typo, just a different word
    for (const Row& r : kRows) {
      const size_t d = edit_distance(name, r.info.name);
      if (d < best_d) {
        best_d = d;
        best = r.info.name;
      }
    }
    out.push_back(best ? fmt::format("memplan: unknown variable {} (did you mean {}?)", name, best)
                       : fmt::format("memplan: unknown variable {}", name));
  }
  return out;
}

const Options& options() {
  static const Options opts = [] {
    try {
      std::vector<std::string> warnings;
      Options o = parse_options([](const char* n) { return std::getenv(n); }, &warnings);
      for (auto& w : unknown_memplan_vars(environ)) warnings.push_back(std::move(w));
      if (!o.disable && o.log >= LogLevel::Warn) {
        for (const auto& w : warnings) std::fprintf(stderr, "%s\n", w.c_str());
      }
      return o;
    } catch (...) {
      return Options{};  // out of memory this early: defaults, silently
    }
  }();
  return opts;
}

std::string rank_path(const std::string& path, int rank, int world_size) {
  if (path.empty() || world_size <= 1) return path;
  const std::string tag = fmt::format(".rank{}", rank);
  const size_t slash = path.find_last_of('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = path.find_last_of('.');
  // A dot that starts the file name (".trace") is not an extension.
  if (dot == std::string::npos || dot <= base) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

int env_rank() {
  int v = 0;
  for (const char* name : {"RANK", "LOCAL_RANK"}) {
    const char* s = std::getenv(name);
    if (s && parse_int(s, 0, std::numeric_limits<int>::max(), &v)) return v;
  }
  return 0;
}

int env_world_size() {
  int v = 1;
  const char* s = std::getenv("WORLD_SIZE");
  if (s && parse_int(s, 1, std::numeric_limits<int>::max(), &v)) return v;
  return 1;
}

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::Error: return "error";
    case LogLevel::Warn: return "warn";
    case LogLevel::Info: return "info";
    case LogLevel::Debug: return "debug";
  }
  return "info";
}

}  // namespace memplan
