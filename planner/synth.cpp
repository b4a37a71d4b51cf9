#include "planner/synth.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace memplan::planner {

SynthBuilder::SynthBuilder() { p_.op_hash = ""; }

int64_t SynthBuilder::param(int64_t bytes) {
  Value v;
  v.bytes = bytes;
  v.kind = ValueKind::Parameter;
  p_.values.push_back(v);
  return static_cast<int64_t>(p_.values.size()) - 1;
}

int64_t SynthBuilder::input(int64_t bytes) {
  Value v;
  v.bytes = bytes;
  v.kind = ValueKind::Input;
  p_.values.push_back(v);
  return static_cast<int64_t>(p_.values.size()) - 1;
}

std::vector<int64_t> SynthBuilder::shape_of(int64_t v) const { return {p_.values[v].bytes / 4}; }

std::vector<int64_t> SynthBuilder::op(const std::string& name, const std::vector<int64_t>& in,
                                      const std::vector<Out>& out, const std::vector<int64_t>& saved,
                                      double time_us, int64_t workspace, bool random) {
  const int64_t idx = static_cast<int64_t>(p_.forward.size());
  Op o;
  o.name = name;
  o.seq_nr = idx;
  o.time_us = time_us;
  o.random = random;
  o.peak = workspace;  // workspace stashed here until finish() computes the timeline
  for (int64_t v : in) {
    o.inputs.push_back({v, shape_of(v), "Float"});
    auto& c = p_.values[v].consumers;
    if (c.empty() || c.back() != idx) c.push_back(idx);
  }
  std::vector<int64_t> res;
  for (size_t k = 0; k < out.size(); ++k) {
    int64_t v = out[k].view_of;
    std::vector<int64_t> shape;
    if (out[k].written >= 0) {
      v = out[k].written;
      shape = shape_of(v);
      o.writes.push_back(v);
    } else if (v < 0) {
      Value val;
      val.bytes = out[k].bytes;
      val.kind = ValueKind::Activation;
      val.producer = idx;
      p_.values.push_back(val);
      v = static_cast<int64_t>(p_.values.size()) - 1;
      shape = shape_of(v);
    } else {
      shape = {p_.values[v].bytes / 4, static_cast<int64_t>(k) + 1};  // a view: other shape
    }
    o.outputs.push_back({v, shape, "Float"});
    res.push_back(v);
  }
  p_.forward.push_back(o);
  saved_.push_back(saved);
  for (int64_t v : saved) p_.values[v].saved_by.push_back(idx);
  return res;
}

std::vector<int64_t> SynthBuilder::op_saving_outputs(const std::string& name, const std::vector<int64_t>& in,
                                                     const std::vector<Out>& out,
                                                     const std::vector<int64_t>& saved_in,
                                                     const std::vector<int>& saved_out, double time_us,
                                                     int64_t workspace, bool random) {
  auto res = op(name, in, out, saved_in, time_us, workspace, random);
  const int64_t idx = static_cast<int64_t>(p_.forward.size()) - 1;
  for (int k : saved_out) {
    saved_.back().push_back(res[k]);
    p_.values[res[k]].saved_by.push_back(idx);
  }
  return res;
}

void SynthBuilder::hold_outside(int64_t v) { p_.values[v].held_outside = true; }

