// Rebuilding an evicted value: the externals a re-run reads (parameters, inputs, buffers: taken as
// they were when captured, copied before a write), the slots where a value may still be had
// without re-running anything, and the re-run itself (run_op: the op called again through the
// dispatcher with its thread-local state and RNG state restored), memoized across one rebuild.
#include "agent/replay.h"

#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "agent/log.h"
#include "agent/pack_hooks.h"
#include "agent/storage_copy.h"
#include "hooks/op_callbacks.h"
#include "profiler/tensor_args.h"

namespace memplan {

namespace {

thread_local std::vector<at::Tensor>* tl_capture = nullptr;
constexpr int kMaxDepth = 4000;  // a rebuild chain longer than the step itself means a cycle


// Restores a forward op's thread-local state around its re-run: grad mode on (the original ran
// with autograd, which is what makes it pack internal tensors), its autocast state, its RNG
// state, the kernel choice it ran under (kernel_choice.h: SDPA backends, cuDNN...), and no
// TorchDispatchMode (no op that ran under one is re-run: rerunnable_call; a backward run under a
// script's mode must not see our re-runs, which a mode that rounds its ops' outputs would
// change), leaving the user's RNG stream, autocast state, kernel choice and modes as they were.
class RerunState {
 public:
  RerunState(const std::vector<std::pair<at::Generator, at::Tensor>>& rng, bool cpu_ac,
             at::ScalarType cpu_dt, bool cuda_ac, at::ScalarType cuda_dt, const KernelChoice& kernels)
      : grad_(true),
        kernels_(kernels),
        cpu_ac_(at::autocast::is_autocast_enabled(at::kCPU)),
        cuda_ac_(at::autocast::is_autocast_enabled(at::kCUDA)),
        cpu_dt_(at::autocast::get_autocast_dtype(at::kCPU)),
        cuda_dt_(at::autocast::get_autocast_dtype(at::kCUDA)),
        cache_(at::autocast::is_autocast_cache_enabled()) {
    if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) {  // a TLS read in the common case
      modes_ = c10::impl::TorchDispatchModeTLS::get_state();
      c10::impl::TorchDispatchModeTLS::set_state(c10::impl::TorchDispatchModeTLS());
    }
    // No autocast weight cache: a re-run runs outside the user's autocast region, so nothing
    // would clear the bf16/fp16 weight copies it cached until the next forward's region ends,
    // memory no plan accounts for (+23% over the predicted peak at 35% under CPU bf16 autocast).
    // Uncached casts give the same values and die with the op.
    at::autocast::set_autocast_cache_enabled(false);
    at::autocast::set_autocast_enabled(at::kCPU, cpu_ac);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_ac);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dt);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dt);
    for (const auto& [gen, state] : rng) {
      at::Generator g = gen;
      std::lock_guard<std::mutex> lock(g.mutex());
      saved_rng_.emplace_back(g, g.get_state());
      g.set_state(state);
    }
  }
  ~RerunState() {
    for (auto& [gen, state] : saved_rng_) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
    at::autocast::set_autocast_enabled(at::kCPU, cpu_ac_);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_ac_);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dt_);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dt_);
    at::autocast::set_autocast_cache_enabled(cache_);
    if (modes_) c10::impl::TorchDispatchModeTLS::set_state(std::move(*modes_));
  }

 private:
  at::AutoGradMode grad_;
  KernelChoiceScope kernels_;
  bool cpu_ac_, cuda_ac_;
  at::ScalarType cpu_dt_, cuda_dt_;
  bool cache_;
  std::vector<std::pair<at::Generator, at::Tensor>> saved_rng_;
  std::optional<c10::impl::TorchDispatchModeTLS> modes_;  // the script's, while the re-run runs without
};

}  // namespace

std::vector<at::Tensor>* Replayer::capture() { return tl_capture; }

// Cost: a clone, or a short scan of this moment's copies (moment_copies_) that finds one to share.
void Replayer::snapshot_external(const at::Tensor& t, uint32_t version) {
  const std::pair<const c10::TensorImpl*, uint32_t> key{t.unsafeGetTensorImpl(), version};
  if (snapshots_.count(key)) return;
  const c10::StorageImpl* storage = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
  if (storage != nullptr) {
    for (const MomentCopy& m : moment_copies_) {
      if (m.storage == storage && same_layout(m.of, t)) {
        snapshots_.emplace(key, m.copy);
        return;
      }
    }
  }
  AgentScope scope;  // not an op of the step
  at::NoGradGuard no_grad;
  at::Tensor copy = t.detach().clone(at::MemoryFormat::Preserve);
  if (storage != nullptr) moment_copies_.push_back({storage, t, copy});
  snapshots_.emplace(key, std::move(copy));
  ++stats_.snapshots;
}

