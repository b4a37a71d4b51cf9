#include "agent/log.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_set>

namespace memplan {

namespace {

std::atomic<LogSink> g_sink{nullptr};

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::Error: return "error: ";
    case LogLevel::Warn: return "warning: ";
    default: return "";
  }
}

void emit(LogLevel level, const char* msg, size_t n) noexcept {
  try {
    std::string line = "[memplan] ";
    line += level_tag(level);
    line.append(msg, n);
    if (line.empty() || line.back() != '\n') line += '\n';
    if (LogSink sink = g_sink.load(std::memory_order_acquire)) {
      sink(line);
      return;
    }
    // One call: stdio locks the stream for it, so concurrent lines stay whole.
    std::fwrite(line.data(), 1, line.size(), stderr);
  } catch (...) {
    // Out of memory: the message itself is lost, but say something.
    static const char kLost[] = "[memplan] (log message lost: out of memory)\n";
    std::fwrite(kLost, 1, sizeof(kLost) - 1, stderr);
  }
}

}  // namespace

bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= static_cast<int>(options().log);
}

void log(LogLevel level, const std::string& msg) noexcept {
  if (log_enabled(level)) emit(level, msg.data(), msg.size());
}

bool log_once(const std::string& key, LogLevel level, const std::string& msg) noexcept {
  if (!log_enabled(level)) return false;
  try {
    static std::mutex mu;
    static auto* seen = new std::unordered_set<std::string>();  // leaked: usable during exit
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!seen->insert(key).second) return false;
    }
  } catch (...) {
    return false;
  }
  emit(level, msg.data(), msg.size());
  return true;
}

void set_log_sink(LogSink sink) noexcept { g_sink.store(sink, std::memory_order_release); }


}  // namespace memplan
