"""The README's demo and the replay benchmark: they run, print their side-by-side tables with
results identical, and leave no files behind (each run dumps every loss and gradient)."""
from conftest import ROOT, Runner


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