namespace {
// Whether `t`'s storage no longer holds its elements (resized smaller since: FSDP2 frees a
// block's unsharded parameters after its forward, and gathers them again for its backward).
// Cost: a few multiplications.
bool released(const at::Tensor& t) {
  if (!t.has_storage() || t.layout() != at::kStrided) return false;
  return t.storage().nbytes() <
         at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize(), static_cast<size_t>(t.storage_offset()));
}
}  // namespace

// An external as a re-run must read it: itself if unchanged since `src` captured it (and its
// storage still there), else its snapshot from then (snapshot_external); undefined if neither.
at::Tensor Replayer::external_as_captured(const TensorSource& src) const {
  if (!src.external.defined()) return src.external;
  const c10::TensorImpl* impl = src.external.unsafeGetTensorImpl();
  if (version_of(src.external) == src.external_version && !released(src.external)) {
    return src.external;
  }
  auto it = snapshots_.find({impl, src.external_version});
  return it == snapshots_.end() ? at::Tensor() : it->second;
}

bool Replayer::written_unsnapshotted(const c10::TensorImpl* impl, const External& e) const {
  return e.tensor.defined() && version_of(e.tensor) != e.version && !snapshots_.count({impl, e.version});
}

void Replayer::guard_external(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  auto range = external_storage_.equal_range(t.storage().unsafeGetStorageImpl());
  for (auto it = range.first; it != range.second; ++it) {
    auto e = externals_.find(it->second);
    if (e == externals_.end() || !e->second.tensor.defined()) continue;
    const uint32_t now = version_of(e->second.tensor);
    // Contents no recipe captured (written since, and not captured again) need no copy.
    if (e->second.last_version != now) continue;
    snapshot_external(e->second.tensor, now);
    // Whether the write moves its version is known once it landed (settle_writes): through
    // `.data` it does not (a counter of its own), through `detach()` it does (a shared one).
    const at::Tensor& ext = e->second.tensor;
    if (ext.unsafeGetTensorImpl()->version_counter().enabled() &&
        std::none_of(writing_.begin(), writing_.end(), [&](const auto& w) { return w.first.is_same(ext); }))
      writing_.emplace_back(ext, ext._version());
  }
}

uint32_t Replayer::version_of(const at::Tensor& t) const {
  const uint32_t v = t._version();
  if (unbumped_.empty()) return v;
  const auto it = unbumped_.find(t.unsafeGetTensorImpl());
  return it == unbumped_.end() ? v : v + it->second;
}

namespace {
// Each tensor of `fn`'s arguments that `written` (WritesByName::of) marks as written.
template <typename F>
void each_written(const at::RecordFunction& fn, const std::vector<char>& written, F f) {
  if (written.empty()) return;
  const auto inputs = fn.inputs();
  for (size_t i = 0; i < inputs.size() && i < written.size(); ++i) {
    if (written[i]) for_each_tensor(inputs[i], f);
  }
}
}  // namespace

void Replayer::note_writes(const at::RecordFunction& fn, const std::vector<char>& written) {
  writing_.clear();
  each_written(fn, written, [&](const at::Tensor& t) {
    if (t.defined() && t.unsafeGetTensorImpl()->version_counter().enabled()) writing_.emplace_back(t, t._version());
  });
}

void Replayer::settle_writes() {
  for (const auto& [t, before] : writing_) {
    if (t._version() == before) ++unbumped_[t.unsafeGetTensorImpl()];
    if (t.has_storage()) mark_overwritten(t);
  }
  writing_.clear();
}

