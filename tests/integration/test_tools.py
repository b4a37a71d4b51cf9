"""The README's demo and the replay benchmark: they run, print their side-by-side tables with
results identical, and leave no files behind (each run dumps every loss and gradient). And
tools/what_if_gpu.py: its op prices, and a profile memplan-plan reads."""
import importlib.util
import json
import math
import subprocess

from conftest import BUILD, ROOT, Runner


def _scratch_left(tmp):
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("memplan-run"))


def test_demo_prints_the_side_by_side_table_and_cleans_up(tmp_path):
    # TMPDIR: where the demo's runs put their files, so that what stays behind can be seen.
    r = Runner(tmp_path)
    p = r.run(["--budget", "50%", "--steps", "6"], script=ROOT / "tools" / "demo.py",
              env={"TMPDIR": tmp_path})
    for row in ["un-planned peak", "budget", "planned peak (measured)", "planned peak (predicted)",
                "median step, plain", "median step, memplan"]:
        assert row in p.stdout, p.stdout
    assert "losses and gradients identical" in p.stdout
    assert _scratch_left(tmp_path) == []


def test_replay_bench_prints_one_row_per_budget_and_cleans_up(tmp_path):
    r = Runner(tmp_path)
    p = r.run(["--models", "mlp", "--budgets", "200%,50%", "--steps", "5", "--threads", "1"],
              script=ROOT / "bench" / "replay_bench.py", env={"TMPDIR": tmp_path})
    rows = [line.split("|")[1:-1] for line in p.stdout.splitlines() if line.startswith("| mlp |")]
    assert [c[1].strip() for c in rows] == ["200%", "50%"], p.stdout
    assert all(c[-1].strip() == "yes" for c in rows), p.stdout  # identical to the plain run
    assert _scratch_left(tmp_path) == []


def test_gapped_bench_prints_one_row_per_depth_and_cleans_up(tmp_path):
    # Steps 8-11 of --depth-random run 2, 3, 2 and 2 of the 4 blocks (examples/train.py's draw),
    # replaying the 4-block plan with blocks left out.
    r = Runner(tmp_path)
    p = r.run(["--rounds", "1", "--steps", "12", "--train-args=--small"],
              script=ROOT / "bench" / "gapped_bench.py", env={"TMPDIR": tmp_path})
    rows = [line.split("|")[1:-1] for line in p.stdout.splitlines() if line.startswith("| ") and "ms |" in line]
    assert [(c[0].strip(), c[1].strip()) for c in rows] == [("2", "3"), ("3", "1")], p.stdout
    # Steps 0-11 run 4,1,1,1,1,4,4,2,2,3,2,2 blocks: the plan of step 1's kind replays 2-4 whole,
    # step 5 diverges, the 4-block plan (step 0's record) replays 6 whole and 7-11 with gaps.
    assert "steps that left blocks out: 5;" in p.stdout, p.stdout
    assert "losses and gradients identical" in p.stdout, p.stdout
    assert _scratch_left(tmp_path) == []


def test_what_if_gpu_prices_ops_by_the_roofline_and_the_planner_reads_the_result(tmp_path):
    spec = importlib.util.spec_from_file_location("what_if_gpu", ROOT / "tools" / "what_if_gpu.py")
    wi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wi)
    src = ROOT / "tests" / "data" / "profiles" / "gpt2_cpu.json"
    out = tmp_path / "gpu.json"
    assert wi.main([str(src), "-o", str(out), "--gpu", "h100", "--eff", "0.5", "--kernel-us", "3",
                    "--host-us", "7", "--view-host-us", "1"]) == 0
    before, after = json.loads(src.read_text()), json.loads(out.read_text())
    assert len(after["forward"]) == len(before["forward"]) and after["values"] == before["values"]
    # The first linear layer, by hand: 2 * tokens * in * out flops at half the H100's FP32 peak,
    # against its inputs' and output's bytes at half its bandwidth; 3 us more for the launch.
    i, lin = next((i, o) for i, o in enumerate(before["forward"]) if o["name"] == "aten::linear")
    x, w = lin["inputs"][0]["shape"], lin["inputs"][1]["shape"]
    flops = 2.0 * math.prod(x[:-1]) * x[-1] * w[0]
    moved = sum(4 * max(1, math.prod(t["shape"])) for t in lin["inputs"] + lin["outputs"])
    want = 3 + max(flops / (67e12 * 0.5), moved / (3.35e12 * 0.5)) * 1e6
    assert abs(after["forward"][i]["cupti_us"] - want) < 1e-6
    assert after["forward"][i]["time_us"] == max(7, want)
    views = [o for o in after["forward"] if o["name"] in ("aten::view", "aten::transpose")]
    assert views and all(o["time_us"] == 1 and o["cupti_us"] == 0 for o in views)
    total = sum(o["time_us"] for o in after["forward"]) + sum(n["time_us"] for n in after["backward"])
    assert abs(after["forward_us"] + after["backward_us"] - total) < 1e-3
    # A backward node that only reshapes a gradient launches nothing; a matmul's costs twice its op.
    nodes = after["backward"]
    assert all(n["time_us"] == 7 for n in nodes if n["name"] in ("TBackward0", "ViewBackward0"))
    mm = next(n for n in nodes if n["name"] == "AddmmBackward0")
    assert mm["cupti_us"] > after["forward"][mm["fwd_op"]]["cupti_us"]
    p = subprocess.run([str(BUILD / "memplan-plan"), str(out), "--budget", "50%"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "predicted peak" in p.stdout
    assert wi.main([str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.json")]) == 2
