#include "agent/step_kinds.h"

#include <fmt/format.h>

#include <algorithm>

namespace memplan {

namespace {

// The longest-context prediction over `history`, among the kinds `ok` accepts: what followed the
// latest earlier occurrence of the longest history suffix (up to `max_context` steps) that was
// followed by an accepted kind; with no context, the last kind if accepted, else the latest
// accepted one in the history.
template <typename Ok>
std::optional<uint64_t> longest_context(const std::deque<uint64_t>& history, size_t max_context, Ok ok) {
  if (history.empty()) return std::nullopt;
  const size_t n = history.size();
  // For each earlier end position j (latest first): how many steps before j equal the same
  // number of steps at the history's end. A tie keeps the latest j.
  size_t best_len = 0, best_j = n, latest_j = n;
  for (size_t j = n - 1; j-- > 0;) {
    if (!ok(history[j + 1])) continue;
    if (latest_j == n) latest_j = j;
    size_t len = 0;
    while (len < max_context && len <= j && history[j - len] == history[n - 1 - len]) ++len;
    if (len > best_len) {
      best_len = len;
      best_j = j;
      if (len == max_context) break;
    }
  }
  if (best_len > 0) return history[best_j + 1];
  if (ok(history.back())) return history.back();
  if (latest_j < n) return history[latest_j + 1];
  return std::nullopt;
}

}  // namespace

std::optional<uint64_t> StepKinds::predict() const {
  return longest_context(history_, kMaxContext, [](uint64_t) { return true; });
}

std::optional<uint64_t> StepKinds::predict(uint64_t first_op) const {
  const auto starts = [&](uint64_t kind) {
    auto it = kinds_.find(kind);
    return it != kinds_.end() && it->second.first.identity == first_op;
  };
  if (std::optional<uint64_t> kind = longest_context(history_, kMaxContext, starts)) return kind;
  for (const auto& [k, info] : kinds_) {  // a kind seen before the history's window
    if (info.first.identity == first_op) return k;
  }
  return std::nullopt;
}

StepKinds::Choice StepKinds::next(const FirstOp& first) const {
  Choice c;
  if (std::optional<uint64_t> kind = predict(first.identity)) {
    // (set_cover keeps chains one long; followed all the same, as far as there are kinds.)
    for (size_t hops = 0; hops <= cover_.size(); ++hops) {
      auto by = cover_.find(*kind);
      if (by == cover_.end()) break;
      kind = by->second;
    }
    c.kind = *kind;
    auto it = kinds_.find(*kind);
    if (it != kinds_.end() && it->second.plan >= 0) {
      c.profile = false;
      c.plan = it->second.plan;
      for (const auto& [k, info] : kinds_) {
        if (k != *kind && info.first.identity == first.identity && info.plan >= 0 && !cover_.count(k)) {
          c.others.push_back(info.plan);
        }
      }
      std::sort(c.others.begin(), c.others.end());
      return c;
    }
  }
  // No planned kind predicted for this op. Past kOwnPlans kinds, the plan of the smallest planned
  // kind of the same structure that is at least as large (fewest elements, then the earliest).
  // Not when a planned kind starts with this very op: then the first op does not show the
  // step's size (the predicted kind, unplanned, was seen diverging from those: recorded whole).
  if (kinds_.size() < kOwnPlans || first.structure == 0) return c;
  const std::pair<const uint64_t, Kind>* cover = nullptr;
  const bool alike = std::any_of(kinds_.begin(), kinds_.end(), [&](const auto& e) {
    return e.second.plan >= 0 && e.second.first.identity == first.identity;
  });
  for (const auto& e : kinds_) {
    const Kind& k = e.second;
    if (alike || k.plan < 0 || k.first.structure != first.structure || k.first.numel < first.numel) continue;
    if (!cover || k.first.numel < cover->second.first.numel ||
        (k.first.numel == cover->second.first.numel && k.plan < cover->second.plan)) {
      cover = &e;
    }
  }
  if (cover) {
    c.profile = false;
    c.kind = cover->first;
    c.plan = cover->second.plan;
    c.family = true;
  } else {
    // Larger than every planned kind of its structure (or the first): planned from this one
    // record, so that its size and the smaller ones have a plan (a length may never recur).
    c.plan_at_once = true;
  }
  return c;
}

bool StepKinds::finish(const Choice& c, uint64_t signature, const FirstOp& first, bool diverged, bool gapped) {
  gapped = gapped && !c.profile && !diverged;
  if (gapped) signature = c.kind;  // one kind for all the subsets of layers a plan covers
  history_.push_back(signature);
  if (history_.size() > kWindow) history_.pop_front();
  const bool missed = !c.profile && !gapped && (diverged || signature != c.kind);
  missed_.push_back(missed ? 1 : 0);
  if (missed_.size() > kMissWindow) missed_.pop_front();
  misses_total_ += missed ? 1 : 0;
  Kind& k = kinds_[signature];
  if (missed && signature == c.kind) {
    // The same ops, yet the replay left the profile (a saved tensor or a node differed): this
    // kind's plan no longer describes its steps; record it again.
    k = Kind{};
    k.first = first;
    return false;
  }
  if (!(c.family && signature == c.kind)) k.first = first;  // (a family's step is not the kind's own first op)
  if (!c.profile) return false;
  ++k.profiled;
  ++recorded_;
  return k.plan < 0 && !cover_.count(signature) &&
         (k.profiled >= warmup_ || (!any_plan_ && recorded_ >= warmup_) || c.plan_at_once);
}

size_t StepKinds::families() const {
  std::vector<uint64_t> seen;
  size_t alone = 0;
  for (const auto& [kind, k] : kinds_) {
    if (k.first.structure == 0) {
      ++alone;
    } else if (std::find(seen.begin(), seen.end(), k.first.structure) == seen.end()) {
      seen.push_back(k.first.structure);
    }
  }
  return alone + seen.size();
}

bool StepKinds::set_cover(uint64_t kind, uint64_t by) {
  if (uncoverable_.count(kind)) return false;
  for (size_t hops = 0; hops <= cover_.size(); ++hops) {  // `by` covered itself: its cover
    auto it = cover_.find(by);
    if (it == cover_.end()) break;
    by = it->second;
  }
  if (kind == by) return false;
  cover_[kind] = by;
  // Kinds `kind` covered are covered by `by` now (a kind covers no kind that covers it: the
  // relation is an order on op sequences, and a kind is planned once).
  for (auto& [k, c] : cover_) {
    if (c == kind) c = by;
  }
  return true;
}

void StepKinds::set_plan(uint64_t kind, int plan) {
  kinds_[kind].plan = plan;
  any_plan_ = true;
}

std::optional<std::string> StepKinds::give_up() const {
  if (families() > kMaxKinds || kinds_.size() > kMaxKindsAll) {
    return fmt::format("the training step ran {} different op sequences (shapes or ops change from step to "
                       "step; at most {} are planned)",
                       kinds_.size(), families() > kMaxKinds ? kMaxKinds : kMaxKindsAll);
  }
  const auto recent = static_cast<size_t>(std::count(missed_.begin(), missed_.end(), 1));
  if (recent >= kMaxMisses) {
    return fmt::format("{} of the last {} steps ran other ops than predicted (the steps follow no "
                       "repeating pattern)",
                       recent, missed_.size());
  }
  return std::nullopt;
}

std::vector<uint64_t> StepKinds::recent(size_t n) const {
  const size_t k = std::min(n, history_.size());
  return std::vector<uint64_t>(history_.end() - static_cast<std::ptrdiff_t>(k), history_.end());
}

int StepKinds::plan_of(uint64_t kind) const {
  auto it = kinds_.find(kind);
  return it == kinds_.end() ? -1 : it->second.plan;
}

}  // namespace memplan
