#include "planner/rerun_ops.h"

#include <algorithm>

namespace memplan::planner {

std::vector<std::vector<int64_t>> value_providers(const Profile& p) {
  const size_t nv = p.values.size(), n = p.forward.size();
  std::vector<std::vector<int64_t>> providers(nv);
  for (size_t i = 0; i < n; ++i)
    for (const TensorRef& t : p.forward[i].outputs)
      if (t.value >= 0 && static_cast<size_t>(t.value) < nv) providers[t.value].push_back(static_cast<int64_t>(i));
  for (size_t v = 0; v < nv; ++v) {
    const int64_t prod = p.values[v].producer;
    if (prod >= 0 && static_cast<size_t>(prod) < n) providers[v].push_back(prod);
  }
  return providers;
}

std::vector<char> rerun_ops(const Profile& p, const std::vector<std::vector<int64_t>>& providers,
                            const std::vector<int64_t>& evicted) {
  const auto n = static_cast<int64_t>(p.forward.size());
  std::vector<char> rerun(p.forward.size(), 0);
  std::vector<int64_t> work;
  // The providers of `v` before op `before`: an op that writes `v` later (a parameter written
  // through `.data` after a layer read it) made nothing that op read.
  auto need = [&](int64_t v, int64_t before) {
    if (v < 0 || static_cast<size_t>(v) >= providers.size()) return;
    for (int64_t o : providers[v])
      if (o < before && !rerun[o] && p.forward[o].rerunnable) {  // no plan re-runs another (rerun_handle.h)
        rerun[o] = 1;
        work.push_back(o);
      }
  };
  for (int64_t v : evicted) need(v, n);
  while (!work.empty()) {
    const int64_t o = work.back();
    work.pop_back();
    for (const TensorRef& t : p.forward[o].inputs) need(t.value, o);
  }
  return rerun;
}

std::vector<int64_t> last_rerun_node(const std::vector<Recompute>& recomputes, size_t n_fwd) {
  std::vector<int64_t> last(n_fwd, -1);
  for (const Recompute& r : recomputes)
    for (int64_t o : r.ops)
      if (o >= 0 && static_cast<size_t>(o) < n_fwd) last[o] = std::max(last[o], r.before_bwd);
  return last;
}

}  // namespace memplan::planner
