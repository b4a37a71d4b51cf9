// Our default saved-tensor hooks (the pack/unpack pair the shim pushes), as seen from C++.
//
// The shim takes them off the stack while backward runs (the engine copies the thread's hooks
// stack into every node it runs, and each copy of a Python hook takes the GIL). A rebuild during
// backward still needs them on top: re-running an op with autograd on is how its internal saved
// tensors (layer_norm's mean/rstd) are recovered, through our pack hook. OnTop puts them there.
#pragma once

namespace memplan {

namespace pack_hooks {

// Remembers the pair now on top of this thread's stack as ours. Call with the GIL held, right
// after pushing them.
void remember();
// Ours are on top of this thread's stack. Cost: a TLS read and a pointer compare.
bool on_top();

// For its scope, ours are on top and not bypassed (tracing off): pushed if they are not there
// (2 reference counts, so the GIL, each way), nothing else if they are.
class OnTop {
 public:
  OnTop();
  ~OnTop();
  OnTop(const OnTop&) = delete;
  OnTop& operator=(const OnTop&) = delete;

 private:
  bool prev_tracing_;
  bool pushed_ = false;
};

}  // namespace pack_hooks
}  // namespace memplan