Profile SynthBuilder::finish() {
  Profile p = p_;
  const int64_t nf = static_cast<int64_t>(p.forward.size());
  // Backward: one node per forward op, in reverse order.
  for (int64_t i = nf - 1; i >= 0; --i) {
    Op n;
    n.name = p.forward[i].name.substr(p.forward[i].name.find(':') + 2) + "Backward0";
    n.seq_nr = p.forward[i].seq_nr;
    n.fwd_op = i;
    n.time_us = 2 * p.forward[i].time_us;
    const int64_t j = static_cast<int64_t>(p.backward.size());
    for (int64_t v : saved_[i]) {
      auto& u = p.values[v].unpacked_by;
      if (std::find(u.begin(), u.end(), j) == u.end()) u.push_back(j);
    }
    p.backward.push_back(n);
  }
  for (Value& v : p.values) {
    std::sort(v.unpacked_by.begin(), v.unpacked_by.end());
    if (!v.saved_by.empty()) v.saved_bytes = v.bytes;
  }
  // Baseline: parameters with grads and two optimizer moments, plus inputs.
  int64_t base = 0;
  for (const Value& v : p.values) {
    if (v.kind == ValueKind::Parameter) base += 4 * v.bytes;
    if (v.kind == ValueKind::Input) base += v.bytes;
  }
  const int64_t nb = static_cast<int64_t>(p.backward.size());
  // When does each activation die? (Same rule as the planner's Graph.)
  std::vector<std::vector<int64_t>> dies(nf + nb);
  std::vector<int64_t> grads(nf, 0);
  for (size_t vi = 0; vi < p.values.size(); ++vi) {
    const Value& v = p.values[vi];
    if (v.producer < 0 || v.held_outside) continue;
    int64_t end = v.producer;
    for (int64_t c : v.consumers) end = std::max(end, c);
    if (!v.saved_by.empty()) end = nf + v.unpacked_by.back();
    dies[end].push_back(static_cast<int64_t>(vi));
    grads[v.producer] += v.bytes;  // the gradient of this output, alive during the node
  }
  int64_t live = base, peak = base;
  auto freed = [&](int64_t pos) {
    int64_t b = 0;
    for (int64_t v : dies[pos]) b += p.values[v].bytes;
    return b;
  };
  std::vector<int64_t> outb(nf, 0);
  for (const Value& v : p.values)
    if (v.producer >= 0) outb[v.producer] += v.bytes;
  for (int64_t i = 0; i < nf; ++i) {
    Op& o = p.forward[i];
    const int64_t ws = o.peak;
    const int64_t out = outb[i];
    o.live_before = live;
    o.start_us = p.forward_us;
    p.forward_us += o.time_us;
    o.peak = live + out + ws;
    live += out - freed(i);
    o.live_after = live;
    peak = std::max(peak, o.peak);
  }
  for (int64_t j = 0; j < nb; ++j) {
    Op& n = p.backward[j];
    n.live_before = live;
    n.start_us = p.forward_us + p.backward_us;
    p.backward_us += n.time_us;
    n.peak = live + grads[n.fwd_op];
    live -= freed(nf + j);
    n.live_after = live;
    peak = std::max(peak, n.peak);
  }
  p.baseline_bytes = base;
  p.peak_bytes = peak;
  p.end_bytes = live;
  // Hash of names and input shapes (FNV-1a), like the recorder's op_hash.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char ch : s) {
      h ^= ch;
      h *= 1099511628211ull;
    }
  };
  for (const Op& o : p.forward) {
    mix(o.name);
    for (const TensorRef& t : o.inputs) mix(fmt::format("{}", fmt::join(t.shape, ",")));
  }
  p.op_hash = fmt::format("{:016x}", h);
  return p;
}

namespace {

double us(int64_t bytes, double flops_per_byte = 1) {
  return 1.0 + static_cast<double>(bytes) * flops_per_byte / 4.0e3;  // ~a few us per MB
}

}  // namespace

Profile synth_transformer(int layers, int64_t tokens, int64_t hidden, int64_t seq) {
  SynthBuilder b;
  const int64_t act = tokens * hidden * 4, stat = tokens * 4;
  const int64_t heads = std::max<int64_t>(1, hidden / 64);
  const int64_t scores = (tokens / seq) * heads * seq * seq * 4;
  const int64_t ids = b.input(tokens * 8);
  const int64_t wemb = b.param(1000 * hidden * 4);
  int64_t x = b.op("aten::embedding", {wemb, ids}, {{act}}, {ids}, us(act))[0];
  for (int l = 0; l < layers; ++l) {
    const int64_t w1 = b.param(hidden * 4), b1 = b.param(hidden * 4);
    auto ln = b.op_saving_outputs("aten::native_layer_norm", {x, w1, b1}, {{act}, {stat}, {stat}},
                                  {x, w1, b1}, {1, 2}, us(act));
    const int64_t wqkv = b.param(3 * hidden * hidden * 4);
    const int64_t qkv = b.op("aten::linear", {ln[0], wqkv}, {{3 * act}}, {ln[0], wqkv}, us(3 * act, 8))[0];
    auto qkv3 = b.op("aten::split", {qkv}, {{0, qkv}, {0, qkv}, {0, qkv}}, {}, 0.5);
    const int64_t s = b.op("aten::matmul", {qkv3[0], qkv3[1]}, {{scores}}, {qkv}, us(scores, 4))[0];
    const int64_t pr = b.op_saving_outputs("aten::softmax", {s}, {{scores}}, {}, {0}, us(scores))[0];
    auto dr = b.op_saving_outputs("aten::native_dropout", {pr}, {{scores}, {scores / 4}}, {}, {1},
                                  us(scores), 0, true);
    const int64_t ctx = b.op("aten::matmul", {dr[0], qkv3[2]}, {{act}}, {dr[0], qkv}, us(scores, 4))[0];
    const int64_t wo = b.param(hidden * hidden * 4);
    const int64_t o = b.op("aten::linear", {ctx, wo}, {{act}}, {ctx, wo}, us(act, 8))[0];
    const int64_t x2 = b.op("aten::add", {x, o}, {{act}}, {}, us(act))[0];
    const int64_t w2 = b.param(hidden * 4), b2 = b.param(hidden * 4);
    auto ln2 = b.op_saving_outputs("aten::native_layer_norm", {x2, w2, b2}, {{act}, {stat}, {stat}},
                                   {x2, w2, b2}, {1, 2}, us(act));
    const int64_t wf1 = b.param(4 * hidden * hidden * 4), wf2 = b.param(4 * hidden * hidden * 4);
    const int64_t f1 = b.op("aten::linear", {ln2[0], wf1}, {{4 * act}}, {ln2[0], wf1}, us(4 * act, 8))[0];
    const int64_t g = b.op("aten::gelu", {f1}, {{4 * act}}, {f1}, us(4 * act))[0];
    const int64_t f2 = b.op("aten::linear", {g, wf2}, {{act}}, {g, wf2}, us(4 * act, 8))[0];
    x = b.op("aten::add", {x2, f2}, {{act}}, {}, us(act))[0];
  }
  const int64_t wf = b.param(hidden * 4), bf = b.param(hidden * 4);
  auto lnf = b.op_saving_outputs("aten::native_layer_norm", {x, wf, bf}, {{act}, {stat}, {stat}},
                                 {x, wf, bf}, {1, 2}, us(act));
  const int64_t wout = b.param(1000 * hidden * 4);
  const int64_t logits = b.op("aten::linear", {lnf[0], wout}, {{tokens * 1000 * 4}}, {lnf[0], wout},
                              us(tokens * 4000, 8))[0];
  const int64_t tgt = b.input(tokens * 8);
  auto ce = b.op_saving_outputs("aten::cross_entropy_loss", {logits, tgt}, {{4}, {tokens * 1000 * 4}},
                                {tgt}, {1}, us(tokens * 4000));
  b.hold_outside(ce[0]);
  return b.finish();
}

