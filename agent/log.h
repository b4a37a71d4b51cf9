// Logging to stderr with the "[memplan] " prefix, filtered by MEMPLAN_LOG.
//
// Usable from anywhere, before or without torch, from any thread, in an LD_PRELOAD constructor.
// Never throws: a formatting error or an allocation failure prints a fallback line or nothing.
// Each message is written with one fwrite so lines from different threads do not interleave.
//
//   memplan::warn("budget {} is below the baseline {}", format_bytes(b), format_bytes(base));
//   memplan::log_once("no-cuda", LogLevel::Info, "no CUDA device: CPU profiling only");
#pragma once

#include <string>
#include <utility>

#include <fmt/format.h>

#include "agent/options.h"

namespace memplan {

// Whether `level` passes MEMPLAN_LOG (reads options() on first use).
bool log_enabled(LogLevel level) noexcept;

// One line "[memplan] <msg>\n" (error/warn lines also say "error: " / "warning: ").
void log(LogLevel level, const std::string& msg) noexcept;

// Like log, but a given key prints at most once per process (e.g. a per-op fallback warning
// that would otherwise repeat every iteration). Returns whether it printed.
bool log_once(const std::string& key, LogLevel level, const std::string& msg) noexcept;

namespace detail {
// Formats and logs; a throwing formatter gives "[memplan] (log format error: ...)" instead.
// Inline on purpose: formatting happens in the caller's translation unit, so torch-side code
// (compiled against torch's bundled fmt, header-only) and torch-free code (the system libfmt)
// never pass fmt types to each other; only std::string crosses.
inline void vlog(LogLevel level, fmt::string_view f, fmt::format_args args) noexcept {
  try {
    log(level, fmt::vformat(f, args));
  } catch (const std::exception& e) {
    log(level, std::string("(log format error: ") + e.what() + ") " + std::string(f.data(), f.size()));
  } catch (...) {
    log(level, "(log format error)");
  }
}
// The checked format string's text: get() where the fmt in use has it (torch's bundled fmt
// deprecates the implicit conversion; the system's 9.x has only that).
template <class... A>
fmt::string_view text(const fmt::format_string<A...>& f) noexcept {
#if FMT_VERSION >= 110000
  return f.get();
#else
  return f;
#endif
}
}  // namespace detail

// fmt-style helpers; the format string is checked at compile time. Arguments are only formatted
// when the level is enabled.
template <class... A>
void error(fmt::format_string<A...> f, A&&... a) noexcept {
  if (log_enabled(LogLevel::Error)) detail::vlog(LogLevel::Error, detail::text<A...>(f), fmt::make_format_args(a...));
}
template <class... A>
void warn(fmt::format_string<A...> f, A&&... a) noexcept {
  if (log_enabled(LogLevel::Warn)) detail::vlog(LogLevel::Warn, detail::text<A...>(f), fmt::make_format_args(a...));
}
template <class... A>
void info(fmt::format_string<A...> f, A&&... a) noexcept {
  if (log_enabled(LogLevel::Info)) detail::vlog(LogLevel::Info, detail::text<A...>(f), fmt::make_format_args(a...));
}
template <class... A>
void debug(fmt::format_string<A...> f, A&&... a) noexcept {
  if (log_enabled(LogLevel::Debug)) detail::vlog(LogLevel::Debug, detail::text<A...>(f), fmt::make_format_args(a...));
}

// Where log lines go; tests capture them. nullptr restores stderr. Not for production use.
using LogSink = void (*)(const std::string& line);
void set_log_sink(LogSink sink) noexcept;

}  // namespace memplan
