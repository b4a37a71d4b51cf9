"""Replay: an unmodified training step fits MEMPLAN_BUDGET with losses and every gradient
bit-identical (torch.equal) to the run without memplan, for each model of the zoo."""
import json
import random
import re
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT, Runner, assert_same_dumps, load_profile, losses, nvtx_recorder, torchrun

ZOO = ["mlp", "gpt2", "cnn", "views", "tied", "lstm"]
BUDGETS = ["70%", "50%", "min"]
STEPS = 12  # 2 warm-up steps + 10 replayed optimizer steps
TOLERANCE = 0.05  # measured peak within 5% of the predicted peak


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    cache = {}

    def get(model, extra=()):
        key = (model, tuple(extra))
        if key not in cache:
            r = Runner(tmp_path_factory.mktemp(f"plain-{model}"))
            p = r.run(["--model", model, "--steps", STEPS, "--dump", "plain.pt", *extra])
            cache[key] = (p.stdout, r.tmp / "plain.pt")
        return cache[key]

    return get


def replay(runner, model, budget, extra=(), env=None):
    e = {"MEMPLAN_BUDGET": "1%" if budget == "min" else budget, "MEMPLAN_REPORT": "report.json",
         "MEMPLAN_WARMUP": 2}
    e.update(env or {})
    p = runner.run(["--model", model, "--steps", STEPS, "--dump", "agent.pt", *extra], mode="launcher", env=e)
    report = json.loads((runner.tmp / "report.json").read_text())
    return p, report


def identical_replay(runner, plain_runs, model, budget, extra=(), env=None):
    """replay(), checked against the plain run of the same script: the same stdout, and every loss
    and gradient torch.equal."""
    stdout, plain_dump = plain_runs(model, extra)
    p, report = replay(runner, model, budget, extra, env)
    assert p.stdout == stdout
    assert_same_dumps(plain_dump, runner.tmp / "agent.pt")
    return p, report


def identical_script_replay(runner, name, args, budget):
    """A test script of this directory (tests/integration/NAME, whose last argument is where it
    saves its losses, gradients and buffers), run plainly and under the launcher at `budget`:
    the same stdout, every dump torch.equal. Returns the launcher's process and its report."""
    script = ROOT / "tests" / "integration" / name
    plain = runner.run([*args, "plain.pt"], script=script)
    p = runner.run([*args, "agent.pt"], mode="launcher", script=script,
                   env={"MEMPLAN_BUDGET": budget, "MEMPLAN_REPORT": "report.json"})
    assert p.stdout == plain.stdout
    assert_same_dumps(runner.tmp / "plain.pt", runner.tmp / "agent.pt")
    return p, json.loads((runner.tmp / "report.json").read_text())


def measured_peaks(report):
    """Each replayed step's peak on the profile's baseline (the script may hold more outside)."""
    base = report["plan"]["baseline_bytes"]
    out = []
    for r in report["replay"]:
        out += [p - b + base for p, b in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
    return out


def assert_peaks_as_predicted(report, feasible=True):
    """Every replayed step within the budget (a feasible plan) or within 1% of the minimum (the
    minimum-memory plan, feasible=False), the worst within TOLERANCE of the predicted peak."""
    plan = report["plan"]
    assert plan["feasible"] == feasible
    limit = plan["budget_bytes"] if feasible else plan["min_feasible_bytes"] * 1.01
    worst = max(measured_peaks(report))
    assert worst <= limit, (worst, limit)
    error = worst / report["plan"]["predicted_peak_bytes"] - 1
    assert abs(error) <= TOLERANCE, error


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("model", ZOO)
def test_zoo_bit_identical_within_budget(runner, plain_runs, model, budget):
    stdout, plain_dump = plain_runs(model)
    p, report = replay(runner, model, budget)
    assert p.stdout == stdout and len(losses(stdout)) == STEPS
    assert_same_dumps(plain_dump, runner.tmp / "agent.pt")
    plan = report["plan"]
    if budget == "min":
        assert not plan["feasible"]
        assert "below the minimum feasible" in p.stderr
    if plan["feasible"]:
        limit = plan["budget_bytes"]  # planned 2% under it: no slack given here
    else:
        # Below the minimum the minimum-memory plan runs, with no margin left to aim under it:
        # its measured peak may exceed the predicted minimum by the simulator's error (< 1%).
        limit = plan["min_feasible_bytes"] * 1.01
    if report["phase"] == "done":  # a plan with no action: the step runs as it is
        assert report["replay"] == []
        assert abs(plan["predicted_peak_bytes"] / plan["unplanned_peak_bytes"] - 1) < 0.01
        return
    peaks = measured_peaks(report)
    assert len(peaks) >= STEPS - 2
    worst = max(peaks)
    error = worst / plan["predicted_peak_bytes"] - 1
    print(f"{model} {budget}: budget {plan['budget_bytes']} predicted {plan['predicted_peak_bytes']} "
          f"measured {worst} error {100 * error:+.2f}%")
    assert worst <= limit, (worst, limit)
    assert abs(error) <= TOLERANCE, error
    assert sum(r["divergences"] for r in report["replay"]) == 0
    # The replay re-runs no op the plan does not (nor its time, nor its transients): it re-ran
    # GPT-2's views of q and k where the plan named that of v (TensorRef::from).
    for r in report["replay"]:
        assert r["ops_rerun"] <= r["steps"] * plan["rerun_ops"], (r["ops_rerun"], r["steps"], plan["rerun_ops"])


def test_gpt2_budget_actually_lowers_the_peak(runner, plain_runs):
    stdout, plain_dump = plain_runs("gpt2")
    p, report = replay(runner, "gpt2", "50%")
    plan = report["plan"]
    act = plan["unplanned_peak_bytes"] - plan["baseline_bytes"]
    assert plan["feasible"]
    assert max(measured_peaks(report)) - plan["baseline_bytes"] <= 0.5 * act * 1.001
    assert sum(r["evicted"] for r in report["replay"]) > 0
    assert sum(r["on_demand"] for r in report["replay"]) == 0
    # The first replayed step is recorded whole (for the trace), the others light; each says how
    # long the agent's callbacks took in it.
    assert [r["light_steps"] for r in report["replay"]] == [r["steps"] - 1 for r in report["replay"]]
    assert all(len(r["callback_us"]) == r["steps"] and min(r["callback_us"]) > 0 for r in report["replay"])
    # ... and which step that was: every one after the warm-up (2 steps), in order.
    assert [s for r in report["replay"] for s in r["callback_steps"]] == list(range(2, STEPS))
    # Planned recomputes start from pre-hooks on their autograd Nodes (the node callbacks are off
    # in light steps): every one of them, in every step, since none was left to on-demand above.
    assert all(r["node_hooks"] > 0 and r["node_hooks"] % r["steps"] == 0 for r in report["replay"])
    # Ops that save nothing the plan evicts keep their saved tensors with autograd (no Python hook
    # call); the peak above shows the evicted ones still went through ours.
    assert all(r["ops_unhooked"] > r["ops_hooked"] > 0 for r in report["replay"])
    # On the CPU the plan keeps dropout masks compact (docs/compaction.md): every one is expanded
    # once, at its unpack, and none is refused; the gradients above stay identical.
    rs = report["replay"]
    assert sum(r["compacted"] for r in rs) > 0
    assert sum(r["expanded"] for r in rs) == sum(r["compacted"] for r in rs)
    assert sum(r["compact_refused"] for r in rs) == 0


def test_autocast_bit_identical_and_weight_cache_not_evicted(runner, plain_runs):
    """Forward under CPU bfloat16 autocast: bit-identical at 50%, and the parameters' bf16 copies
    that autocast caches (saved inside linear, held by the cache until the region ends) count as
    held outside autograd, so no plan evicts them expecting memory back during forward."""
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", ["--autocast"], env={"MEMPLAN_SUMMARY": "1"})
    held = [l for l in p.stderr.splitlines() if "also held outside autograd" in l]
    assert held and "of which 0 B also held" not in held[0], held
    assert sum(r["divergences"] for r in report["replay"]) == 0
    assert_peaks_as_predicted(report)


def test_script_allocating_between_steps_keeps_the_peak_as_predicted(runner, plain_runs):
    """The script logs every parameter (p.detach(): the next step begins there) and clones every
    gradient after opt.step with grad mode on, so the clones are in the next step and their inputs
    (last step's gradients, freed by zero_grad mid-step) existed before it. The replay must not keep such inputs alive: only ops a rebuild may re-run hold
    them (measured before: +16% over the predicted peak at 35% in such a loop)."""
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", ["--log-grads"])
    assert_peaks_as_predicted(report)


def test_optimizer_state_made_inside_a_profiled_step_is_no_activation(runner, plain_runs):
    """Parameter copies between backward and opt.step open the next step's window before the optimizer
    step, so the profiled step 1 holds Adam's first step, which makes its state (two tensors per
    parameter). That memory stays: it is counted with what the step began with, not as the
    step's activations (before: every later step measured 30% under the prediction at 35-50%, and
    torchvision resnet18 24% under at 50%, all of it the state)."""
    p, report = identical_replay(runner, plain_runs, "gpt2", "40%", ["--log-params-before-step"])
    assert_peaks_as_predicted(report)


def test_gpt2_dropout_rebuilt_from_its_compact_mask(runner, plain_runs):
    """At 35% the plan evicts dropout outputs and keeps their masks compact: after a first re-run
    checked bit for bit, each such dropout is rebuilt as input x mask, without the random draw."""
    p, report = identical_replay(runner, plain_runs, "gpt2", "35%")
    rs = report["replay"]
    assert sum(r["tail_reruns"] for r in rs) > 0
    assert sum(r["on_demand"] for r in rs) == 0
    assert "differs from re-running dropout" not in p.stderr
    assert max(measured_peaks(report)) <= report["plan"]["budget_bytes"]


# torchvision's own models, unmodified (examples/models.py TORCHVISION): squeeze-excitation with
# in-place Hardswish (MobileNetV3), a ViT with dropout in attention and MLP, and DenseNet in its
# memory-efficient mode, which wraps its own layers in torch.utils.checkpoint.
@pytest.mark.parametrize("model", ["tv-mobilenet", "tv-vit", "tv-densenet"])
def test_torchvision_models_bit_identical_within_budget(runner, plain_runs, model):
    pytest.importorskip("torchvision")
    p, report = identical_replay(runner, plain_runs, model, "50%", ["--batch", "8"])
    assert sum(r["evicted"] for r in report["replay"]) > 0
    assert len(measured_peaks(report)) >= STEPS - 2
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])


def test_a_value_held_for_a_later_recompute_is_read_by_it_not_re_run(runner, plain_runs):
    # tv-vit at its minimum: a recompute keeps the packed q/k/v projection (a view of one output
    # of its linear) for the next recompute, which rebuilt the projection's other views by
    # re-running the linear beside the hold: +4.3% over the predicted peak, 120 ops re-run per
    # step where the plan re-runs 73. The hold is now read through the storage it shares with the
    # views asked for.
    pytest.importorskip("torchvision")
    p, report = identical_replay(runner, plain_runs, "tv-vit", "min", ["--batch", "8"])
    plan = report["plan"]
    assert plan["feasible"] is False
    worst = max(measured_peaks(report))
    assert abs(worst / plan["predicted_peak_bytes"] - 1) <= 0.01, (worst, plan)
    for r in report["replay"]:
        assert 0 < r["ops_rerun"] <= r["steps"] * plan["rerun_ops"], (r["ops_rerun"], r["steps"], plan["rerun_ops"])


def test_in_place_activations_are_re_run_as_planned(runner, plain_runs):
    # tv-mobilenet: Hardswish in place on BatchNorm outputs. The profile names what each op writes
    # (Op::writes). A re-run of hardswish_ needs its BatchNorm re-run first (the tensor autograd
    # keeps holds the written values); a later reader reads the written tensor where it is. Plans
    # said otherwise, and the replay re-ran 140 ops a step where the plan re-ran 128 (BatchNorms
    # and convolutions the simulator never counted).
    pytest.importorskip("torchvision")
    env = {"MEMPLAN_PROFILE_OUT": "profile.json"}
    p, report = identical_replay(runner, plain_runs, "tv-mobilenet", "50%", ["--batch", "8"], env)
    ops = load_profile(runner.tmp / "profile.json")["forward"]
    hardswish = [op for op in ops if op["name"] == "aten::hardswish_"]
    assert hardswish and all(op.get("writes") == [op["inputs"][0]["value"]] for op in hardswish)
    bn = [op for op in ops if op["name"] == "aten::batch_norm"]
    assert bn and all(len(op.get("writes", [])) == 2 for op in bn)  # running mean and variance
    plan = report["plan"]
    for r in report["replay"]:
        assert 0 < r["ops_rerun"] <= r["steps"] * plan["rerun_ops"], (r["ops_rerun"], r["steps"], plan["rerun_ops"])
    assert_peaks_as_predicted(report, feasible=plan["feasible"])


# --user-hooks: the script's own saved_tensors_hooks must see every pack and unpack (its count is
# in stdout), also for ops whose saved tensors the agent leaves to autograd.
@pytest.mark.parametrize("extra", [["--torch-profiler"], ["--checkpoint"], ["--func"], ["--accum", "2"],
                                   ["--eval-every", "3"], ["--user-hooks"]])
def test_coexistence_with_a_budget(runner, plain_runs, extra):
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)


# Selective activation checkpointing (--sac: matrix products saved, the rest recomputed) looks
# for the user's saved-tensor hooks around its region. It found ours: a FutureWarning a plain run
# does not print, and with respect_saved_tensors_hooks=True the tensors it caches went through our
# pack hook (41 saved storages in the profile instead of 17), where its own check of a cached
# tensor modified in place (and allow_cache_entry_mutation) no longer applied. Its regions are
# left to it, as every checkpoint region: it does not see our hooks.
def test_selective_checkpoint_regions_are_left_to_it(runner, plain_runs):
    import inspect

    from torch.utils.checkpoint import checkpoint

    respect = "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters  # not in torch 2.13
    packs = {"respect": None}
    for sac in (["--sac"], ["--sac", "respect"])[:2 if respect else 1]:
        p, report = identical_replay(runner, plain_runs, "gpt2", "50%", sac, env={"MEMPLAN_PROFILE_OUT": "p.json"})
        assert "around a selective activation checkpoint region" not in p.stderr and "FutureWarning" not in p.stderr
        assert report["replay"] and report["replay"][0]["steps"] >= 8
        assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])
        packs[sac[-1]] = sum(len(op.get("packs", [])) for op in load_profile(runner.tmp / "p.json")["forward"])
    assert packs["--sac"] > 0 and packs["respect"] in (None, packs["--sac"])