Profile synth_resnet(int blocks, int64_t pixels, int64_t channels) {
  SynthBuilder b;
  int64_t px = pixels, ch = channels;
  const int64_t img = b.input(pixels * 3 * 4);
  auto conv = [&](int64_t x, int64_t cin, int64_t cout, int64_t out_px) {
    const int64_t w = b.param(cin * cout * 9 * 4);
    const int64_t out = out_px * cout * 4;
    return b.op("aten::convolution", {x, w}, {{out}}, {x, w}, us(out, 16), out / 4)[0];
  };
  auto bn = [&](int64_t x, int64_t c, int64_t bytes) {
    const int64_t w = b.param(c * 4), bb = b.param(c * 4);
    return b.op_saving_outputs("aten::native_batch_norm", {x, w, bb}, {{bytes}, {c * 4}, {c * 4}},
                               {x, w}, {1, 2}, us(bytes))[0];
  };
  auto relu = [&](int64_t x, int64_t bytes) {
    return b.op_saving_outputs("aten::relu", {x}, {{bytes}}, {}, {0}, us(bytes))[0];
  };
  int64_t x = relu(bn(conv(img, 3, ch, px), ch, px * ch * 4), px * ch * 4);
  // Four stages like a real ResNet: downsample (1x1-conv skip) at the start of stages 2-4 only.
  const int stage_len = std::max(1, blocks / 4);
  for (int k = 0; k < blocks; ++k) {
    const bool down = k > 0 && k % stage_len == 0 && k / stage_len <= 3;
    const int64_t opx = down ? std::max<int64_t>(1, px / 4) : px;
    const int64_t och = down ? ch * 2 : ch;
    const int64_t bytes = opx * och * 4;
    int64_t h = relu(bn(conv(x, ch, och, opx), och, bytes), bytes);
    h = bn(conv(h, och, och, opx), och, bytes);
    int64_t skip = x;
    if (down) skip = bn(conv(x, ch, och, opx), och, bytes);
    const int64_t s = b.op("aten::add", {h, skip}, {{bytes}}, {}, us(bytes))[0];
    x = relu(s, bytes);
    px = opx;
    ch = och;
  }
  const int64_t pooled = b.op("aten::mean", {x}, {{ch * 4 * 8}}, {}, us(px * ch * 4))[0];
  const int64_t wl = b.param(ch * 1000 * 4);
  const int64_t logits = b.op("aten::linear", {pooled, wl}, {{8 * 1000 * 4}}, {pooled, wl}, us(32000, 4))[0];
  const int64_t tgt = b.input(8 * 8);
  auto ce = b.op_saving_outputs("aten::cross_entropy_loss", {logits, tgt}, {{4}, {8 * 1000 * 4}}, {tgt},
                                {1}, us(32000));
  b.hold_outside(ce[0]);
  return b.finish();
}

}  // namespace memplan::planner
