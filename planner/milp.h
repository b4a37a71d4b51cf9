// A small solver-neutral mixed-integer LP: minimise obj·x subject to lo <= A x <= hi, bounds,
// integrality. One adapter per solver (milp_cbc.cpp is the only one that sees CBC). Solvers never
// throw and never print; every solve has a time limit.
#pragma once

#include <memory>
#include <vector>

namespace memplan::planner {

struct MilpRow {
  std::vector<int> idx;
  std::vector<double> coef;
  double lo = -1e30, hi = 1e30;
};

struct MilpProblem {
  std::vector<double> obj, lb, ub;
  std::vector<char> integer;
  std::vector<MilpRow> rows;

  int add_var(double cost, double lo, double hi, bool is_int) {
    obj.push_back(cost);
    lb.push_back(lo);
    ub.push_back(hi);
    integer.push_back(is_int ? 1 : 0);
    return static_cast<int>(obj.size()) - 1;
  }
  void add_row(MilpRow r) { rows.push_back(std::move(r)); }
  int n_vars() const { return static_cast<int>(obj.size()); }
};

enum class MilpStatus {
  Optimal,     // proven optimal
  Feasible,    // stopped by a limit with a solution (not proven optimal)
  Infeasible,  // proven infeasible
  NoSolution,  // stopped by a limit without a solution
  Error,       // the solver failed
};

const char* to_string(MilpStatus s);

struct MilpResult {
  MilpStatus status = MilpStatus::Error;
  double objective = 0;
  std::vector<double> x;
  bool clock_stopped = false;  // the time limit ended the search (the answer depends on timing)
  bool has_solution() const { return status == MilpStatus::Optimal || status == MilpStatus::Feasible; }
};

// Where a solve stops. A node limit makes the answer a function of the problem alone (CBC runs
// single-threaded and is deterministic short of its clock); the time limit is the safety net.
struct MilpLimits {
  double seconds = 1.0;
  int nodes = -1;  // branch-and-bound nodes; < 0: no limit
};

class MilpSolver {
 public:
  virtual ~MilpSolver() = default;
  virtual MilpResult solve(const MilpProblem& p, const MilpLimits& limits) = 0;
};

std::unique_ptr<MilpSolver> make_cbc_solver();

}  // namespace memplan::planner
