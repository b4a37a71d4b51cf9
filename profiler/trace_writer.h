// Chrome Trace Event JSON (the format ui.perfetto.dev and chrome://tracing load).
//
// Collection is apart from output: TraceBuilder keeps events in memory as compact structs (no
// JSON objects per event; args are serialised once, when given), and write() streams the file:
//   {"traceEvents":[...], "displayTimeUnit":"ms", "otherData":{...}}
// Event kinds: "X" complete (a span), "i" instant (thread scope), "C" counter, "M" metadata
// (process_name, thread_name, thread_sort_index). pid is the one given at construction; a track
// is a tid. Metadata events come first, then the others in the order they were added (Perfetto
// does not need them sorted). Times are microseconds as doubles. Not thread-safe: one builder
// per writer thread, or a lock around it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace memplan {

class TraceBuilder {
 public:
  explicit TraceBuilder(int64_t pid);

  // A span on `track`. `args` should be a JSON object (shown in Perfetto's details pane);
  // null (the default) means none, any other non-object is wrapped as {"value": args}.
  void complete(const std::string& name, const std::string& category, double ts_us,
                double dur_us, int64_t track, const nlohmann::json& args);
  void complete(const std::string& name, const std::string& category, double ts_us,
                double dur_us, int64_t track);
  void instant(const std::string& name, const std::string& category, double ts_us,
               int64_t track, const nlohmann::json& args);
  void instant(const std::string& name, const std::string& category, double ts_us, int64_t track);
  // A counter track named `name` with one line per series ("allocated", "reserved", ...).
  // Non-finite values are dropped (JSON has no NaN).
  void counter(const std::string& name, double ts_us,
               const std::vector<std::pair<std::string, double>>& series);
  void track_name(int64_t track, const std::string& name);  // also keeps tracks in id order
  void process_name(const std::string& name);
  // A string entry in "otherData" (tool version, budget, plan hash...). Later values replace.
  void set_other(const std::string& key, const std::string& value);

  size_t size() const { return events_.size(); }
  void reserve(size_t n) { events_.reserve(n); }
  void clear();

  // The whole document as a string (tests, small traces).
  std::string to_json() const;
  // Writes `path` through a temporary file in the same directory and renames it, so a crash or a
  // full disk never leaves a truncated trace behind. False and a message on failure; never throws.
  bool write(const std::string& path, std::string* error) const;

 private:
  enum class Phase : char { Complete = 'X', Instant = 'i', Counter = 'C', Meta = 'M' };
  struct Event {
    Phase ph;
    std::string name;
    std::string cat;
    double ts = 0;
    double dur = 0;
    int64_t tid = 0;
    std::string args;  // serialised JSON object, "" = none
  };
  template <class Out>
  void emit(Out& out) const;

  int64_t pid_;
  std::vector<Event> meta_;
  std::vector<Event> events_;
  std::vector<std::pair<std::string, std::string>> other_;
};

// JSON string escaping for trace text: quotes, backslashes and control characters escaped,
// invalid UTF-8 replaced with U+FFFD so the file always parses. Appends to `out`, with quotes.
void append_json_string(std::string* out, const std::string& s);

}  // namespace memplan
