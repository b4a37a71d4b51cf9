// Whether a rebuild can re-run a forward op, and with which operator: one test for the recorder
// (Op::rerunnable, which the planner plans with) and the replayer (which gives the op a recipe),
// so that a plan never counts on re-running an op the replay cannot call.
//
// Re-runnable: an operator the dispatcher knows, with a schema, whose RecordFunction carries every
// argument. Not re-runnable: a Python autograd.Function (torch.compile's CompiledFunction, a user's
// custom Function: a RecordFunction named after the class, no operator), an op whose inputs do
// not match its schema, or an op whose re-run may not reproduce its first run's bits
// (op_determinism.h: index_add_ on a GPU without deterministic algorithms), an op called on a
// side stream (side_stream_of), or an op called under a script's own TorchDispatchMode (it may
// change what the op computes, as a mode rounding every output does, or count its calls; a re-run
// outside the mode gave other bits, one inside it a call the script did not make). Their saved
// tensors can only be kept.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <atomic>
#include <optional>
#include <vector>

#include "profiler/op_determinism.h"
#include "profiler/tensor_args.h"

namespace memplan {

// Whether any tensor argument is off the CPU (on a GPU or another accelerator; a 0-dim CPU scalar
// may come beside them). Cost: one pass over the arguments.
inline bool on_accelerator(c10::ArrayRef<c10::IValue> inputs) {
  bool any = false;
  for (const c10::IValue& iv : inputs) {
    for_each_tensor(iv, [&](const at::Tensor& t) { any = any || !t.device().is_cpu(); });
  }
  return any;
}

// What op_determinism's finer conditions need of a call: where it runs, and whether its second
// argument (index_put_'s indices) is a list of boolean masks only. Cost: one pass over the
// arguments.
inline OpCall op_call(c10::ArrayRef<c10::IValue> inputs) {
  OpCall call;
  call.accelerator = on_accelerator(inputs);
  if (inputs.size() > 1 && inputs[1].isList()) {
    bool any = false, masks = true;
    for_each_tensor(inputs[1], [&](const at::Tensor& t) {
      any = true;
      masks = masks && (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte);
    });
    call.mask_indices = any && masks;
  }
  return call;
}

// torch.use_deterministic_algorithms as it is set now (thread-independent, process-wide).
inline DeterminismMode determinism_mode() {
  return {at::globalContext().deterministicAlgorithms(), at::globalContext().deterministicAlgorithmsWarnOnly()};
}

// Whether `d`'s current stream is another than its default one (`with torch.cuda.stream(s)`). An
// op queued there runs beside the default stream's work, ordered against it only by the script's
// own waits: a re-run would run on whatever stream is current at the rebuild, and its inputs'
// memory, freed by an eviction after their last forward use, could be handed to the default
// stream while its kernels still read it. The CPU has one stream. A backend whose guard names no
// default stream (Meta; a test's FakeGuardImpl: getDefaultStream throws) counts stream 0 as it,
// asked once per device type. Cost: two virtual calls (a thread-local read each on CUDA).
inline bool side_stream_of(c10::Device d) {
  if (d.is_cpu() || !c10::impl::hasDeviceGuardImpl(d.type())) return false;
  // Per device type: 0 not asked yet, 1 its guard names a default stream, 2 it does not.
  static std::atomic<int8_t> named[static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)];
  std::atomic<int8_t>& known = named[static_cast<size_t>(d.type())];
  try {
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(d.type());
    const c10::Stream now = impl->getStream(d);
    if (known.load(std::memory_order_relaxed) == 2) return now.id() != 0;
    try {
      const c10::Stream dflt = impl->getDefaultStream(d);
      known.store(1, std::memory_order_relaxed);
      return now != dflt;
    } catch (const c10::Error&) {
      known.store(2, std::memory_order_relaxed);
      return now.id() != 0;
    }
  } catch (const c10::Error&) {
    return false;  // no such device here (a CUDA device argument without a GPU): the op will say so
  }
}

// The device a call runs on, seen argument by argument (so that a pass the caller makes anyway can
// find it): the first tensor argument not on the CPU, else a Device argument not on the CPU
// (`randn(size, device=...)`), else the CPU. Cost: a device read per tensor, a tag check per argument.
class CallDevice {
 public:
  // A call's, in a pass of its own.
  static CallDevice of(c10::ArrayRef<c10::IValue> inputs) {
    CallDevice d;
    for (const c10::IValue& iv : inputs) {
      d.see(iv);
      for_each_tensor(iv, [&](const at::Tensor& t) { d.see(t); });
    }
    return d;
  }
  void see(const c10::IValue& arg) {
    if (!arg_ && arg.isDevice() && !arg.toDevice().is_cpu()) arg_ = arg.toDevice();
  }
  void see(const at::Tensor& t) {
    if (!tensor_ && !t.device().is_cpu()) tensor_ = t.device();
  }
  c10::Device device() const { return tensor_ ? *tensor_ : arg_ ? *arg_ : c10::Device(c10::kCPU); }
  // Whether the call runs on a side stream of that device (side_stream_of; never on the CPU).
  bool side_stream() const {
    const c10::Device d = device();
    return !d.is_cpu() && side_stream_of(d);
  }

