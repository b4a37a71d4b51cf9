// The DP against brute force: every schedule of the Rotor grammar, replayed op by op on an explicit
// store (not the recurrence's arithmetic), on random chains of up to 6 blocks with 1-3 options.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "planner/chain_dp.h"

using namespace memplan::planner;

namespace {

// Explicit operations.
struct Step {
  enum Kind { Fe, Fc, Fn, B } kind;
  int i, k;
};
using Seq = std::vector<Step>;

// All schedules for blocks a..b with x_a stored: Fe a then the rest then B a, or Fc a, Fn up to
// j-1, the schedules of j..b, then those of a..j-1.
std::vector<Seq> all(const Chain& ch, int a, int b) {
  std::vector<Seq> out;
  for (int k = 0; k < static_cast<int>(ch.opts[a].size()); ++k) {
    if (a == b) {
      out.push_back({{Step::Fe, a, k}, {Step::B, a, k}});
      continue;
    }
    for (const Seq& rest : all(ch, a + 1, b)) {
      Seq s{{Step::Fe, a, k}};
      s.insert(s.end(), rest.begin(), rest.end());
      s.push_back({Step::B, a, k});
      out.push_back(s);
    }
  }
  for (int j = a + 1; j <= b; ++j) {
    bool may = true;  // blocks a..j-1 run again
    for (int i = a; i < j; ++i) may = may && ch.may_rerun(i);
    if (!may) break;
    Seq head{{Step::Fc, a, 0}};
    for (int i = a + 1; i < j; ++i) head.push_back({Step::Fn, i, 0});
    auto right = all(ch, j, b);
    auto left = all(ch, a, j - 1);
    for (const Seq& r : right)
      for (const Seq& l : left) {
        Seq s = head;
        s.insert(s.end(), r.begin(), r.end());
        s.insert(s.end(), l.begin(), l.end());
        out.push_back(s);
      }
  }
  return out;
}

// Replays a schedule on a store of named items; returns (peak above x_0, time).
std::pair<int, double> replay(const Chain& ch, const Seq& s) {
  std::map<std::pair<char, int>, int> store;  // ('x', i) or ('a', i) -> size
  auto mem = [&] {
    int m = 0;
    for (auto& [key, sz] : store) m += sz;
    return m;
  };
  store[{'x', 0}] = ch.c[0];
  int peak = 0;
  double time = 0;
  for (const Step& st : s) {
    const int i = st.i;
    switch (st.kind) {
      case Step::Fe: {
        const ChainOption& o = ch.opts[i][st.k];
        EXPECT_TRUE(store.count({'x', i}));
        peak = std::max(peak, mem() + ch.c[i + 1] + o.s + o.of);
        store[{'x', i + 1}] = ch.c[i + 1];
        store[{'a', i}] = o.s;
        time += o.fw;
        break;
      }
      case Step::Fc:
      case Step::Fn:
        EXPECT_TRUE(store.count({'x', i}));
        peak = std::max(peak, mem() + ch.c[i + 1] + ch.off[i]);
        store[{'x', i + 1}] = ch.c[i + 1];
        if (st.kind == Step::Fn) store.erase({'x', i});
        time += ch.ff[i];
        break;
      case Step::B: {
        const ChainOption& o = ch.opts[i][st.k];
        store.erase({'x', i + 1});
        EXPECT_TRUE(store.count({'a', i}));
        peak = std::max(peak, mem() + o.ob);
        store.erase({'a', i});
        store.erase({'x', i});
        time += o.bw;
        break;
      }
    }
  }
  EXPECT_TRUE(store.empty());
  return {peak - ch.c[0], time};
}

Chain random_chain(std::mt19937& rng, int L) {
  std::uniform_int_distribution<int> sz(0, 6), nopt(1, 3);
  std::uniform_real_distribution<double> t(1, 10);
  Chain ch;
  for (int i = 0; i <= L; ++i) ch.c.push_back(sz(rng));
  ch.opts.resize(L);
  for (int i = 0; i < L; ++i) {
    ch.ff.push_back(std::round(t(rng)));
    ch.off.push_back(sz(rng) / 2);
    const int k = nopt(rng);
    for (int j = 0; j < k; ++j)
      ch.opts[i].push_back({std::round(t(rng)), std::round(2 * t(rng)), sz(rng), sz(rng) / 2, sz(rng)});
  }
  return ch;
}

// Per memory size 0..M: the least time of any schedule of the grammar whose replayed peak fits
// (kInf if none).
std::vector<double> brute_force_best(const Chain& ch, int M) {
  std::vector<std::pair<int, double>> runs;
  for (const Seq& s : all(ch, 0, ch.length() - 1)) runs.push_back(replay(ch, s));
  std::vector<double> best(M + 1, kInf);
  for (int m = 0; m <= M; ++m)
    for (auto [peak, time] : runs)
      if (peak <= m) best[m] = std::min(best[m], time);
  return best;
}

}  // namespace

