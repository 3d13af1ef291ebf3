"""specverify.hf.divergence: the explained-divergence rule, τ calibration, and the greedy runners.

Hand-built logits pin the rule exactly (margin, gap, first divergence only, float32 strictness);
a tiny random Llama (specverify.hf.tiny_models) exercises the Hugging Face runners.  Runtime: ~5 s.
"""

from __future__ import annotations

import math

import pytest
import torch

from specverify.hf import divergence
from specverify.hf.divergence import GreedyRun, calibrate_from_runs, compare_greedy
from specverify.hf.tiny_models import tiny_causal_lm

# Three steps over a vocabulary of 4.  Step 1 is a near tie (margin 0.1); at step 2 the runner-up
# trails by 0.3 and the third token by 2.0.
LOGITS = torch.tensor([
    [5.0, 1.0, 0.0, 0.0],
    [0.0, 3.0, 2.9, 0.0],
    [4.0, 0.0, 3.7, 2.0],
])
BASELINE = GreedyRun(LOGITS.argmax(-1), LOGITS)  # tokens 0, 1, 0


def test_identical_rows_pass_in_every_dtype():
    for dtype in (torch.float32, torch.bfloat16):
        report = compare_greedy([BASELINE], [BASELINE.tokens.clone()], tau=0.5, dtype=dtype)
        assert report.identical and report.passed and report.tokens_compared == 3


def test_a_near_tie_flip_is_explained_in_reduced_precision_only():
    candidate = torch.tensor([0, 2, 3])  # flips the near tie at step 1, then anything
    report = compare_greedy([BASELINE], [candidate], tau=0.25, dtype=torch.bfloat16, labels=["p"])
    (d,) = report.divergences
    assert (d.row, d.position, d.baseline_token, d.candidate_token) == ("p", 1, 1, 2)
    assert d.margin == pytest.approx(0.1) and d.gap == pytest.approx(0.1) and d.explained
    assert report.passed and report.tokens_compared == 2  # nothing after the first divergence counts
    strict = compare_greedy([BASELINE], [candidate], tau=0.25, dtype=torch.float32)
    assert not strict.passed and not strict.divergences[0].explained  # float32 must be identical


def test_the_gap_of_the_chosen_token_decides_not_the_top2_margin():
    """At step 2 the top-2 margin is 0.3 (within τ = 0.5) but the candidate took the third token,
    2.0 below the top: a bug, not rounding."""
    report = compare_greedy([BASELINE], [torch.tensor([0, 1, 3])], tau=0.5, dtype=torch.float16)
    (d,) = report.divergences
    assert d.margin == pytest.approx(0.3) and d.gap == pytest.approx(2.0)
    assert not d.explained and not report.passed and report.unexplained == (d,)
    assert "UNEXPLAINED" in str(report) and "position 2" in str(report)


def test_every_row_reports_its_own_first_divergence():
    rows = [BASELINE.tokens.clone(), torch.tensor([0, 2, 0]), torch.tensor([1, 1, 0])]
    report = compare_greedy([BASELINE] * 3, rows, tau=0.2, dtype=torch.bfloat16)
    assert [(d.row, d.position, d.explained) for d in report.divergences] == [("1", 1, True), ("2", 0, False)]
    assert report.tokens_compared == 3 + 2 + 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(candidates=[torch.tensor([0, 1])]), "candidates: row 0 has 2 tokens"),
    (dict(candidates=[]), "candidates: expected 1 rows"),
    (dict(candidates=[torch.tensor([0, 1, 0])], tau=-1.0), "tau: expected >= 0"),
])
def test_compare_greedy_argument_errors(kwargs, message):
    arguments = dict(candidates=[BASELINE.tokens], tau=0.1, dtype=torch.bfloat16) | kwargs
    with pytest.raises(ValueError, match=message):
        compare_greedy([BASELINE], **arguments)


