#include "profiler/trace_writer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace memplan {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is not one.
size_t utf8_len(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
  else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  // Overlong forms, surrogates and beyond U+10FFFF are invalid JSON text too.
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

void append_number(std::string* out, double v) {
  if (!std::isfinite(v)) v = 0;  // JSON has no NaN/Infinity
  fmt::format_to(std::back_inserter(*out), "{}", v);
}

std::string args_text(const nlohmann::json& args) {
  if (args.is_null()) return {};
  const nlohmann::json& obj = args.is_object() ? args : nlohmann::json{{"value", args}};
  return obj.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Buffered output: to a string only (to_json) or flushed to a FILE every MiB (write).
struct Sink {
  std::string buf;
  FILE* file = nullptr;
  bool ok = true;
  void flush() {
    if (file && !buf.empty()) {
      ok = ok && std::fwrite(buf.data(), 1, buf.size(), file) == buf.size();
      buf.clear();
    }
  }
  void maybe_flush() {
    if (file && buf.size() >= (1u << 20)) flush();
  }
};

}  // namespace

void append_json_string(std::string* out, const std::string& s) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (c < 0x20 || c == 0x7F) {
      fmt::format_to(std::back_inserter(*out), "\\u{:04x}", c);
    } else if (c < 0x80) {
      out->push_back(static_cast<char>(c));
    } else if (size_t n = utf8_len(s, i)) {
      out->append(s, i, n);
      i += n;
      continue;
    } else {
      out->append("\\ufffd");
    }
    ++i;
  }
  out->push_back('"');
}

TraceBuilder::TraceBuilder(int64_t pid) : pid_(pid) {}

void TraceBuilder::complete(const std::string& name, const std::string& category, double ts_us,
                            double dur_us, int64_t track, const nlohmann::json& args) {
  // A failed allocation drops the event: the trace is a diagnostic, never worth a crash.
  try {
    events_.push_back({Phase::Complete, name, category, ts_us, std::max(0.0, dur_us), track,
                       args_text(args)});
  } catch (...) {
  }
}

void TraceBuilder::complete(const std::string& name, const std::string& category, double ts_us,
                            double dur_us, int64_t track) {
  try {
    events_.push_back({Phase::Complete, name, category, ts_us, std::max(0.0, dur_us), track, {}});
  } catch (...) {
  }
}

void TraceBuilder::instant(const std::string& name, const std::string& category, double ts_us,
                           int64_t track, const nlohmann::json& args) {
  try {
    events_.push_back({Phase::Instant, name, category, ts_us, 0, track, args_text(args)});
  } catch (...) {
  }
}

void TraceBuilder::instant(const std::string& name, const std::string& category, double ts_us,
                           int64_t track) {
  try {
    events_.push_back({Phase::Instant, name, category, ts_us, 0, track, {}});
  } catch (...) {
  }
}

void TraceBuilder::counter(const std::string& name, double ts_us,
                           const std::vector<std::pair<std::string, double>>& series) {
  try {
    std::string args = "{";
    for (const auto& [key, value] : series) {
      if (!std::isfinite(value)) continue;
      if (args.size() > 1) args.push_back(',');
      append_json_string(&args, key);
      args.push_back(':');
      append_number(&args, value);
    }
    args.push_back('}');
    events_.push_back({Phase::Counter, name, "", ts_us, 0, 0, std::move(args)});
  } catch (...) {
  }
}

void TraceBuilder::track_name(int64_t track, const std::string& name) {
  try {
    std::string args = "{\"name\":";
    append_json_string(&args, name);
    args.push_back('}');
    meta_.push_back({Phase::Meta, "thread_name", "", 0, 0, track, std::move(args)});
    meta_.push_back({Phase::Meta, "thread_sort_index", "", 0, 0, track,
                     fmt::format("{{\"sort_index\":{}}}", track)});
  } catch (...) {
  }
}

void TraceBuilder::process_name(const std::string& name) {
  try {
    std::string args = "{\"name\":";
    append_json_string(&args, name);
    args.push_back('}');
    meta_.push_back({Phase::Meta, "process_name", "", 0, 0, 0, std::move(args)});
  } catch (...) {
  }
}

void TraceBuilder::set_other(const std::string& key, const std::string& value) {
  try {
    for (auto& kv : other_) {
      if (kv.first == key) {
        kv.second = value;
        return;
      }
    }
    other_.emplace_back(key, value);
  } catch (...) {
  }
}

void TraceBuilder::clear() {
  meta_.clear();
  events_.clear();
  other_.clear();
}

template <class Out>
void TraceBuilder::emit(Out& out) const {
  std::string& b = out.buf;
  b.append("{\"traceEvents\":[");
  bool first = true;
  auto one = [&](const Event& e) {
    b.append(first ? "\n" : ",\n");
    first = false;
    b.append("{\"ph\":\"");
    b.push_back(static_cast<char>(e.ph));
    b.append("\",\"name\":");
    append_json_string(&b, e.name);
    if (!e.cat.empty()) {
      b.append(",\"cat\":");
      append_json_string(&b, e.cat);
    }
    fmt::format_to(std::back_inserter(b), ",\"pid\":{},\"tid\":{}", pid_, e.tid);
    if (e.ph != Phase::Meta) {
      b.append(",\"ts\":");
      append_number(&b, e.ts);
    }
    if (e.ph == Phase::Complete) {
      b.append(",\"dur\":");
      append_number(&b, e.dur);
    }
    if (e.ph == Phase::Instant) b.append(",\"s\":\"t\"");
    if (!e.args.empty()) {
      b.append(",\"args\":");
      b.append(e.args);
    }
    b.push_back('}');
    out.maybe_flush();
  };
  for (const Event& e : meta_) one(e);
  for (const Event& e : events_) one(e);
  b.append("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"tool\":\"memplan\"");
  for (const auto& [key, value] : other_) {
    if (key == "tool") continue;
    b.push_back(',');
    append_json_string(&b, key);
    b.push_back(':');
    append_json_string(&b, value);
  }
  b.append("}}\n");
}

std::string TraceBuilder::to_json() const {
  Sink s;
  try {
    s.buf.reserve(64 + (meta_.size() + events_.size()) * 128);
    emit(s);
  } catch (...) {
    return {};
  }
  return std::move(s.buf);
}

bool TraceBuilder::write(const std::string& path, std::string* error) const {
  const std::string tmp = fmt::format("{}.tmp{}", path, static_cast<long>(getpid()));
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    if (error) *error = fmt::format("cannot create {}: {}", tmp, std::strerror(errno));
    return false;
  }
  Sink s;
  s.file = f;
  bool ok = true;
  try {
    s.buf.reserve((1u << 20) + 4096);
    emit(s);
    s.flush();
    ok = s.ok;
  } catch (...) {
    ok = false;
  }
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    if (error) {
      *error = fmt::format("writing {} failed: {}", path, err ? std::strerror(err) : "out of memory");
    }
  }
  return ok;
}

}  // namespace memplan
