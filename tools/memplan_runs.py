"""Runs a training script with and without memplan and reads back what each run measured.
Shared by tools/demo.py and bench/replay_bench.py (not part of the agent)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "train.py"
LAUNCHER = ROOT / "tools" / "memplan-run"


def agent_build():
    """The build directory the launcher loads the agent from (MEMPLAN_BUILD, else build/)."""
    return Path(os.environ.get("MEMPLAN_BUILD", str(ROOT / "build")))


def _env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPLAN_") and k != "LD_PRELOAD"}
    env["MEMPLAN_BUILD"] = str(agent_build())
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


# Every run's files (a dump of all losses and gradients can be hundreds of MiB) live under one
# directory that goes away when the calling script exits, even on an exception; discard() frees
# a run's files sooner.
_scratch = None
_scratch_lock = threading.Lock()  # runs may start from several threads (tools/soak.py --jobs)


def _new_workdir():
    global _scratch
    with _scratch_lock:
        if _scratch is None:
            _scratch = tempfile.TemporaryDirectory(prefix="memplan-runs-")
    return Path(tempfile.mkdtemp(dir=_scratch.name))


def discard(result):
    """Deletes the files of a run() result that used the scratch directory."""
    if _scratch is not None and Path(_scratch.name) in Path(result["dir"]).parents:
        shutil.rmtree(result["dir"], ignore_errors=True)


def run(model, steps, budget=None, memplan=True, extra_args=(), python=sys.executable, warmup=2,
        quiet=True, workdir=None, plan=None, prefix=()):
    """One run. budget=None with memplan=True profiles only; plan: a plan file to replay
    (MEMPLAN_PLAN) instead of planning. workdir: where the run's files go (kept); by default a
    scratch directory deleted at exit. prefix: a command the run goes through (["taskset", "-c",
    "0"]). Returns a dict of what it measured."""
    work = Path(workdir) if workdir else _new_workdir()
    args = [str(python), str(TRAIN), "--model", model, "--steps", str(steps), "--dump", "dump.pt",
            "--times", "times.json", *extra_args]
    env = {"MEMPLAN_WARMUP": warmup, "MEMPLAN_REPORT": "report.json"}
    if budget is not None:
        env["MEMPLAN_BUDGET"] = budget
    if plan is not None:
        env["MEMPLAN_PLAN"] = str(Path(plan).resolve())
    if quiet:
        env["MEMPLAN_SUMMARY"] = 0
    cmd = [*prefix, *([str(LAUNCHER), *args] if memplan else args)]
    p = subprocess.run(cmd, cwd=work, env=_env(env), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit status {p.returncode}):\n{p.stderr[-4000:]}")
    out = {"dir": work, "stdout": p.stdout, "stderr": p.stderr}
    out["times"] = times = json.loads((work / "times.json").read_text())
    # Steps before and at the plan are warm-up; time the ones after.
    out["step_s"] = statistics.median(times[warmup + 1:]) if len(times) > warmup + 1 else statistics.median(times)
    rep = work / "report.json"
    if memplan and rep.exists():
        out["report"] = json.loads(rep.read_text())
    return out


def measured_peak(report):
    """Median replayed-step peak on the profile's baseline, or None if nothing was replayed."""
    plan = report.get("plan") or {}
    base = plan.get("baseline_bytes", report.get("profile", {}).get("baseline_bytes", 0))
    peaks = []
    for r in report.get("replay", []):
        peaks += [p - b + base for p, b in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
    return statistics.median(peaks) if peaks else None


def same_results(a_dir, b_dir):
    """(identical, what differed) comparing two runs' dumps with torch.equal (NaN equal to NaN):
    every loss, every gradient and every buffer (BatchNorm's running statistics are part of the
    result)."""
    import torch

    def equal(x, y):
        # torch.equal, with NaN equal to NaN at the same places: a script whose training diverges
        # (tv-vit --weight-norm: every loss NaN) ran plainly against itself is not "different".
        return torch.equal(x, y) or (x.is_floating_point() and x.dtype == y.dtype and x.shape == y.shape and
                                     bool(torch.isclose(x, y, rtol=0, atol=0, equal_nan=True).all()))

    a, b = torch.load(Path(a_dir) / "dump.pt"), torch.load(Path(b_dir) / "dump.pt")
    for i, (x, y) in enumerate(zip(a["loss"], b["loss"])):
        if not equal(x, y):
            return False, f"loss of step {i}"
    for kind, key in (("gradient", "grads"), ("buffer", "buffers")):
        for i, (xa, xb) in enumerate(zip(a.get(key, []), b.get(key, []))):
            for name in xa:
                if name not in xb or not equal(xa[name], xb[name]):
                    return False, f"{kind} {name} at step {i}"
    return len(a["loss"]) == len(b["loss"]) > 0, "number of steps"


def mib(b):
    return "-" if b is None else f"{b / 2**20:.1f} MiB"
