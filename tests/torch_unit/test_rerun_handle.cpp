// rng_device: which device's generator a random op's re-run must restore. On a GPU a dropout's
// input is a CUDA tensor made in the step; the CUDA generator is the one that draws its mask.
// No GPU here: a meta tensor stands for "a tensor not on the CPU", and a CUDA Device value
// needs no device to exist.
#include <ATen/ATen.h>
#include <c10/core/impl/FakeGuardImpl.h>
#include <gtest/gtest.h>

#include "profiler/op_hash.h"
#include "profiler/recorder.h"
#include "profiler/rerun_handle.h"

using memplan::rng_device;

namespace {
std::vector<c10::IValue> args(std::initializer_list<c10::IValue> l) { return std::vector<c10::IValue>(l); }
}  // namespace

TEST(RngDevice, CpuTensorsAndScalarsDrawOnTheCpu) {
  EXPECT_EQ(rng_device(args({at::ones({2}), 0.5, true})), c10::Device(c10::kCPU));
  EXPECT_EQ(rng_device(args({})), c10::Device(c10::kCPU));
}

TEST(RngDevice, ATensorNotOnTheCpuDecidesWhereverItIs) {
  const at::Tensor meta = at::empty({2}, at::TensorOptions().device(c10::kMeta));
  // A dropout: its one tensor input (made in the step, so no "external" the recipe holds).
  EXPECT_EQ(rng_device(args({meta, 0.1, true})), c10::Device(c10::kMeta));
  // After a CPU tensor (a 0-dim scalar tensor beside a device one).
  EXPECT_EQ(rng_device(args({at::ones({}), meta})), c10::Device(c10::kMeta));
  // Inside a tensor list.
  EXPECT_EQ(rng_device(args({c10::IValue(std::vector<at::Tensor>{at::ones({1}), meta})})), c10::Device(c10::kMeta));
}

TEST(RngDevice, ADeviceArgumentDecidesWhenNoTensorDoes) {
  // randn(size, dtype, layout, device, pin_memory): the device argument.
  const c10::Device cuda1("cuda:1");
  EXPECT_EQ(rng_device(args({c10::IValue(std::vector<int64_t>{2, 3}), c10::IValue(), c10::IValue(), cuda1, false})),
            cuda1);
  EXPECT_EQ(rng_device(args({c10::IValue(std::vector<int64_t>{2}), c10::Device(c10::kCPU)})), c10::Device(c10::kCPU));
}

// rerun_handle on real ops: an op whose re-run may give other bits (op_determinism.h) gets no
// handle unless deterministic algorithms are on. index_copy_ is nondeterministic on the CPU too;
// index_add_ only off the CPU (a meta tensor stands for a GPU one).
namespace {

struct Seen {
  std::string name;
  std::vector<bool> handled;  // rerun_handle(fn).has_value(), per call of `name`
};
thread_local Seen* tl_seen = nullptr;

std::unique_ptr<at::ObserverContext> see(const at::RecordFunction& fn) {
  if (tl_seen && tl_seen->name == fn.name()) tl_seen->handled.push_back(memplan::rerun_handle(fn).has_value());
  return nullptr;
}

// Runs `f` with deterministic algorithms set to (on, warn_only); what rerun_handle said of `name`.
template <typename F>
std::vector<bool> handles_of(const char* name, bool on, bool warn_only, F f) {
  auto& ctx = at::globalContext();
  const bool was_on = ctx.deterministicAlgorithms(), was_warn = ctx.deterministicAlgorithmsWarnOnly();
  ctx.setDeterministicAlgorithms(on, warn_only);
  Seen seen{name, {}};
  tl_seen = &seen;
  const auto h = at::addThreadLocalCallback(at::RecordFunctionCallback(&see).needsInputs(true));
  f();
  at::removeCallback(h);
  tl_seen = nullptr;
  ctx.setDeterministicAlgorithms(was_on, was_warn);
  return seen.handled;
}

}  // namespace

