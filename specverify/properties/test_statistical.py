"""Sampled statistical checks of the implementation under test (``--specverify-impl``, default the reference).

Hypothesis draws the cases (toy chains, drafts per step, windows); every example runs one check of
``sampled_checks`` (the library's harness driving ``--specverify-impl`` through the SPEC §1 signature only,
completion by target sampling, Pearson or exact binomial tests against the exact target law).

Statistics (see ``budget.py``): each Hypothesis example is one test at level
``α = α_suite / M`` with the ``n`` that detects a TV deviation of ``budget.DETECTABLE_TV`` on the
tested cells with probability ``budget.POWER``.  Seeds are ``derive_seed`` of the check's name,
the drawn case and the run's base seed, never a Hypothesis integer.  Sampling with a token of
target probability 0 is a certain failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specverify.core.chains import PositionalChain
from specverify.core.seeding import derive_seed
from specverify.properties import budget
from specverify.properties.sampled_checks import (
    CheckOutcome,
    LoopCase,
    StepCase,
    run_acceptance_check,
    run_loop_check,
    run_step_check,
)
from specverify.testing.strategies import draft_target_pairs, markov_chains, positional_chains, probability_vectors

STATISTICAL_SETTINGS: dict[str, Any] = dict(
    deadline=None,
    database=None,
    # No shrinking: a search over failing examples would be a search for an unlucky draw.
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


# --------------------------------------------------------------------------------------------
# Hypothesis strategies of the checks' cases
# --------------------------------------------------------------------------------------------


@st.composite
def rejecting_chains(draw: st.DrawFn) -> PositionalChain:
    """Context-free steps with frequent rejection: TV(p_i, q_i) in [0.3, 0.9] at every position,
    ``V^(K+1) ≤ 81`` (K = 2..3)."""
    vocab, num_draft = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 3), (4, 2)]))
    distances = st.floats(0.3, 0.9)
    pairs = [draw(distances.flatmap(lambda tv: draft_target_pairs(vocab, relation="tv",
                                                                  tv=tv))) for _ in range(num_draft)]
    bonus = draw(probability_vectors(vocab))
    return PositionalChain(np.stack([p for p, _ in pairs] + [bonus]), np.stack([q for _, q in pairs]))


@st.composite
def loop_cases(draw: st.DrawFn) -> LoopCase:
    """Markov chains (V = 2..4, order 1..2, V^order ≤ 9), K = 1..3 drafts, L = 2..3 with V^L ≤ 64."""
    vocab, order = draw(st.sampled_from([(2, 1), (3, 1), (4, 1), (2, 2), (3, 2)]))
    chain = draw(markov_chains(vocab, order))
    length = draw(st.sampled_from([length for length in (2, 3) if vocab**length <= 64]))
    return LoopCase(chain, draw(st.integers(1, 3)), length)


@st.composite
def batched_cases(draw: st.DrawFn) -> StepCase:
    """R = 2..3 different requests (same V = 2..4, K = 1..2, V^(K+1) ≤ 64) interleaved in every batch."""
    vocab, num_draft = draw(st.sampled_from([(2, 1), (3, 1), (4, 1), (2, 2), (3, 2), (4, 2)]))
    chains = draw(st.lists(positional_chains(vocab, num_draft), min_size=2, max_size=3))
    return StepCase(tuple(chains), tuple(range(num_draft + 1)))


@st.composite
def long_draft_cases(draw: st.DrawFn) -> StepCase:
    """K = 4..8 drafts, the joint of all K+1 completed tokens (V^(K+1) ≤ 512)."""
    vocab, num_draft = draw(st.sampled_from([(2, 4), (2, 5), (2, 6), (2, 7), (2, 8), (3, 4)]))
    chain = draw(positional_chains(vocab, num_draft))
    return StepCase((chain,), tuple(range(num_draft + 1)))


def assert_check_passes(run: Callable[..., CheckOutcome], impl: Any, case: StepCase | LoopCase, *, test: str,
                        base_seed: int, suite_alpha: float, **name: str) -> None:
    """Run one check at the budget's per-execution level, seeded by the test's name and the drawn
    case; print its outcome and fail when it rejects."""
    alpha = budget.alpha_per_execution(suite_alpha)
    seed = derive_seed(test, case.key(), base=base_seed)
    outcome = run(impl, case, alpha=alpha, seed=seed, **name)
    print(outcome)
    assert not outcome.rejected, f"loss detected: {outcome}"


# --------------------------------------------------------------------------------------------
# The statistical tests (budgeted in budget.STATISTICAL_TESTS)
# --------------------------------------------------------------------------------------------


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_first_token_marginal"), **STATISTICAL_SETTINGS)
@given(chain=positional_chains(st.integers(2, 6), st.integers(1, 3)))
def test_first_token_marginal(chain, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """The first emitted token is distributed as p_0."""
    case = StepCase((chain,), (0,))
    assert_check_passes(run_step_check, specverify_impl, case, test="test_first_token_marginal",
                        base_seed=specverify_base_seed,
                        suite_alpha=specverify_suite_alpha, name="first_token_marginal")


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_step_joint_with_frequent_rejection"), **STATISTICAL_SETTINGS)
@given(chain=rejecting_chains())
def test_step_joint_with_frequent_rejection(chain, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """The completed K+1 tokens of one step are distributed as target sampling, with rejections (and
    so corrections) frequent at every position."""
    case = StepCase((chain,), tuple(range(chain.num_draft + 1)))
    assert_check_passes(run_step_check, specverify_impl, case, test="test_step_joint_with_frequent_rejection",
                        base_seed=specverify_base_seed,
                        suite_alpha=specverify_suite_alpha, name="step_joint")


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_bonus_position"), **STATISTICAL_SETTINGS)
@given(chain=positional_chains(st.integers(2, 6), st.integers(1, 4), relation="identical"))
def test_bonus_position(chain, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """With q_i = p_i every draft is accepted, so the token at position K is the bonus: law p_K."""
    case = StepCase((chain,), (chain.num_draft,))
    assert_check_passes(run_step_check, specverify_impl, case, test="test_bonus_position",
                        base_seed=specverify_base_seed,
                        suite_alpha=specverify_suite_alpha, name="bonus_position")


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_decoding_loop_joint"), **STATISTICAL_SETTINGS)
@given(case=loop_cases())
def test_decoding_loop_joint(case, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """The first L tokens of whole decoding loops (context-dependent targets, per-row state) are
    distributed as L tokens of target sampling."""
    assert_check_passes(run_loop_check, specverify_impl, case, test="test_decoding_loop_joint",
                        base_seed=specverify_base_seed,
                        suite_alpha=specverify_suite_alpha)


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_batched_rows_that_differ"), **STATISTICAL_SETTINGS)
@given(case=batched_cases())
def test_batched_rows_that_differ(case, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """In batches that interleave different requests every request's completed step has its own
    target law (no row reads another row's laws or randomness)."""
    assert_check_passes(run_step_check, specverify_impl, case, test="test_batched_rows_that_differ",
                        base_seed=specverify_base_seed,
                        suite_alpha=specverify_suite_alpha, name="batched_rows")


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_long_drafts"), **STATISTICAL_SETTINGS)
@given(case=long_draft_cases())
def test_long_drafts(case, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """K = 4..8 drafts: the completed K+1 tokens are distributed as target sampling."""
    assert_check_passes(run_step_check, specverify_impl, case, test="test_long_drafts", base_seed=specverify_base_seed,
                        suite_alpha=specverify_suite_alpha, name="long_drafts")


@pytest.mark.statistical
@settings(max_examples=budget.examples("test_acceptance_rate_is_one_minus_tv"), **STATISTICAL_SETTINGS)
@given(chain=positional_chains(st.integers(2, 6), 1))
def test_acceptance_rate_is_one_minus_tv(chain, specverify_impl, specverify_base_seed, specverify_suite_alpha):
    """A single draft x ~ q is accepted with probability Σ min(p, q) = 1 − TV(p, q)."""
    case = StepCase((chain,), (0,))
    assert_check_passes(run_acceptance_check, specverify_impl, case, test="test_acceptance_rate_is_one_minus_tv",
                        base_seed=specverify_base_seed,
                        suite_alpha=specverify_suite_alpha)
