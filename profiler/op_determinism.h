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
};

// Whether `name` (an operator name as RecordFunction gives it: "aten::index_add_") may give other
// bits when run twice on the same inputs, on the CPU (`accelerator` false) or on a GPU or another
// accelerator, under `mode`. Convolutions are not on the list: cuDNN's forward algorithms are
// deterministic (its nondeterministic ones compute weight and input gradients). Cost: nothing when
// the mode is on without warn_only, else a scan of 23 short names.
bool may_differ_on_rerun(std::string_view name, bool accelerator, DeterminismMode mode);

// Whether `name` is on the list at all, whatever the device and mode (for the planner's message).
bool has_nondeterministic_kernel(std::string_view name);

}  // namespace memplan
