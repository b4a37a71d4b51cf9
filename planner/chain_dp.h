// The DP across blocks: Rotor's persistent recurrence with Rockmate's per-block option index.
// Everything here is in abstract integer memory units; chain.cpp's caller maps blocks to a Chain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace memplan::planner {

enum class Mode { Fn, Fc, Fe };
const char* to_string(Mode m);

struct ChainOption {
  double fw = 0, bw = 0;  // time of the block's forward (with grad) and backward (+ its recompute)
  int s = 0;              // kept for backward (a_bar)
  int of = 0, ob = 0;     // overheads above what is kept, in forward and in backward
};

// L blocks. c[i] = size of block i's input x_i (c has L+1 entries; c[L] is the chain's output).
struct Chain {
  std::vector<int> c;
  std::vector<std::vector<ChainOption>> opts;
  std::vector<double> ff;   // fast (no-grad) forward time
  std::vector<int> off;     // fast forward overhead above input and output
  // Per block: 0 if it may not run again (it holds an op a rebuild cannot call, Op::rerunnable):
  // never Fc or Fn, only Fe with its own options. Empty: every block may.
  std::vector<char> rerun;
  int length() const { return static_cast<int>(opts.size()); }
  bool may_rerun(int i) const { return rerun.empty() || rerun[i] != 0; }
};

// Opt[m][a][b] and the choice that reached it, in flat arrays.
struct DpTable {
  int L = 0, M = 0, K = 0;  // blocks, memory slots (0..M), max options per block
  std::vector<double> opt;  // kInf when infeasible
  std::vector<int32_t> what;  // -1 infeasible; 0..K-1 Fe option k; K + j: checkpoint at j
  size_t at(int m, int a, int b) const {
    return (static_cast<size_t>(m) * L + a) * L + b;
  }
  double value(int m, int a, int b) const { return opt[at(m, a, b)]; }
};

inline constexpr double kInf = 1e300;

DpTable dp_fill(const Chain& ch, int M);

// One forward sweep over blocks [first, last], each with its mode. Sweep 0 is the user's forward;
// the others are re-forwards, run as recompute actions just before block `last`'s backward.
struct SweepStep {
  int block = 0;
  Mode mode = Mode::Fe;
  int option = 0;
};
struct Sweep {
  int first = 0, last = 0;
  std::vector<SweepStep> steps;
};

// Schedule for the whole chain within m slots; false if Opt[m][0][L-1] is infeasible.
bool dp_schedule(const Chain& ch, const DpTable& t, int m, std::vector<Sweep>* out);

}  // namespace memplan::planner