 private:
  std::optional<c10::Device> tensor_, arg_;
};

// The device whose default generator a re-run of a random op draws from, so whose state the
// recipe keeps: the call's (CallDevice). A dropout's input is made in the step: on a GPU it is a
// CUDA tensor, and the CUDA generator's Philox seed and offset are what make the re-run draw the
// same mask. Cost: one pass over the arguments, once per random op's recipe.
inline c10::Device rng_device(c10::ArrayRef<c10::IValue> inputs) { return CallDevice::of(inputs).device(); }

// Whether the call runs on a side stream of its device (CallDevice's). Cost: one pass over the
// arguments, then side_stream_of for a call off the CPU.
inline bool on_side_stream(c10::ArrayRef<c10::IValue> inputs) { return CallDevice::of(inputs).side_stream(); }

// Whether the running op runs under a TorchDispatchMode the script entered (FlopCounterMode, a
// numerics emulation): torch's own tracing modes (fake, proxy, functional) are infra modes, not
// counted. Cost: a TLS read.
inline bool under_script_mode() { return c10::impl::TorchDispatchModeTLS::any_modes_set(/*skip_infra_modes=*/true); }

// The checks past the lookup: the call carries every argument of `op`'s schema, and its re-run
// reproduces its bits under the deterministic-algorithms mode as it is set now (a script that
// turns deterministic algorithms off after the profile gets no recipe for those ops: their
// values are kept, as for any op without one), outside any TorchDispatchMode of the script's
// (torch.compile's tracing modes never reach here: Agent's traced()). Cost: a TLS read, a size
// compare, and under nondeterministic algorithms a scan of op_determinism's list, and
// on_side_stream (a call on a side stream is not re-run: see side_stream_of).
inline bool rerunnable_call(const c10::OperatorHandle& op, const at::RecordFunction& fn) {
  if (under_script_mode()) return false;
  if (fn.inputs().size() != op.schema().arguments().size()) return false;  // kwarg-only oddities
  if (on_side_stream(fn.inputs())) return false;
  const DeterminismMode mode = determinism_mode();
  return mode.strict() || !may_differ_on_rerun(fn.name(), op_call(fn.inputs()), mode);  // op_call only if needed
}

// Cost: one dispatcher lookup by name (the operator's name copied, a hash map read under the
// dispatcher's lock), then rerunnable_call; called once per recorded op. The replayer looks up
// through RerunHandles.
inline std::optional<c10::OperatorHandle> rerun_handle(const at::RecordFunction& fn) {
  const auto name = fn.operator_name();
  if (!name) return std::nullopt;
  auto op = c10::Dispatcher::singleton().findOp(*name);
  if (!op || !op->hasSchema() || !rerunnable_call(*op, fn)) return std::nullopt;
  return op;
}

// rerun_handle for the ops of a step, by their index, with the lookup kept from step to step: a
// kept handle is taken when the running call's schema is its very schema (RecordFunction names
// the call by the schema the dispatcher holds, so the same name address is the same operator
// and overload; another op at that index, in a step that left the profile, is looked up anew).
// Only aten operators are kept: they are registered for good, so a kept handle never outlives
// its operator (a torch.library one can be removed). Cost: a pointer compare and
// rerunnable_call; rerun_handle's the first time.
class RerunHandles {
 public:
  std::optional<c10::OperatorHandle> of(size_t op, const at::RecordFunction& fn) {
    if (op < kept_.size() && kept_[op] && kept_[op]->schema().name().c_str() == fn.name()) {
      return rerunnable_call(*kept_[op], fn) ? kept_[op] : std::nullopt;
    }
    ++lookups_;
    auto h = rerun_handle(fn);
    if (h && h->schema().name().rfind("aten::", 0) == 0) {
      if (op >= kept_.size()) kept_.resize(op + 1);
      kept_[op] = h;
    }
    return h;
  }

  // How many calls went to the dispatcher (for tests: a kept handle saves exactly one).
  size_t lookups() const { return lookups_; }

 private:
  std::vector<std::optional<c10::OperatorHandle>> kept_;
  size_t lookups_ = 0;
};

}  // namespace memplan
