// Forward ops whose second run may not give the first run's bits: PyTorch's own list of
// nondeterministic kernels (torch.use_deterministic_algorithms' documentation, torch 2.14).
//
// A rebuild re-runs forward ops and hands backward their new results in place of the first ones.
// For an op that accumulates with atomics (index_add_ on a GPU) or writes duplicate indices in no
// set order (index_put_, index_copy_), the two runs may differ in their last bits, and backward
// would differentiate at a point the forward never computed: a gradient no plain run can give.
// Such an op is not re-run (rerun_handle.h), and what only it could rebuild stays saved.
//
// Under torch.use_deterministic_algorithms(True) these ops run deterministic kernels, or raise if
// they have none; with warn_only=True the ones with none run their nondeterministic kernels after
// a warning. Torch-free: the recorder passes where the op runs and the mode.
#pragma once

#include <string_view>

namespace memplan {

struct DeterminismMode {
  bool on = false;         // torch.are_deterministic_algorithms_enabled()
  bool warn_only = false;  // ... with warn_only=True
  // Every op runs a deterministic kernel or raises: no op's re-run can differ.
  bool strict() const { return on && !warn_only; }
};

// What the list's finer conditions need to know of one call.
struct OpCall {
  bool accelerator = false;   // a tensor argument is on a GPU or another accelerator, not the CPU
  bool mask_indices = false;  // index_put_'s indices are all boolean masks: each element is
                              // written once (`x[mask] = v`), so the order of writes cannot matter
};

// Whether `name` (an operator name as RecordFunction gives it: "aten::index_add_") may give other
// bits when run twice on the same inputs, for `call`, under `mode`. Convolutions are not on the
// list: cuDNN's forward algorithms are deterministic (its nondeterministic ones compute weight and
// input gradients). Composite ops are matched by their own name only (a nondeterministic kernel
// inside one is not seen), except cross_entropy_loss and nll_loss_nd, which reach nll_loss2d on a
// GPU. Cost: nothing when the mode is on without warn_only, else a scan of 29 short names.
bool may_differ_on_rerun(std::string_view name, OpCall call, DeterminismMode mode);

// Whether `name` is on the list at all, whatever the call and mode (for the planner's message).
bool has_nondeterministic_kernel(std::string_view name);

// Whether deterministic algorithms give `name` a deterministic kernel (else the mode makes it raise,
// and telling the user to turn the mode on would break the script).
bool has_deterministic_kernel(std::string_view name);

}  // namespace memplan