# Other ways a script takes its gradients: clipped before the optimizer step, or computed by
# torch.autograd.grad and set into .grad by the script. Each backward still ends a step, as planned.
@pytest.mark.parametrize("extra", [["--clip-grad"], ["--autograd-grad"]])
def test_gradients_clipped_or_taken_by_autograd_grad_replay_as_planned(runner, plain_runs, extra):
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "keeps its graph" not in p.stderr
    assert report["replay"] and report["replay"][0]["steps"] >= 8 and report["replay"][0]["evicted"] > 0
    assert_peaks_as_predicted(report)


# Channels-last convolutions: each re-run gets its inputs in the layout the forward gave them,
# so it makes its output in the same layout, and the same bits.
# With --cnn-dropout: an element-wise dropout of channels-last feature maps, whose noise is
# channels-last too. Its re-run is input x compact mask (the tail), checked in memory order; it
# was refused as not contiguous, with a warning that input x mask "differs", and re-ran the
# dropout with its RNG state put back.
@pytest.mark.parametrize("extra", [[], ["--cnn-dropout"]])
def test_a_channels_last_cnn_replays_as_planned(runner, plain_runs, extra):
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", ["--channels-last", *extra])
    assert report["replay"] and report["replay"][0]["evicted"] > 0
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])  # below its minimum
    if extra:
        assert "differs from re-running dropout" not in p.stderr
        assert report["replay"][0]["tail_reruns"] > 0


