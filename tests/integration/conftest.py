"""Runs example scripts plainly, under the launcher, and under LD_PRELOAD; compares results."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("MEMPLAN_BUILD", ROOT / "build")).resolve()
PY = sys.executable
TRAIN = ROOT / "examples" / "train.py"
LAUNCHER = ROOT / "tools" / "memplan-run"


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPLAN_") and k not in ("LD_PRELOAD",)}
    env["PYTHONUNBUFFERED"] = "1"
    env["MEMPLAN_BUILD"] = str(BUILD)
    env.pop("PYTHONPATH", None)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


class Runner:
    def __init__(self, tmp: Path):
        self.tmp = tmp

    def run(self, args, mode="plain", env=None, timeout=600, script=TRAIN, python=PY, check=True):
        """mode: plain (no agent), launcher (tools/memplan-run), preload (LD_PRELOAD only)."""
        e = clean_env(env)
        cmd = [str(python), str(script), *map(str, args)]
        if mode == "launcher":
            cmd = [str(LAUNCHER), *cmd]
        elif mode == "preload":
            e["LD_PRELOAD"] = str(BUILD / "libmemplan.so")
        elif mode != "plain":
            raise ValueError(mode)
        p = subprocess.run(cmd, cwd=self.tmp, env=e, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p


@pytest.fixture
def runner(tmp_path):
    return Runner(tmp_path)


def load_profile(path):
    with open(path) as f:
        return json.load(f)


def losses(stdout):
    return [line for line in stdout.splitlines() if line.startswith("step ")]


def assert_same_dumps(a, b):
    import torch

    ra, rb = torch.load(a), torch.load(b)
    assert len(ra["loss"]) == len(rb["loss"]) > 0
    for la, lb in zip(ra["loss"], rb["loss"]):
        assert torch.equal(la, lb), (la, lb)
    for step, (ga, gb) in enumerate(zip(ra["grads"], rb["grads"])):
        assert ga.keys() == gb.keys()
        for name in ga:
            assert torch.equal(ga[name], gb[name]), f"step {step}: gradient of {name} differs"
    assert len(ra["buffers"]) == len(rb["buffers"])
    for step, (ba, bb) in enumerate(zip(ra["buffers"], rb["buffers"])):
        assert ba.keys() == bb.keys()
        for name in ba:
            assert torch.equal(ba[name], bb[name]), f"step {step}: buffer {name} differs"


def nvtx_recorder(tmp):
    """(env, log path) that make NVTX write every range to a file (tests/nvtx_inject); skips the
    test when the build had no NVTX3 headers."""
    recorder = os.environ.get("MEMPLAN_TEST_NVTX_RECORDER")
    if not recorder:
        pytest.skip("built without NVTX3 headers")
    log = Path(tmp) / "nvtx.log"
    return {"NVTX_INJECTION64_PATH": recorder, "MEMPLAN_NVTX_LOG": log}, log


def torchrun(tmp, script_args, env, port, launcher=True):
    """`memplan-run python -m torch.distributed.run --nproc_per_node=2 examples/train.py ...`
    (without memplan-run: launcher=False)."""
    args = [*([str(LAUNCHER)] if launcher else []), PY, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
            str(TRAIN), *map(str, script_args), "--distributed"]
    e = clean_env({"OMP_NUM_THREADS": 1, **env})
    trace = os.environ.get("MEMPLAN_TEST_TERMINATE_TRACE")
    if trace:
        e["LD_PRELOAD"] = trace  # memplan-run puts the agent before it
    p = subprocess.run(args, cwd=tmp, env=e, capture_output=True, text=True, timeout=600)
    if p.returncode != 0 and EXIT_ABORT in p.stderr:
        # Now and then, under load, a rank dies at exit with this abort, in plain runs as well
        # as under memplan (1 in 16 plain two-rank runs before examples/train.py's barrier before
        # destroy_process_group; since, about 1 in 40 under ctest -j2, none in 45 alone). Its
        # cause is not found: the run is repeated once, and the dying thread's stack (printed by
        # tests/terminate_trace) goes to pytest's warnings summary.
        import warnings

        stack = p.stderr[p.stderr.find("memplan-test: std::terminate"):][:4000]
        warnings.warn(f"a rank aborted at exit ({EXIT_ABORT}); run repeated once. {stack}")
        p = subprocess.run(args, cwd=tmp, env=e, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return p


EXIT_ABORT = "terminate called without an active exception"
