"""specverify.core.greedy_identity: whole-sequence greedy identity on hand-built scores.

The logits pin the rule exactly: every position is judged (a near-tie first divergence hides
nothing after it), exceedances over the tolerance fail, tolerance 0 is exact identity, the
divergent-positions test is Fisher's exact test against the noise sample, and the tolerance is
set by the trusted noise's maximum and the candidate's upper decile.  Runtime: < 1 s.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import hypergeom

from specverify.core.greedy_identity import (
    SAFETY_FACTOR,
    divergent_positions_pvalue,
    judge,
    noise_tolerance,
    score_laws,
    score_logits,
)
from specverify.core.seeding import derive_seed

# Four positions over a vocabulary of 4, teacher-forced on the candidate's own prefix.  Position 0
# is a near tie (margin 0.1); position 2's runner-up trails by 0.3, its third token by 2.0.
LOGITS = torch.tensor([
    [3.0, 2.9, 0.0, 0.0],
    [5.0, 1.0, 0.0, 0.0],
    [4.0, 0.0, 3.7, 2.0],
    [0.0, 0.0, 0.0, 6.0],
])
GREEDY = torch.tensor([0, 0, 0, 3])


def test_the_greedy_row_has_no_gap_and_passes_exactly():
    row = score_logits("p", GREEDY, LOGITS)
    assert row.gaps.tolist() == [0.0] * 4 and row.best == (0, 0, 0, 3)
    assert row.margins == pytest.approx([0.1, 4.0, 0.3, 6.0])
    result = judge([row], tolerance=0.0)
    assert result.passed and result.positions == 4 and not result.first_divergences
    assert result.explainable_fraction == 0.0


def test_a_near_tie_first_divergence_does_not_hide_a_later_error():
    """The issue-21 failure: the first wrong token is a near tie (explained), and the row goes on to
    emit a token the target scores 4 nats below its own, which a first-divergence rule never saw."""
    candidate = torch.tensor([1, 1, 0, 3])
    result = judge([score_logits("p", candidate, LOGITS)], tolerance=0.25)
    first, = result.first_divergences
    assert (first.position, first.target_token, first.candidate_token, first.explained) == (0, 0, 1, True)
    assert first.gap == pytest.approx(0.1)
    exceedance, = result.exceedances
    assert (exceedance.position, exceedance.gap) == (1, pytest.approx(4.0)) and not exceedance.explained
    assert not result.passed and result.divergent == 2
    assert "UNEXPLAINED" in str(result) and "position 1" in str(result)


def test_the_gap_of_the_chosen_token_decides_not_the_top2_margin():
    """At position 2 the top-2 margin is 0.3 (within the tolerance 0.5), but the row took the third token."""
    result = judge([score_logits("p", torch.tensor([0, 0, 3, 3]), LOGITS)], tolerance=0.5)
    exceedance, = result.exceedances
    assert exceedance.margin == pytest.approx(0.3) and exceedance.gap == pytest.approx(2.0)
    assert result.explainable_fraction == pytest.approx(2 / 4)  # positions 0 and 2 have margin <= 0.5


def test_float32_identity_is_exact():
    result = judge([score_logits("p", torch.tensor([1, 0, 0, 3]), LOGITS)], tolerance=0.0)
    assert not result.passed and len(result.exceedances) == 1  # the near tie is an error at tolerance 0


def test_divergences_within_the_tolerance_pass_while_rounding_explains_their_number():
    noise_gaps = np.zeros(400)
    noise_gaps[:8] = 0.05  # plain greedy flipped 8 of 400 positions
    rows = [score_logits(f"r{i}", torch.tensor([1, 0, 0, 3]) if i < 2 else GREEDY, LOGITS) for i in range(50)]
    result = judge(rows, tolerance=0.25, noise_gaps=noise_gaps)
    assert result.passed and result.divergent == 2 and (result.noise_divergent, result.noise_positions) == (8, 400)
    assert result.pvalue == pytest.approx(float(hypergeom.sf(1, 600, 10, 200)))


def test_too_many_explained_divergences_fail():
    """A decoder that takes the runner-up at every near tie: each gap is within τ, their number is not."""
    noise_gaps = np.zeros(400)
    noise_gaps[:2] = 0.05
    rows = [score_logits(f"r{i}", torch.tensor([1, 0, 2, 3]), LOGITS) for i in range(20)]
    result = judge(rows, tolerance=0.5, noise_gaps=noise_gaps)
    assert not result.exceedances and result.divergent == 40
    assert result.pvalue < 1e-12 and not result.passed


def test_a_gap_the_references_own_tokens_reach_is_no_exceedance():
    """The reference's own greedy tokens, scored the same way, reach gaps past the tolerance (a
    re-scoring path that disagrees with the reference's decoding, e.g. llama.cpp's AMX kernels for
    batches of 32 tokens or more): such a gap is explained, a larger one is still an exceedance,
    and where the reference's own token falls outside the scored alternatives only the
    divergent-positions test judges."""
    candidate = [score_logits("p", torch.tensor([0, 1, 0, 3]), LOGITS)]  # position 1: gap 4.0
    noise_gaps = np.zeros(400)
    noise_gaps[:6] = [0.05, 0.1, 4.5, 0.02, 0.3, 0.01]
    widened = judge(candidate, tolerance=0.25, noise_gaps=noise_gaps)
    assert widened.threshold == 4.5 and not widened.exceedances and widened.passed
    assert "reach a gap of 4.5" in str(widened)
    noise_gaps[2] = 3.0
    narrower = judge(candidate, tolerance=0.25, noise_gaps=noise_gaps)
    assert [d.position for d in narrower.exceedances] == [1] and not narrower.passed
    noise_gaps[2] = math.inf
    unbounded = judge(candidate, tolerance=0.25, noise_gaps=noise_gaps)
    assert not unbounded.exceedances and unbounded.passed and "only the divergent-positions test" in str(unbounded)
    many = judge([score_logits(f"r{i}", torch.tensor([0, 1, 0, 3]), LOGITS) for i in range(20)], tolerance=0.25,
                 noise_gaps=noise_gaps)
    assert not many.exceedances and many.pvalue < 1e-9 and not many.passed  # 20 of 80 against 6 of 400


def test_divergent_positions_pvalue_is_the_hypergeometric_tail():
    """Under exchangeability (candidate and noise positions one random split of all positions), the
    simulated frequency of X ≥ x matches the p-value."""
    assert divergent_positions_pvalue(0, 50, 3, 100) == 1.0
    assert divergent_positions_pvalue(4, 50, 0, 0) == 1.0  # no noise sample: nothing to compare
    rng = np.random.default_rng(derive_seed("greedy-identity-hypergeom"))
    flips = np.zeros(150, dtype=bool)
    flips[:9] = True
    counts = np.array([rng.permutation(flips)[:50].sum() for _ in range(20000)])
    assert np.mean(counts >= 6) == pytest.approx(divergent_positions_pvalue(6, 50, 3, 100), abs=0.004)


def test_scores_from_sparse_laws():
    laws = [{"a": -0.1, "b": -2.5}, None, {"a": -1.0, "b": -1.05}, {"x": -0.2, "y": -3.0}]
    row = score_laws("p", ["a", "b", "b", "z"], laws)
    assert row.positions.tolist() == [0, 2, 3]  # position 1 has no law: not compared
    assert row.best == ("a", "a", "x") and row.tokens == ("a", "b", "z")
    assert row.gaps[0] == 0.0 and row.gaps[1] == pytest.approx(0.05) and math.isinf(row.gaps[2])
    result = judge([row], tolerance=0.1)
    exceedance, = result.exceedances
    assert exceedance.position == 3 and "beyond the scored alternatives" in exceedance.describe()


@pytest.mark.parametrize("kwargs, message", [
    (dict(tolerance=-1.0), "tolerance: expected >= 0"),
    (dict(tolerance=float("nan")), "tolerance: expected >= 0"),
    (dict(tolerance=0.1, alpha=0.0), "alpha: expected a level"),
])
def test_judge_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        judge([score_logits("p", GREEDY, LOGITS)], **kwargs)


def test_score_logits_needs_one_row_per_token():
    with pytest.raises(ValueError, match=r"logits: expected \[3, V\]"):
        score_logits("p", GREEDY[:3], LOGITS)


def test_a_single_outlying_candidate_deviation_cannot_widen_the_tolerance():
    """The candidate's deviations enter by their upper decile, which ignores the largest
    ⌊0.1 (n − 1)⌋ of n = 31 (three): one position 50 nats off leaves the tolerance where it was."""
    trusted = np.full(200, 0.01)
    candidate = np.linspace(0.0, 0.2, 31)
    outlying = candidate.copy()
    outlying[-1] = 50.0
    plain, attacked = noise_tolerance(trusted, candidate), noise_tolerance(trusted, outlying)
    assert attacked.tolerance == plain.tolerance == SAFETY_FACTOR * np.quantile(candidate, 0.9)
    assert attacked.set_by == "candidate deviations" and attacked.candidate_quantile == pytest.approx(0.18)


def test_the_trusted_noise_enters_by_its_maximum():
    """One trusted value is a value a lossless run reached: it sets τ however rare it is."""
    trusted = np.r_[np.full(400, 0.01), 0.3]
    result = noise_tolerance(trusted, np.full(50, 0.05))
    assert (result.tau, result.tolerance, result.set_by) == (0.3, 0.6, "trusted noise")
    assert (result.trusted_positions, result.candidate_positions) == (401, 50)
    assert noise_tolerance(trusted, safety_factor=3.0).tolerance == pytest.approx(0.9)


def test_the_floor_bounds_the_tolerance_from_below():
    assert noise_tolerance(floor=1e-4).tolerance == 1e-4 and noise_tolerance().tolerance == 0.0  # nothing measured
    small = noise_tolerance([1e-6, 2e-5], [3e-5], floor=1e-4)
    assert (small.tau, small.tolerance, small.set_by) == (3e-5, 1e-4, "floor")
    assert noise_tolerance([0.1], floor=1e-4).tolerance == 0.2


@pytest.mark.parametrize("kwargs, message", [
    (dict(safety_factor=0.5), "safety_factor: expected >= 1"),
    (dict(floor=-1e-4), "floor: expected a finite value >= 0"),
    (dict(trusted=[0.1, float("inf")]), "trusted: expected finite noise values >= 0"),
    (dict(candidate=[-0.1]), "candidate: expected finite noise values >= 0"),
])
def test_noise_tolerance_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        noise_tolerance(**kwargs)
