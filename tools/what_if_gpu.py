#!/usr/bin/env python3
"""What would the planner choose if this profile's ops cost what they would on a GPU?

A model, not a measurement: it rewrites the op times of a recorded profile (memplan-profile.json,
docs/profile-schema.md) with a roofline estimate for a named GPU and writes the result as a new
profile, which `memplan-plan --sweep` then plans. The graph and the memory stay as recorded;
only the costs change. Use it to see how much a plan's overhead depends on the ratio of cheap
(memory-bound) to expensive (matmul) ops, before a GPU is at hand; the answer to "what does it
cost on a GPU" stays tools/gpu_check.sh's measurement.

Cost of a forward op, in microseconds:
    device = kernel_floor + max(flops / (peak_flops * eff), bytes / (bandwidth * eff))
    time   = max(host, device)       # a re-run is bound by its launch or its kernels
flops counts only matrix products (linear, matmul, mm, bmm, addmm, baddbmm, sdpa); every other
op is memory-bound: the bytes of its tensor inputs and outputs. Views launch no kernel.
A backward node gets twice its forward op's flops and bytes when it is the op's one heavy node
(AddmmBackward0, BmmBackward0, ...), nothing on the device when it only reshapes a gradient
(ViewBackward0, TBackward0, ...), and the host floor either way. AccumulateGrad: host floor.

Caveat: the memory is the recorded device's. A CPU profile's aten::dropout saves a float mask
(4 bytes an element, kept as 1 bit by the CPU plans' compaction); CUDA's fused dropout saves a
bool mask (1 byte). Percent budgets are of the recorded activation memory.

    python tools/what_if_gpu.py memplan-profile.json -o gpu.json [--gpu h100] && \
        build/memplan-plan gpu.json --sweep
"""
import argparse
import json
import math
import sys

# Peak dense rates (TFLOP/s) and memory bandwidth (TB/s), from the vendors' datasheets.
# Float matmuls take the FP32 rate: torch's default float32_matmul_precision is "highest".
GPUS = {
    "h100": {"fp32": 67.0, "half": 989.0, "bw": 3.35},   # H100 SXM5
    "h200": {"fp32": 67.0, "half": 989.0, "bw": 4.8},    # H200 SXM
    "a100": {"fp32": 19.5, "half": 312.0, "bw": 2.04},   # A100 SXM4 80GB
}
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
               "Short": 2, "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8}
VIEW_OPS = {"aten::view", "aten::transpose", "aten::t", "aten::permute", "aten::reshape",
            "aten::split", "aten::chunk", "aten::unsqueeze", "aten::squeeze", "aten::expand",
            "aten::slice", "aten::select", "aten::narrow", "aten::flatten", "aten::unflatten",
            "aten::as_strided", "aten::detach", "aten::alias", "aten::unbind", "aten::view_as",
            "aten::expand_as", "aten::movedim", "aten::swapaxes"}
# Not aten::contiguous: it copies when its input is not contiguous, and the profile does not say
# whether it was; priced by its bytes, as a copy (the demo's follows a transpose, so it copies).
MATMULS = {"aten::linear", "aten::matmul", "aten::mm", "aten::bmm", "aten::addmm",
           "aten::baddbmm", "aten::scaled_dot_product_attention"}
LIGHT_NODES = {"ViewBackward0", "UnsafeViewBackward0", "TransposeBackward0", "TBackward0",
               "ExpandBackward0", "PermuteBackward0", "ReshapeAliasBackward0", "UnsqueezeBackward0",
               "SqueezeBackward0", "AliasBackward0", "DetachBackward0", "SelectBackward0",
               "SliceBackward0", "AsStridedBackward0", "torch::autograd::AccumulateGrad"}


def numel(shape):
    return math.prod(shape)


def tensor_bytes(t):
    return numel(t.get("shape", [])) * DTYPE_BYTES.get(t.get("dtype", "Float"), 4)