def test_calibration_measures_margin_changes_until_the_first_divergence():
    """A free-running shape whose logits move the step-0 margin by 0.25 and flip the near tie at
    step 1 (gap 0.1); what it does after the flip is ignored.  A teacher-forced shape moves the
    step-2 margin by 0.5 and flips nothing.  τ = 2 × max(0.25, 0.1, 0.5) = 1.0."""
    free = LOGITS.clone()
    free[0, 0] -= 0.25
    free[1, 2] += 0.2
    free[2] = torch.tensor([0.0, 9.0, 0.0, 0.0])  # after the divergence: not aligned, not measured
    forced = LOGITS.clone()
    forced[2, 0] += 0.5
    calibration = calibrate_from_runs(
        [BASELINE], {"batch4": [GreedyRun(free.argmax(-1), free)], "teacher-forced": [GreedyRun(forced.argmax(-1), forced)]},
        dtype=torch.bfloat16, teacher_forced=frozenset({"teacher-forced"}),
    )
    assert calibration.max_margin_change == pytest.approx(0.5)
    assert calibration.max_divergence_gap == pytest.approx(0.1)
    assert calibration.tau == pytest.approx(1.0)
    assert calibration.positions == 2 + 3  # the free run is aligned through its divergence at step 1
    (flip,) = calibration.divergences
    assert (flip.row, flip.position, flip.tau, flip.explained) == ("batch4/0", 1, calibration.tau, True)
    assert calibration.shapes == ("batch4", "teacher-forced") and calibration.dtype == "bfloat16"


def test_calibration_without_noise_gives_tau_zero_and_rejects_a_shrinking_factor():
    same = {"batch2": [BASELINE]}
    assert calibrate_from_runs([BASELINE], same, dtype=torch.float16).tau == 0.0
    with pytest.raises(ValueError, match="safety_factor"):
        calibrate_from_runs([BASELINE], same, dtype=torch.float16, safety_factor=0.5)
    with pytest.raises(ValueError, match="others: shape 'batch2' has 2 runs"):
        calibrate_from_runs([BASELINE], {"batch2": [BASELINE, BASELINE]}, dtype=torch.float16)


@pytest.fixture(scope="module")
def tiny():
    return tiny_causal_lm(vocab_size=32, hidden_size=32, num_layers=2, seed=5)


PROMPTS = [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6]), torch.tensor([7, 8, 9])]


def test_greedy_decode_is_fixed_length_and_batch_invariant_in_float32(tiny):
    alone = divergence.greedy_decode(tiny, PROMPTS, max_new_tokens=12, batch_size=1)
    batched = divergence.greedy_decode(tiny, PROMPTS, max_new_tokens=12, batch_size=2)  # 2 calls, the last filled up
    assert len(alone) == len(batched) == 3
    for a, b in zip(alone, batched):
        assert a.tokens.shape == (12,) and a.logits.shape == (12, 32)
        assert torch.equal(a.tokens, a.logits.argmax(-1))
        assert torch.equal(a.tokens, b.tokens)
        assert torch.allclose(a.logits, b.logits, atol=1e-4)


def test_teacher_forced_scores_the_same_tokens(tiny):
    (run,) = divergence.greedy_decode(tiny, PROMPTS[:1], max_new_tokens=10)
    forced = divergence.teacher_forced(tiny, PROMPTS[0], run.tokens)
    assert torch.equal(forced.tokens, run.tokens)
    assert torch.allclose(forced.logits, run.logits, atol=1e-4)


def test_calibrate_runs_every_shape_in_reduced_precision():
    model = tiny_causal_lm(vocab_size=32, hidden_size=32, num_layers=2, seed=5).to(torch.bfloat16)
    reference = divergence.greedy_decode(model, PROMPTS, max_new_tokens=12)
    calibration = divergence.calibrate(model, PROMPTS, reference, batch_sizes=(2, 3))
    assert calibration.shapes == ("batch2", "batch3", "teacher-forced")
    assert math.isfinite(calibration.tau) and calibration.tau >= 2 * calibration.max_margin_change
    assert calibration.dtype == "bfloat16"
    with pytest.raises(ValueError, match="batch_size"):
        divergence.greedy_decode(model, PROMPTS, max_new_tokens=4, batch_size=0)