TEST(RerunHandle, ANondeterministicKernelIsNotRerunWithoutTheMode) {
  const auto copy = [] {
    at::Tensor x = at::zeros({4, 3});
    x.index_copy_(0, at::tensor({0, 2}, at::kLong), at::ones({2, 3}));
  };
  EXPECT_EQ(handles_of("aten::index_copy_", /*on=*/false, false, copy), std::vector<bool>{false});
  EXPECT_EQ(handles_of("aten::index_copy_", /*on=*/true, false, copy), std::vector<bool>{true});
  // Ops not on the list are re-run whatever the mode.
  EXPECT_EQ(handles_of("aten::add", false, false, [] { (void)at::add(at::ones({2}), at::ones({2})); }),
            std::vector<bool>{true});
}

TEST(RerunHandle, AtomicsOnlyOffTheCpu) {
  const auto add_on = [](c10::Device d) {
    return [d] {
      const auto opt = at::TensorOptions().device(d);
      at::Tensor x = at::zeros({4, 3}, opt);
      x.index_add_(0, at::zeros({2}, opt.dtype(at::kLong)), at::ones({2, 3}, opt));
    };
  };
  EXPECT_EQ(handles_of("aten::index_add_", false, false, add_on(c10::kCPU)), std::vector<bool>{true});
  EXPECT_EQ(handles_of("aten::index_add_", false, false, add_on(c10::kMeta)), std::vector<bool>{false});
  EXPECT_EQ(handles_of("aten::index_add_", true, false, add_on(c10::kMeta)), std::vector<bool>{true});
  EXPECT_EQ(handles_of("aten::index_add_", true, true, add_on(c10::kMeta)), std::vector<bool>{true});
}

// `x[mask] = v` writes each element once: re-run whatever the mode. Integer indices may repeat.
TEST(RerunHandle, IndexPutThroughABooleanMaskIsRerun) {
  const auto put = [](bool masks) {
    return [masks] {
      at::Tensor x = at::zeros({4});
      const at::Tensor idx = masks ? at::tensor({1, 0, 1, 0}).to(at::kBool) : at::tensor({0, 2, 2}, at::kLong);
      x.index_put_({idx}, at::ones({masks ? 2 : 3}));
    };
  };
  EXPECT_EQ(handles_of("aten::index_put_", false, false, put(true)), std::vector<bool>{true});
  EXPECT_EQ(handles_of("aten::index_put_", false, false, put(false)), std::vector<bool>{false});
  EXPECT_EQ(handles_of("aten::index_put_", true, false, put(false)), std::vector<bool>{true});
}

// RerunHandles: the replayer's per-op rerun_handle, with the lookup kept. Every call below is
// taken as op 0 of a step (another op at a kept index, as in a step that left the profile): each
// gets its own operator and overload, never the kept one of another call, the determinism
// test still runs on a kept handle, and a kept handle is really taken (no second lookup).
namespace {

struct Calls {
  memplan::RerunHandles handles;
  std::vector<std::string> names;      // per call: the operator it is, "name.overload"
  std::vector<std::string> got;        // per call: the handle's, or "-" for none
  std::vector<size_t> lookups;         // per call: the dispatcher lookups so far
};
thread_local Calls* tl_calls = nullptr;

std::string full_name(const c10::OperatorName& n) { return n.name + "." + n.overload_name; }

std::unique_ptr<at::ObserverContext> call(const at::RecordFunction& fn) {
  if (tl_calls == nullptr || !fn.operator_name()) return nullptr;
  const std::string name = full_name(*fn.operator_name());
  if (name != "aten::add.Tensor" && name != "aten::mul.Tensor" && name != "aten::index_copy_.") {
    return nullptr;  // the arguments' making, the ops inside these
  }
  tl_calls->names.push_back(name);
  const auto h = tl_calls->handles.of(0, fn);
  tl_calls->got.push_back(h ? full_name(h->schema().operator_name()) : "-");
  tl_calls->lookups.push_back(tl_calls->handles.lookups());
  return nullptr;
}

}  // namespace

