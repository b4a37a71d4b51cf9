// _memplan: the Python face of the agent. Only bindings here: each function forwards to Agent.
#include <torch/csrc/utils/pybind.h>

#include "agent/agent.h"
#include "hooks/cpu_allocator.h"
#include "profiler/memory.h"

namespace py = pybind11;
using memplan::Agent;
using memplan::Saved;

PYBIND11_MODULE(_memplan, m) {
  m.doc() = "memplan agent (loaded by boot/sitecustomize.py; not a public API)";
  py::class_<Saved>(m, "Saved");
  m.def("boot", [] { return Agent::get().boot(); });
  // The default saved-tensor hooks: called from autograd kernels with the GIL held.
  m.def("pack", [](const at::Tensor& t) { return Agent::get().pack(t); });
  m.def("unpack", [](const Saved& s) { return Agent::get().unpack(s); });
  m.def("hooks_pushed", [] { Agent::get().hooks_pushed(); });
  m.def("backward_begin", [] { Agent::get().backward_begin(); });
  m.def("backward_end", [] { return Agent::get().backward_end(); });
  m.def("optimizer_step_begin", [](bool differentiable) { Agent::get().optimizer_step_begin(differentiable); });
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
