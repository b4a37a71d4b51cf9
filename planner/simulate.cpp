#include "planner/simulate.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "planner/rerun_ops.h"

namespace memplan::planner {

namespace {

struct Copy {
  int64_t start = 0, end = 0;  // positions, inclusive
};

bool fail(SimResult* r, std::string msg) {
  r->ok = false;
  r->error = std::move(msg);
  return false;
}

bool run(const Graph& g, const Plan& plan, SimResult* r) {
  const Profile& p = *g.prof;
  const int64_t N = g.n_fwd, M = g.n_bwd, E = g.end_pos();
  const int64_t nv = static_cast<int64_t>(p.values.size());
  auto value_ok = [&](int64_t v) { return v >= 0 && v < nv; };

  std::map<int64_t, int64_t> evict_at;  // value -> after_fwd
  for (const Eviction& e : plan.evictions) {
    if (!value_ok(e.value)) return fail(r, fmt::format("eviction of unknown value {}", e.value));
    if (!g.evictable[e.value])
      return fail(r, fmt::format("value {} is not evictable (not a saved activation only autograd holds)", e.value));
    if (e.after_fwd < g.last_fwd_use[e.value] || e.after_fwd >= N)
      return fail(r, fmt::format("value {} evicted after op {} but forward op {} still uses it",
                                 e.value, e.after_fwd, g.last_fwd_use[e.value]));
    if (!evict_at.emplace(e.value, e.after_fwd).second)
      return fail(r, fmt::format("value {} evicted twice", e.value));
  }
  std::map<int64_t, int64_t> held;  // value -> until_bwd
  for (const Hold& h : plan.holds) {
    if (!value_ok(h.value) || g.persistent[h.value])
      return fail(r, fmt::format("hold of value {} which is not an activation", h.value));
    if (h.from_fwd < g.producer(h.value) || h.from_fwd >= N || h.until_bwd < 0 || h.until_bwd >= M)
      return fail(r, fmt::format("hold of value {}: bad range {}..{}", h.value, h.from_fwd, h.until_bwd));
    if (evict_at.count(h.value)) return fail(r, fmt::format("value {} both held and evicted", h.value));
    held[h.value] = h.until_bwd;
  }
  std::map<int64_t, std::vector<int64_t>> releases;
  for (const Release& rel : plan.releases) {
    if (!value_ok(rel.value) || rel.after_bwd < 0 || rel.after_bwd >= M)
      return fail(r, fmt::format("bad release of value {} after node {}", rel.value, rel.after_bwd));
    releases[rel.value].push_back(rel.after_bwd);
  }
  for (auto& [v, rs] : releases) std::sort(rs.begin(), rs.end());

  std::vector<int64_t> compact = plan.compactions;
  std::vector<char> is_compact(nv, 0);
  for (size_t k = 0; k < compact.size(); ++k) {
    const int64_t v = compact[k];
    if (!value_ok(v) || g.compact_bytes[v] <= 0)
      return fail(r, fmt::format("compaction of value {} which is not a dropout mask", v));
    if (k > 0 && v <= compact[k - 1]) return fail(r, "compactions not sorted or repeated");
    if (evict_at.count(v) || held.count(v) || releases.count(v))
      return fail(r, fmt::format("value {} is both compacted and evicted, held or released", v));
    is_compact[v] = 1;
  }

  // Planned copies of every touched value.
  std::map<int64_t, std::vector<Copy>> copies;
  std::map<int64_t, size_t> next_release;
  auto take_release = [&](int64_t v, int64_t start) -> int64_t {
    auto it = releases.find(v);
    if (it == releases.end()) return -1;
    size_t& k = next_release[v];
    while (k < it->second.size() && N + it->second[k] < start) ++k;
    if (k == it->second.size()) return -1;
    return N + it->second[k++];
  };
  std::vector<int64_t> touched;
  for (auto& [v, a] : evict_at) touched.push_back(v);
  for (auto& [v, u] : held) touched.push_back(v);
  for (const Recompute& rc : plan.recomputes)
    for (int64_t v : rc.keep) touched.push_back(v);
  for (auto& [v, rs] : releases) touched.push_back(v);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (int64_t v : touched) {
    if (g.persistent[v]) return fail(r, fmt::format("plan touches persistent value {}", v));
    Copy c{g.producer(v), g.natural_end[v]};
    auto e = evict_at.find(v);
    // Evicted: gone after that op, or after the last op during which a Python variable held it.
    if (e != evict_at.end()) c.end = std::max(e->second, std::min(g.held_until[v], c.end));
    auto h = held.find(v);
    if (h != held.end()) {
      int64_t rel = take_release(v, c.start);
      if (rel < 0 || rel < N + h->second)
        return fail(r, fmt::format("hold of value {} is never released (or released early)", v));
      c.end = std::max(c.end, rel);
    }
    copies[v].push_back(c);
  }

  // Recompute actions: order, op lists, keeps; their kept copies.
  int64_t prev = -1;
  std::vector<std::map<int64_t, char>> produced_by(plan.recomputes.size());
  for (size_t a = 0; a < plan.recomputes.size(); ++a) {
    const Recompute& rc = plan.recomputes[a];
    if (rc.before_bwd < 0 || rc.before_bwd >= M || rc.before_bwd <= prev)
      return fail(r, fmt::format("recompute {}: before_bwd {} out of range or out of order", a, rc.before_bwd));
    prev = rc.before_bwd;
    int64_t last = -1;
    for (int64_t o : rc.ops) {
      if (o <= last || o >= N)
        return fail(r, fmt::format("recompute {}: ops not in forward order or out of range", a));
      last = o;
      if (!g.rerunnable[o])
        return fail(r, fmt::format("recompute {}: forward op {} ({}) cannot be re-run", a, o, p.forward[o].name));
      for (int64_t v : g.produces[o]) produced_by[a][v] = 1;
    }
    for (int64_t v : rc.keep) {
      if (!value_ok(v) || !produced_by[a].count(v))
        return fail(r, fmt::format("recompute {}: keeps value {} that its ops do not create", a, v));
      Copy c{N + rc.before_bwd, -1};
      const Value& val = p.values[v];
      // Autograd holds it to its last unpack; a kept graph, to the step's end.
      if (!val.saved_by.empty() && g.last_unpack[v] >= rc.before_bwd) {
        c.end = p.graph_kept ? g.natural_end[v] : N + g.last_unpack[v];
      }
      int64_t rel = take_release(v, c.start);
      c.end = std::max(c.end, rel);
      if (c.end < 0)
        return fail(r, fmt::format("recompute {}: kept value {} is neither unpacked later nor released", a, v));
      copies[v].push_back(c);
    }
  }
  for (auto& [v, rs] : releases)
    if (next_release[v] < rs.size())
      return fail(r, fmt::format("release of value {} after node {} matches no hold or kept value", v,
                                 rs[next_release[v]]));

  auto alive_at = [&](int64_t v, int64_t pos) {
    auto it = copies.find(v);
    if (it == copies.end()) return g.persistent[v] || (g.producer(v) < pos && g.natural_end[v] >= pos);
    for (const Copy& c : it->second)
      if (c.start < pos && c.end >= pos) return true;
    return false;
  };
  // Every unpack of a touched value finds it alive.
  for (int64_t v : touched)
    for (int64_t u : p.values[v].unpacked_by) {
      bool ok = false;
      for (const Copy& c : copies[v]) ok = ok || (c.start <= N + u && c.end >= N + u);
      if (!ok)
        return fail(r, fmt::format("value {} is unpacked by backward node {} but is not alive then", v, u));
    }

  // Memory difference to the measured timeline.
  std::vector<int64_t> diff(E + 2, 0);
  auto add = [&](int64_t s, int64_t e, int64_t b) {
    s = std::max<int64_t>(s, 0);
    e = std::min(e, E - 1);
    if (s > e) return;
    diff[s] += b;
    diff[e + 1] -= b;
  };
  for (auto& [v, cs] : copies) {
    add(g.producer(v), g.natural_end[v], -g.bytes(v));
    for (const Copy& c : cs) add(c.start, c.end, g.bytes(v));
  }
  // A compact value: the mask is made at the end of its producer (both forms alive there), only
  // the mask lives until backward, and each unpacking node holds an expanded copy while it runs.
  for (int64_t v : compact) {
    if (std::binary_search(touched.begin(), touched.end(), v))
      return fail(r, fmt::format("value {} is both compacted and kept by a recompute", v));
    const int64_t full = g.bytes(v), small = g.compact_bytes[v], prod = g.producer(v);
    add(prod, prod, small);
    add(prod + 1, g.natural_end[v], small - full);
    for (int64_t u : p.values[v].unpacked_by) add(N + u, N + u, full);
  }
  // Inputs the replay keeps: every op a rebuild may re-run (one providing an evicted value, and
  // transitively the ops providing its inputs: replay.cpp's hold_externals_) keeps its inputs
  // from before the step until the step ends. One the script frees during the forward (the raw
  // batch after `x = normalize(x)`) lives that much longer (FGSM probe: +5.5% unseen). So does a
  // value the replay takes for such an input (Graph::unseen: a custom autograd.Function's result),
  // from its natural end.
  // Both this and the RNG snapshots below follow the ops a rebuild may re-run: found once.
  std::vector<char> rerun;
  if (!evict_at.empty() && (g.any_dies || g.any_unseen || g.any_fwd_written || p.rng_state_bytes > 0)) {
    std::vector<int64_t> evicted;
    for (auto& [v, a] : evict_at) evicted.push_back(v);
    rerun = rerun_ops(p, g.providers, evicted);
  }
  if (!rerun.empty() && (g.any_dies || g.any_unseen)) {
    std::vector<char> kept(nv, 0);
    for (int64_t o = 0; o < N; ++o) {
      if (!rerun[o]) continue;
      for (const TensorRef& t : p.forward[o].inputs) {
        if (!value_ok(t.value) || kept[t.value]) continue;
        if (g.dies_after[t.value] >= 0) {
          kept[t.value] = 1;
          add(g.dies_after[t.value] + 1, E - 1, g.bytes(t.value));
        } else if (g.unseen[t.value] && g.natural_end[t.value] < E - 1) {
          kept[t.value] = 1;
          add(g.natural_end[t.value] + 1, E - 1, g.bytes(t.value));
        }
      }
    }
  }
  // RNG snapshots: the recipe of a random op a rebuild may re-run keeps its generator's state
  // from the op to the step's end (replay.cpp, Replayer::op_start), Profile::rng_state_bytes each.
  if (!rerun.empty() && p.rng_state_bytes > 0) {
    for (int64_t o = 0; o < N; ++o)
      if (rerun[o] && p.forward[o].random) add(o, E - 1, p.rng_state_bytes);
  }
  // Inputs and parameters the step writes in place before a re-run reads them, copied by the
  // replay and alive to the step's end, one copy each, from the earliest of:
  // - where a recipe captures it, for a write the replay's op callbacks may not see (an optimizer
  //   step in backward, ahead of a re-run that reads a weight without grad; copied_when_captured,
  //   as replay.cpp does);
  // - where a forward op writes it after a recipe captured it (Graph::fwd_written_at: the write
  //   guard copies it then, for whichever op a rebuild may re-run read it).
  std::vector<int64_t> copy_from;
  if (!plan.recomputes.empty() && g.any_written) {
    const std::vector<int64_t> last = last_rerun_node(plan.recomputes, static_cast<size_t>(N));
    copy_from.assign(nv, -1);
    for (int64_t o = 0; o < N; ++o) {
      for (const TensorRef& t : p.forward[o].inputs) {
        if (!value_ok(t.value) || copy_from[t.value] >= 0 || !copied_when_captured(p.values[t.value], last[o])) continue;
        copy_from[t.value] = o;
      }
    }
  }
  if (!rerun.empty() && g.any_fwd_written) {
    if (copy_from.empty()) copy_from.assign(nv, -1);
    for (int64_t v = 0; v < nv; ++v) {
      const int64_t w = g.fwd_written_at[v];
      if (w < 0 || (copy_from[v] >= 0 && copy_from[v] <= w)) continue;
      const auto& readers = p.values[v].consumers;
      if (std::any_of(readers.begin(), readers.end(), [&](int64_t o) { return o < w && rerun[o]; })) copy_from[v] = w;
    }
  }
  for (int64_t v = 0; v < static_cast<int64_t>(copy_from.size()); ++v)
    if (copy_from[v] >= 0) add(copy_from[v], E - 1, g.bytes(v));
  std::vector<int64_t> delta(E + 1, 0);
  int64_t run_sum = 0;
  for (int64_t i = 0; i < E; ++i) delta[i] = (run_sum += diff[i]);

  r->fwd_live.resize(N);
  r->fwd_peak.resize(N);
  r->bwd_live.resize(M);
  r->bwd_peak.resize(M);
  r->peak = p.baseline_bytes;
  for (int64_t i = 0; i < N; ++i) {
    const Op& op = p.forward[i];
    r->fwd_live[i] = op.live_after + delta[i];
    r->fwd_peak[i] = std::max({op.peak, op.live_before, op.live_after}) + delta[i];
    r->peak = std::max(r->peak, r->fwd_peak[i]);
  }
  for (int64_t j = 0; j < M; ++j) {
    const Op& n = p.backward[j];
    r->bwd_live[j] = n.live_after + delta[N + j];
    r->bwd_peak[j] = std::max({n.peak, n.live_before, n.live_after}) + delta[N + j];
  }

  // Recompute transients and input availability.
  r->time_us = g.step_time_us;
  r->action_peak.assign(plan.recomputes.size(), 0);
  for (size_t a = 0; a < plan.recomputes.size(); ++a) {
    const Recompute& rc = plan.recomputes[a];
    const int64_t pos = N + rc.before_bwd;
    int64_t kept_bytes = 0;
    for (int64_t v : rc.keep) kept_bytes += g.bytes(v);
    const int64_t pre = p.backward[rc.before_bwd].live_before + delta[pos] - kept_bytes;
    std::map<int64_t, size_t> last_use;  // value created here -> index of its last reader here
    std::map<int64_t, char> in_action;
    for (size_t k = 0; k < rc.ops.size(); ++k) {
      in_action[rc.ops[k]] = 1;
      for (const Dep& d : g.deps[rc.ops[k]]) last_use[d.value] = k;
    }
    std::map<int64_t, char> made;
    std::vector<std::vector<int64_t>> free_at(rc.ops.size());
    for (size_t k = 0; k < rc.ops.size(); ++k)
      for (int64_t v : g.produces[rc.ops[k]]) {
        if (std::find(rc.keep.begin(), rc.keep.end(), v) != rc.keep.end()) continue;
        auto lu = last_use.find(v);
        free_at[lu != last_use.end() && lu->second > k ? lu->second : k].push_back(v);
      }
    int64_t cur = pre, peak = pre;
    for (size_t k = 0; k < rc.ops.size(); ++k) {
      const int64_t o = rc.ops[k];
      for (const Dep& d : g.deps[o]) {
        if (d.stale && !(in_action.count(d.src) && d.src < o))
          return fail(r, fmt::format("recompute before node {}: op {} reads value {} as op {} made it, which is "
                                     "written in place later and not rerun",
                                     rc.before_bwd, o, d.value, d.src));
        if (!made.count(d.value) && !alive_at(d.value, pos))
          return fail(r, fmt::format("recompute before node {}: op {} needs value {} which is not available",
                                     rc.before_bwd, o, d.value));
      }
      cur += g.out_bytes[o];
      peak = std::max(peak, cur + g.workspace[o]);
      for (int64_t v : g.produces[o]) made[v] = 1;
      // A dropout whose mask is compact and still alive is rebuilt as input x mask (compaction.md).
      const int64_t m = g.op_mask[o];
      const bool tail = m >= 0 && is_compact[m] && pos <= g.natural_end[m];
      r->recompute_us += tail ? g.compact_us[m] : p.forward[o].time_us;
      for (int64_t v : free_at[k]) cur -= g.bytes(v);  // created here, no longer needed
    }
    r->action_peak[a] = peak;
    r->bwd_peak[rc.before_bwd] = std::max(r->bwd_peak[rc.before_bwd], peak);
  }
  for (int64_t j = 0; j < M; ++j) r->peak = std::max(r->peak, r->bwd_peak[j]);
  for (int64_t v : compact) r->compact_us += g.compact_us[v];
  r->time_us += r->recompute_us + r->compact_us;
  r->ok = true;
  return true;
}

}  // namespace

SimResult simulate(const Graph& g, const Plan& plan) {
  SimResult r;
  run(g, plan, &r);
  return r;
}

void recorded_peaks(const Plan& plan, const SimResult& sim, std::vector<int64_t>* fwd_peak,
                    std::vector<int64_t>* bwd_peak) {
  *fwd_peak = sim.fwd_peak;
  *bwd_peak = sim.bwd_peak;
  for (size_t a = 0; a < plan.recomputes.size() && a < sim.action_peak.size(); ++a) {
    const int64_t j = plan.recomputes[a].before_bwd;
    if (j > static_cast<int64_t>(bwd_peak->size()) || (j == 0 && fwd_peak->empty())) continue;
    int64_t& before = j > 0 ? (*bwd_peak)[static_cast<size_t>(j - 1)] : fwd_peak->back();
    before = std::max(before, sim.action_peak[a]);
  }
}

}  // namespace memplan::planner
