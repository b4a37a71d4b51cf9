#include "planner/chain_dp.h"

#include <algorithm>

namespace memplan::planner {

const char* to_string(Mode m) {
  switch (m) {
    case Mode::Fn: return "Fn";
    case Mode::Fc: return "Fc";
    case Mode::Fe: return "Fe";
  }
  return "Fe";
}

// Memory model (what the brute-force test replays op by op). Items: x_i (size c[i]) and the kept
// part a_i of block i's option k (size s). Opt(m, a, b) = least time to run forward a..b and then
// backward b..a when x_a is stored (not counted in m) and m units are free for everything else.
//   Fe(i,k): peak += c[i+1] + s + of; then x_{i+1} and a_i are stored, x_i stays.
//   Fc(i):   peak += c[i+1] + off;    then x_{i+1} stored, x_i stays.
//   Fn(i):   as Fc, but x_i is dropped.
//   B(i,k):  x_{i+1} (if still there) is dropped; peak += ob; then a_i and x_i are dropped.
//
// Recurrence (Rotor persistent, option index added):
//   Opt(m, a, a) = min_k  fw[a][k] + bw[a][k]
//                  s.t. c[a+1] + s[a][k] + of[a][k] <= m  and  s[a][k] + ob[a][k] <= m
//   Opt(m, a, b) = min( Opt_e, Opt_c )                                          (a < b)
//   Opt_e = min_k fw[a][k] + Opt(m - s[a][k] - c[a+1], a+1, b) + bw[a][k]
//           s.t. c[a+1] + s[a][k] + of[a][k] <= m,  s[a][k] + ob[a][k] <= m
//   Opt_c = min_{a<j<=b} sum_{i=a}^{j-1} ff[i] + Opt(m - c[j], j, b) + Opt(m, a, j-1)
//           s.t. c[a+1] + off[a] <= m  and  c[i] + c[i+1] + off[i] <= m for a<i<j
//           and every block a..j-1 may run again (Chain::rerun)
// Opt_e: Fe on a, solve the rest, then a's backward. Opt_c: Fc on a, Fn up to j-1, store x_j,
// solve j..b, then re-forward a..j-1 from the stored x_a. O(M L^2 (L + K)) time.
DpTable dp_fill(const Chain& ch, int M) {
  DpTable t;
  const int L = ch.length();
  int K = 1;
  for (const auto& o : ch.opts) K = std::max<int>(K, static_cast<int>(o.size()));
  t.L = L;
  t.M = M;
  t.K = K;
  if (L == 0) return t;
  const size_t n = static_cast<size_t>(M + 1) * L * L;
  t.opt.assign(n, kInf);
  t.what.assign(n, -1);
  const auto& c = ch.c;
  for (int m = 0; m <= M; ++m) {
    for (int d = 0; d < L; ++d) {
      for (int a = 0; a + d < L; ++a) {
        const int b = a + d;
        double best = kInf;
        int32_t choice = -1;
        for (int k = 0; k < static_cast<int>(ch.opts[a].size()); ++k) {
          const ChainOption& o = ch.opts[a][k];
          if (c[a + 1] + o.s + o.of > m || o.s + o.ob > m) continue;
          double v;
          if (a == b) {
            v = o.fw + o.bw;
          } else {
            const int rest = m - o.s - c[a + 1];
            if (rest < 0) continue;
            const double sub = t.opt[t.at(rest, a + 1, b)];
            if (sub >= kInf) continue;
            v = o.fw + sub + o.bw;
          }
          if (v < best) {
            best = v;
            choice = k;
          }
        }
        if (a < b && c[a + 1] + ch.off[a] <= m && ch.may_rerun(a)) {
          double fwd = ch.ff[a];
          int fn_need = 0;  // max over a<i<j of c[i] + c[i+1] + off[i]
          for (int j = a + 1; j <= b; ++j) {
            if (j > a + 1) {
              if (!ch.may_rerun(j - 1)) break;
              fwd += ch.ff[j - 1];
              fn_need = std::max(fn_need, c[j - 1] + c[j] + ch.off[j - 1]);
            }
            if (fn_need > m) break;
            if (m - c[j] < 0) continue;
            const double right = t.opt[t.at(m - c[j], j, b)];
            const double left = t.opt[t.at(m, a, j - 1)];
            if (right >= kInf || left >= kInf) continue;
            const double v = fwd + right + left;
            if (v < best) {
              best = v;
              choice = K + j;
            }
          }
        }
        t.opt[t.at(m, a, b)] = best;
        t.what[t.at(m, a, b)] = choice;
      }
    }
  }
  return t;
}

namespace {

// Reconstruction mirrors the recurrence: an Fe choice extends the current sweep; a checkpoint
// choice extends it with Fc, Fn..., continues it from j, then opens a new sweep a..j-1.
void rebuild(const Chain& ch, const DpTable& t, int m, int a, int b, size_t sweep,
             std::vector<Sweep>* out) {
  while (true) {
    const int32_t w = t.what[t.at(m, a, b)];
    if (w < t.K) {
      (*out)[sweep].steps.push_back({a, Mode::Fe, w});
      if (a == b) return;
      m -= ch.opts[a][w].s + ch.c[a + 1];
      a += 1;
      continue;
    }
    const int j = w - t.K;
    (*out)[sweep].steps.push_back({a, Mode::Fc, 0});
    for (int i = a + 1; i < j; ++i) (*out)[sweep].steps.push_back({i, Mode::Fn, 0});
    rebuild(ch, t, m - ch.c[j], j, b, sweep, out);
    out->push_back(Sweep{a, j - 1, {}});
    rebuild(ch, t, m, a, j - 1, out->size() - 1, out);
    return;
  }
}

}  // namespace

bool dp_schedule(const Chain& ch, const DpTable& t, int m, std::vector<Sweep>* out) {
  out->clear();
  if (t.L == 0) return true;
  if (m < 0 || m > t.M || t.what[t.at(m, 0, t.L - 1)] < 0) return false;
  out->push_back(Sweep{0, t.L - 1, {}});
  rebuild(ch, t, m, 0, t.L - 1, 0, out);
  return true;
}

}  // namespace memplan::planner