TEST(ChainDp, MatchesBruteForceOnRandomChains) {
  std::mt19937 rng(12345);
  int compared = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 1 + trial % (trial < 50 ? 5 : 6);
    Chain ch = random_chain(rng, L);
    if (L == 6)  // keep the enumeration small: at most two options per block
      for (auto& o : ch.opts) o.resize(std::min<size_t>(o.size(), 2));
    const int M = 40;
    DpTable t = dp_fill(ch, M);
    const std::vector<double> brute = brute_force_best(ch, M);
    for (int m = 0; m <= M; ++m) {
      const double best = brute[m];
      const double dp = t.value(m, 0, L - 1);
      ASSERT_EQ(dp >= kInf, best >= kInf) << "trial " << trial << " m " << m;
      if (best < kInf) {
        ASSERT_NEAR(dp, best, 1e-9) << "trial " << trial << " L " << L << " m " << m;
        ++compared;
        // The reconstructed schedule replays to the same time within m.
        std::vector<Sweep> sw;
        ASSERT_TRUE(dp_schedule(ch, t, m, &sw));
      }
    }
  }
  EXPECT_GT(compared, 500);
}

// Blocks that may not run again (an op a rebuild cannot call): the DP against brute force over
// the schedules that never run them twice, and no schedule it builds runs them twice.
TEST(ChainDp, BlocksThatMayNotRerunRunOnceAndMatchBruteForce) {
  std::mt19937 rng(2024);
  int compared = 0, fewer = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int L = 2 + trial % 4;
    Chain ch = random_chain(rng, L);
    ch.rerun.assign(L, 1);
    for (int i = 0; i < L; ++i) ch.rerun[i] = (rng() % 3 == 0) ? 0 : 1;
    const int M = 40;
    DpTable t = dp_fill(ch, M);
    Chain free = ch;
    free.rerun.clear();
    DpTable tf = dp_fill(free, M);
    const std::vector<double> brute = brute_force_best(ch, M);
    for (int m = 0; m <= M; ++m) {
      const double best = brute[m];
      const double dp = t.value(m, 0, L - 1);
      ASSERT_EQ(dp >= kInf, best >= kInf) << "trial " << trial << " m " << m;
      if (best >= kInf) continue;
      ASSERT_NEAR(dp, best, 1e-9) << "trial " << trial << " m " << m;
      ++compared;
      EXPECT_GE(dp, tf.value(m, 0, L - 1) - 1e-9);  // a restriction never helps
      if (dp > tf.value(m, 0, L - 1) + 1e-9) ++fewer;
      std::vector<Sweep> sw;
      ASSERT_TRUE(dp_schedule(ch, t, m, &sw));
      for (const Sweep& s : sw)
        for (const SweepStep& st : s.steps)
          if (!ch.may_rerun(st.block)) {
            EXPECT_EQ(st.mode, Mode::Fe);
            EXPECT_EQ(&s, &sw[0]) << "block " << st.block << " re-forwarded";
          }
    }
  }
  EXPECT_GT(compared, 300);
  EXPECT_GT(fewer, 0);  // the flag matters somewhere
}

TEST(ChainDp, TimeNeverGrowsWithMemory) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    Chain ch = random_chain(rng, 1 + trial % 8);
    DpTable t = dp_fill(ch, 60);
    double prev = kInf;
    for (int m = 0; m <= 60; ++m) {
      const double v = t.value(m, 0, ch.length() - 1);
      EXPECT_LE(v, prev);
      prev = v;
    }
  }
}

TEST(ChainDp, ScheduleCoversEveryBlockOnce) {
  std::mt19937 rng(99);
  Chain ch = random_chain(rng, 8);
  DpTable t = dp_fill(ch, 80);
  for (int m = 0; m <= 80; ++m) {
    std::vector<Sweep> sw;
    if (!dp_schedule(ch, t, m, &sw)) continue;
    // Sweep 0 covers all blocks in order; every block ends as Fe in exactly one sweep.
    ASSERT_EQ(sw[0].steps.size(), 8u);
    std::vector<int> fe(8, 0);
    for (const Sweep& s : sw) {
      for (size_t k = 0; k < s.steps.size(); ++k) {
        EXPECT_EQ(s.steps[k].block, s.first + static_cast<int>(k));
        if (s.steps[k].mode == Mode::Fe) ++fe[s.steps[k].block];
      }
      EXPECT_EQ(s.steps.back().mode, Mode::Fe);
    }
    for (int f : fe) EXPECT_EQ(f, 1);
  }
}
