"""The README demo: the GPT-2-style example trained plainly and under memplan at a budget, side by
side (peaks, step times, overhead) and whether every loss, gradient and buffer came out identical."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memplan_runs as mr  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    print(f"== plain PyTorch: examples/gpt2_demo.py, {args.steps} steps", flush=True)
    plain = mr.run("gpt2", args.steps, memplan=False)
    print(f"== under memplan: MEMPLAN_BUDGET={args.budget} tools/memplan-run python examples/gpt2_demo.py", flush=True)
    mp = mr.run("gpt2", args.steps, budget=args.budget, quiet=False)
    sys.stderr.write(mp["stderr"])
    rep = mp["report"]
    prof, plan = rep["profile"], rep.get("plan", {})
    base = prof["baseline_bytes"]
    act = prof["peak_bytes"] - base
    measured = mr.measured_peak(rep)
    pct = lambda b: "-" if b is None or act <= 0 else f"{100 * (b - base) / act:.0f}%"
    same, what = mr.same_results(plain["dir"], mp["dir"])
    rows = [
        ("un-planned peak", mr.mib(prof["peak_bytes"]), pct(prof["peak_bytes"])),
        ("budget", mr.mib(plan.get("budget_bytes")), pct(plan.get("budget_bytes"))),
        ("planned peak (measured)", mr.mib(measured), pct(measured)),
        ("planned peak (predicted)", mr.mib(plan.get("predicted_peak_bytes")), pct(plan.get("predicted_peak_bytes"))),
        ("median step, plain", f"{1000 * plain['step_s']:.1f} ms", ""),
        ("median step, memplan", f"{1000 * mp['step_s']:.1f} ms", f"x{mp['step_s'] / plain['step_s']:.2f}"),
    ]
    print()
    print(f"{'':28}{'absolute':>14}{'of activations / ratio':>26}")
    for name, a, b in rows:
        print(f"{name:28}{a:>14}{b:>26}")
    print(f"(baseline held outside the step: {mr.mib(base)}; activation memory = peak - baseline)")
    print("losses and gradients identical" if same else f"DIFFERENT: {what}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
