// The agent's configuration: one table of MEMPLAN_* environment variables, read once, tolerant.
//
// Like mimalloc's options.c: every variable is one row (name, default, what is accepted, help,
// parser) so the parser, the warnings and docs/options.md cannot drift apart. A bad value never
// stops the run: it gives one warning naming the variable, the value and what is accepted, and the
// default is used. Torch-free and exception-free.
#pragma once

#include "planner/budget.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace memplan {

enum class LogLevel { Error, Warn, Info, Debug };

// Which thread's steps are observed and planned (one thread: the saved-tensor hooks and the
// recorder are per training thread). Import: the thread that imported torch (a script's main
// thread). FirstBackward: the first thread that calls backward (a framework that runs the
// training function on a thread of its own); its first step runs unobserved.
enum class TrainThread { Import, FirstBackward };

// One budget type for the option, the offline CLI and the planner (planner/budget.h):
// Kind::Bytes caps everything allocated during the step; Kind::Percent, in (0, 1000], is of the
// un-planned step's activation memory.
using Budget = planner::Budget;

struct Options {
  bool disable = false;                              // MEMPLAN_DISABLE
  Budget budget;                                     // MEMPLAN_BUDGET; None = profile only
  int warmup = 2;                                    // MEMPLAN_WARMUP: iterations to profile
  std::string trace = "memplan-trace.json";          // MEMPLAN_TRACE; "" = none
  std::string profile_out = "memplan-profile.json";  // MEMPLAN_PROFILE_OUT; "" = none
  std::string plan;                                  // MEMPLAN_PLAN: load instead of planning
  std::string plan_cache;                            // MEMPLAN_PLAN_CACHE: dir; "" = no cache
  std::string report;                                // MEMPLAN_REPORT: JSON report at exit
  LogLevel log = LogLevel::Info;                     // MEMPLAN_LOG
  bool summary = true;                               // MEMPLAN_SUMMARY
  bool nvtx = true;                                  // MEMPLAN_NVTX
  TrainThread train_thread = TrainThread::Import;    // MEMPLAN_TRAIN_THREAD
};

struct OptionInfo {
  const char* name;          // "MEMPLAN_WARMUP"
  const char* default_text;  // "2"
  const char* accepted;      // "an integer 1..1000": used in warnings and docs
  const char* help;          // one line for docs/options.md
};

// Every variable, in documentation order.
const std::vector<OptionInfo>& option_table();

// Pure: `lookup(name)` returns the value or nullptr when unset (tests pass a map). Appends one
// warning per bad value, e.g.
//   memplan: ignoring MEMPLAN_WARMUP='abc': expected an integer 1..1000; using 2
// `warnings` may be null.
Options parse_options(const std::function<const char*(const char*)>& lookup,
                      std::vector<std::string>* warnings);

// MEMPLAN_* names in `env` (a NULL-terminated "NAME=value" array, like environ) that are neither
// options nor known helper variables: most likely typos. One warning each, with the closest
// option name when there is one:
//   memplan: unknown variable MEMPLAN_BUGDET (did you mean MEMPLAN_BUDGET?)
std::vector<std::string> unknown_memplan_vars(char** env);

// Process-wide options: parsed from getenv on the first call (thread-safe, C++11 static init);
// the warnings of parse_options and unknown_memplan_vars(environ) go to stderr once, unless
// MEMPLAN_LOG=error or MEMPLAN_DISABLE is set.
const Options& options();

// Sizes: a number (decimals allowed: "1.5GiB") and an optional unit, case-insensitive, spaces
// tolerated: B or none; KiB/MiB/GiB/TiB and K/M/G/T (1024); KB/MB/GB/TB (1000).
// Rejects negatives, empty, overflow, fractional bytes and garbage. `bytes` is untouched on false.
bool parse_size(const std::string& text, int64_t* bytes);
// A size > 0, or "N%" / "N.M%" with 0 < N <= 1000.
bool parse_budget(const std::string& text, Budget* out);
// 1/0, true/false, yes/no, on/off, case-insensitive.
bool parse_bool(const std::string& text, bool* out);
// "import" or "backward" (also "first-backward"), case-insensitive.
bool parse_train_thread(const std::string& text, TrainThread* out);

// Per-rank output path when the process is one of several ranks (world_size > 1): ".rankN" goes
// before the extension: "trace.json" -> "trace.rank1.json", "out/trace" -> "out/trace.rank1".
// Unchanged for a single process or an empty path.
std::string rank_path(const std::string& path, int rank, int world_size);
// RANK (falls back to LOCAL_RANK) and WORLD_SIZE as torchrun sets them; 0 / 1 when unset or bad.
int env_rank();
int env_world_size();

const char* to_string(LogLevel level);

}  // namespace memplan