def matmul_flops(op):
    """2*M*N*K summed over the batch, from the recorded input shapes; 0 if they do not fit."""
    ins = [t.get("shape", []) for t in op["inputs"]]
    name = op["name"]
    try:
        if name == "aten::linear":          # x [..., K], W [N, K]
            return 2.0 * numel(ins[0]) * ins[1][0]
        if name in ("aten::addmm", "aten::baddbmm"):
            a, b = ins[1], ins[2]
        elif name == "aten::scaled_dot_product_attention":  # q [..., L, E], k [..., S, E]
            q, k = ins[0], ins[1]
            return 4.0 * numel(q[:-1]) * k[-2] * q[-1]
        else:
            a, b = ins[0], ins[1]
        if len(a) < 2 or len(b) < 1:
            return 0.0
        out_batch = numel(a[:-2]) if len(a) > 2 else 1
        n = b[-1] if len(b) >= 2 else 1
        return 2.0 * out_batch * a[-2] * a[-1] * n
    except (IndexError, TypeError):
        return 0.0


def half_precision(op):
    return any(t.get("dtype") in ("Half", "BFloat16") for t in op["inputs"])


def forward_cost(op, gpu):
    """(flops, bytes, peak rate) of one forward op."""
    if op["name"] in VIEW_OPS:
        return 0.0, 0.0, 1.0
    rate = gpu["half"] if half_precision(op) else gpu["fp32"]
    moved = sum(tensor_bytes(t) for t in op["inputs"] + op["outputs"])
    flops = matmul_flops(op) if op["name"] in MATMULS else 0.0
    return flops, moved, rate


def device_us(flops, moved, rate, gpu, a):
    if flops == 0.0 and moved == 0.0:
        return 0.0
    compute = flops / (rate * 1e12 * a.eff) * 1e6
    memory = moved / (gpu["bw"] * 1e12 * a.eff) * 1e6
    return a.kernel_us + max(compute, memory)


def rewrite(prof, gpu, a):
    fwd_cost = []
    for op in prof["forward"]:
        flops, moved, rate = forward_cost(op, gpu)
        dev = device_us(flops, moved, rate, gpu, a)
        host = a.host_us if dev > 0 else a.view_host_us
        fwd_cost.append((flops, moved, rate))
        op.update(time_us=max(host, dev), cpu_us=host, cupti_us=dev, event_us=-1.0)
    heavy = {}
    for n in prof["backward"]:
        if n["name"] not in LIGHT_NODES and n.get("fwd_op", -1) >= 0:
            heavy[n["fwd_op"]] = heavy.get(n["fwd_op"], 0) + 1
    for n in prof["backward"]:
        f = n.get("fwd_op", -1)
        dev = 0.0
        if n["name"] not in LIGHT_NODES and f >= 0:
            flops, moved, rate = fwd_cost[f]
            share = 2.0 / heavy[f]
            dev = device_us(flops * share, moved * share, rate, gpu, a)
        n.update(time_us=max(a.host_us, dev), cpu_us=a.host_us, cupti_us=dev, event_us=-1.0)
    t = 0.0
    for op in prof["forward"]:
        op["start_us"] = t
        t += op["time_us"]
    prof["forward_us"] = t
    for n in prof["backward"]:
        n["start_us"] = t
        t += n["time_us"]
    prof["backward_us"] = t - prof["forward_us"]
    prof["overhead_us"] = 0.0
    return prof


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--gpu", default="h100", choices=sorted(GPUS))
    p.add_argument("--eff", type=float, default=0.7, help="share of the peak rates reached (default 0.7)")
    p.add_argument("--kernel-us", type=float, default=2.5, help="device time of an empty kernel (default 2.5)")
    p.add_argument("--host-us", type=float, default=6.0,
                   help="host time to dispatch and launch one op or node (default 6)")
    p.add_argument("--view-host-us", type=float, default=2.0, help="host time of a view op (default 2)")
    a = p.parse_args(argv)
    try:
        with open(a.profile) as f:
            prof = json.load(f)
        prof = rewrite(prof, GPUS[a.gpu], a)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"what_if_gpu: cannot read {a.profile}: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(prof, f)
    fwd, bwd = prof["forward_us"], prof["backward_us"]
    print(f"{a.gpu}: modelled forward {fwd / 1e3:.2f} ms, backward {bwd / 1e3:.2f} ms "
          f"(eff {a.eff}, kernel floor {a.kernel_us} us, host {a.host_us} us an op) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