// A slot that shares t's counter moved with the write; one whose version stayed is another
// tensor of the storage with a counter of its own (`x` after `x.data.sub_(m)`, or `x.data` after
// a write through `x`). Before, a rebuild of an op that read it before the write read it live
// as written, and one that read it after re-ran its maker: both other contents than the forward's
// (the batch centred in place after the first layer: every gradient off by ~1e-7).
void Replayer::mark_overwritten(const at::Tensor& t) {
  const auto [first, last] = slot_by_storage_.equal_range(t.storage().unsafeGetStorageImpl());
  for (auto st = first; st != last; ++st) {
    const auto [o, k] = st->second;
    if (static_cast<size_t>(k) >= slots_[o].size()) continue;
    Slot& s = slots_[o][k];
    if (s.overwritten || s.storage._unsafe_get_target() != t.storage().unsafeGetStorageImpl()) continue;
    if (auto impl = s.impl.lock()) {
      if (impl.get() != t.unsafeGetTensorImpl() && impl->version_counter().current_version() == s.version)
        s.overwritten = true;
    } else if (!s.counter.enabled() || s.counter.current_version() == s.version) {
      s.overwritten = true;
    }
  }
}

void Replayer::before_write(const at::RecordFunction& fn) {
  // An untracked op: a moment of its own (an earlier one's copies may predate a write since).
  moment_copies_.clear();
  if (!externals_.empty()) before_write(fn, writes_.of(fn));
}

void Replayer::before_write(const at::RecordFunction& fn, const std::vector<char>& written) {
  if (!externals_.empty()) each_written(fn, written, [&](const at::Tensor& t) { guard_external(t); });
}

// Cost: one version read per external captured this step (parameters, inputs, buffers).
bool Replayer::externals_changed() const {
  for (const auto& [impl, e] : externals_) {
    if (written_unsnapshotted(impl, e)) return true;
  }
  return false;
}

// The whole chain a rebuild might re-run (every slot taken as gone: what is alive now may not be
// then), each op once.
const at::Tensor* Replayer::chain_reads_changed_external(const TensorSource& src, std::vector<char>& seen,
                                                        int depth) {
  static const at::Tensor kUnfollowable;
  if (depth > kMaxDepth) return &kUnfollowable;
  switch (src.kind) {
    case TensorSource::Kind::External:
      if (src.external.defined() && !external_as_captured(src).defined()) {
        refused_by_.insert(src.external.unsafeGetTensorImpl());
        return &src.external;
      }
      return nullptr;
    case TensorSource::Kind::None:
      return &kUnfollowable;
    case TensorSource::Kind::Slot:
    case TensorSource::Kind::Internal:
      break;
  }
  if (src.op < 0 || static_cast<size_t>(src.op) >= recipes_.size()) return &kUnfollowable;
  if (seen[src.op]) return nullptr;
  seen[src.op] = 1;
  for (const Arg& a : recipes_[src.op].args) {
    for (const TensorSource& t : a.tensors) {
      if (const at::Tensor* w = chain_reads_changed_external(t, seen, depth + 1)) return w;
    }
  }
  return nullptr;
}

at::Tensor Replayer::Slot::view(c10::Storage storage, int64_t at_offset) const {
  at::Tensor t = at::empty({0}, options);
  t.set_(std::move(storage), at_offset, sizes, strides);
  return t;
}

// Whether output `index` of `op` can be had without re-running it (alive, or its storage alive
// and unchanged).
bool Replayer::slot_available(int64_t op, int64_t index) const {
  const Slot& s = slots_[op][index];
  if (s.overwritten) return false;
  if (auto impl = s.impl.lock()) return impl->version_counter().current_version() == s.version;
  if (!s.storage.expired()) return s.counter.enabled() && s.counter.current_version() == s.version;
  return held_view(op, index, /*make=*/false).defined();
}

