#include "profiler/op_determinism.h"

#include <array>

namespace memplan {

namespace {

struct Entry {
  std::string_view name;
  bool cpu_too;      // nondeterministic on the CPU as well, not only on an accelerator
  bool alternative;  // has a deterministic kernel that the mode selects (else the mode raises)
  bool indexed = false;  // index_put family: deterministic when every index is a boolean mask
};

// Forward ops only: what a rebuild re-runs. In-place and out-of-place forms alike. Where the list
// is finer than a name (scatter_reduce's reduce, put_'s accumulate, cumsum's dtype, scatter's
// value overload), the entry takes the stricter reading: an op left saved costs memory, one re-run
// that differs costs the result. kthvalue is from earlier versions of the list.
constexpr std::array<Entry, 29> kList = {{
    {"aten::index_add", false, true},         {"aten::index_add_", false, true},
    {"aten::scatter_add", false, true},       {"aten::scatter_add_", false, true},
    {"aten::scatter", false, true},           {"aten::scatter_", false, true},
    {"aten::scatter_reduce", false, false},   {"aten::scatter_reduce_", false, false},
    {"aten::cumsum", false, true},            {"aten::cumsum_", false, true},
    {"aten::index_put", true, true, true},    {"aten::index_put_", true, true, true},
    {"aten::_index_put_impl_", true, true, true}, {"aten::_unsafe_index_put", true, true, true},
    {"aten::index_copy", true, true},         {"aten::index_copy_", true, true},
    {"aten::put", true, false},               {"aten::put_", true, false},
    {"aten::max_unpool2d", true, false},      {"aten::max_unpool3d", true, false},
    {"aten::histc", false, false},            {"aten::bincount", false, false},
    {"aten::median", false, false},           {"aten::nanmedian", false, false},
    {"aten::kthvalue", false, false},         {"aten::nll_loss2d", false, false},
    {"aten::nll_loss2d_forward", false, false}, {"aten::nll_loss_nd", false, false},
    {"aten::cross_entropy_loss", false, false},
}};

const Entry* find(std::string_view name) {
  for (const Entry& e : kList) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

bool may_differ_on_rerun(std::string_view name, OpCall call, DeterminismMode mode) {
  if (mode.strict()) return false;
  const Entry* e = find(name);
  if (e == nullptr || (!call.accelerator && !e->cpu_too) || (e->indexed && call.mask_indices)) return false;
  return !mode.on || !e->alternative;  // warn_only: only ops with no deterministic kernel
}

bool has_nondeterministic_kernel(std::string_view name) { return find(name) != nullptr; }

bool has_deterministic_kernel(std::string_view name) {
  const Entry* e = find(name);
  return e == nullptr || e->alternative;
}

}  // namespace memplan
