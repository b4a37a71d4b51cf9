// The CBC adapter: the only file that includes COIN-OR headers.
#include <coin/CbcModel.hpp>
#include <coin/CoinMessageHandler.hpp>
#include <coin/CoinPackedMatrix.hpp>
#include <coin/OsiClpSolverInterface.hpp>

#include "planner/milp.h"

namespace memplan::planner {

const char* to_string(MilpStatus s) {
  switch (s) {
    case MilpStatus::Optimal: return "optimal";
    case MilpStatus::Feasible: return "feasible";
    case MilpStatus::Infeasible: return "infeasible";
    case MilpStatus::NoSolution: return "no-solution";
    case MilpStatus::Error: return "error";
  }
  return "error";
}

namespace {

class CbcSolver : public MilpSolver {
 public:
  MilpResult solve(const MilpProblem& p, const MilpLimits& limits) override {
    MilpResult r;
    try {
      const int n = p.n_vars();
      CoinPackedMatrix m(false, 0, 0);  // row-ordered
      m.setDimensions(0, n);
      OsiClpSolverInterface si;
      const double inf = si.getInfinity();
      auto bound = [&](double b) { return b <= -1e30 ? -inf : b >= 1e30 ? inf : b; };
      std::vector<double> rlo, rhi, clo, chi;
      for (const MilpRow& row : p.rows) {
        m.appendRow(static_cast<int>(row.idx.size()), row.idx.data(), row.coef.data());
        rlo.push_back(bound(row.lo));
        rhi.push_back(bound(row.hi));
      }
      for (int i = 0; i < n; ++i) {
        clo.push_back(bound(p.lb[i]));
        chi.push_back(bound(p.ub[i]));
      }
      si.messageHandler()->setLogLevel(0);
      si.loadProblem(m, clo.data(), chi.data(), p.obj.data(), rlo.data(), rhi.data());
      for (int i = 0; i < n; ++i)
        if (p.integer[i]) si.setInteger(i);
      si.setHintParam(OsiDoReducePrint, true, OsiHintTry);
      // Solve the root LP first: CBC expects it, and a proven-infeasible LP ends here.
      si.initialSolve();
      if (si.isProvenPrimalInfeasible()) {
        r.status = MilpStatus::Infeasible;
        return r;
      }
      if (!si.isProvenOptimal()) {
        r.status = MilpStatus::Error;
        return r;
      }
      CbcModel model(si);
      model.setLogLevel(0);
      model.messageHandler()->setLogLevel(0);
      model.solver()->messageHandler()->setLogLevel(0);
      model.setMaximumSeconds(limits.seconds > 0 ? limits.seconds : 1.0);
      if (limits.nodes >= 0) model.setMaximumNodes(limits.nodes);
      model.setNumberThreads(0);
      model.branchAndBound();
      const double* x = model.bestSolution();
      r.clock_stopped = model.maximumSecondsReached();
      if (model.isProvenInfeasible()) {
        r.status = MilpStatus::Infeasible;
      } else if (x != nullptr) {
        r.status = model.isProvenOptimal() ? MilpStatus::Optimal : MilpStatus::Feasible;
        r.x.assign(x, x + n);
        r.objective = model.getObjValue();
      } else if (model.isProvenOptimal()) {
        // Proven "optimal" with no incumbent happens when the LP itself is infeasible.
        r.status = MilpStatus::Infeasible;
      } else {
        r.status = r.clock_stopped || model.isNodeLimitReached() ? MilpStatus::NoSolution : MilpStatus::Infeasible;
      }
    } catch (...) {
      r.status = MilpStatus::Error;  // CoinError or bad_alloc: never across the API
    }
    return r;
  }
};

}  // namespace

std::unique_ptr<MilpSolver> make_cbc_solver() { return std::make_unique<CbcSolver>(); }

}  // namespace memplan::planner