at::Tensor Replayer::held_view(int64_t op, int64_t index, bool make) const {
  const Slot& s = slots_[op][index];
  // The forward's storage must be gone: while it lives, what shares it is the forward's own
  // tensor, which the version checks before this judge.
  const c10::StorageImpl* storage = s.storage._unsafe_get_target();
  if (storage == nullptr || !s.storage.expired() || !s.counter.enabled()) return at::Tensor();
  if (static_cast<size_t>(op) >= output_values_.size() || static_cast<size_t>(index) >= output_values_[op].size())
    return at::Tensor();
  const int64_t v = output_values_[op][index];
  if (v < 0) return at::Tensor();
  // `t` was re-made as output `from_index` of `from_op` (viewed as `src` if a view): it stands for
  // the forward's storage at that slot's version, laid out as the forward's was, shifted by where
  // it starts in it.
  auto view_of = [&](const at::Tensor& t, int64_t from_op, int64_t from_index, const TensorSource* src) {
    if (!t.defined() || !t.has_storage() || t.layout() != at::kStrided) return at::Tensor();
    const Slot& from = slots_[from_op][from_index];
    // Views of one storage share one version counter: equal versions, equal contents.
    if (from.storage._unsafe_get_target() != storage || from.version != s.version) return at::Tensor();
    const bool viewed = src != nullptr && src->view;
    if (!t.sizes().equals(viewed ? src->sizes : from.sizes) || !t.strides().equals(viewed ? src->strides : from.strides) ||
        t.scalar_type() != s.options.dtype().toScalarType()) {
      return at::Tensor();
    }
    const int64_t offset = s.offset + t.storage_offset() - (viewed ? src->offset : from.offset);
    int64_t last = offset;
    for (size_t d = 0; d < s.sizes.size(); ++d) {
      if (s.sizes[d] == 0) return at::Tensor();
      last += (s.sizes[d] - 1) * s.strides[d];
    }
    if (offset < 0 || (last + 1) * static_cast<int64_t>(t.element_size()) > static_cast<int64_t>(t.storage().nbytes()))
      return at::Tensor();
    return make ? s.view(t.storage(), offset) : t;
  };
  if (auto h = holds_.find(v); h != holds_.end() && h->second.op >= 0) {
    if (at::Tensor t = view_of(h->second.tensor, h->second.op, h->second.index, nullptr); t.defined()) return t;
  }
  // A saved tensor of the value a recompute put back (SDPA's q, k, v; the next recompute re-runs
  // SDPA for its output).
  if (auto h = handles_.find(v); h != handles_.end()) {
    for (const auto& w : h->second) {
      auto st = w.lock();
      if (!st || st->evicted || st->source.kind != TensorSource::Kind::Slot) continue;
      if (at::Tensor t = view_of(st->tensor, st->source.op, st->source.index, &st->source); t.defined()) return t;
    }
  }
  return at::Tensor();
}

void Replayer::count_uses(const TensorSource& src, Memo& memo, int depth) {
  if (depth > kMaxDepth) throw std::runtime_error("memplan: rebuild chain too deep");
  int64_t op = -1;
  if (src.kind == TensorSource::Kind::Slot) {
    if (src.op < 0 || static_cast<size_t>(src.op) >= slots_.size() ||
        static_cast<size_t>(src.index) >= slots_[src.op].size()) {
      throw std::runtime_error("memplan: rebuild refers to an unknown op output");
    }
    if (slot_available(src.op, src.index)) return;
    ++memo.output_uses[{src.op, src.index}];
    op = src.op;
  } else if (src.kind == TensorSource::Kind::Internal) {
    ++memo.pack_uses[{src.op, src.index}];
    op = src.op;
  } else {
    return;
  }
  if (memo.will_run.size() <= static_cast<size_t>(op)) memo.will_run.resize(recipes_.size(), false);
  if (memo.will_run[op]) return;
  memo.will_run[op] = true;
  for (const Arg& a : recipes_.at(op).args) {
    for (const TensorSource& t : a.tensors) count_uses(t, memo, depth + 1);
  }
}

namespace {
// Takes one use of a memo entry; the entry goes at its last use.
at::Tensor take(std::map<std::pair<int64_t, int64_t>, at::Tensor>& entries,
                std::map<std::pair<int64_t, int64_t>, int>& uses, std::pair<int64_t, int64_t> key) {
  auto e = entries.find(key);
  if (e == entries.end()) return at::Tensor();
  at::Tensor t = e->second;
  auto u = uses.find(key);
  if (u == uses.end() || --u->second <= 0) {
    entries.erase(e);
    if (u != uses.end()) uses.erase(u);
  }
  return t;
}
}  // namespace

