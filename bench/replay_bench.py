"""Replay benchmark: for each zoo model, budgets 100/70/50/33% and the minimum, the measured and
predicted peaks, the median step time and the overhead against plain PyTorch, side by side in
one run (configurations interleaved so machine noise hits them alike). Not a test.

    MEMPLAN_BUILD=build python bench/replay_bench.py [--models gpt2,cnn] [--steps 12] [--rounds 1]
        [--budgets 100%,50%] [--train-args "--device cuda --batch 32"] [--threads 1]
        [--plans a.json,b.json]

--plans: also replay these plan files (MEMPLAN_PLAN; made by `memplan-plan PROFILE --budget B
-o a.json` from a profile of the same script), each as a row named after its file: the same
plan with and without a planner feature, side by side in the same rounds.

--threads 1 is the setting for small shared VMs: there, two-thread CPU runs land in a fast or a
slow mode ~30% apart for a whole run, plain and planned alike, which hides the differences the
bench is for; one thread is steady to about 2%.
"""
import argparse
import os
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import memplan_runs as mr  # noqa: E402

BUDGETS = ["200%", "100%", "70%", "50%", "33%", "min"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,gpt2,cnn,views,tied,lstm")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=1, help="repeat every configuration, take medians")
    ap.add_argument("--budgets", default=",".join(BUDGETS), help="comma-separated; 'min' is below any minimum")
    ap.add_argument("--train-args", default="", help="extra examples/train.py arguments, e.g. '--device cuda'")
    ap.add_argument("--plans", default="", help="comma-separated plan files to replay as extra rows")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op CPU threads of every run (OMP/MKL_NUM_THREADS); 0: as inherited")
    args = ap.parse_args()
    if args.threads > 0:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    budgets = [b for b in args.budgets.split(",") if b]
    plans = {Path(f).name: f for f in args.plans.split(",") if f}
    budgets += list(plans)
    extra = shlex.split(args.train_args)
    print(f"| model | budget | feasible | measured peak | predicted | error | act. measured | median step | overhead | predicted overhead | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        plains, runs = [], {b: [] for b in budgets}
        for _ in range(args.rounds):
            plains.append(mr.run(model, args.steps, memplan=False, extra_args=extra))
            for b in budgets:
                budget = None if b in plans else "1%" if b == "min" else b
                runs[b].append(mr.run(model, args.steps, budget=budget, plan=plans.get(b), extra_args=extra))
        plain = plains[-1]
        t0 = statistics.median(x["step_s"] for x in plains)
        for b in budgets:
            r = runs[b][-1]
            rep = r["report"]
            plan = rep.get("plan", {})
            prof = rep["profile"]
            act = prof["peak_bytes"] - prof["baseline_bytes"]
            measured = mr.measured_peak(rep)
            if measured is None:  # nothing to do under this budget: the step already fits
                measured = prof["peak_bytes"]
            pred = plan.get("predicted_peak_bytes", prof["peak_bytes"])
            t = statistics.median(x["step_s"] for x in runs[b])
            same, _ = mr.same_results(plain["dir"], r["dir"])
            # The planner's own estimate of the recompute cost (profiled op times): what the
            # measured overhead exceeds it by is the agent's bookkeeping, not recomputation.
            unplanned_us = plan.get("unplanned_time_us", 0)
            pred_over = plan["predicted_time_us"] / unplanned_us if unplanned_us > 0 else 1.0
            print(f"| {model} | {b} | {plan.get('feasible', True)} | {mr.mib(measured)} | {mr.mib(pred)} | "
                  f"{100 * (measured / pred - 1):+.1f}% | {100 * (measured - prof['baseline_bytes']) / max(act, 1):.0f}% | "
                  f"{1000 * t:.1f} ms | x{t / t0:.3f} | x{pred_over:.3f} | {'yes' if same else 'NO'} |", flush=True)
        for r in [*plains, *(x for b in budgets for x in runs[b])]:
            mr.discard(r)  # each run's dump of losses and gradients: up to hundreds of MiB


if __name__ == "__main__":
    main()
