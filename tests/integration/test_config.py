"""Bad MEMPLAN_* values: one warning naming the variable, the value and what is accepted; the
script's results and exit code unchanged."""
import pytest

from conftest import assert_same_dumps, losses

BAD = {
    "MEMPLAN_DISABLE": "maybe",
    "MEMPLAN_BUDGET": "12XB",
    "MEMPLAN_WARMUP": "abc",
    "MEMPLAN_LOG": "loud",
    "MEMPLAN_SUMMARY": "perhaps",
    "MEMPLAN_NVTX": "2x",
}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    from conftest import Runner

    r = Runner(tmp_path_factory.mktemp("plain"))
    p = r.run(["--model", "mlp", "--small", "--steps", "3", "--dump", "plain.pt"])
    return p, r.tmp / "plain.pt"


@pytest.mark.parametrize("var", sorted(BAD))
def test_malformed_value_warns_once_and_changes_nothing(runner, plain, var):
    value = BAD[var]
    p = runner.run(["--model", "mlp", "--small", "--steps", "3", "--dump", "a.pt"], mode="launcher",
                   env={var: value})
    assert p.stdout == plain[0].stdout
    assert_same_dumps(plain[1], runner.tmp / "a.pt")
    warnings = [l for l in p.stderr.splitlines() if var in l and value in l]
    assert len(warnings) == 1, p.stderr
    assert "expected" in warnings[0] and "using" in warnings[0]


def test_typo_variable_is_named(runner, plain):
    p = runner.run(["--model", "mlp", "--small", "--steps", "3"], mode="launcher", env={"MEMPLAN_BUGDET": "50%"})
    assert p.stdout == plain[0].stdout
    assert any("MEMPLAN_BUGDET" in l and "MEMPLAN_BUDGET" in l for l in p.stderr.splitlines())


def test_unwritable_output_paths_warn_and_change_nothing(runner, plain):
    p = runner.run(["--model", "mlp", "--small", "--steps", "3"], mode="launcher",
                   env={"MEMPLAN_PROFILE_OUT": "/nonexistent/dir/p.json", "MEMPLAN_TRACE": "/nonexistent/t.json"})
    assert p.returncode == 0 and p.stdout == plain[0].stdout
    assert "profile not written" in p.stderr and "trace not written" in p.stderr


def test_exit_code_of_failing_script_is_kept(runner):
    import sys

    script = runner.tmp / "fail.py"
    script.write_text("import torch, sys\nx = torch.ones(2, requires_grad=True)\n(x * 2).sum().backward()\nsys.exit(7)\n")
    p = runner.run([], mode="launcher", script=script, check=False, env={"MEMPLAN_WARMUP": "zz"})
    assert p.returncode == 7