at::Tensor Replayer::slot_tensor(int64_t op, int64_t index, Memo& memo, int depth) {
  if (at::Tensor t = take(memo.outputs, memo.output_uses, {op, index}); t.defined()) return t;
  if (op < 0 || static_cast<size_t>(op) >= slots_.size() || static_cast<size_t>(index) >= slots_[op].size()) {
    throw std::runtime_error("memplan: rebuild refers to an unknown op output");
  }
  const Slot& s = slots_[op][index];
  if (auto impl = s.impl.lock()) {
    at::Tensor live(impl);
    if (impl->version_counter().current_version() == s.version) return live;
  } else if (auto storage = s.storage.lock()) {
    // The output tensor is gone but its storage is alive (a saved alias, a view) and unchanged:
    // view it again instead of re-running the op.
    if (s.counter.enabled() && s.counter.current_version() == s.version) {
      return s.view(c10::Storage(std::move(storage)), s.offset);
    }
  }
  if (at::Tensor t = held_view(op, index, /*make=*/true); t.defined()) return t;
  if (memo.output_uses.find({op, index}) == memo.output_uses.end()) memo.output_uses[{op, index}] = 1;
  run_op(op, memo, depth + 1);
  at::Tensor t = take(memo.outputs, memo.output_uses, {op, index});
  if (!t.defined()) throw std::runtime_error("memplan: re-run returned fewer outputs");
  return t;
}

at::Tensor Replayer::resolve(const TensorSource& src, Memo& memo, int depth) {
  if (depth > kMaxDepth) throw std::runtime_error("memplan: rebuild chain too deep");
  switch (src.kind) {
    case TensorSource::Kind::External:
      // Written in place after the value was evicted: its old contents are gone, and re-running
      // with the new ones would give another tensor. Fail loudly rather than differ silently.
      if (!src.external.defined()) return src.external;
      if (at::Tensor t = external_as_captured(src); t.defined()) return t;
      refused_by_.insert(src.external.unsafeGetTensorImpl());
      throw std::runtime_error(
          "memplan: an input of a recomputed op was written in place after its value was evicted; "
          "cannot rebuild it bit for bit (set MEMPLAN_DISABLE=1 for this script)");
    case TensorSource::Kind::Slot: {
      at::Tensor base = slot_tensor(src.op, src.index, memo, depth);
      if (!src.view) return base;
      return at::as_strided(base, src.sizes, src.strides, src.offset);
    }
    case TensorSource::Kind::Internal: {
      const std::pair<int64_t, int64_t> key{src.op, src.index};
      if (at::Tensor t = take(memo.packs, memo.pack_uses, key); t.defined()) return t;
      if (memo.pack_uses.find(key) == memo.pack_uses.end()) memo.pack_uses[key] = 1;
      run_op(src.op, memo, depth + 1);
      at::Tensor t = take(memo.packs, memo.pack_uses, key);
      if (!t.defined()) {
        const Recipe& r = recipes_.at(src.op);
        throw std::runtime_error(fmt::format("memplan: re-run packed fewer tensors (forward op {} {}, pack {})", src.op,
                                             r.op ? r.op->schema().name() : "?", src.index));
      }
      return t;
    }
    case TensorSource::Kind::None:
      break;
  }
  throw std::runtime_error("memplan: tensor has no source to rebuild it from");
}

std::shared_ptr<SavedState> Replayer::tail_mask(int64_t op, const Memo& memo) const {
  auto m = op_mask_.find(op);
  if (m == op_mask_.end() || tail_state_[op] < 0) return nullptr;
  const Recipe& r = recipes_[op];
  if (r.args.empty() || r.args[0].kind != Arg::Kind::Tensor || r.op->schema().name() != "aten::dropout")
    return nullptr;
  for (const auto& [key, uses] : memo.pack_uses)
    if (key.first == op) return nullptr;  // an evicted pack of this op is rebuilt from this run
  auto h = handles_.find(m->second);
  if (h == handles_.end()) return nullptr;
  for (const auto& w : h->second) {
    auto s = w.lock();
    if (s && s->compact) return s;
  }
  return nullptr;
}

