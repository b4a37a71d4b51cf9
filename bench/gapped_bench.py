"""LayerDrop benchmark: does a step that leaves blocks out cost more than a full step? Such a step
replays the deepest step's plan past the gaps (Replayer::skip_to) and relies on on-demand rebuilds
for whatever a left-out block's recompute point would have put back.

`examples/train.py --model gpt2 --depth-random` runs 1 to L of its L blocks per step. Per depth:
median step time plain and planned, their ratio (median over rounds), and the agent's callback
time per step (replay bookkeeping and planned rebuilds, timed in-process: steadier than wall-time
ratios on a shared VM) as a share of the plain step. Then the steps that left blocks out: how
many, their on-demand rebuilds, their worst activation peak against the plan's budget, and
whether losses and gradients were identical. Plain and planned run at the same time, one core
each, the sides swapped every round (this VM's speed drifts between runs; pairs cancel most of
it). Not a test.

    MEMPLAN_BUILD=build python bench/gapped_bench.py [--rounds 6] [--steps 60] [--budget 50%]
        [--layers 4] [--train-args "--batch 8"]
"""
import argparse
import random
import shlex
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import memplan_runs as mr  # noqa: E402

WARMUP = 2


def depth_of(step, layers):
    """Blocks run in `step`: examples/train.py --depth-random's draw."""
    return random.Random(2000 + step).randrange(1, layers + 1)


def pair(args, extra, swap):
    """Plain and planned at once, on cores 0 and 1 (swapped if `swap`)."""
    out = {}
    cores = ("1", "0") if swap else ("0", "1")

    def go(name, core, **kw):
        out[name] = mr.run("gpt2", args.steps, extra_args=extra, warmup=WARMUP,
                           prefix=["taskset", "-c", core], **kw)

    threads = [threading.Thread(target=go, args=("plain", cores[0]), kwargs={"memplan": False}),
               threading.Thread(target=go, args=("planned", cores[1]), kwargs={"budget": args.budget})]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(out) != 2:
        raise SystemExit("a run failed (see above)")
    return out["plain"], out["planned"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--train-args", default="", help="more examples/train.py arguments")
    args = ap.parse_args()
    extra = ["--depth-random", "--layers", str(args.layers), *shlex.split(args.train_args)]
    first = WARMUP + 6  # past the warm-up and the misses before the deepest kind is planned
    ratios, plain_ms, agent_ms = {}, {}, {}
    gapped, on_demand, worst, identical = 0, 0, 0.0, True
    for r in range(args.rounds):
        plain, planned = pair(args, extra, swap=r % 2 == 1)
        rep = planned["report"]
        by_depth = {}
        for s in range(first, args.steps):
            by_depth.setdefault(depth_of(s, args.layers), []).append(s)
        for d, steps in by_depth.items():
            a = statistics.median(plain["times"][s] for s in steps)
            b = statistics.median(planned["times"][s] for s in steps)
            ratios.setdefault(d, []).append(b / a)
            plain_ms.setdefault(d, []).extend(1e3 * plain["times"][s] for s in steps)
        plans = rep.get("plans", [])
        for q in rep.get("replay", []):
            for s, us in zip(q["callback_steps"], q["callback_us"]):
                if s >= first:
                    agent_ms.setdefault(depth_of(s, args.layers), []).append(us / 1e3)
            gapped += q["gapped_steps"]
            on_demand += q["on_demand"]
            plan = plans[q["plan"]]
            allowed = plan["budget_bytes"] - plan["baseline_bytes"]
            for p, b in zip(q["gapped_peak_bytes"], q["gapped_baseline_bytes"]):
                worst = max(worst, (p - b) / allowed)
        same, what = mr.same_results(plain["dir"], planned["dir"])
        if not same:
            identical = False
            print(f"round {r + 1}: results differ ({what})")
        mr.discard(plain)
        mr.discard(planned)
    print(f"GPT-2 demo model, --depth-random over {args.layers} blocks, budget {args.budget}, "
          f"{args.rounds} rounds of {args.steps} steps (steps {first}+ counted)\n")
    print("| blocks run | steps | plain step | planned / plain (wall) | agent callbacks | share of plain step |")
    print("|---|---|---|---|---|---|")
    for d in sorted(ratios):
        p = statistics.median(plain_ms[d])
        # None replayed (every such step diverged, say): no figure rather than 0 ms.
        a = statistics.median(agent_ms[d]) if d in agent_ms else None
        agent = "- | -" if a is None else f"{a:.2f} ms | {100 * a / p:.1f}%"
        print(f"| {d}{' (full)' if d == args.layers else ''} | {len(plain_ms[d])} | {p:.1f} ms | "
              f"x{statistics.median(ratios[d]):.3f} | {agent} |")
    print(f"\nsteps that left blocks out: {gapped}; on-demand rebuilds in all replayed steps: {on_demand}; "
          f"worst activation peak of a step that left blocks out: {100 * worst:.0f}% of its plan's budget; "
          f"losses and gradients {'identical' if identical else 'DIFFERED'}")


if __name__ == "__main__":
    main()
