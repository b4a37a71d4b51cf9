"""Prints tools/gpu_check.sh's tables from a memplan profile and profile_check.py's output.

    python tests/gpu/profile_table.py PROFILE.json RUN.log [--top 10]
Per-op CUPTI kernel time vs CUDA-event time for the ops with the largest device time, and the
agent's step peak (profile peak_bytes) vs torch.cuda.max_memory_allocated. Standard library only.
"""
import argparse
import json
import re
import sys


def fmt_us(v):
    return "-" if v is None or v < 0 else f"{v:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    with open(a.profile) as f:
        p = json.load(f)
    ops = [("F", i, o) for i, o in enumerate(p.get("forward", []))]
    ops += [("B", i, o) for i, o in enumerate(p.get("backward", []))]

    def key(e):
        o = e[2]
        return max(o.get("cupti_us", -1), o.get("event_us", -1), o.get("time_us", -1))

    both = [o for _, _, o in ops if o.get("cupti_us", -1) >= 0 and o.get("event_us", -1) >= 0]
    print(f"device {p.get('device')}  step {p.get('step')}  ops {len(p.get('forward', []))} fwd + "
          f"{len(p.get('backward', []))} bwd; measured by CUPTI {sum(o.get('cupti_us', -1) >= 0 for _, _, o in ops)},"
          f" by events {sum(o.get('event_us', -1) >= 0 for _, _, o in ops)}, both {len(both)}")
    if not any(o.get("cupti_us", -1) >= 0 or o.get("event_us", -1) >= 0 for _, _, o in ops):
        print("NOTE: no op has a device time (cupti_us/event_us all -1): CPU run, or the agent does not "
              "call DeviceTimer yet (hooks/device_timer.h)")
    print(f"{'':2} {'#':>4} {'op':<34} {'cupti_us':>10} {'event_us':>10} {'ev/cupti':>8} {'cpu_us':>9}")
    for kind, i, o in sorted(ops, key=key, reverse=True)[: a.top]:
        c, e = o.get("cupti_us", -1), o.get("event_us", -1)
        ratio = f"{e / c:.2f}" if c > 0 and e >= 0 else "-"
        print(f"{kind:2} {i:>4} {o.get('name', '?')[:34]:<34} {fmt_us(c):>10} {fmt_us(e):>10} {ratio:>8} "
              f"{fmt_us(o.get('cpu_us', -1)):>9}")
    if both:
        tc = sum(o["cupti_us"] for o in both)
        te = sum(o["event_us"] for o in both)
        print(f"total over ops with both: cupti {tc:.1f} us, events {te:.1f} us"
              + (f" (events/cupti {te / tc:.2f})" if tc > 0 else ""))

    mma = None
    with open(a.log, errors="replace") as f:
        for line in f:
            m = re.match(r"MAX_MEMORY_ALLOCATED (-?\d+)", line.strip())
            if m:
                mma = int(m.group(1))
    peak = p.get("peak_bytes")
    mib = lambda b: f"{b / 2**20:.2f} MiB"
    print(f"step peak: agent peak_bytes {peak} ({mib(peak)}), baseline {p.get('baseline_bytes')}")
    if mma is None or mma < 0:
        print("torch.cuda.max_memory_allocated: not measured (no MAX_MEMORY_ALLOCATED line, or CPU run)")
    else:
        d = peak - mma
        print(f"torch.cuda.max_memory_allocated {mma} ({mib(mma)}); agent - torch = {d} bytes "
              f"({100.0 * d / mma:+.3f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