void Replayer::run_op(int64_t op, Memo& memo, int depth) {
  const Recipe& r = recipes_.at(op);
  if (!r.valid || !r.op) throw std::runtime_error("memplan: no recipe to rebuild from");
  // Dropout with its mask kept compact: on the CPU aten::dropout returns `input * noise` (after
  // drawing noise); the noise is the compact mask, so that product is the op's output bit for bit,
  // without the random draw. Checked against a full re-run the first time (below).
  const std::shared_ptr<SavedState> mask = tail_mask(op, memo);
  if (mask && tail_state_[op] == 1) {
    at::Tensor in = resolve(r.args[0].tensors[0], memo, depth);
    if (tail_fits(in, mask->mask)) {
      at::Tensor out;
      {
        AgentScope scope;
        at::NoGradGuard no_grad;
        out = at::mul(in.detach(), expand_mask(mask->mask));
      }
      ++stats_.ops_rerun;
      ++stats_.tail_reruns;
      const std::pair<int64_t, int64_t> key{op, 0};
      if (memo.output_uses.count(key)) memo.outputs[key] = out;
      return;
    }
    tail_state_[op] = -1;  // cannot happen in a step that matches the profile; never again
  }
  torch::jit::Stack stack;
  stack.reserve(r.args.size());
  auto prepare = [&](const TensorSource& src, bool requires_grad, bool written) {
    at::Tensor t = resolve(src, memo, depth);
    if (!t.defined()) return t;
    // A tensor this rebuild made that nothing else holds (the memo gave up its last use: a
    // BatchNorm output that an in-place activation re-run writes) may be written where it is:
    // no one can see the write. Copying it was memory the plan did not count (a CNN with
    // in-place Hardswish at its minimum budget measured +10.7% over its predicted peak).
    // Dense in any layout, not only contiguous: a channels-last one copied measured +12.1% over
    // the prediction (CNN with Hardswish, channels-last, at its minimum budget). Nor need it be
    // dense: a slice of a storage it alone holds (`m[:, :k] = False` re-run) is written where it
    // is, so the rebuilt output is a view of the whole rebuilt storage, as the forward's was,
    // which source_of may re-view as the tensor it was a slice of. Not overlapping (an expanded
    // tensor), which an in-place op refuses too ("too hard to tell" it accepts, and so do we: the
    // forward wrote the same layout). Cost: two refcount reads and a stride walk.
    const bool exclusive = written && t.use_count() == 1 && t.has_storage() && t.storage().use_count() == 1 &&
                           at::has_internal_overlap(t) != at::MemOverlap::Yes;
    // Never let a re-run write a live tensor (BatchNorm running stats, in-place ops): scratch.
    // An argument that required grad gets it again, so the re-run records and packs as the
    // original did. A written one is made a non-leaf, with grad mode on (a rebuild mostly runs
    // inside backward, where it is off): an in-place op on a leaf that requires grad is an error
    // (hardswish_ on a BatchNorm output, in MobileNetV3). A copy does that; so does
    // _unsafe_view, with no copy, for an exclusive one (autograd sees a new tensor, not a view
    // of the leaf, which it would refuse to write in place too).
    t = t.detach();
    if (requires_grad) t.requires_grad_(true);
    if (written) {
      AgentScope scope;  // not an op of the step
      at::AutoGradMode grad(requires_grad);
      // A tensor of the step that is a slice of its storage is copied with all of it: the
      // re-run's output is then a view of a storage like the forward's, which source_of may
      // re-view as the tensor the slice was cut from. One from outside the step is copied alone:
      // its storage may be far larger (a KV cache written through a slice), and no source
      // re-views it (source_of takes dead slots on storages the step made only).
      at::Tensor whole;
      if (!exclusive && src.kind != TensorSource::Kind::External) whole = copy_with_storage(t);
      if (whole.defined()) {
        t = whole;
        if (requires_grad) t = at::_unsafe_view(t.detach().requires_grad_(true), t.sizes());
      } else if (!exclusive) {
        t = t.clone(at::MemoryFormat::Preserve);
      } else if (requires_grad) {
        t = at::_unsafe_view(t, t.sizes());
      }
    }
    return t;
  };
  for (const Arg& a : r.args) {
    switch (a.kind) {
      case Arg::Kind::Constant:
        stack.push_back(a.constant);
        break;
      case Arg::Kind::Tensor:
        stack.emplace_back(prepare(a.tensors[0], a.requires_grad[0], a.written));
        break;
      case Arg::Kind::TensorList: {
        std::vector<at::Tensor> list;
        for (size_t i = 0; i < a.tensors.size(); ++i) list.push_back(prepare(a.tensors[i], a.requires_grad[i], a.written));
        stack.emplace_back(std::move(list));
        break;
      }
      case Arg::Kind::OptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        size_t j = 0;
        for (bool present : a.present) {
          if (present) {
            list.push_back(prepare(a.tensors[j], a.requires_grad[j], a.written));
            ++j;
          } else {
            list.push_back(std::nullopt);
          }
        }
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
  at::Tensor tail_input;  // kept for the one-time check of the dropout tail
  if (mask && tail_state_[op] == 0 && !stack.empty() && stack[0].isTensor()) tail_input = stack[0].toTensor();
  std::vector<at::Tensor> packs;
  {
    AgentScope scope;  // our callbacks ignore the re-run
    // A re-run must pack through our hooks (that is how internal tensors are recovered), also
    // inside an op whose own packs bypass them (Agent::op_start) and during backward, when the
    // shim has taken them off the stack.
    pack_hooks::OnTop hooks;
    RerunState state(r.rng, r.autocast_cpu, r.autocast_cpu_dtype, r.autocast_cuda, r.autocast_cuda_dtype, r.kernels);
    std::vector<at::Tensor>* outer = tl_capture;
    tl_capture = &packs;
    try {
      r.op->callBoxed(&stack);
    } catch (...) {
      tl_capture = outer;
      throw;
    }
    tl_capture = outer;
  }
  ++stats_.ops_rerun;
  if (tail_input.defined()) {
    bool same = false;
    if (!stack.empty() && stack[0].isTensor()) {
      AgentScope scope;
      at::NoGradGuard no_grad;
      same = tail_matches(tail_input.detach(), mask->mask, stack[0].toTensor().detach());
    }
    tail_state_[op] = same ? 1 : -1;
    if (!same) {
      log_once("dropout-tail", LogLevel::Warn,
               fmt::format("forward op {}: input x mask differs from re-running dropout; re-running it", op));
    }
  }
  // Keep only what a planned use will take; the rest dies here.
  int64_t k = 0;
  auto keep_output = [&](const at::Tensor& t) {
    const std::pair<int64_t, int64_t> key{op, k++};
    if (memo.output_uses.count(key)) memo.outputs[key] = t.detach();
  };
  for (const c10::IValue& iv : stack) {
    if (iv.isTensor()) {
      keep_output(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorVector()) keep_output(t);
    }
  }
  for (size_t p = 0; p < packs.size(); ++p) {
    const std::pair<int64_t, int64_t> key{op, static_cast<int64_t>(p)};
    if (memo.pack_uses.count(key)) memo.packs[key] = packs[p];
  }
}

void Replayer::rebuild(SavedState& s, Memo& memo) {
  at::Tensor t = resolve(s.source, memo, 0);
  // A re-run that took another kernel than its forward (a setting it depends on that RerunState
  // does not restore) may save other tensors: one clear error, not a backward fed wrong ones
  // ("batch1 must be a 3D tensor" when SDPA's backend changed). Cost: a size compare.
  if (t.defined() && (t.sizes() != c10::IntArrayRef(s.meta_sizes) || t.scalar_type() != s.meta_dtype)) {
    throw std::runtime_error(fmt::format(
        "memplan: re-running forward op {} gave a saved tensor of {} {} where the forward saved {} {}: the op "
        "took another kernel than in the forward; MEMPLAN_DISABLE=1 runs without memplan",
        s.op, c10::toString(t.scalar_type()), c10::str(t.sizes()), c10::toString(s.meta_dtype),
        c10::str(c10::IntArrayRef(s.meta_sizes))));
  }
  s.tensor = t.defined() ? t.detach() : t;
  s.evicted = false;
  ++stats_.rebuilt;
}

at::Tensor Replayer::materialize(SavedState& s) {
  if (!s.evicted) return s.tensor;
  if (!op_running_) settle_writes();  // a write outside any recorded op's window (untracked_op)
  // Also outside backward (a script reading grad_fn._saved_* in forward): these ops are ours.
  AgentScope scope;
  if (s.compact) {  // each unpack gets its own copy, freed when the node is done with it
    ++stats_.expanded;
    return expand_mask(s.mask);
  }
  ++stats_.on_demand;
  log_once("on-demand", LogLevel::Debug, "a saved tensor was needed before its planned recompute; rebuilt on demand");
  ActionSpan span(this, "memplan/recompute on demand",
                  naming_actions() ? fmt::format("memplan/recompute value {} on demand", s.value) : std::string());
  Memo memo;
  count_uses(s.source, memo, 0);
  rebuild(s, memo);
  return s.tensor;
}

}  // namespace memplan
