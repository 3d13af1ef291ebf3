"""specverify.hf.divergence: teacher-forced scoring, noise calibration and the identity verdict of
Hugging Face models.

A tiny random Llama (specverify.hf.tiny_models) exercises the runners, the calibration in
bfloat16 (the model's own and a float32 reference) and :func:`check_identity` on correct and
corrupted rows; the judgement itself is pinned in tests/core/test_greedy_judgement.py.  Runtime: ~5 s.
"""

from __future__ import annotations

import math

import pytest
import torch

from specverify.hf import divergence
from specverify.hf.tiny_models import tiny_causal_lm


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
    assert torch.equal(forced.argmax(-1), run.tokens)
    assert torch.allclose(forced, run.logits, atol=1e-4)
    with pytest.raises(ValueError, match=r"tokens: expected a non-empty row of ids in \[0, 32\)"):
        divergence.teacher_forced(tiny, PROMPTS[0], torch.tensor([3, 32]))


def test_float32_identity_is_exact_over_the_whole_row(tiny):
    """The greedy rows pass; a row corrupted at one late position fails there, whatever came before."""
    runs = divergence.greedy_decode(tiny, PROMPTS, max_new_tokens=12)
    correct = divergence.check_identity(tiny, PROMPTS, [r.tokens for r in runs])
    assert correct.passed and correct.positions == 36 and correct.exceedances == 0
    corrupted = runs[1].tokens.clone()
    corrupted[9] = (corrupted[9] + 1) % 32
    report = divergence.check_identity(tiny, PROMPTS, [runs[0].tokens, corrupted, runs[2].tokens], labels="abc")
    (result,) = report.results
    assert not report.passed and result.tolerance == 0.0
    assert [(d.row, d.position) for d in result.exceedances][:1] == [("b", 9)]
    assert "greedy identity, float32" in str(report)


@pytest.fixture(scope="module")
def tiny_bf16(tiny):
    model = tiny_causal_lm(vocab_size=32, hidden_size=32, num_layers=2, seed=5).to(torch.bfloat16)
    return model, divergence.calibrate(model, PROMPTS, max_new_tokens=12, batch_sizes=(1, 3), float32_model=tiny)


def test_calibrate_measures_each_reference_in_reduced_precision(tiny_bf16):
    model, calibration = tiny_bf16
    assert calibration.shapes == ("batch1", "batch3") and calibration.dtype == "bfloat16"
    own, float32 = calibration.noise
    assert own.reference == "bfloat16 teacher-forced" and float32.reference == "float32 teacher-forced"
    for noise in calibration.noise:
        assert noise.positions == 2 * 3 * 12  # two shapes, three prompts, twelve tokens
        assert math.isfinite(noise.tau) and noise.tau == max(noise.max_margin_change, noise.max_gap)
        assert noise.tolerance == 2 * noise.tau  # floor 0: dense float logits
    assert float32.tau > 0 and float32.calibration.set_by == "trusted noise"  # bf16 against fp32 is never zero
    with pytest.raises(ValueError, match="batch_size"):
        divergence.greedy_decode(model, PROMPTS, max_new_tokens=4, batch_size=0)
    with pytest.raises(ValueError, match="safety_factor"):
        divergence.calibrate(model, PROMPTS, max_new_tokens=4, safety_factor=0.5)


def test_reduced_precision_identity_passes_plain_greedy_and_fails_a_corrupted_row(tiny, tiny_bf16):
    model, calibration = tiny_bf16
    runs = divergence.greedy_decode(model, PROMPTS, max_new_tokens=12, batch_size=2)  # another shape
    rows = [r.tokens for r in runs]
    report = divergence.check_identity(model, PROMPTS, rows, calibration=calibration, float32_model=tiny)
    assert report.passed, str(report)
    assert [r.reference for r in report.results] == ["bfloat16 teacher-forced", "float32 teacher-forced"]
    assert all(r.alpha == pytest.approx(0.5e-3) for r in report.results)  # Bonferroni over the references
    logits = divergence.teacher_forced(model, PROMPTS[2], rows[2])
    worst = int(logits[7].argmin())  # the token the target likes least at position 7
    rows[2] = rows[2].clone()
    rows[2][7] = worst
    report = divergence.check_identity(model, PROMPTS, rows, calibration=calibration, float32_model=tiny)
    assert not report.passed and report.exceedances >= 1


def test_check_identity_argument_errors(tiny, tiny_bf16):
    model, calibration = tiny_bf16
    rows = [torch.zeros(12, dtype=torch.int64)] * 3
    with pytest.raises(ValueError, match="calibration: a bfloat16 model needs"):
        divergence.check_identity(model, PROMPTS, rows)
    with pytest.raises(ValueError, match="float32_model: pass it exactly"):
        divergence.check_identity(model, PROMPTS, rows, calibration=calibration)
    with pytest.raises(ValueError, match="candidates: expected 3 rows"):
        divergence.check_identity(tiny, PROMPTS, rows[:2])
    with pytest.raises(ValueError, match="needs no calibration"):
        divergence.calibrate(tiny, PROMPTS, max_new_tokens=4)