TEST(RerunHandles, AKeptHandleServesOnlyItsOwnOperatorAndStillChecksTheMode) {
  auto& ctx = at::globalContext();
  const bool was_on = ctx.deterministicAlgorithms(), was_warn = ctx.deterministicAlgorithmsWarnOnly();
  Calls calls;
  tl_calls = &calls;
  const auto h = at::addThreadLocalCallback(at::RecordFunctionCallback(&call).needsInputs(true));
  const at::Tensor a = at::ones({2, 3}), idx = at::tensor({0, 1}, at::kLong);
  at::Tensor x = at::zeros({4, 3});
  ctx.setDeterministicAlgorithms(false, false);
  (void)at::add(a, a);                 // looked up, kept
  (void)at::add(a, a);                 // the kept one
  (void)at::add(a, a, 2);              // the same operator with another alpha: kept one still
  (void)at::mul(a, a);                 // another operator at the kept index: looked up
  (void)at::add(a, a);
  x.index_copy_(0, idx, a);            // nondeterministic: none, nothing kept
  ctx.setDeterministicAlgorithms(true, false);
  x.index_copy_(0, idx, a);            // re-runnable now: kept
  ctx.setDeterministicAlgorithms(false, false);
  x.index_copy_(0, idx, a);            // kept, but the mode says no
  at::removeCallback(h);
  tl_calls = nullptr;
  ctx.setDeterministicAlgorithms(was_on, was_warn);
  ASSERT_EQ(calls.names.size(), 8u) << ::testing::PrintToString(calls.names);
  const std::vector<std::string> want = {calls.names[0], calls.names[1], calls.names[2], calls.names[3],
                                         calls.names[4], "-", calls.names[6], "-"};
  EXPECT_EQ(calls.got, want);
  EXPECT_EQ(calls.names[3], "aten::mul.Tensor");
  EXPECT_EQ(calls.names[6], "aten::index_copy_.");
  // Kept handles are used: add again, add with alpha and the last index_copy_ look nothing up;
  // index_copy_ without deterministic algorithms is looked up and, refused, not kept.
  EXPECT_EQ(calls.lookups, (std::vector<size_t>{1, 1, 1, 2, 3, 4, 5, 5}));
}

// side_stream_of: an op queued on a stream other than its device's default is not re-run, and what
// it reads is not evicted. No GPU here: PrivateUse1 with c10's FakeGuardImpl (streams that are
// numbers) stands for a device with streams; its guard names no default stream, so stream 0 is it.
namespace {
const c10::impl::DeviceGuardImplRegistrar fake_streams(c10::DeviceType::PrivateUse1,
                                                       new c10::impl::FakeGuardImpl<c10::DeviceType::PrivateUse1>());

// A CPU tensor sent to the stand-in device: `to`'s Device argument is the call's device, and the
// copy itself fails (no allocator for it), after the callbacks have seen the call.
void send_to(c10::Device dev) {
  try {
    (void)at::ones({2}).to(dev);
  } catch (const c10::Error&) {
  }
}
}  // namespace

TEST(SideStream, OnlyAStreamOtherThanTheDefaultOne) {
  const c10::Device dev(c10::DeviceType::PrivateUse1, 0);
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(dev.type());
  EXPECT_FALSE(memplan::side_stream_of(dev));
  const c10::Stream was = impl->exchangeStream(c10::Stream(c10::Stream::UNSAFE, dev, 3));  // torch.cuda.stream(s)
  EXPECT_TRUE(memplan::side_stream_of(dev));
  EXPECT_TRUE(memplan::side_stream_of(dev));  // asked again: the guard's answer is kept, not the stream
  // A call is on its device's stream: a Device argument decides when no tensor does (randn(device=)).
  EXPECT_TRUE(memplan::on_side_stream(args({c10::IValue(std::vector<int64_t>{2}), c10::IValue(), c10::IValue(), dev})));
  EXPECT_FALSE(memplan::on_side_stream(args({at::ones({2}), 0.5})));  // on the CPU
  impl->exchangeStream(was);
  EXPECT_FALSE(memplan::side_stream_of(dev));
  EXPECT_FALSE(memplan::on_side_stream(args({c10::IValue(std::vector<int64_t>{2}), c10::IValue(), c10::IValue(), dev})));
}

