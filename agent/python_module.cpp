// _memplan: the Python face of the agent. Only bindings here: each function forwards to Agent.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <exception>
#include <memory>

#include "agent/agent.h"
#include "hooks/cpu_allocator.h"
#include "profiler/memory.h"

namespace py = pybind11;
using memplan::Agent;
using memplan::Saved;
using memplan::SavedState;

namespace {

// The default saved-tensor hooks, called from autograd kernels with the GIL held, once per saved
// tensor of every op whose packs come through us: plain METH_O functions and a capsule for the
// handle. Through pybind each call cost a dispatcher pass plus a registered-instance insert and
// erase (~0.7 us per pack/unpack pair, measured as 1% of a dispatch-bound step).
constexpr const char* kCapsule = "memplan.Saved";

void free_handle(PyObject* capsule) {
  delete static_cast<std::shared_ptr<SavedState>*>(PyCapsule_GetPointer(capsule, kCapsule));
}

PyObject* pack(PyObject*, PyObject* arg) {
  if (!THPVariable_Check(arg)) {
    PyErr_SetString(PyExc_TypeError, "memplan pack hook: expected a tensor");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  Saved h = Agent::get().pack(THPVariable_Unpack(arg));
  auto* owned = new std::shared_ptr<SavedState>(std::move(h.s));
  PyObject* capsule = PyCapsule_New(owned, kCapsule, &free_handle);
  if (capsule == nullptr) delete owned;
  return capsule;
  END_HANDLE_TH_ERRORS
}

PyObject* unpack(PyObject*, PyObject* arg) {
  auto* handle = static_cast<std::shared_ptr<SavedState>*>(PyCapsule_GetPointer(arg, kCapsule));
  if (handle == nullptr) return nullptr;  // not ours: PyCapsule_GetPointer set a TypeError/ValueError
  // Errors as torch raises them (torch.OutOfMemoryError for an OOM during a rebuild; autograd's
  // in-place error, re-thrown by Agent::unpack with its exact message, as a RuntimeError).
  HANDLE_TH_ERRORS
  return THPVariable_Wrap(Agent::get().unpack(Saved{*handle}));
  END_HANDLE_TH_ERRORS
}

PyMethodDef g_hooks[] = {
    {"pack", pack, METH_O, "default saved-tensor pack hook"},
    {"unpack", unpack, METH_O, "default saved-tensor unpack hook"},
};

}  // namespace

PYBIND11_MODULE(_memplan, m) {
  m.doc() = "memplan agent (loaded by boot/sitecustomize.py; not a public API)";
  m.def("boot", [] { return Agent::get().boot(); });
  for (PyMethodDef& def : g_hooks) {
    m.add_object(def.ml_name, py::reinterpret_steal<py::object>(PyCFunction_NewEx(&def, nullptr, m.ptr())));
  }
  m.def("hooks_pushed", [] { Agent::get().hooks_pushed(); });
  m.def("claim_thread", [] { return Agent::get().claim_thread(); });
  m.def("owns_thread", [] { return Agent::get().owns_thread(); });
  m.def("backward_begin", [](bool keeps_graph) { Agent::get().backward_begin(keeps_graph); });
  m.def("backward_end", [] { return Agent::get().backward_end(); });
  m.def("optimizer_step_begin", [](bool observed) { Agent::get().optimizer_step_begin(observed); });
  m.def("optimizer_step_end", [] { Agent::get().optimizer_step_end(); });
  m.def("finish", [] { Agent::get().finish(); });
  m.def("on_fork_child", [] { Agent::get().fork_child(); });
  m.def("phase", [] { return std::string(memplan::to_string(Agent::get().phase())); });
  m.def("steps", [] { return Agent::get().steps_seen(); });
  m.def("profile_path", [] { return Agent::get().profile_path(); });
  m.def("memory", [] {
    py::dict d;
    d["cpu_live"] = memplan::cpu_memory().live();
    d["cpu_peak"] = memplan::cpu_memory().peak();
    d["cpu_untracked"] = memplan::cpu_untracked_allocations();
    d["cuda_live"] = memplan::cuda_memory().live();
    d["cuda_peak"] = memplan::cuda_memory().peak();
    return d;
  });
  m.def("trace_path", [] { return Agent::get().trace_path(); });
}