# A backward that keeps its graph for another: two backwards through one graph (every saved
# tensor read twice, rebuilt ones too), or a gradient penalty (torch.autograd.grad with
# create_graph, then a backward through the forward and the penalty: a double backward). Each
# backward is a step of its own, so little or nothing is planned; one message says why. The
# profile says the graph was kept, so the simulator keeps what autograd saved, compact masks
# and rebuilt values too, to the step's end: every step within 1% of its plan's prediction
# (--backward-twice measured 8.7% under it before).
@pytest.mark.parametrize("extra", [["--backward-twice"], ["--grad-penalty"]])
def test_a_backward_that_keeps_its_graph_changes_no_result_and_says_why_little_is_planned(
        runner, plain_runs, extra):
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert p.stderr.count("keeps its graph for another one") == 1
    assert len(report["plans"]) == 2  # each backward ends a step: two kinds
    if extra == ["--backward-twice"]:  # the forward and the first backward: its minimum plan
        assert any(r["evicted"] > 0 for r in report["replay"])
    for r in report["replay"]:
        plan = report["plans"][r["plan"]]
        peaks = [a - b + plan["baseline_bytes"] for a, b in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
        assert abs(max(peaks) / plan["predicted_peak_bytes"] - 1) <= 0.01, (max(peaks), plan)


def test_gradient_accumulation_plans_for_the_micro_step_that_allocates_the_gradients(runner, plain_runs):
    # Two forward/backward passes per optimizer step: the first allocates every gradient, the
    # second adds into them; one kind of step. The plan came from the latest warm-up record (a
    # second micro-step), and every first micro-step passed its predicted peak by what the
    # gradients add where the CNN peaks, late in backward (+6.2%; the views model +11%, found by
    # tools/soak.py). The plan now counts the gradients the first micro-step allocates: every
    # step within 1% of it.
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", ["--accum", "2"])
    assert p.stderr.count("of gradients that step 1 of the same kind added into") == 1
    assert report["replay"] and report["replay"][0]["steps"] >= 8
    worst = max(measured_peaks(report))
    assert abs(worst / report["plan"]["predicted_peak_bytes"] - 1) <= 0.01, (worst, report["plan"])


@pytest.mark.parametrize("model", ["gpt2", "mlp"])
def test_gradients_zeroed_before_a_first_backward_are_counted_for_the_micro_steps_that_keep_them(
        runner, plain_runs, model):
    # --accum 2 --zero-grad-late: each first micro-step sets the gradients to None between its
    # forward and its backward and makes them again node by node; each second keeps them. Planned
    # from a first one (the latest of 3 warm-up records), every second passed its prediction by
    # the gradients not yet made again: GPT-2 at 50% +7.4% (4.7% over the budget), the MLP +15.6%.
    extra = ["--accum", "2", "--zero-grad-late"]
    p, report = identical_replay(runner, plain_runs, model, "50%", extra, {"MEMPLAN_WARMUP": 3})
    assert p.stderr.count("freed before it (zeroed between forward and backward)") == 1
    plan = report["plan"]
    peaks = measured_peaks(report)
    assert len(peaks) >= 2 * STEPS - 4
    assert max(peaks) <= plan["predicted_peak_bytes"] * 1.01, (max(peaks), plan)
    if plan["feasible"]:
        assert max(peaks) <= plan["budget_bytes"], (max(peaks), plan)


def plan_peaks(report, index):
    """The replayed steps of plan `index`, each on that plan's baseline, and the plan."""
    plan = next(p for p in report["plans"] if p["index"] == index)
    peaks = [p - b + plan["baseline_bytes"] for r in report["replay"] if r["plan"] == index
             for p, b in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
    return peaks, plan


@pytest.mark.parametrize("how", ["--log-grads", "--zero-grad-late"])
def test_gradients_only_the_first_step_allocated_are_planned_away(runner, plain_runs, how):
    # --log-grads reads every parameter with grad mode on after the optimizer step, so each
    # first micro-step begins with those ops: a kind of its own. The other kind (the second
    # micro-steps) shares its ops with the run's first step, which allocated the gradients, and
    # its plan counted them though none of its later steps allocates any: the CNN measured 4.2%
    # under the prediction, tv-regnet 16.6% (tools/soak.py), recomputing more than the budget
    # asks. --zero-grad-late: one kind, but the gradients are zeroed between forward and
    # backward, inside the step whose baseline held them: allocated again, they add nothing
    # (-7.5%). After two optimizer rounds of steps that allocate none, the kind is planned again
    # without them, and its steps meet that plan's prediction.
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", [how, "--accum", "2"])
    assert p.stderr.count("that kind is planned again without them") == 1
    again = [q for q in report["plans"] if q["replaces"] >= 0]
    assert len(again) == 1 and again[0]["in_use"]
    first = next(q for q in report["plans"] if q["index"] == again[0]["replaces"])
    assert first["kind"] == again[0]["kind"] and not first["in_use"]
    assert again[0]["predicted_peak_bytes"] < first["predicted_peak_bytes"]
    peaks, plan = plan_peaks(report, again[0]["index"])
    assert len(peaks) >= 6
    assert abs(max(peaks) / plan["predicted_peak_bytes"] - 1) <= 0.01, (peaks, plan)
    assert max(peaks) <= (plan["budget_bytes"] if plan["feasible"] else plan["min_feasible_bytes"] * 1.01)


@pytest.mark.parametrize("how", ["plain", "--zero-grad-late", "--grad-probe"])
def test_a_kind_that_allocates_its_gradients_again_goes_back_to_the_plan_that_counts_them(runner, plain_runs, how):
    # The logging stops after step 5: from there each first micro-step is of the other kind again,
    # and allocates the gradients that kind's later plan, made without them, does not count.
    # plain: a step that begins with a watched parameter's gradient unset replays the plan that
    # counts them, and so do the later ones: no step passes its prediction.
    # --zero-grad-late: the gradients are zeroed inside the step, between forward and backward:
    # its baseline held them, so they add nothing; the plan without them stays right.
    # --grad-probe: the watched leaf is one whose gradient the script never resets, so nothing
    # tells before the step ends: that one step passes the prediction by them, then the kind
    # goes back for good.
    extra = ["--log-grads-until", "5", "--accum", "2"] + ([how] if how != "plain" else [])
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", extra)
    assert p.stderr.count("that kind is planned again without them") == 1
    assert p.stderr.count("goes back to the plan that counts them") == (0 if how == "--zero-grad-late" else 1)
    assert p.stderr.count("will allocate the") == (1 if how == "plain" else 0)
    again = next(q for q in report["plans"] if q["replaces"] >= 0)
    peaks, plan = plan_peaks(report, again["index"])
    over = [x for x in peaks if x > plan["predicted_peak_bytes"] * 1.01]
    assert len(over) == (1 if how == "--grad-probe" else 0), (peaks, plan)
    assert abs(max(x for x in peaks if x not in over) / plan["predicted_peak_bytes"] - 1) <= 0.01, (peaks, plan)
    back, first = plan_peaks(report, again["replaces"])
    if how == "--zero-grad-late":
        assert again["in_use"] and len(peaks) >= 12
    else:
        assert not again["in_use"] and first["in_use"] and len(back) >= 8
        assert abs(max(back) / first["predicted_peak_bytes"] - 1) <= 0.01, (back, first)


def test_a_step_that_begins_without_gradients_replays_a_plan_made_from_one_that_did(runner, plain_runs):
    # --zero-grad-late: the gradients are zeroed between forward and backward, so each step begins
    # with them (they are in its baseline) and allocates them again in backward; the plan is made
    # from step 1, which began so. The backward of step 4 raises before any gradient is made, so
    # step 5 begins without them and allocates them above its baseline: it passed its prediction
    # by them (the CNN +8.2%; tv-regnet +17.9%, tools/soak.py). A step that begins with a watched
    # parameter's gradient unset now replays a plan made from step 0, which began so too.
    extra = ["--zero-grad-late", "--backward-raises-at", "4"]
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", extra)
    assert p.stderr.count("begins without gradients, unlike step 1") == 1
    variant = [q for q in report["plans"] if q["variant_of"] >= 0]
    assert len(variant) == 1 and not variant[0]["in_use"]
    peaks, plan = plan_peaks(report, variant[0]["index"])
    assert len(peaks) == 1 and abs(peaks[0] / plan["predicted_peak_bytes"] - 1) <= 0.01, (peaks, plan)
    rest, main = plan_peaks(report, variant[0]["variant_of"])
    assert main["in_use"] and len(rest) + len(peaks) == STEPS - 2
    assert max(rest) <= main["predicted_peak_bytes"] * 1.01, (rest, main)


def test_a_kind_first_recorded_in_a_later_micro_step_plans_its_first_micro_steps_with_their_gradients(
        runner, plain_runs):
    # --accum 2, one warm-up step: from step 4 the last block runs twice, a new kind of step,
    # profiled again in a later micro-step (the first diverged), whose gradients exist: its
    # backward adds into them. No step of that kind ever began without them, so each first
    # micro-step replayed a plan that never counted them and passed its prediction by them
    # (+12.3% at 26%, tools/soak.py seed 13). It now replays a plan made from the same record with
    # the gradients its backward added into kept.
    extra = ["--accum", "2", "--repeat-block-at", "4"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "26%", extra, env={"MEMPLAN_WARMUP": 1})
    assert p.stderr.count("and no recorded step of its kind began so") == 1
    variant = [q for q in report["plans"] if q["variant_of"] >= 0]
    assert len(variant) == 1
    for plan in report["plans"]:
        peaks, plan = plan_peaks(report, plan["index"])
        assert peaks and max(peaks) <= plan["predicted_peak_bytes"] * 1.01, (peaks, plan)
    peaks, _ = plan_peaks(report, variant[0]["index"])
    assert len(peaks) >= 4  # every first micro-step of the new kind


def test_inplace_error_unchanged_with_a_budget(runner):
    args = ["--model", "mlp", "--steps", "3", "--inplace-error"]
    plain = runner.run(args, check=False)
    agent = runner.run(args, mode="launcher", check=False, env={"MEMPLAN_BUDGET": "50%", "MEMPLAN_WARMUP": 1})
    assert plain.returncode != 0 and agent.returncode == plain.returncode
    err = lambda s: [l for l in s.splitlines() if "modified by an inplace operation" in l]
    assert err(plain.stderr) and err(agent.stderr) == err(plain.stderr)


def test_divergence_stops_evicting_and_reprofiles(runner, plain_runs):
    # From step 6 the forward runs its last block twice: the step starts as the profile did, then
    # runs other ops. That step diverges (evictions stop, what was evicted is rebuilt on demand), is
    # recorded, and the new kind gets its own plan.
    extra = ["--repeat-block-at", "6"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert sum(r["divergences"] for r in report["replay"]) == 1
    assert len(report["replay"]) == 2  # a new plan for the new op sequence after re-profiling
    assert "diverged" in p.stderr
    assert report["step_kinds"]["misses"] == 1


def gapped_peaks(report, index):
    """The steps that replayed plan `index` with some of its ops left out, on its baseline."""
    plan = next(p for p in report["plans"] if p["index"] == index)
    return [p - b + plan["baseline_bytes"] for r in report["replay"] if r["plan"] == index
            for p, b in zip(r["gapped_peak_bytes"], r["gapped_baseline_bytes"])]


@pytest.mark.parametrize("budget", BUDGETS)
def test_a_step_that_leaves_out_a_layer_replays_the_plan_of_the_ops_it_runs(runner, plain_runs, budget):
    # From step 6 the forward skips its last block: its ops are the profile's with a stretch left
    # out. Each such step replays the plan without the left-out ops' actions (it used to diverge
    # and stop evicting, then be profiled and planned as a new kind), within that plan's budget
    # (below the minimum: within its predicted peak, the minimum).
    extra = ["--skip-block-at", "6"]
    p, report = identical_replay(runner, plain_runs, "gpt2", budget, extra)
    assert "diverged" not in p.stderr and "left out forward ops" in p.stderr
    assert report["step_kinds"]["misses"] == 0
    assert len(report["plans"]) == 1 and len(report["replay"]) == 1
    r = report["replay"][0]
    assert r["divergences"] == 0 and r["gapped_steps"] == STEPS - 6 and r["evicted"] == r["rebuilt"], r
    peaks = gapped_peaks(report, report["plans"][0]["index"])
    plan = report["plan"]
    limit = plan["budget_bytes"] if plan["feasible"] else plan["predicted_peak_bytes"]
    assert len(peaks) == STEPS - 6 and max(peaks) <= limit, (peaks, limit)


def test_a_gapped_step_that_refused_evictions_is_a_kind_of_its_own(runner, plain_runs):
    # The warm-up steps make two detached copies of the embeddings (the first unused), the steps
    # from 4 on one: their ops are the plan's with a stretch left out, and the greedy match takes
    # their copy for the profile's unused one, which the plan made no recipe for. The evictions
    # of what is rebuilt from it are refused (those tensors kept), so the plan's budget does not
    # hold for such a step: it is not replayed as a gapped step of that plan but recorded,
    # planned as a kind of its own (never covered by the first plan), and the later steps replay
    # that plan with every eviction done, within its budget.
    extra = ["--side-copies-until", "4"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert p.stderr.count("could not evict what the plan evicts") == 1
    assert len(report["plans"]) == 2 and report["step_kinds"]["kinds"] == 2, report["step_kinds"]
    first, second = sorted(report["replay"], key=lambda r: r["plan"])
    assert first["gapped_steps"] == 1 and first["not_rebuildable"] > 0 and not first["gapped_peak_bytes"], first
    assert second["gapped_steps"] == 0 and second["not_rebuildable"] == 0 and second["divergences"] == 0, second
    assert second["evicted"] == second["rebuilt"] > 0 and second["steps"] >= 4, second
    own, plan = plan_peaks(report, second["plan"])
    assert len(own) == second["steps"] and max(own) <= plan["budget_bytes"], (own, plan["budget_bytes"])


def test_layerdrop_steps_replay_the_plan_of_the_deepest_step(runner, plain_runs):
    # Each step runs a pseudo-random number of the model's blocks (LayerDrop-like: 4, 1, 1, 1, 1,
    # 4, ...). The warm-up plans its last step (1 block); step 5 (4 blocks) diverges from that
    # plan, and the warm-up's 4-block record (step 0) is planned at once; its plan replaces the
    # 1-block one, and every later step replays it with the missing blocks' ops left out. This
    # used to make a new kind of step nearly every step, and give up after 4 wrong guesses in 16
    # steps ("memplan stops planning").
    extra = ["--steps", "24", "--depth-random"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "memplan stops planning" not in p.stderr
    assert report["step_kinds"]["misses"] <= 2, report["step_kinds"]
    deepest = max(report["plans"], key=lambda q: q["unplanned_peak_bytes"])
    peaks = gapped_peaks(report, deepest["index"])
    assert len(peaks) >= 5 and max(peaks) <= deepest["budget_bytes"], peaks
    own, _ = plan_peaks(report, deepest["index"])
    assert own and max(own) <= deepest["budget_bytes"], own
    # Once the deepest kind is planned (after step 5), every step replays its plan.
    assert len(own) + len(peaks) >= 24 - 8
    assert sum(len(plan_peaks(report, q["index"])[0]) + len(gapped_peaks(report, q["index"]))
               for q in report["plans"]) >= 24 - 12


def test_a_kind_whose_record_freed_more_before_backward_is_planned_again_with_that_kept(runner, plain_runs):
    # --accum 2 --zero-grad-late: the first micro-step of each round sets the gradients to None
    # between its forward and backward; --depth-random: a step runs 4 blocks or 1. The one-block
    # kind's record (step 2) followed a four-block step and so freed all four blocks' gradients
    # there; its plan took that as every one-block step's, and the later ones, freeing less, ran
    # their backward above the prediction (+15.5% and +8.9% in turn, tools/soak.py). The first
    # replayed step that freed less and peaked over the prediction has its kind planned again
    # with the difference kept through backward; that one step ran over, none after it.
    extra = ["--accum", "2", "--depth-random", "--zero-grad-late"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "min", extra, {"MEMPLAN_WARMUP": 3})
    assert p.stderr.count("planned again with that memory kept through backward") == 1
    remade = [q for q in report["plans"] if q["remade_from"] >= 0]
    assert len(remade) == 1 and remade[0]["in_use"]
    first_peaks, first = plan_peaks(report, remade[0]["remade_from"])
    assert first["kind"] == remade[0]["kind"] and not first["in_use"]
    assert len(first_peaks) == 1 and first_peaks[0] > first["predicted_peak_bytes"] * 1.02, (first_peaks, first)
    peaks, plan = plan_peaks(report, remade[0]["index"])
    assert len(peaks) >= 4
    # Steps that free the most there end under it (what their gradients take); none over.
    assert plan["predicted_peak_bytes"] * (1 - TOLERANCE) <= max(peaks) <= plan["predicted_peak_bytes"] * 1.01, \
        (peaks, plan)
    assert max(peaks) <= plan["min_feasible_bytes"] * 1.01


@pytest.mark.parametrize("model", ["cnn", "gpt2"])
def test_a_kind_whose_record_freed_less_before_backward_is_planned_again_with_that_freed(runner, plain_runs, model):
    # MEMPLAN_WARMUP=1 --zero-grad-late: the plan's record, the run's first step, had no gradients
    # to zero between forward and backward; each later step frees them there, and so ran its
    # backward under the prediction by them (the CNN -6.9%, GPT-2 at 50% -17.6%): more recomputed
    # than the budget asks. After three such steps in a row the kind is planned again with that
    # memory freed; its steps meet the new prediction.
    p, report = identical_replay(runner, plain_runs, model, "50%", ["--zero-grad-late"], {"MEMPLAN_WARMUP": 1})
    assert p.stderr.count("planned again with that memory freed through backward") == 1
    remade = [q for q in report["plans"] if q["remade_from"] >= 0]
    assert len(remade) == 1 and remade[0]["in_use"]
    first_peaks, first = plan_peaks(report, remade[0]["remade_from"])
    assert len(first_peaks) == 3 and max(first_peaks) < first["predicted_peak_bytes"] * 0.95, (first_peaks, first)
    peaks, plan = plan_peaks(report, remade[0]["index"])
    assert len(peaks) >= STEPS - 5
    assert abs(max(peaks) / plan["predicted_peak_bytes"] - 1) <= 0.01, (peaks, plan)
    assert plan["predicted_peak_bytes"] < first["predicted_peak_bytes"]
    assert max(peaks) <= (plan["budget_bytes"] if plan["feasible"] else plan["min_feasible_bytes"] * 1.01)


@pytest.mark.parametrize("attack,warmup", [("same", 3), ("same", 2), ("same", 1), ("shorter", 2), ("shorter", 1)])
def test_adversarial_training_keeps_to_the_plan_of_the_backward_that_makes_the_gradients(
        runner, plain_runs, attack, warmup):
    # FGSM adversarial training: each micro-step runs the attack (a forward, then the gradient of
    # the input alone, torch.autograd.grad: no parameter's AccumulateGrad runs) and then the step
    # on the perturbed input, two steps per iteration. 'same': the attack's forward runs the
    # step's ops, one kind; 'shorter': its loss is one op short, a kind the step's plan covers.
    # Before: planned from the attack's record (the warm-up's last, or with MEMPLAN_WARMUP=1 its
    # only one), the plan counted no parameter gradients and every training step ran over it
    # (+10.7%, +13.7%); with MEMPLAN_WARMUP=2 the leaf watched for gradients was the attack's
    # input, dead by the next step, which so counted as beginning with gradients: every later
    # step, beginning without, replayed a plan from the attack's record (+6.0%); 'shorter':
    # every attack step was a miss, and four gave up planning.
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", ["--adversarial", attack],
                                 {"MEMPLAN_WARMUP": warmup})
    assert "memplan stops planning" not in p.stderr
    assert report["step_kinds"]["misses"] <= 1, report["step_kinds"]
    remade = [q for q in report["plans"] if q["remade_from"] >= 0]
    # Only a run whose one record is the attack's learns of the gradients from a training step.
    assert len(remade) == (1 if (attack, warmup) == ("same", 1) else 0), report["plans"]
    # (With MEMPLAN_WARMUP=1 'shorter' the attack's kind was planned first; the step's plan
    # replaces it: the one all steps replay.)
    plan = max((q for q in report["plans"] if q["in_use"]), key=lambda q: len(plan_peaks(report, q["index"])[0]))
    peaks, plan = plan_peaks(report, plan["index"])
    attacks = gapped_peaks(report, plan["index"])
    if attack == "same":  # one kind: the attack's steps measured with the training steps'
        attacks = [b for b in peaks if b < max(peaks) * 0.95]
        peaks = [b for b in peaks if b >= max(peaks) * 0.95]
    assert len(peaks) >= STEPS - 3 and len(attacks) >= STEPS - 3, (peaks, attacks)
    assert abs(max(peaks) / plan["predicted_peak_bytes"] - 1) <= 0.01, (peaks, plan)
    assert max(attacks) < plan["predicted_peak_bytes"], (attacks, plan)


@pytest.mark.parametrize("batch", [4, 8])
def test_a_step_whose_backward_ran_more_nodes_than_its_record_has_its_kind_planned_again(
        runner, plain_runs, batch):
    # MEMPLAN_WARMUP=1 with adversarial training on the small CNN: the one record is the attack's
    # (the input's gradient alone). A training step's backward also makes every weight's gradient,
    # its temporaries 55 KB over the attack's peak: 7% of the plan's prediction at batch 4, 3.5% at
    # 8. Before, neither was planned again: under the old 64 KiB floor of a difference worth a new
    # plan, and at batch 8 the training step ended 39 KB under the attack's record, so "ended with
    # more" did not tell. Now the first training step, recorded whole, ran more backward nodes than
    # the record: its kind is planned again with what it made at each node.
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", ["--adversarial", "same", "--small",
                                                                   "--batch", str(batch)],
                                 {"MEMPLAN_WARMUP": 1})
    remade = [q for q in report["plans"] if q["remade_from"] >= 0]
    assert len(remade) == 1, report["plans"]
    assert "backward nodes" in p.stderr, p.stderr
    first = report["plans"][remade[0]["remade_from"]]
    trigger = [b - base + first["baseline_bytes"] for r in report["replay"] if r["plan"] == first["index"]
               for b, base in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
    assert len(trigger) == 1 and trigger[0] > first["predicted_peak_bytes"] * 1.02, (trigger, first)
    peaks, plan = plan_peaks(report, remade[0]["index"])
    attacks = [b for b in peaks if b < max(peaks) * 0.97]
    peaks = [b for b in peaks if b >= max(peaks) * 0.97]
    assert len(peaks) >= STEPS - 3 and len(attacks) >= STEPS - 3, (peaks, attacks)
    assert abs(max(peaks) / plan["predicted_peak_bytes"] - 1) <= 0.01, (peaks, plan)
    assert max(attacks) < plan["predicted_peak_bytes"], (attacks, plan)


def test_gradients_a_step_made_beyond_its_record_are_counted_where_its_backward_made_them(runner, plain_runs):
    # MEMPLAN_WARMUP=1 with adversarial training on the views model: the one record is the
    # attack's (the input's gradient alone); the first training step makes every parameter's
    # gradient, runs over, and its kind is planned again. Its gradients are made late in its
    # backward, where no eviction lowers anything: counted node by node, the new record's peak is
    # what that step measured, and no plan lowers it. Kept through the whole backward (before),
    # they made a plan of 4 evictions predicting 10% more than any step reached (they ran 9.3% under).
    p, report = identical_replay(runner, plain_runs, "views", "73%", ["--adversarial"], {"MEMPLAN_WARMUP": 1})
    remade = [q for q in report["plans"] if q["remade_from"] >= 0]
    assert len(remade) == 1, report["plans"]
    first, again = report["plans"][remade[0]["remade_from"]], remade[0]
    trigger = [b - base + first["baseline_bytes"] for r in report["replay"] if r["plan"] == first["index"]
               for b, base in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
    assert len(trigger) == 1, report["replay"]
    assert abs(again["predicted_peak_bytes"] / trigger[0] - 1) <= 0.01, (again, trigger)
    assert again["evictions"] == 0 and again["in_use"], again


def test_a_gan_replays_both_backwards_of_its_iteration_each_as_planned(runner, plain_runs):
    # A GAN's iteration (train.py --gan): the generator's forward; the model, as the discriminator,
    # on real and detached fake inputs, its backward and optimizer step; then the generator's loss
    # through the model on the same fakes, whose backward reads the generator's tensors saved in
    # the first window. Two kinds of step, each replaying its own (minimum-memory) plan; the
    # generator's gradients are in the dump too.
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", ["--gan"])
    assert report["step_kinds"] == {"kinds": 2, "misses": 0}, report["step_kinds"]
    in_use = [q for q in report["plans"] if q["in_use"]]
    assert len(in_use) == 2, report["plans"]
    for q in in_use:
        peaks, plan = plan_peaks(report, q["index"])
        assert plan["evictions"] > 0, plan
        assert len(peaks) >= STEPS - 3, peaks
        limit = plan["budget_bytes"] if plan["feasible"] else plan["min_feasible_bytes"] * 1.01
        assert max(peaks) <= limit, (peaks, plan)
        assert abs(max(peaks) / plan["predicted_peak_bytes"] - 1) <= TOLERANCE, (peaks, plan)


def test_independent_layerdrop_plans_a_recorded_deeper_step_when_a_step_diverges(runner, plain_runs):
    # Each of 6 blocks is skipped with probability 0.3 (fairseq's LayerDrop; steps that run the
    # same number of blocks run the same ops). The warm-up's last step ran 4 blocks, its first 5:
    # a 5-block step diverges from the 4-block plan, and the warm-up's 5-block record is planned
    # at once, its plan covering the smaller kinds. Waiting for two records of its own, every
    # such step was a miss, and memplan gave up at step 13 ("4 of the last 14 steps").
    extra = ["--steps", "24", "--layerdrop", "0.3", "--layers", "6", "--seed", "1"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "memplan stops planning" not in p.stderr
    assert p.stderr.count("that record is planned now") == 1
    assert report["step_kinds"]["misses"] <= 3, report["step_kinds"]
    for q in report["plans"]:
        peaks = gapped_peaks(report, q["index"])
        assert not peaks or max(peaks) <= q["budget_bytes"], (peaks, q["budget_bytes"])
    assert sum(len(gapped_peaks(report, q["index"])) for q in report["plans"]) >= 8


def test_a_sequence_length_change_is_a_new_kind_of_step_not_a_divergence(runner, plain_runs):
    # From step 6 the batches are shorter: the step's first op (the token embedding) already reads
    # the new shape, so no plan is tried on it. The new kind is recorded whole, planned, replayed.
    extra = ["--seq-change-at", "6"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert sum(r["divergences"] for r in report["replay"]) == 0
    assert report["step_kinds"] == {"kinds": 2, "misses": 0}
    assert len(report["replay"]) == 2 and all(r["steps"] > 0 for r in report["replay"])
    assert "diverged" not in p.stderr


def test_a_loss_over_masked_tokens_replays_one_plan_whatever_the_mask(runner, plain_runs):
    # The loss covers a random 15% of the positions, picked by a boolean mask each step: the ops
    # after `out[keep]` see another number of tokens every step. They used to make a new kind of
    # step each time (a divergence, a new profile), and after 9 kinds memplan gave up. Other
    # sizes after an op whose output shape depends on the data are now the same kind of step.
    extra = ["--masked-loss"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "stops planning" not in p.stderr and "diverged" not in p.stderr
    assert len(report["replay"]) == 1
    r = report["replay"][0]
    assert r["divergences"] == 0 and r["steps"] == STEPS - 2
    assert r["drifted"] >= r["steps"] - 1  # a step may draw as many tokens as the profile's
    assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["on_demand"] == 0
    assert report["step_kinds"]["misses"] == 0
    assert_peaks_as_predicted(report)


def test_a_masked_loss_above_the_peak_costs_nothing_after_the_warmup(runner, plain_runs):
    # A budget above the un-planned peak: a plan without actions, and no replayer to follow the
    # ops. Steps whose sizes differ after the mask are matched to its kind at their end (same
    # ops, dtypes and ranks), so the agent stops observing ops after the warm-up instead of
    # recording 8 "new" kinds and giving up with a warning.
    extra = ["--masked-loss"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "200%", extra)
    assert "stops planning" not in p.stderr and "other ops than" not in p.stderr
    assert report["phase"] == "done" and report["replay"] == []
    assert report["step_kinds"]["misses"] == 0 and report["step_kinds"]["kinds"] <= 2


def test_layers_after_a_data_dependent_row_count_are_evicted_as_planned(runner, plain_runs):
    # After the first layer the MLP keeps the rows a random mask picks: three of its four layers
    # see another number of rows every step. Their saved tensors are evicted and rebuilt as
    # planned. (Mapped to the plan by size, they were not, while the plan's rebuilds still ran:
    # a mixture of experts at 50% measured 51% over its predicted peak.)
    extra = ["--drop-rows", "--batch", "32"]
    p, report = identical_replay(runner, plain_runs, "mlp", "50%", extra)
    assert len(report["replay"]) == 1
    r = report["replay"][0]
    assert r["divergences"] == 0 and r["steps"] == STEPS - 2 and r["drifted"] >= r["steps"] - 1
    assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["on_demand"] == 0
    assert r["evicted"] % r["steps"] == 0  # every planned eviction, every step
    plan = report["plan"]
    peaks = measured_peaks(report)
    # The row count moves the peak a little (about 2% at 80% of 512 rows), around the prediction.
    assert all(abs(pk / plan["predicted_peak_bytes"] - 1) <= TOLERANCE for pk in peaks), peaks
    assert max(peaks) < plan["unplanned_peak_bytes"]


def test_a_step_larger_than_its_record_after_a_data_dependent_shape_has_its_kind_planned_with_room(
        runner, plain_runs):
    # The MLP keeps a random 80% of its 8 rows after the first layer. The plan's record (step 1)
    # kept fewer rows than later steps, which keep more in every later activation. Near the
    # budget, at 87%, they ran over it (+5.2% of the activation memory over the prediction;
    # tools/soak.py seed 43). The first step over it has its kind planned again that much under
    # the budget (its headroom, counted in the new prediction): that step ran over, the new
    # plan's steps keep to their prediction.
    extra = ["--small", "--drop-rows", "--release-params", "--batch", "8"]
    p, report = identical_replay(runner, plain_runs, "mlp", "87%", extra)
    assert p.stderr.count("ran its kind's ops with larger sizes") == 1, p.stderr
    remade = [q for q in report["plans"] if q["remade_from"] >= 0]
    assert len(remade) == 1 and remade[0]["in_use"] and remade[0]["headroom_bytes"] > 0, report["plans"]
    first_peaks, first = plan_peaks(report, remade[0]["remade_from"])
    assert first["headroom_bytes"] == 0
    assert len(first_peaks) >= 1 and first_peaks[-1] > first["budget_bytes"], (first_peaks, first)
    assert max(first_peaks[:-1], default=0) <= first["budget_bytes"]
    peaks, plan = plan_peaks(report, remade[0]["index"])
    assert len(peaks) >= 5
    assert max(peaks) <= plan["predicted_peak_bytes"] * 1.01, (peaks, plan)
    if plan["feasible"]:
        assert max(peaks) <= plan["budget_bytes"]
    else:
        # The budget less the headroom is under the minimum at the record's sizes: the least memory
        # any plan keeps, with room for the larger sizes.
        assert plan["predicted_peak_bytes"] <= (plan["min_feasible_bytes"] + plan["headroom_bytes"]) * 1.001


def test_steps_of_data_dependent_sizes_close_to_the_budget_stay_watched_under_a_plan_without_actions(
        runner, plain_runs):
    # At 106% the plan has no actions, and there is no replayer to follow its steps. The agent used
    # to stop observing ops after the warm-up, and step 26, which kept more rows than any before it,
    # ran 49 KiB over the budget unseen. The steps' peaks span about 5% of the activation memory, and
    # the budget is only 6% above the highest: the steps stay watched (Agent::sizes_settled), and
    # the one over the budget has its kind planned with room (check_sizes).
    extra = ["--small", "--drop-rows", "--release-params", "--batch", "8", "--steps", "30"]
    p, report = identical_replay(runner, plain_runs, "mlp", "106%", extra)
    first = report["plans"][0]
    assert not first["actions"] and first["headroom_bytes"] == 0, report["plans"]
    assert p.stderr.count("ran its kind's ops with larger sizes") == 1, p.stderr
    assert "step 26 ran" in p.stderr, p.stderr
    remade = [q for q in report["plans"] if q["remade_from"] >= 0]
    assert len(remade) == 1 and remade[0]["in_use"] and remade[0]["headroom_bytes"] > 0, report["plans"]
    seen = report["data_dependent_sizes"][first["kind"]]
    assert seen["steps"] >= 25 and seen["low_bytes"] < seen["high_bytes"], seen


def test_steps_of_data_dependent_sizes_far_under_the_budget_are_no_longer_watched(runner, plain_runs):
    # The same model at 200%: far above the peaks its steps reach, next to how far apart those lie.
    # After a few steps the agent stops observing ops (no cost from there).
    extra = ["--small", "--drop-rows", "--release-params", "--batch", "8", "--steps", "30"]
    p, report = identical_replay(runner, plain_runs, "mlp", "200%", extra)
    assert report["phase"] == "done" and report["replay"] == []
    assert "larger sizes" not in p.stderr
    seen = next(iter(report["data_dependent_sizes"].values()))
    assert 4 <= seen["steps"] <= 12, seen


@pytest.mark.parametrize("warmup", [2, 1])
def test_an_optimizer_step_in_backward_needs_no_copy_of_the_parameters(runner, plain_runs, warmup):
    # PyTorch's optimizer-in-backward recipe: each parameter is updated from its
    # post-accumulate-grad hook while backward still runs. The profile sees the parameters written
    # in backward; but every re-run reads a parameter before its gradient is complete, so before
    # its update, and nothing is copied: the peaks stay as predicted.
    # With one warm-up step the profiled step is the first, whose backward makes Adam's state one
    # parameter at a time. That state is baseline (every later step starts with it), so the ops
    # recorded before each piece of it are counted as if it were there: before, they were not,
    # the profile's activations came out half of a later step's, and the replay measured +44%
    # over the prediction (found by tools/soak.py).
    extra = ["--optimizer-in-backward"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra, env={"MEMPLAN_WARMUP": warmup})
    assert report["replay"]
    for r in report["replay"]:
        assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["snapshots"] == 0, r
    assert_peaks_as_predicted(report)


def test_a_parameter_updated_in_backward_before_a_re_run_reads_it_is_copied_first(runner, plain_runs):
    # The same, with a side branch that reads the first layer's weight without grad and feeds
    # that layer's input: its tanh output is first needed after that weight's update. A plan that
    # rebuilds it there (forced here: the planner, which counts the copy, prefers rebuilding it
    # earlier, with another value) used to raise in backward ("an input of a recomputed op was
    # written in place after its value was evicted") and the script died. The profile now says
    # before which backward node the weight was written, and the replay copies it when the recipe
    # that rebuild re-runs captures it.
    extra = ["--optimizer-in-backward", "--detached-side"]
    replay(runner, "mlp", "min", extra, env={"MEMPLAN_PLAN_CACHE": "cache"})
    prof = json.loads((runner.tmp / "memplan-profile.json").read_text())
    tanh = next(i for i, op in enumerate(prof["forward"]) if op["name"] == "aten::tanh")
    v = prof["forward"][tanh]["outputs"][0]["value"]
    weight = prof["forward"][0]["inputs"][0]["value"]  # aten::detach's
    assert prof["values"][weight]["kind"] == "parameter" and prof["values"][weight]["written"]
    first_use = min(prof["values"][v]["unpacked_by"])
    assert 0 <= prof["values"][weight]["written_before_node"] <= first_use
    (cached,) = (runner.tmp / "cache").glob("plan-*.json")
    plan = json.loads(cached.read_text())
    plan.update(evictions=[{"value": v, "after_fwd": max(prof["values"][v]["consumers"])}],
                recomputes=[{"before_bwd": first_use, "ops": list(range(tanh + 1)), "keep": [v]}],
                holds=[], releases=[], compactions=[])
    (runner.tmp / "late.json").write_text(json.dumps(plan))
    p, report = identical_replay(runner, plain_runs, "mlp", "min", extra, env={"MEMPLAN_PLAN": "late.json"})
    assert "fails the simulator" not in p.stderr
    assert report["replay"]
    for r in report["replay"]:
        # Its two saved handles (tanh's output, the projection's input), once a step; one copy.
        assert r["evicted"] == r["rebuilt"] == 2 * r["steps"] and r["on_demand"] == 0, r
        assert r["snapshots"] == r["steps"], r
    assert "written in place after its value was evicted" not in p.stderr
    # The copy is in the prediction.
    error = max(measured_peaks(report)) / report["plan"]["predicted_peak_bytes"] - 1
    assert abs(error) <= TOLERANCE, (error, p.stderr)


def test_a_parameter_released_after_the_forward_is_copied_for_a_re_run_before_its_restore(runner, plain_runs):
    # FSDP2 frees a block's unsharded parameters after its forward (the storage resized to 0) and
    # gathers them again just before that block's backward, keeping their version. A re-run
    # before then, of an op reading such a parameter, read an empty storage ("out of bounds for
    # storage of size 0"): the planned recompute failed, so did the rebuild at unpack, and the
    # rank died (test_fsdp2_two_ranks, now and then, with a plan made from a slower profile).
    # Here by hand: the MLP's first weight is released after its layer's forward and restored
    # when its output's gradient arrives; the plan (forced) rebuilds the first ReLU's output, by
    # re-running the first layer, before the ReLU's backward, so before the restore. The profile
    # sees the released storage at the backward's first node, and the replay copies the weight
    # when the recipe captures it.
    extra = ["--release-params"]
    replay(runner, "mlp", "min", extra, env={"MEMPLAN_PLAN_CACHE": "cache"})
    prof = json.loads((runner.tmp / "memplan-profile.json").read_text())
    assert prof["forward"][0]["name"] == "aten::linear"
    weight = prof["forward"][0]["inputs"][1]["value"]
    assert prof["values"][weight]["kind"] == "parameter" and prof["values"][weight]["written"]
    assert prof["values"][weight]["written_before_node"] == 0
    relu = next(i for i, op in enumerate(prof["forward"]) if op["name"] == "aten::relu")
    v = prof["forward"][relu]["outputs"][0]["value"]
    first_use = min(prof["values"][v]["unpacked_by"])
    (cached,) = (runner.tmp / "cache").glob("plan-*.json")
    plan = json.loads(cached.read_text())
    plan.update(evictions=[{"value": v, "after_fwd": max(prof["values"][v]["consumers"])}],
                recomputes=[{"before_bwd": first_use, "ops": [0, relu], "keep": [v]}],
                holds=[], releases=[], compactions=[])
    (runner.tmp / "early.json").write_text(json.dumps(plan))
    p, report = identical_replay(runner, plain_runs, "mlp", "min", extra, env={"MEMPLAN_PLAN": "early.json"})
    assert "planned recompute failed" not in p.stderr and "could not" not in p.stderr
    assert report["replay"]
    for r in report["replay"]:
        assert r["evicted"] == r["rebuilt"] and r["evicted"] >= r["steps"] and r["on_demand"] == 0, r
        assert r["snapshots"] == r["steps"], r  # the weight, once a step


def test_alternating_kinds_of_step_each_replay_their_own_plan(runner, plain_runs):
    # Two forward/backward passes per optimizer step, of different sequence lengths: two kinds of
    # step that alternate (as a GAN's discriminator and generator steps, or two losses with a
    # backward each). Each kind is profiled and planned once; then every step replays its own
    # kind's plan, predicted from the ones before it. (This used to diverge at every step and
    # re-profile and re-plan without end: about a second of planning every other step.)
    extra = ["--accum", "2", "--seq-cycle", "64,32"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    kinds = report["step_kinds"]
    # Two: the script's setup ops before the first step's forward (they read nothing that
    # requires grad) are not part of that step, which used to make it a third kind.
    assert kinds["kinds"] == 2
    assert kinds["misses"] <= 1  # right after the warm-up, before the second kind has a plan
    # The shorter kind shares its ops with the run's first step (a longer one), which allocated
    # every gradient: its plan counts them, though its steps (second micro-steps) never allocate
    # any. Where that plan peaks depends on the op times it was made from: when its steps peak
    # under the prediction, that kind is planned again without them (check_gradient_credit).
    made = [q for q in report["plans"] if q["replaces"] < 0]
    assert len(made) == 2 and len(report["plans"]) - len(made) <= 1
    assert len(report["replay"]) == len(report["plans"])
    assert p.stderr.count("planning took") == len(report["plans"])
    plans = {q["index"]: q for q in report["plans"]}
    per_kind = {}
    for r in report["replay"]:
        plan = plans[r["plan"]]
        assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["on_demand"] <= r["evicted"] // r["steps"]
        peaks = [pk - b for pk, b in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
        per_kind[r["kind"]] = per_kind.get(r["kind"], 0) + len(peaks)
        assert max(peaks) + plan["baseline_bytes"] <= plan["budget_bytes"]
    assert len(per_kind) == 2 and min(per_kind.values()) >= STEPS - 4
    assert sum(r["steps"] for r in report["replay"]) >= 2 * STEPS - 5


def test_kinds_alike_at_their_first_op_are_told_apart_by_their_ops(runner, plain_runs):
    # Three sequence lengths in random order, and a model that slices its position table first
    # (`pos.weight[:t]`, as ViT's `pos_embed[:, :n]`): every kind of step starts with the same op,
    # so the first op cannot choose the plan and the history cannot predict it. The step follows
    # every candidate kind until an op tells them apart (here the second, the token embedding),
    # before any of them acts. This used to guess wrong on most steps, and give up after four:
    # "4 of the last 10 steps ran other ops than predicted ... memplan stops planning".
    extra = ["--steps", "24", "--seq-random", "64,48,32", "--pos-first"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "memplan stops planning" not in p.stderr
    kinds = report["step_kinds"]
    assert kinds["kinds"] == 3 and len(report["plans"]) == 3
    # A kind's first step after another kind already has a plan is predicted as that one, and
    # diverges (it has no plan to be told apart by yet); every later step replays its own plan.
    assert kinds["misses"] <= 2, kinds
    assert sum(r["steps"] for r in report["replay"]) >= 24 - 8
    for plan, r in zip(report["plans"], report["replay"]):
        assert r["evicted"] > 0 and r["on_demand"] == 0, r
        peaks = [pk - b for pk, b in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
        assert peaks and max(peaks) + plan["baseline_bytes"] <= plan["budget_bytes"]


def test_alternating_kinds_above_the_peak_take_no_action(runner, plain_runs):
    extra = ["--accum", "2", "--seq-cycle", "64,32"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "200%", extra)
    assert report["phase"] == "done" and report["replay"] == [] and len(report["plans"]) == 2


def test_a_new_sequence_length_every_step_replays_the_plan_of_a_longer_one(runner, plain_runs):
    # A new sequence length every step (as padding each batch to its longest sequence does). The
    # first four kinds are profiled as usual; from then on a length longer than every planned one
    # is profiled and planned at once, and any other length with no plan of its own replays the
    # plan of the shortest longer length of the same ops (matched by structure, mapped by
    # position, rebuilt from its own calls), under that plan's budget. This used to make a new
    # kind every step and give up after nine: "memplan stops planning and runs plain PyTorch".
    extra = ["--steps", "24", "--seq-cycle", "8,12,16,20,24,28,32,36,40,44"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "memplan stops planning" not in p.stderr
    assert p.stderr.count("replays the plan of the smallest larger step of the same ops") == 1
    kinds = report["step_kinds"]
    assert kinds["misses"] == 0, kinds
    # 8 and 12 in the warm-up (12 planned), 16 and 20 recorded once each, 24-44 planned at once.
    assert len(report["plans"]) == 7, kinds
    family = sum(r["family_steps"] for r in report["replay"])
    assert family >= 6, [r["family_steps"] for r in report["replay"]]
    for plan, r in zip(report["plans"], report["replay"]):
        assert r["divergences"] == 0 and r["on_demand"] == 0, r
        assert len(r["family_peak_bytes"]) == r["family_steps"]
        base = plan["baseline_bytes"]
        own = [pk - b + base for pk, b in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
        smaller = [pk - b + base for pk, b in zip(r["family_peak_bytes"], r["family_baseline_bytes"])]
        assert own, r  # each plan's own length came again
        assert abs(max(own) / plan["predicted_peak_bytes"] - 1) <= TOLERANCE
        # A shorter length replaying a longer one's plan peaks below that longer one.
        assert all(pk <= max(own) for pk in smaller), (smaller, own)


def test_a_new_length_told_apart_only_after_the_first_op_replays_a_longer_plan(runner, plain_runs):
    # The same lengths, but the model slices its position table first, so every step starts with
    # the same op (as a step whose window opens at the last step's `loss.detach()` does). The
    # length shows at the second op: there a step with no plan of its own takes the plan of the
    # shortest longer planned length (matched by structure from there on); one longer than every
    # planned length replays the longest plan (its peak may pass that budget), and the next step
    # is recorded whole and planned. This used to miss at every new length and give up.
    extra = ["--steps", "24", "--seq-cycle", "8,12,16,20,24,28,32,36,40,44", "--pos-first"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "memplan stops planning" not in p.stderr
    kinds = report["step_kinds"]
    assert kinds["misses"] <= 1, kinds  # a new length before kOwnPlans kinds: a divergence
    assert sum(r["family_steps"] for r in report["replay"]) >= 6
    assert len(report["plans"]) >= 5
    for r in report["replay"]:
        assert r["on_demand"] == 0 and len(r["family_peak_bytes"]) == r["family_steps"], r


def test_a_step_that_keeps_changing_falls_back_to_plain_pytorch(runner, plain_runs):
    # A new sequence length every step, and a random number of blocks (LayerDrop-like): steps
    # alike at their start that run other ops each time, in no pattern. One message, then plain
    # PyTorch (the op callbacks removed), every result unchanged.
    extra = ["--steps", "24", "--seq-cycle", "8,12,16,20,24,28,32,36,40,44", "--depth-random"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert p.stderr.count("memplan stops planning and runs plain PyTorch from here") == 1
    assert "ran other ops than predicted" in p.stderr
    assert report["phase"] == "done"


@pytest.mark.parametrize("when", ["early", "late", "data", "backward"])
def test_a_buffer_written_in_the_forward_is_never_read_new_by_a_recompute(runner, plain_runs, when):
    # The model adds a buffer to its embeddings, then updates the buffer in place in the same
    # step: under no_grad right after the add (early), after the blocks (late), through .data
    # with grad mode on after the blocks (data; the buffer's version does not move), or from a
    # hook in backward, where no write is seen (backward: the profile says it was written, and a
    # recipe copies it when it captures it).
    # Autograd saves nothing of it, so plain PyTorch is fine; a recompute of the add would read the
    # updated buffer and differ (early: other losses from the first replayed step; late: the
    # rebuild raised in backward and killed the script, and so did backward; data: other
    # gradients when the copy was taken but not read, the version being unchanged). The write is
    # seen before it lands and the buffer copied first (or copied when captured), so every value
    # is evicted as planned from the first replayed step.
    # At the minimum budget: its plan re-runs the add every time (at 50% some plans, which vary
    # with the measured times, do not, and a broken copy went unnoticed).
    extra = ["--shift-buffer", when]
    p, report = identical_replay(runner, plain_runs, "gpt2", "min", extra)
    assert "written in place during the step" not in p.stderr
    for r in report["replay"]:
        assert r["evicted"] > 0 and r["not_rebuildable"] == 0 and r["rebuilt"] == r["evicted"], r
    assert_peaks_as_predicted(report, feasible=False)


@pytest.mark.parametrize("extra", [["--sdpa"], ["--noisy-op"]], ids=["sdpa", "custom-op"])
def test_random_ops_without_a_generator_argument_are_rebuilt_with_their_random_numbers(runner, plain_runs, extra):
    # Both draw from the default generator with nothing in their schema to say so: fused attention
    # with dropout_p (known by its dropout argument; rebuilt without its RNG state it gave other
    # gradients from the first replayed step, a TransformerEncoder at 50%), and a user's
    # torch.library op calling rand_like (seen drawing while profiled, RngWatch; at 30% the plan
    # re-runs it, and without its RNG state the losses differed from the first replayed step).
    budget = "30%" if extra == ["--noisy-op"] else "50%"
    p, report = identical_replay(runner, plain_runs, "gpt2", budget, extra)
    r = report["replay"][0]
    assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["ops_rerun"] > 0, r


def test_an_external_written_by_a_recorded_op_is_rebuilt_from_its_snapshot(runner, plain_runs):
    # StochasticDepth's noise: made by `empty` (an external to the step's ops), then written in
    # place by bernoulli_ and div_. A rebuild re-runs them from a copy of the noise taken before
    # the write, so nothing downstream has to be kept (EfficientNet-B0 at 50%: 570 values were).
    extra = ["--stochastic-depth"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "written in place during the step" not in p.stderr
    r = report["replay"][0]
    assert r["evicted"] > 0 and r["not_rebuildable"] == 0 and r["rebuilt"] == r["evicted"]


def test_inplace_activations_are_rebuilt_on_a_scratch_copy_that_is_no_leaf(runner, plain_runs):
    # conv -> BatchNorm -> hardswish_ (MobileNetV3's block). A rebuild re-runs hardswish_ on a
    # scratch copy of the BatchNorm output; that copy required grad and was a leaf, and an in-place
    # op on such a leaf is an error: backward raised and the script died (MobileNetV3 at 50%).
    # Made inside backward (grad mode off), the copy must still record, or hardswish_ saves nothing.
    extra = ["--hardswish"]
    p, report = identical_replay(runner, plain_runs, "cnn", "50%", extra)
    r = report["replay"][0]
    assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["on_demand"] == 0
    assert "recompute failed" not in p.stderr and "could not restore" not in p.stderr


@pytest.mark.parametrize("layout", [[], ["--channels-last"]])
def test_an_in_place_re_run_writes_the_rebuilds_own_tensor_without_a_copy(runner, plain_runs, layout):
    # The same block, rebuilt whole before hardswish_'s backward (a plan forced by hand, as
    # the minimum-memory plan may make it): the re-run of hardswish_ writes the BatchNorm output
    # the same rebuild just made. That tensor was copied first, as a live one must be, and the
    # copy was memory the simulator does not count: +10.7% over the predicted peak at the CNN's
    # minimum (found by tools/soak.py). Nothing else holds it, so it is now written in place,
    # in any dense layout: channels-last was still copied (+12.1%, soak seed 16).
    extra = ["--hardswish"] + layout
    replay(runner, "cnn", "min", extra, env={"MEMPLAN_PLAN_CACHE": "cache"})
    prof = json.loads((runner.tmp / "memplan-profile.json").read_text())
    fwd, values = prof["forward"], prof["values"]
    act = max(i for i, op in enumerate(fwd) if op["name"] == "aten::hardswish_")  # its conv reads a pool
    bn, conv = act - 1, act - 3
    assert (fwd[bn]["name"], fwd[conv]["name"]) == ("aten::batch_norm", "aten::conv2d")
    bn_out = fwd[bn]["outputs"][0]["value"]
    block = [v for v, val in enumerate(values)
             if val["producer"] in (conv, bn, act) and val["unpacked_by"] and v != bn_out]
    first_use = min(min(values[v]["unpacked_by"]) for v in block)
    (cached,) = (runner.tmp / "cache").glob("plan-*.json")
    plan = json.loads(cached.read_text())
    plan.update(evictions=[{"value": v, "after_fwd": act} for v in block],
                recomputes=[{"before_bwd": first_use, "ops": [conv, bn, act], "keep": block}],
                holds=[], releases=[], compactions=[])
    (runner.tmp / "block.json").write_text(json.dumps(plan))
    p, report = identical_replay(runner, plain_runs, "cnn", "min", extra,
                                 env={"MEMPLAN_PLAN": "block.json", "MEMPLAN_LOG": "debug"})
    assert "fails the simulator" not in p.stderr
    for r in report["replay"]:
        assert r["evicted"] == r["rebuilt"] == len(block) * r["steps"] and r["on_demand"] == 0, r
    # The plan file's predicted peak is the cached plan's: the simulator's for this plan, against
    # a replayed step's record (MEMPLAN_LOG=debug writes them), comes from memplan-plan.
    replayed = sorted(runner.tmp.glob("memplan-profile.json.replay*.json"))
    assert replayed
    out = subprocess.run([str(BUILD / "memplan-plan"), str(runner.tmp / "memplan-profile.json"), "--plan",
                          str(runner.tmp / "block.json"), "--against", str(replayed[-1])],
                         capture_output=True, text=True, check=True).stdout
    error = float(re.search(r"\(([-+]\d+\.\d)%\)", out.splitlines()[0]).group(1))
    assert abs(error) <= 1.0, out
    # The copy did not always make the step's peak, but it always made the rebuild's.
    excess = int(re.search(r"largest excess over the predicted peak of an op or node: (-?\d+) B", out).group(1))
    assert excess < 64 * 1024, out


def test_a_custom_autograd_function_is_never_re_run_and_the_peak_is_as_predicted(runner, plain_runs):
    # GELU as the script's own torch.autograd.Function: one op memplan cannot call again (no
    # dispatcher operator). Plans counted on re-running it (or on its result being an input from
    # before the step, alive throughout); the replay kept those tensors instead, and the measured
    # peak passed the predicted one (+6-16%) and the budget. Now what only it could rebuild stays,
    # said once, what reads its saved result in place is still evicted, and the planned rebuilds
    # before its backward node run there (the node is found from the next op's inputs).
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", ["--custom-gelu"])
    assert_peaks_as_predicted(report)
    rs = report["replay"]
    assert sum(r["evicted"] for r in rs) > 0
    assert sum(r["not_rebuildable"] for r in rs) == 0 and sum(r["on_demand"] for r in rs) == 0
    assert p.stderr.count("cannot be evicted") == 1 and "TanhGelu" in p.stderr
    assert "not found in the graph" not in p.stderr


def test_a_recompute_before_the_node_of_a_write_through_a_view_runs_there(runner, plain_runs):
    # EfficientNet's classifier: dropout in place on the flattened features. Autograd puts the
    # dropout's node (MulBackward0, which unpacks the noise) inside a CopySlices of the view's
    # base, and the view's grad_fn, made again when asked for, is numbered after the op: the
    # recompute planned before that node found no node to hang on, was left to on-demand
    # rebuilds, and each rebuild re-ran its own chain (tv-efficientnet at 62%: 84 on demand in 7
    # steps, 1827 ops re-run where the plan re-runs 1596). Forced here: a plan that evicts the
    # noise and rebuilds it before that node.
    extra = ["--head-dropout"]
    replay(runner, "cnn", "70%", extra, env={"MEMPLAN_PLAN_CACHE": "cache"})
    prof = json.loads((runner.tmp / "memplan-profile.json").read_text())
    fwd, bwd, values = prof["forward"], prof["backward"], prof["values"]
    (drop,) = [i for i, op in enumerate(fwd) if op["name"] == "aten::dropout_"]
    (noise,) = [v for v, val in enumerate(values) if val["producer"] == drop and val["saved_by"] == [drop]]
    (node,) = values[noise]["unpacked_by"]
    assert bwd[node]["name"] == "MulBackward0" and bwd[node - 1]["name"] == "torch::autograd::CopySlices"
    # The dropout writes its input: its re-run starts again from the pooling that made it.
    (pool,) = [i for i, op in enumerate(fwd) if op["name"] == "aten::max_pool2d" and i > drop - 3]
    (cached,) = (runner.tmp / "cache").glob("plan-*.json")
    plan = json.loads(cached.read_text())
    plan.update(evictions=[{"value": noise, "after_fwd": drop}],
                recomputes=[{"before_bwd": node, "ops": list(range(pool, drop + 1)), "keep": [noise]}],
                holds=[], releases=[], compactions=[])
    (runner.tmp / "write.json").write_text(json.dumps(plan))
    p, report = identical_replay(runner, plain_runs, "cnn", "70%", extra, env={"MEMPLAN_PLAN": "write.json"})
    assert "not found in the graph" not in p.stderr
    for r in report["replay"]:
        assert r["evicted"] == r["rebuilt"] == r["steps"] > 0 and r["on_demand"] == 0, r
        assert r["node_hooks"] == r["steps"] and r["ops_rerun"] == r["steps"] * (drop + 1 - pool), r


def test_a_nondeterministic_kernel_is_re_run_only_under_deterministic_algorithms(runner, plain_runs):
    # Each block starts with an identity through index_copy, which PyTorch lists as
    # nondeterministic (writes in no set order) unless torch.use_deterministic_algorithms(True):
    # a re-run could give backward other bits than the forward used. Without the mode it is never
    # re-run (the profile says so), what only it could rebuild stays, said once, and the rest of
    # the plan holds. With the mode, the same op is re-run like any other.
    env = {"MEMPLAN_PROFILE_OUT": "profile.json"}

    def index_copies():
        ops = load_profile(runner.tmp / "profile.json")["forward"]
        return [op.get("rerunnable", True) for op in ops if op["name"] == "aten::index_copy"]

    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", ["--index-copy", "--nondeterministic"], env)
    assert index_copies() == [False] * 4
    assert p.stderr.count("cannot be evicted") == 1 and "aten::index_copy" in p.stderr
    assert "use_deterministic_algorithms(True)" in p.stderr
    assert_peaks_as_predicted(report)
    rs = report["replay"]
    assert sum(r["evicted"] for r in rs) > 0
    assert sum(r["not_rebuildable"] for r in rs) == 0 and sum(r["on_demand"] for r in rs) == 0

    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", ["--index-copy"], env)
    assert index_copies() == [True] * 4
    assert "cannot be evicted" not in p.stderr
    assert_peaks_as_predicted(report)


def test_a_torch_compiled_model_is_left_as_it_is_with_one_message(runner, plain_runs):
    # torch.compile: the model's forward is one CompiledFunction, which memplan cannot re-run; so
    # are the loss's saved tensors, which need its output. No plan lowers the peak: the step runs
    # as it is, bit-identical, and the user is pointed to torch.compile's own budget.
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", ["--small", "--compile"])
    assert p.stderr.count("cannot be evicted") == 1
    assert "CompiledFunction" in p.stderr and "activation_memory_budget" in p.stderr
    assert "no plan lowers it" in p.stderr
    plan = report["plan"]
    assert not plan["feasible"] and plan["predicted_peak_bytes"] == plan["unplanned_peak_bytes"]
    assert sum(r["not_rebuildable"] for r in report["replay"]) == 0


def test_compiled_mlps_are_kept_and_the_eager_rest_of_the_model_is_planned(runner, plain_runs):
    # Only each block's MLP torch.compile'd, as a user compiles the part they care about: its
    # CompiledFunction is kept whole (one message), while attention, layer norms and dropouts
    # around it are evicted and re-run, bit-identical, the peak lowered as predicted.
    p, report = identical_replay(runner, plain_runs, "gpt2", "60%", ["--small", "--compile-mlp"])
    assert p.stderr.count("cannot be evicted") == 1 and "CompiledFunction" in p.stderr
    plan = report["plan"]
    assert plan["predicted_peak_bytes"] < plan["unplanned_peak_bytes"]
    assert_peaks_as_predicted(report, feasible=plan["feasible"])
    assert sum(r["evicted"] for r in report["replay"]) > 0
    assert sum(r["ops_rerun"] for r in report["replay"]) > 0
    assert sum(r["not_rebuildable"] for r in report["replay"]) == 0


def test_a_recompile_inside_a_step_is_not_taken_for_the_steps_ops(runner, plain_runs):
    # A new sequence length at step 5 makes torch.compile trace the MLPs again, inside that step's
    # forward, on fake tensors (symbolic sizes: StorageImpl::nbytes throws). Taken for the step's
    # ops, they raised in our callbacks and the process crashed (tools/soak.py seed 51); one
    # warm-up step also recorded the first compile's into the profile. Now they are passed over.
    extra = ["--small", "--compile-mlp", "--seq-change-at", "5"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "60%", extra, env={"MEMPLAN_WARMUP": 1})
    assert "Exception in RecordFunction callback" not in p.stderr
    assert "left out forward ops" not in p.stderr  # the first compile's ops are in no record
    assert len(report["plans"]) == 2  # one per sequence length
    plans = {q["index"]: q for q in report["plans"]}
    for r in report["replay"]:  # each kind's steps as its plan predicts
        plan = plans[r["plan"]]
        assert r["evicted"] > 0
        peaks = [pk - b + plan["baseline_bytes"] for pk, b in zip(r["measured_peak_bytes"], r["measured_baseline_bytes"])]
        assert abs(max(peaks) / plan["predicted_peak_bytes"] - 1) <= TOLERANCE


@pytest.mark.parametrize("late", [0, 5])
def test_an_op_the_recorder_cannot_describe_leaves_the_run_to_pytorch_with_one_message(runner, late):
    # A strided nested tensor's sizes() throws in our op callback. Thrown on to RecordFunction,
    # torch printed it with a stack trace for every op after it, and the step's record was left
    # half made. Now: one message, plain PyTorch from there, bit-identical. From step 5 on (after
    # the plan), the step already evicted: what it evicted is rebuilt for backward.
    p, report = identical_script_replay(runner, "nested_step.py", [late], "50%")
    assert "Exception in RecordFunction callback" not in p.stderr
    assert p.stderr.count("could not follow an op") == 1 and "NestedTensorImpl" in p.stderr
    if late:
        assert sum(r["evicted"] for r in report["replay"]) > 0


@pytest.mark.parametrize("where", ["fwd", "bwd", "flops", "late"])
def test_a_scripts_dispatch_mode_sees_no_rerun_and_changes_no_bit(runner, where):
    # A TorchDispatchMode of the script's (dispatch_mode_step.py). Before: with a mode that
    # rounds op outputs through bfloat16 around the forward only, the evicted values were rebuilt
    # outside it, unrounded (other gradients); around the backward only, the rebuilds ran inside
    # it and were rounded (other losses). Now an op run under a mode is not re-run (its values
    # are kept), and a re-run runs under no mode. FlopCounterMode's count (stdout) is the plain
    # run's: it is not shown our re-runs.
    p, report = identical_script_replay(runner, "dispatch_mode_step.py", [where], "50%")
    replayed = report["replay"]
    if where == "bwd":  # rebuilt while the backward runs under the mode
        assert sum(r["evicted"] for r in replayed) > 0
    elif where == "late":  # planned without the mode: kept from step 6 on, with one message
        assert sum(r["evicted"] for r in replayed) > 0 and sum(r["not_rebuildable"] for r in replayed) > 0
        assert p.stderr.count("under a TorchDispatchMode the script entered") == 1
    else:  # every op ran under the mode: nothing can be rebuilt, and the message says why
        assert "forward op(s) run under a TorchDispatchMode the script entered" in p.stderr
        assert sum(r["evicted"] for r in replayed) == 0


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_a_kernel_choice_scoped_to_the_forward_holds_for_its_reruns(runner, budget):
    # sdpa_math_step.py: the forward under sdpa_kernel(SDPBackend.MATH), the backward outside it.
    # The re-runs in backward took the CPU's fused (flash) kernel instead of the math
    # decomposition, which saves other tensors, and the script died in backward ("batch1 must be
    # a 3D tensor"). A recipe keeps the kernel choice its op ran under (agent/kernel_choice.h).
    p, report = identical_script_replay(runner, "sdpa_math_step.py", [], budget)
    assert report["replay"] and report["replay"][0]["evicted"] > 0
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_quantization_aware_training_reruns_its_fake_quantizers_as_they_ran(runner, budget):
    # qat_step.py: fused_moving_avg_obs_fake_quant updates its observer's running min/max, scale
    # and zero point in place without bumping their versions. A re-run read the updated statistics
    # (the moving average taken twice: another scale, another mask) and the first layer's
    # gradients differed from the first replayed step on. Such writes now count as versions.
    p, report = identical_script_replay(runner, "qat_step.py", [], budget)
    assert report["replay"] and sum(r["evicted"] for r in report["replay"]) > 0


@pytest.mark.parametrize("budget", ["50%", "1%"])
@pytest.mark.parametrize("what,copies", [("weights", 4), ("batch", 1)])
def test_what_the_forward_writes_through_data_is_copied_once_and_planned_with(runner, what, copies, budget):
    # data_write_step.py writes in place through `.data` after an op read the tensor: each layer's
    # weight after the layer ran (weights), or the batch after the first layer (batch). Autograd
    # does not see it; backward reads the new contents. A re-run of that op must read the tensor
    # as it was, so the replay copies it at the write. Before, the plan left those copies out (the
    # first replayed step ran over its prediction, weights +29%, batch +20%, and its kind was
    # planned again), and the same storage was copied once per tensor of it a recipe captured: the
    # weight and its `.data` alias the write's own recipe took (no rebuild re-runs a write made
    # after what it rebuilds: rerun_ops); the batch and the two aliases `x.data` made (copies made
    # at one op's start now share one per storage: Replayer::moment_copies_).
    p, report = identical_script_replay(runner, "data_write_step.py", [what], budget)
    assert "planned again" not in p.stderr and len(report["plans"]) == 1
    for r in report["replay"]:
        assert r["evicted"] > 0 and 0 < r["snapshots"] <= copies * r["steps"], r
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_a_tensor_made_in_the_step_and_written_through_data_is_rebuilt_as_each_op_read_it(runner, budget):
    # data_write_step.py made: the batch is made in the step (randn(...).sin()), read by the first
    # layer, centred in place through `x.data` (a counter of its own: x's version stays), then
    # added to each later layer's output. A re-run of the first layer must read x as it was, and
    # one of a later add x as written. The replay took x's slot, at its version, for unwritten:
    # the first layer's re-run read the centred x, and every gradient came out ~1e-7 off (50% and
    # 1%, silently). Now a write through another counter marks the storage's slots overwritten
    # (Replayer::mark_overwritten), and the record reads the later adds' x from the write
    # (Recorder::last_write_), so the plan re-makes x only for the first layer.
    p, report = identical_script_replay(runner, "data_write_step.py", ["made"], budget)
    assert_one_plan_evicting_as_predicted(p, report)


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_an_embedding_with_max_norm_rebuilds_its_lookup_from_the_renormalised_weight(runner, budget):
    # max_norm_step.py: nn.Embedding(max_norm=1.0) renormalises the weight's looked-up rows in
    # place through `weight.detach()` (which shares the weight's version counter) before each
    # lookup. The replay copied the weight for the detach's recipe and then took it as overwritten
    # for the rest of the step, as if written through `.data`: the lookup's recipe, which captured
    # it after the write, found no copy of what it read, the rebuild failed and backward raised
    # ("an input of a recomputed op was written in place after its value was evicted"). A write's
    # effect on the counter is now read once it landed (Replayer::settle_writes).
    p, report = identical_script_replay(runner, "max_norm_step.py", [], budget)
    assert "could not" not in p.stderr and "failed" not in p.stderr
    assert report["replay"] and all(r["evicted"] > 0 and r["on_demand"] == 0 for r in report["replay"])
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_gumbel_noise_drawn_into_a_factorys_tensor_is_rebuilt_not_copied(runner, budget):
    # gumbel_step.py: F.gumbel_softmax(hard=True) draws its noise into torch.empty_like(logits)
    # with exponential_, and builds its one-hot in torch.zeros_like(logits) with scatter_. Python's
    # factories run below autograd (no sequence number), and were no ops of the step: what they
    # made came from nowhere and was written in place, so a rebuild could only have it as a copy
    # kept from before the write, as large as what evicting saves. No plan lowered the peak (the
    # minimum was the un-planned peak). Recorded now (made like a tensor: hooks/op_callbacks.cpp),
    # what the layers save is evicted, and rebuilt with the noise drawn again as it was.
    p, report = identical_script_replay(runner, "gumbel_step.py", [], budget)
    assert "planned again" not in p.stderr and len(report["plans"]) == 1
    plan = report["plan"]
    activations = plan["unplanned_peak_bytes"] - plan["baseline_bytes"]
    assert plan["predicted_peak_bytes"] - plan["baseline_bytes"] <= 0.6 * activations, plan
    for r in report["replay"]:
        assert r["evicted"] > 0 and r["snapshots"] == 0 and r["on_demand"] == 0, r
        # The ops the plan prices are the ops re-run: max's indices, saved by a node that dies in
        # the forward (its values output unused), were taken as alive to the step's end, and the
        # replay re-ran max unpriced (90 ops a step against 78 planned).
        assert r["ops_rerun"] == plan["rerun_ops"] * r["steps"], (r, plan["rerun_ops"])
    assert_peaks_as_predicted(report, feasible=plan["feasible"])


@pytest.mark.parametrize("budget", ["50%", "1%"])
@pytest.mark.parametrize("mode", ["whole", "read-first", "factory"])
def test_a_mask_written_through_a_slice_then_read_whole_is_rebuilt_not_held(runner, mode, budget):
    # mask_slice_step.py: m = ones_like(h, bool); m[:, :k] = False; h.masked_fill(m.logical_not(), 0).
    # The write is fill_ on a slice that dies at once; m's own slot is at the version before it.
    # logical_not's recipe found no source for m and took it as an external, held to the step's
    # end, which the plan does not count: the first replayed step ran +7.1% over the prediction
    # ("read-first", m also read before the write: +6.4%) and its kind was planned again. Now the
    # dead fill_'s output, at m's version on m's storage (made in the step), is m's source, viewed
    # whole (Replayer::source_of), and its rebuild writes the re-made slice in place (run_op).
    # "factory": m = torch.ones(h.shape, dtype=torch.bool), made from its arguments alone (as an
    # FNO's spectral layer makes the buffer it fills through a slice). That factory was no op of
    # the step, so m was an input from outside, held by the recipes that read it: +6.7% over the
    # prediction and planned again. Now every aten factory is an op of the step (op_callbacks.cpp).
    p, report = identical_script_replay(runner, "mask_slice_step.py", [mode], budget)
    assert "planned again" not in p.stderr and len(report["plans"]) == 1
    assert "could not" not in p.stderr and "failed" not in p.stderr
    for r in report["replay"]:
        assert r["evicted"] > 0 and r["snapshots"] == 0 and r["on_demand"] == 0, r
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])


def assert_one_plan_evicting_as_predicted(p, report):
    """One plan, never made again; every replayed step evicted, nothing rebuilt on demand, and
    the peaks as predicted (assert_peaks_as_predicted)."""
    assert "planned again" not in p.stderr and len(report["plans"]) == 1
    for r in report["replay"]:
        assert r["evicted"] > 0 and r["on_demand"] == 0, r
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_an_lstm_over_packed_sequences_whose_hidden_state_is_dropped_is_planned(runner, budget):
    # packed_lstm_step.py: `out, _ = lstm(packed)` with unsorted lengths. The unsorted indices are
    # saved by three index_select nodes, two of which (the hidden and cell states') die with `_`.
    # The record subtracted every pack handle ever made from the storage's references, found the
    # indices gone before backward and cleared what saved them; backward then unpacked them, and
    # the planner refused the profile ("unpacked in backward but saved by no forward op"): no
    # plan, plain PyTorch at 28.1 MiB. Now only the live handles count (Recorder::pack_handles_).
    p, report = identical_script_replay(runner, "packed_lstm_step.py", [], budget)
    assert "no plan" not in p.stderr
    assert_one_plan_evicting_as_predicted(p, report)


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_the_last_steps_loss_read_by_an_op_left_out_of_the_step_is_not_held(runner, budget):
    # input_grad_step.py: the input is a leaf that requires grad, so after backward the step's
    # graph holds it and its gradient until the script rebinds `loss`. StepDump's
    # loss.detach().clone() opens the next step's window; loss.item() then runs at the index of
    # the forward's first op, whose recipe took the loss as an external and held it, graph and
    # all, to the step's end; the recorder leaves item out, so the record freed that memory when
    # `loss` was rebound: the first replayed step ran +21.6% over the prediction and its kind was
    # planned again 4 MiB higher. Now an op left out drops the externals it captured first.
    p, report = identical_script_replay(runner, "input_grad_step.py", [], budget)
    assert_one_plan_evicting_as_predicted(p, report)


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_what_a_custom_function_wrote_in_place_is_not_re_made_without_it(runner, budget):
    # dirty_function_step.py: ScaleInPlace.apply(h) doubles h in place (ctx.mark_dirty) under its
    # no_grad forward; its RecordFunction shows no output, so tanh(h) looked as if it read what
    # `+ 0` made. The plan evicted tanh's result and re-ran `+ 0` and tanh, which the replay, finding
    # h at another version, did by holding h to the step's end, unplanned: the first replayed step
    # ran +44% over the prediction and its kind was planned again. Now the recorder notes the
    # write (the input's version counter moved: Op::writes) and that tanh read h from the
    # Function, which cannot re-run: tanh's result is kept, and a recipe holding h is planned.
    p, report = identical_script_replay(runner, "dirty_function_step.py", [], budget)
    assert_one_plan_evicting_as_predicted(p, report)


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_an_optimizer_that_calls_the_closure_replays_every_call_as_planned(runner, budget):
    # lbfgs_step.py: LBFGS's step runs the closure, forward and backward, up to three times. The
    # optimizer step's pre hook turned op observation off for the step (an optimizer's own ops are
    # no step's), so the first call's forward went unseen: its backward was taken for the end of an
    # optimizer step that raised ("one training step ran without the plan's actions"), and that
    # kind of step ran at its un-planned peak (31 MiB at a 19 MiB budget) every iteration. A step
    # given a closure is now observed like a differentiable optimizer's.
    p, report = identical_script_replay(runner, "lbfgs_step.py", ["lbfgs"], budget)
    assert "optimizer step raised" not in p.stderr, p.stderr
    assert "no plan lowers" not in p.stderr, p.stderr
    assert len(report["plans"]) == 2, report["plans"]
    for r in report["replay"]:
        assert r["evicted"] > 0 and r["on_demand"] == 0, r
    for index in (pl["index"] for pl in report["plans"]):
        peaks, plan = plan_peaks(report, index)
        assert peaks and plan["predicted_peak_bytes"] < plan["unplanned_peak_bytes"], plan
        for peak in peaks:
            assert abs(peak / plan["predicted_peak_bytes"] - 1) <= TOLERANCE, (index, peak, plan)


def test_an_optimizer_step_without_a_closure_makes_its_state_outside_the_steps_activations(runner):
    # lbfgs_step.py adam: the closure called by the script, then Adam's step, whose first call
    # makes its state inside the window of the recorded step (StepDump's copies open it). The
    # step pre hook's arguments begin with the optimizer itself; taken for a closure, no optimizer
    # step was a quiet stretch, the state counted as the record's activations, and every replayed
    # step measured 7.9% under the prediction.
    p, report = identical_script_replay(runner, "lbfgs_step.py", ["adam"], "50%")
    assert len(report["plans"]) == 1 and "optimizer step raised" not in p.stderr
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])
    assert min(measured_peaks(report)) >= 0.98 * report["plan"]["predicted_peak_bytes"]


@pytest.mark.parametrize("budget", ["50%", "1%"])
def test_what_a_torchscript_graph_saves_after_its_last_op_is_evicted_as_planned(runner, budget):
    # jit_step.py: a jit.script activation runs as a DifferentiableGraph, whose backward node saves
    # what its ops made after the last of them ended (the pack counts for that op). The plan
    # evicted those values after their last read, before the save, so the replay found nothing to
    # evict there and kept them all: +76% over the prediction, with no message and no re-plan. Now
    # a value lives to the op that saved it (planner/graph.cpp), and packs that come after an
    # op's end are evicted at the next op's start (Replayer::settle_late_packs).
    p, report = identical_script_replay(runner, "jit_step.py", [], budget)
    assert_one_plan_evicting_as_predicted(p, report)
    plan = report["plan"]
    activations = plan["unplanned_peak_bytes"] - plan["baseline_bytes"]
    assert plan["predicted_peak_bytes"] - plan["baseline_bytes"] <= 0.75 * activations, plan


def test_plans_made_from_other_op_times_replay_as_predicted(runner):
    # Which plan a budget gets depends on the op times the warm-up measured, which vary from run to
    # run: gumbel_step.py at 1% ran 3.8% over its prediction in about one run in four, and had its
    # kind planned again (test_gumbel_noise_drawn_into_a_factorys_tensor_is_rebuilt_not_copied
    # failed so in CI-like runs). Here the same recorded step is planned under fixed made-up op
    # times, so that the plans differ in a known way, and each is replayed (MEMPLAN_PLAN). With
    # time set 7, a saved value the plan keeps for a later recompute (released after it) was held
    # only by its saved tensor, freed by autograd after its node: the later recompute re-made it
    # from the step's first op, 6 MiB of transients where 1.5 were planned (+3.8%). Now held to its
    # release; and each recompute re-runs its ops in forward order, as the simulator prices them
    # (resolved depth-first, zeros_like's output stood while the chain for max's indices was
    # re-made: +5.8% in other plans). This script's replays match the simulator to the byte.
    script = ROOT / "tests" / "integration" / "gumbel_step.py"
    plain = runner.run(["plain.pt"], script=script)
    runner.run(["record.pt"], mode="launcher", script=script, env={"MEMPLAN_BUDGET": "1%"})
    profile = json.loads((runner.tmp / "memplan-profile.json").read_text())
    for times in [7, 0, 21, 23]:
        rnd = random.Random(times)
        for op in profile["forward"] + profile["backward"]:
            op["time_us"] = op["cpu_us"] = rnd.choice([5.0, 50.0, 500.0, 5000.0])
        timed = runner.tmp / f"times{times}.json"
        timed.write_text(json.dumps(profile))
        plan = runner.tmp / f"plan{times}.json"
        subprocess.run([str(BUILD / "memplan-plan"), str(timed), "--budget", "1%", "-o", str(plan)], check=True,
                       capture_output=True)
        assert json.loads(plan.read_text())["recomputes"], times
        p = runner.run([f"agent{times}.pt"], mode="launcher", script=script,
                       env={"MEMPLAN_PLAN": plan.name, "MEMPLAN_REPORT": "report.json"})
        assert p.stdout == plain.stdout
        assert_same_dumps(runner.tmp / "plain.pt", runner.tmp / f"agent{times}.pt")
        report = json.loads((runner.tmp / "report.json").read_text())
        worst = max(measured_peaks(report))
        assert worst <= report["plan"]["predicted_peak_bytes"] * 1.01, (times, worst, report["plan"])
        assert all(r["on_demand"] == 0 for r in report["replay"]), times
        assert all(r["ops_rerun"] == report["plan"]["rerun_ops"] * r["steps"] for r in report["replay"]), times


def test_wrong_plan_rebuilds_on_demand(runner, plain_runs):
    replay(runner, "gpt2", "50%", env={"MEMPLAN_PLAN_CACHE": "cache"})
    cached = list((runner.tmp / "cache").glob("plan-*.json"))
    assert len(cached) == 1
    plan = json.loads(cached[0].read_text())
    assert plan["evictions"] and plan["recomputes"]
    plan["recomputes"] = []  # every evicted tensor is now needed before any planned recompute
    (runner.tmp / "wrong.json").write_text(json.dumps(plan))
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", env={"MEMPLAN_PLAN": "wrong.json"})
    assert "fails the simulator" in p.stderr
    rep = report["replay"][0]
    assert rep["evicted"] > 0 and rep["on_demand"] == rep["evicted"]


def test_a_view_whose_latest_sibling_view_died_is_still_evicted(runner, plain_runs):
    # Attention splits q, k and v from one projection: views of one storage, each a slot of the
    # op that made it. The second matmul (weights @ v) saves v. Its source was looked up by
    # storage, and only the latest view made of that storage was tried: k's transpose, which died
    # after the first matmul. The pack got no source, its eviction was refused ("kept (no
    # recipe)"), and the step went over the budget (3.00 MiB against 2.99 at 70%, with 3 of 20
    # fresh plans). Forced here: a plan that evicts that value after its last forward reader. At
    # batch 1 matmul saves v itself, a view (at larger batches its reshape is a copy).
    extra = ["--small", "--batch", "1"]
    replay(runner, "gpt2", "70%", extra, env={"MEMPLAN_PLAN_CACHE": "cache"})
    prof = json.loads((runner.tmp / "memplan-profile.json").read_text())
    fwd, values = prof["forward"], prof["values"]

    def views_of(v):
        return [i for i, op in enumerate(fwd) if any(o["value"] == v for o in op["outputs"])]

    candidates = [v for v, val in enumerate(values)
                  if val["producer"] >= 0 and fwd[val["producer"]]["name"] == "aten::linear"
                  and len(views_of(v)) >= 4 and len(val["saved_by"]) >= 2
                  and fwd[max(val["saved_by"])]["name"] == "aten::matmul"]
    assert candidates, "no q/k/v projection whose views two matmuls save (does matmul copy v here?)"
    v = candidates[0]
    last = max(values[v]["consumers"])
    (cached,) = (runner.tmp / "cache").glob("plan-*.json")
    plan = json.loads(cached.read_text())
    plan.update(evictions=[{"value": v, "after_fwd": last}],
                recomputes=[{"before_bwd": min(values[v]["unpacked_by"]),
                             "ops": sorted({values[v]["producer"], *[i for i in views_of(v) if i < last]}),
                             "keep": [v]}],
                holds=[], releases=[], compactions=[])
    (runner.tmp / "views.json").write_text(json.dumps(plan))
    p, report = identical_replay(runner, plain_runs, "gpt2", "70%", extra, env={"MEMPLAN_PLAN": "views.json"})
    assert report["replay"]
    packs = sum((op.get("packs") or []).count(v) for op in fwd)  # q and k's transpose, then v
    assert packs >= 3
    for r in report["replay"]:
        # Every saved handle of it, once a step, none kept (the bug kept v's: 1 a step).
        assert r["not_rebuildable"] == 0, r
        assert r["evicted"] == r["rebuilt"] == packs * r["steps"] and r["on_demand"] == 0, r


def test_plan_cache_is_reused(runner):
    args = ["--model", "gpt2", "--small", "--steps", "4"]
    env = {"MEMPLAN_BUDGET": "50%", "MEMPLAN_PLAN_CACHE": "cache"}
    runner.run(args, mode="launcher", env=env)
    second = runner.run(args, mode="launcher", env=env)
    assert "plan loaded from the cache" in second.stderr


def test_budget_above_peak_takes_no_action(runner, plain_runs):
    stdout, plain_dump = plain_runs("gpt2")
    p, report = replay(runner, "gpt2", "200%")
    assert p.stdout == stdout
    assert report["phase"] == "done" and report["replay"] == []


def test_memory_between_backward_nodes_is_in_the_prediction(runner):
    # A layer applied twice: the engine sums its weight's two gradients between two backward
    # nodes (a transient as large as the weight, 4 MiB here), outside every node's callbacks.
    # With small activations that transient is the step's peak. The profile puts it in the
    # earlier node's peak, so even the empty plan's simulated peak is the measured one (it was
    # 56.0 MiB against 59.8 MiB measured).
    args = ["--model", "mlp", "--batch", "1", "--steps", "3", "--shared-layer"]
    runner.run(args, mode="launcher", env={"MEMPLAN_BUDGET": "200%", "MEMPLAN_REPORT": "report.json"})
    plan = json.loads((runner.tmp / "report.json").read_text())["plan"]
    assert plan["evictions"] == 0
    assert abs(plan["predicted_peak_bytes"] / plan["unplanned_peak_bytes"] - 1) < 0.001, plan


def test_corrupt_plan_file_falls_back(runner, plain_runs):
    (runner.tmp / "bad.json").write_text('{"format": "memplan-plan", "version": 1, "evictions": [')
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", env={"MEMPLAN_PLAN": "bad.json"})
    assert "MEMPLAN_PLAN=bad.json" in p.stderr and "planning from the profile instead" in p.stderr


def torchrun_identical(runner, extra, port):
    """Two gloo ranks without and with memplan at 50%: each rank's losses and gradients (its own
    shard under FSDP) bit-identical, each rank with its own plan. Returns the ranks' reports."""
    args = ["--model", "gpt2", "--small", "--steps", "8", *extra]
    torchrun(runner.tmp, [*args, "--dump", "plain.pt"], {}, port, launcher=False)
    torchrun(runner.tmp, [*args, "--dump", "d.pt"],
             {"MEMPLAN_WARMUP": 2, "MEMPLAN_BUDGET": "50%", "MEMPLAN_REPORT": "report.json"}, port + 1)
    reports = []
    for r in (0, 1):
        assert_same_dumps(runner.tmp / f"plain.pt.rank{r}", runner.tmp / f"d.pt.rank{r}")
        rep = json.loads((runner.tmp / f"report.rank{r}.json").read_text())
        assert rep["rank"] == r and any(x["evicted"] > 0 for x in rep["replay"])
        reports.append(rep)
    # torchrun's launcher imports torch too, runs no step and writes no report of its own.
    assert not (runner.tmp / "report.json").exists()
    return reports


def test_torchrun_two_ranks_each_with_its_own_plan(runner):
    # DDP's first iterations differ (bucket rebuild): a divergence, a re-profile, then replay.
    torchrun_identical(runner, [], 29541)


def test_fsdp2_two_ranks(runner):
    # FSDP2 all-gathers each block's parameters before its forward and again before its backward,
    # and frees them after each: the parameters that recomputations read in backward are the
    # re-gathered ones (same tensors, storage resized back), and gradients are shards.
    # In some steps one collective's buffer (one block's unsharded parameters or gradients,
    # 199,936 B) outlives FSDP2's release of it by milliseconds: its last reference is held on a
    # gloo worker thread (by the finished collective, whose Work holds its tensors), which drops
    # it only when it next gets a core (two ranks on two cores). The free comes from that thread,
    # up to ~65 backward nodes later (seen with a probe on the allocator's deleter; README). The
    # profile cannot show such timing; every step stays within the budget plus one such buffer,
    # and the median step within the budget and TOLERANCE of the prediction.
    import statistics

    sys.path.insert(0, str(ROOT / "examples"))
    import models

    block = sum(p.numel() * p.element_size() for p in models.build("gpt2", small=True).blocks[0].parameters())
    for rep in torchrun_identical(runner, ["--fsdp"], 29545):
        r = rep["replay"][-1]
        assert r["divergences"] == 0 and r["on_demand"] == 0 and r["rebuilt"] == r["evicted"]
        plan = rep["plan"]
        assert plan["feasible"]
        peaks = measured_peaks(rep)
        assert max(peaks) <= plan["budget_bytes"] + block, (max(peaks), plan["budget_bytes"], block)
        median = statistics.median(peaks)
        assert median <= plan["budget_bytes"], (median, plan["budget_bytes"])
        assert abs(median / plan["predicted_peak_bytes"] - 1) <= TOLERANCE


def test_actions_in_nvtx_and_trace(runner):
    env, log = nvtx_recorder(runner.tmp)
    runner.run(["--model", "gpt2", "--small", "--steps", "4"], mode="launcher", env={"MEMPLAN_BUDGET": "50%", **env})
    lines = log.read_text().splitlines()
    for phase in ("memplan/warmup", "memplan/plan", "memplan/replay"):
        assert f"push memplan {phase}" in lines
    assert any(l.startswith("mark memplan memplan/evict value ") for l in lines)
    assert any(l.startswith("push memplan memplan/recompute before node ") for l in lines)
    assert any(l.startswith("push memplan memplan/compact value ") for l in lines)
    trace = json.loads((runner.tmp / "memplan-trace.json").read_text())["traceEvents"]
    steps = [e["name"] for e in trace if e.get("cat") == "phase"]
    assert steps == ["memplan/warmup step 0", "memplan/warmup step 1", "memplan/replay step 2"]
    actions = [e for e in trace if e.get("cat") == "action"]
    assert any(e["name"].startswith("memplan/evict") for e in actions)
    assert any(e["name"].startswith("memplan/recompute") and e["ph"] == "X" for e in actions)
    assert any(e["name"].startswith("memplan/compact value") and e["ph"] == "X" for e in actions)


def test_user_profiler_in_a_replayed_step_sees_every_op(runner):
    # The agent turns RecordFunction off for the children of the ops it records (aten::linear's
    # addmm...) and for optimizer steps only while it is their only observer: a user's
    # torch.profiler in a replayed step sees every op it sees without memplan.
    extra = ["--torch-profiler-step", "4"]
    ops = lambda p: set(json.loads(next(l for l in p.stderr.splitlines()
                                        if l.startswith("USER_PROFILER_OPS "))[len("USER_PROFILER_OPS "):]))
    plain = runner.run(["--model", "gpt2", "--steps", STEPS, "--dump", "plain.pt", *extra])
    p, report = replay(runner, "gpt2", "50%", extra)
    assert p.stdout == plain.stdout
    assert_same_dumps(runner.tmp / "plain.pt", runner.tmp / "agent.pt")
    assert report["replay"][0]["evicted"] > 0
    assert {"aten::linear", "aten::addmm", "aten::bernoulli_", "Optimizer.step#Adam.step", "aten::addcdiv_"} <= ops(plain)
    assert ops(plain) <= ops(p)


@pytest.mark.parametrize("extra", [[], ["--log-params-before-step"]])
def test_optimizer_step_that_raises_costs_no_unplanned_step(runner, plain_runs, extra):
    # RecordFunction is off during an optimizer step. If the step raises (its post hook never
    # runs) and the script goes on, the end of the step's record_function ends that stretch, so
    # the next forward is seen and replayed as planned. It used to stay off until the next
    # backward: that step ran unplanned, at the un-planned peak (with --log-params-before-step,
    # whose step window holds the optimizer step, it was measured +51% over the prediction).
    extra = ["--optimizer-raises-at", "4", *extra]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert p.stderr.count("an optimizer step raised") == 1
    assert "other ops than the step predicted" not in p.stderr
    r = report["replay"][0]
    assert len(report["replay"]) == 1 and r["steps"] == STEPS - 2 and r["divergences"] == 0
    assert r["evicted"] > 0 and r["evicted"] % r["steps"] == 0
    assert len(measured_peaks(report)) == r["steps"] and r["other_kind_peak_bytes"] == []
    assert max(measured_peaks(report)) <= report["plan"]["budget_bytes"]
    assert_peaks_as_predicted(report)


def test_backward_that_raises_leaves_the_next_steps_replayed(runner, plain_runs):
    # The backward of step 4 raises before any model node runs (a hook on the output), with every
    # planned eviction done and nothing rebuilt yet; the script catches it and goes on. The step's
    # end puts the evicted tensors back (the graph could be run again) without the agent taking
    # that work for the next step's ops, and the following steps are replayed as planned.
    extra = ["--backward-raises-at", "4"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert "step 4: backward refused" in p.stderr
    r = report["replay"][0]
    assert len(report["replay"]) == 1 and r["divergences"] == 0
    assert r["steps"] == STEPS - 2
    assert r["evicted"] > 0 and r["evicted"] % r["steps"] == 0
    assert r["rebuilt"] == r["evicted"]


def test_rebuilds_inside_backward_under_the_scripts_own_hooks(runner, plain_runs):
    # The script calls backward inside its own saved_tensors_hooks, so ours are not on top while
    # backward runs. A rebuild's re-runs must still pack through ours (that is how layer_norm's
    # mean/rstd are recovered): they are pushed on top for the re-run, then taken off again.
    extra = ["--backward-in-user-hooks"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    r = report["replay"][0]
    assert len(report["replay"]) == 1 and r["divergences"] == 0 and r["steps"] == STEPS - 2
    assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["on_demand"] == 0
    assert "recompute failed" not in p.stderr


def test_a_second_thread_running_ops_and_backward_is_left_out_of_the_step(runner, plain_runs):
    # A thread beside training keeps running tensor ops with grad mode on, and backward calls of
    # its own. Only the thread that imported torch is observed: its steps are profiled and
    # replayed as usual (every one after the plan, no divergence, every eviction rebuilt), the
    # other thread's ops and backward calls are no part of them. Recorded from both threads, the
    # steps came out different every time, and the recorder, written from two threads at once,
    # crashed the process.
    extra = ["--side-thread"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert report["profile"]["forward_ops"] > 0
    assert len(report["replay"]) == 1
    r = report["replay"][0]
    assert r["divergences"] == 0 and r["steps"] == STEPS - 2
    assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["on_demand"] == 0
    assert p.stderr.count("on a thread other than the one that imported torch") == 1


def test_a_training_function_on_a_thread_of_its_own_is_planned_with_train_thread_backward(runner, plain_runs):
    # The model is built and trained on a thread that did not import torch (as Ray Train runs
    # the training function). By default that thread is not observed: one message, naming the
    # setting that observes it, and plain PyTorch. With MEMPLAN_TRAIN_THREAD=backward the first
    # thread to call backward trains: its first step runs unobserved (its forward came before),
    # the next two are profiled and the rest replayed within the budget.
    extra = ["--train-thread"]
    stdout, plain_dump = plain_runs("gpt2", extra)
    p = runner.run(["--model", "gpt2", "--steps", STEPS, "--dump", "agent.pt", *extra], mode="launcher",
                   env={"MEMPLAN_BUDGET": "50%", "MEMPLAN_WARMUP": 2})
    assert p.stdout == stdout
    assert_same_dumps(plain_dump, runner.tmp / "agent.pt")
    assert p.stderr.count("MEMPLAN_TRAIN_THREAD=backward observes the first thread") == 1, p.stderr
    assert "planning took" not in p.stderr
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra, env={"MEMPLAN_TRAIN_THREAD": "backward"})
    assert "thread other than" not in p.stderr
    assert len(report["replay"]) == 1
    r = report["replay"][0]
    assert r["divergences"] == 0 and r["steps"] == STEPS - 3
    assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"] and r["on_demand"] == 0
    assert_peaks_as_predicted(report)


def test_a_backward_whose_nodes_run_on_two_threads_is_left_to_pytorch(runner, plain_runs):
    # A graph with nodes on the CPU and on a GPU (or on two GPUs) has the autograd engine run
    # them on two threads at once; the recorder and the replayer, written from both, would race.
    # Here (no GPU) the loss's backward runs another graph of the step's on a second thread. Only
    # the first thread's node callbacks go on; at the step's end its record is dropped (it misses
    # the other thread's nodes), one message, and plain PyTorch from there.
    extra = ["--backward-on-two-threads"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert p.stderr.count("the nodes of one backward ran on two threads") == 1, p.stderr
    assert "planning took" not in p.stderr and not report["replay"]


def test_batches_from_dataloader_workers_in_any_order_leave_the_steps_alike(runner, plain_runs):
    # Two forked DataLoader workers: the main process rebuilds each batch it receives from shared
    # memory (aten::set_, grad mode on) when it receives it, so a step holds the rebuilds of zero,
    # one or two batches depending on the order the workers finished them. Those ops read nothing
    # that requires grad and come before the forward: no part of the step. So there is one kind
    # of step, and every step after the plan is replayed.
    extra = ["--workers", "2"]
    p, report = identical_replay(runner, plain_runs, "gpt2", "50%", extra)
    assert report["step_kinds"]["kinds"] == 1 and report["step_kinds"]["misses"] == 0
    assert len(report["replay"]) == 1
    r = report["replay"][0]
    assert r["divergences"] == 0 and r["steps"] == STEPS - 2
    assert r["evicted"] > 0 and r["rebuilt"] == r["evicted"]