TEST(SideStream, TheCpuMetaAndAnAbsentGpuHaveNone) {
  EXPECT_FALSE(memplan::side_stream_of(c10::Device(c10::kCPU)));
  EXPECT_FALSE(memplan::side_stream_of(c10::Device(c10::kMeta)));  // its guard names no default stream
  EXPECT_FALSE(memplan::side_stream_of(c10::Device(c10::kMeta)));
  // No GPU here: CUDA's guard (in a CUDA build) cannot tell its stream; no side stream, no throw.
  EXPECT_FALSE(memplan::side_stream_of(c10::Device("cuda:0")));
  const at::Tensor meta = at::empty({2}, at::TensorOptions().device(c10::kMeta));
  EXPECT_FALSE(memplan::on_side_stream(args({meta})));
}

// rerun_handle refuses a call on a side stream; the same call on the default stream is re-run.
TEST(SideStream, ACallOnASideStreamGetsNoHandle) {
  const c10::Device dev(c10::DeviceType::PrivateUse1, 0);
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(dev.type());
  const auto send = [dev] { send_to(dev); };
  EXPECT_EQ(handles_of("aten::to", false, false, send), std::vector<bool>{true});
  const c10::Stream was = impl->exchangeStream(c10::Stream(c10::Stream::UNSAFE, dev, 1));
  EXPECT_EQ(handles_of("aten::to", false, false, send), std::vector<bool>{false});
  impl->exchangeStream(was);
}

// The replay's running op hash (Recorder::identity_hash) tells a call on a side stream from the
// same call on the default stream, and agrees with the hash of the op the recorder keeps
// (identity_of, Op::side_stream): a step whose op moved to or from a side stream leaves its
// plan's profile (the replay stops evicting), and one that did not stays in it.
namespace {
struct Hashed {
  uint64_t identity = 0, structure = 0;
  std::string overload;
};
thread_local Hashed* tl_hashed = nullptr;
std::unique_ptr<at::ObserverContext> hash_to(const at::RecordFunction& fn) {
  if (tl_hashed && std::string(fn.name()) == "aten::to") {
    tl_hashed->identity = memplan::Recorder::identity_hash(fn, &tl_hashed->structure);
    tl_hashed->overload = fn.overload_name();
  }
  return nullptr;
}
Hashed hash_of_send(c10::Device dev) {
  Hashed h;
  tl_hashed = &h;
  const auto cb = at::addThreadLocalCallback(at::RecordFunctionCallback(&hash_to).needsInputs(true));
  send_to(dev);
  at::removeCallback(cb);
  tl_hashed = nullptr;
  return h;
}
}  // namespace

TEST(SideStream, TheRunningOpHashTellsTheStreamAsTheRecordedOpDoes) {
  const c10::Device dev(c10::DeviceType::PrivateUse1, 0);
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(dev.type());
  const Hashed plain = hash_of_send(dev);
  const c10::Stream was = impl->exchangeStream(c10::Stream(c10::Stream::UNSAFE, dev, 2));
  const Hashed side = hash_of_send(dev);
  impl->exchangeStream(was);
  ASSERT_NE(plain.identity, 0u);
  EXPECT_NE(plain.identity, side.identity);
  EXPECT_NE(plain.structure, side.structure);  // not the same op at other sizes either
  memplan::Op op;
  op.name = "aten::to";
  op.overload = plain.overload;
  op.inputs.push_back({0, {2}, "Float"});
  EXPECT_EQ(memplan::identity_of(op), plain.identity);
  op.side_stream = true;
  EXPECT_EQ(memplan::identity_of(op), side.identity);
  EXPECT_EQ(memplan::structure_of(op), side.structure);
  op.side_stream = false;
  EXPECT_EQ(memplan::structure_of(op), plain.structure);
}
