"""Hugging Face transformers' own models, unmodified (examples/models.py HUGGINGFACE), replayed
under a budget: bit-identical to the run without memplan, each replayed step within its budget and
its prediction. A file of its own so ctest runs it beside test_replay.py."""
import pytest

from test_replay import STEPS, assert_peaks_as_predicted, identical_replay, measured_peaks
from test_replay import plain_runs  # noqa: F401 (the fixture)


# Built from small configs: GPT-2 with HF's eager attention (softmax, dropout, a causal mask of its own), Llama
# (rotary positions, RMSNorm, grouped-query attention) and BERT as a masked LM through
# scaled_dot_product_attention with its dropout, and Mixtral's mixture of experts (routing by the
# data; its minimum is above 50%).
@pytest.mark.parametrize("model,extra", [("hf-gpt2", []), ("hf-llama", ["--sdpa"]), ("hf-bert", ["--sdpa"]),
                                         ("hf-mixtral", [])])
def test_hugging_face_models_bit_identical_within_budget(runner, plain_runs, model, extra):
    pytest.importorskip("transformers")
    p, report = identical_replay(runner, plain_runs, model, "50%", extra)
    assert sum(r["evicted"] for r in report["replay"]) > 0
    assert sum(r["divergences"] for r in report["replay"]) == 0
    assert len(measured_peaks(report)) >= STEPS - 2
    assert_peaks_as_predicted(report, feasible=report["plan"]["feasible"])
