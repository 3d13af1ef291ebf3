"""Unit tests of specverify.core.stats: pooling, the p-value paths, power and sample size, budgets.

Sampled checks are marked ``statistical``; each one states its own level (``CHECK_ALPHA``, split
by Bonferroni over its assertions) and derives its seed from its parameters and the run's base
seed, so ``--specverify-seed random`` measures their false-positive rate.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from specverify.core import stats
from specverify.core.seeding import derive_seed
from specverify.core.stats import (
    Budget,
    binomial_power,
    binomial_sample_size,
    binomial_test,
    bonferroni,
    detectable_tv,
    goodness_of_fit,
    holm,
    homogeneity_sample_size,
    pool_cells,
    power_at,
    sample_size_for_tv,
    two_sample_test,
)

CHECK_ALPHA = 1e-3  # false-positive level of each sampled check in this file
POWER_SLACK = 0.02  # the noncentral-χ² power is an approximation; allow this much below the target
LEVEL_SLACK = 1.2  # ... and this relative excess of the asymptotic test's level


def half_mass_alternative(probs: np.ndarray, up: np.ndarray, epsilon: float) -> np.ndarray:
    """p' = p (1 ± 2ε), + on the cells ``up`` (mass ½), − elsewhere: TV(p, p') = ε and
    n Σ (p' − p)² / p = 4nε² exactly, the worst case of the Cauchy–Schwarz bound."""
    assert math.isclose(probs[up].sum(), 0.5)
    signs = np.where(up, 1.0, -1.0)
    return probs * (1.0 + 2.0 * epsilon * signs)


def rejection_count(probs: np.ndarray, sampling_probs: np.ndarray, n: int, reps: int, alpha: float, seed: int,
                    **kwargs: object) -> int:
    rng = np.random.default_rng(seed)
    samples = rng.multinomial(n, sampling_probs, size=reps)
    return sum(goodness_of_fit(x, probs, seed=seed + i, **kwargs).pvalue <= alpha for i, x in enumerate(samples))


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expected", "min_expected", "groups"),
    [
        ([20, 12, 4, 2, 2], 5, [[2, 3, 4], [1], [0]]),  # 2+2 < 5, +4 closes; the rest alone
        ([3, 3, 3], 5, [[0, 1, 2]]),  # 3+3 closes, leftover 3 < 5 merges back
        ([1.0] * 10, 5, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]),  # ties broken by index
        ([7, 0.5, 2, 0.5], 1, [[1, 3], [2], [0]]),
        ([0.5, 9.5], 5, [[0, 1]]),  # one dominant cell: a single group
        ([10, 20, 30], 5, [[0], [1], [2]]),  # nothing to pool
    ],
)
def test_pool_cells_hand_cases(expected: list[float], min_expected: float, groups: list[list[int]]) -> None:
    assert pool_cells(np.asarray(expected, dtype=float), min_expected) == groups


def test_pooled_statistic_on_a_hand_case() -> None:
    probs = [0.5, 0.3, 0.1, 0.05, 0.05]  # n = 40: expected 20, 12, 4, 2, 2
    result = goodness_of_fit([18, 14, 3, 3, 2], probs)
    assert result.method == "asymptotic"
    assert result.pooled_cells == ((2, 3, 4),)
    assert result.dof == 2
    statistic = (18 - 20) ** 2 / 20 + (14 - 12) ** 2 / 12 + (8 - 8) ** 2 / 8
    assert result.statistic == pytest.approx(statistic, rel=1e-12)
    assert result.pvalue == pytest.approx(sps.chi2.sf(statistic, 2), rel=1e-12)
    assert result.empirical_tv == pytest.approx(0.5 * (2 + 2 + 1 + 1 + 0) / 40)


def test_pooling_depends_only_on_expected_counts() -> None:
    rng = np.random.default_rng(derive_seed("pooling-observed-independent"))
    probs = rng.dirichlet(np.full(40, 0.3))
    n = 120
    reference = goodness_of_fit(rng.multinomial(n, probs), probs)
    assert reference.pooled_cells  # the case does pool
    for observed in [rng.multinomial(n, probs) for _ in range(20)] + [np.eye(40, dtype=int)[0] * n]:
        result = goodness_of_fit(observed, probs)
        assert (result.pooled_cells, result.dof, result.method) == (
            reference.pooled_cells, reference.dof, reference.method
        )


# --------------------------------------------------------------------------------------------
# Verdicts, inputs and the statistic
# --------------------------------------------------------------------------------------------


def test_impossible_cell_is_certain_failure() -> None:
    result = goodness_of_fit([3, 4, 1], [0.5, 0.5, 0.0])
    assert result.method == "impossible-cell"
    assert result.pvalue == 0.0 and result.statistic == math.inf
    assert result.impossible_count == 1
    assert result.empirical_tv == pytest.approx(0.5 * (abs(3 / 8 - 0.5) + abs(4 / 8 - 0.5) + 1 / 8))
    assert "certain failure" in str(result)


def test_empty_zero_probability_cells_are_ignored() -> None:
    with_zero = goodness_of_fit([30, 41, 0], [0.5, 0.5, 0.0])
    without = goodness_of_fit([30, 41], [0.5, 0.5])
    fields = ("statistic", "pvalue", "method", "dof")
    assert [getattr(with_zero, f) for f in fields] == [getattr(without, f) for f in fields]
    assert with_zero.impossible_count == 0


def test_dict_input_matches_array_input() -> None:
    observed = {"a": 30, "b": 25, "c": 5, "d": 0}
    probs = {"c": 0.1, "a": 0.5, "b": 0.4}  # "d" is missing: probability 0, but empty
    from_dict = goodness_of_fit(observed, probs)
    from_array = goodness_of_fit([5, 30, 25], [0.1, 0.5, 0.4])
    fields = ("statistic", "pvalue", "dof", "method", "empirical_tv")
    assert [getattr(from_dict, f) for f in fields] == [getattr(from_array, f) for f in fields]
    impossible = goodness_of_fit({"a": 30, "b": 25, "z": 2}, {"a": 0.5, "b": 0.5})
    assert impossible.method == "impossible-cell" and impossible.impossible_count == 2


def test_dict_labels_name_pooled_cells() -> None:
    probs = {"x": 0.9, "y": 0.05, "z": 0.05}  # n = 100: expected 90, 5, 5
    result = goodness_of_fit({"x": 88, "y": 7, "z": 5}, probs, min_expected=6)
    assert result.pooled_cells == (("y", "z"),)


def test_pearson_matches_scipy_chisquare() -> None:
    observed = np.array([48, 62, 37, 71, 52])
    probs = np.array([0.2, 0.25, 0.15, 0.25, 0.15])
    result = goodness_of_fit(observed, probs)
    reference = sps.chisquare(observed, observed.sum() * probs)
    assert result.pooled_cells == () and result.dof == 4
    assert result.statistic == pytest.approx(reference.statistic, rel=1e-12)
    assert result.pvalue == pytest.approx(reference.pvalue, rel=1e-10)


@pytest.mark.parametrize(
    ("statistic", "scipy_lambda"),
    [("g", "log-likelihood"), (0.0, "log-likelihood"), (2 / 3, "cressie-read"), (-0.5, "freeman-tukey"),
     (1.0, "pearson")],
)
def test_power_divergence_matches_scipy(statistic: str | float, scipy_lambda: str) -> None:
    observed = np.array([48, 62, 37, 71, 52])
    probs = np.array([0.2, 0.25, 0.15, 0.25, 0.15])
    result = goodness_of_fit(observed, probs, statistic=statistic)
    reference = sps.power_divergence(observed, observed.sum() * probs, lambda_=scipy_lambda)
    assert result.statistic == pytest.approx(reference.statistic, rel=1e-10)
    assert result.pvalue == pytest.approx(reference.pvalue, rel=1e-8)


def test_g_statistic_with_empty_cells_is_finite() -> None:
    result = goodness_of_fit([60, 40, 0], [0.5, 0.4, 0.1], statistic="g")
    reference = sps.power_divergence([60, 40, 0], [50, 40, 10], lambda_="log-likelihood")
    assert result.statistic == pytest.approx(reference.statistic, rel=1e-12)


# --------------------------------------------------------------------------------------------
# Exact and Monte-Carlo paths
# --------------------------------------------------------------------------------------------


def test_exact_path_matches_binomial_enumeration() -> None:
    n, p = 9, 0.3  # expected 6.3 and 2.7: one group, so the exact path
    result = goodness_of_fit([1, 8], [p, 1 - p])
    assert result.method == "exact"
    support = np.arange(n + 1)
    pmf = sps.binom.pmf(support, n, p)
    at_least_as_far = np.abs(support - n * p) >= abs(1 - n * p) - 1e-12  # Pearson is monotone in |x − np|
    assert result.pvalue == pytest.approx(pmf[at_least_as_far].sum(), rel=1e-12)


def test_single_possible_cell_has_pvalue_one() -> None:
    result = goodness_of_fit([12, 0, 0], [1.0, 0.0, 0.0])
    assert result.method == "exact" and result.pvalue == pytest.approx(1.0)


def test_monte_carlo_path_is_deterministic_for_a_seed() -> None:
    probs = np.array([0.95] + [0.05 / 40] * 40)  # 60 samples: 3 expected outside the big cell
    observed = np.zeros(41, dtype=int)
    observed[0], observed[[3, 7, 9, 11]] = 56, 1
    first = goodness_of_fit(observed, probs, seed=11, monte_carlo_draws=2_000)
    again = goodness_of_fit(observed, probs, seed=11, monte_carlo_draws=2_000)
    other = goodness_of_fit(observed, probs, seed=12, monte_carlo_draws=2_000)
    assert first.method == "monte-carlo" and first.pooled_cells == ()
    assert first == again
    assert first.pvalue != other.pvalue
    assert abs(first.pvalue - other.pvalue) < 0.08  # p ≈ 0.38: 0.08 is 5 standard errors of the difference


@pytest.mark.statistical
def test_monte_carlo_agrees_with_exact(monkeypatch: pytest.MonkeyPatch, specverify_base_seed: int) -> None:
    """The Monte-Carlo p-value is within 5 standard errors of the exact one (level ≈ 6e-7)."""
    observed, probs = [5, 1, 2], [0.6, 0.3, 0.1]  # n = 8: a single group
    exact = goodness_of_fit(observed, probs)
    monkeypatch.setattr(stats, "EXACT_MAX_OUTCOMES", 1)
    draws = 20_000
    seed = derive_seed("mc-vs-exact", base=specverify_base_seed)
    sampled = goodness_of_fit(observed, probs, monte_carlo_draws=draws, seed=seed)
    assert (exact.method, sampled.method) == ("exact", "monte-carlo")
    standard_error = math.sqrt(exact.pvalue * (1 - exact.pvalue) / draws)
    assert abs(sampled.pvalue - exact.pvalue) < 5 * standard_error + 1 / draws


def _borderline_table() -> tuple[np.ndarray, np.ndarray]:
    """50 cells of expected count 5 (n = 250) and X² = 103.6: χ²₄₉'s tail gives 8.7e-6, while the
    multinomial's own tail at that value is ≈ 1.8e-5 (Pearson's X² is liberal this far out)."""
    counts = np.full(50, 5)
    counts[[0, 1, 2, 36, 37]] += [18, 12, 3, 2, -2]
    counts[3:36] -= 1
    return counts, np.full(50, 1 / 50)


def test_asymptotic_rejection_stands_only_when_a_valid_test_confirms_it() -> None:
    """At level 1e-5 the χ² tail rejects the borderline table; the Monte-Carlo p-value of the same
    pooled table does not (≥ 1.5e-5), so the confirmed test passes and says why."""
    counts, probs = _borderline_table()
    plain = goodness_of_fit(counts, probs)
    assert plain.method == "asymptotic" and 8e-6 < plain.pvalue < 1e-5
    level = 1e-5
    confirmed = goodness_of_fit(counts, probs, seed=0, monte_carlo_draws=stats.monte_carlo_draws(level),
                                confirm_below=level)
    assert confirmed.method == "monte-carlo" and confirmed.confirmed_by == ""
    assert confirmed.pvalue > level
    assert goodness_of_fit(counts, probs, confirm_below=1e-6) == plain  # above the level: nothing to confirm


def test_gross_and_moderate_rejections_are_confirmed() -> None:
    """A gross deviation is confirmed by the relative-entropy bound without simulation, at a level
    (1e-9) no Monte-Carlo run could reach; a moderate one (asymptotic p 1.5e-10, bound above the
    level) by the Monte-Carlo p-value; both keep the χ² p-value."""
    probs = np.full(10, 0.1)
    gross = goodness_of_fit([400] + [0] * 9, probs, confirm_below=1e-9)
    assert (gross.method, gross.confirmed_by) == ("asymptotic", "relative-entropy-bound")
    moderate_counts = np.array([70, 30, 25, 28, 31, 29, 27, 22, 20, 18])
    moderate = goodness_of_fit(moderate_counts, probs, seed=3, monte_carlo_draws=stats.monte_carlo_draws(1e-5),
                               confirm_below=1e-5)
    assert stats.relative_entropy_tail_bound(moderate_counts, probs) > 1e-5 * stats.BOUND_SHARE
    assert (moderate.method, moderate.confirmed_by) == ("asymptotic", "monte-carlo")
    assert moderate.pvalue == goodness_of_fit(moderate_counts, probs).pvalue


def test_a_capped_simulation_leaves_the_confirmation_to_the_bound_at_the_whole_level() -> None:
    """With fewer entries allowed than draws × groups, nothing is simulated: the moderate table
    (asymptotic p 1.5e-10, bound 6.3e-4) is confirmed by the bound at twice the bound, a level whose
    bound share alone would not confirm it; at half the bound it is not confirmed and its p-value
    is the bound, where the simulation would have confirmed it."""
    probs = np.full(10, 0.1)
    counts = np.array([70, 30, 25, 28, 31, 29, 27, 22, 20, 18])
    bound = stats.relative_entropy_tail_bound(counts, probs)
    level = 2 * bound
    capped = dict(seed=3, monte_carlo_draws=stats.monte_carlo_draws(level), monte_carlo_max_entries=10)
    at_whole_level = goodness_of_fit(counts, probs, confirm_below=level, **capped)
    assert bound > level * stats.BOUND_SHARE  # the bound's share alone would not confirm
    assert (at_whole_level.method, at_whole_level.confirmed_by) == ("asymptotic", "relative-entropy-bound")
    below_bound = goodness_of_fit(counts, probs, confirm_below=bound / 2, **capped)
    assert below_bound.method == "relative-entropy-bound" and below_bound.pvalue == bound > bound / 2
    simulated = goodness_of_fit(counts, probs, confirm_below=bound / 2, seed=3,
                                monte_carlo_draws=stats.monte_carlo_draws(bound / 2))
    assert (simulated.method, simulated.confirmed_by) == ("asymptotic", "monte-carlo")


@pytest.mark.parametrize("probs", [[0.25] * 4, [0.5, 0.3, 0.15, 0.05], [0.9, 0.06, 0.03, 0.01]])
def test_relative_entropy_bound_holds_against_exact_enumeration(probs: list[float]) -> None:
    """For every outcome of multinomial(30, p) on 4 cells, the bound is at least the exact
    P(n·D(p̂ ‖ p) ≥ n·D_obs), summed over all C(33, 3) = 5,456 outcomes; and it is below 1e-6
    for the outcomes far in the tail, so it is not vacuous."""
    p, n = np.array(probs), 30
    outcomes = np.array([[a, b, c, n - a - b - c] for a in range(n + 1) for b in range(n + 1 - a)
                         for c in range(n + 1 - a - b)])
    divergence = (outcomes * np.log(np.where(outcomes > 0, outcomes / (n * p), 1.0))).sum(axis=1)
    pmf = np.exp(sps.multinomial.logpmf(outcomes, n, p))
    bounds = np.array([stats.relative_entropy_tail_bound(x, p) for x in outcomes])
    exact_tail = np.array([pmf[divergence >= d - 1e-9].sum() for d in divergence])
    assert np.all(bounds >= exact_tail * (1 - 1e-9))
    assert bounds.min() < 1e-6


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("observed", "probs", "kwargs", "argument"),
    [
        ([3, -1], [0.5, 0.5], {}, "observed"),
        ([3, 1.5], [0.5, 0.5], {}, "observed"),
        ([0, 0], [0.5, 0.5], {}, "observed"),
        ([3, 1], [0.5, 0.6], {}, "expected_probs"),
        ([3, 1], [1.5, -0.5], {}, "expected_probs"),
        ([3, 1], [0.5, 0.5 - 1e-6], {}, "expected_probs"),
        ([3, 1, 2], [0.5, 0.5], {}, "length mismatch"),
        ({"a": 1}, [1.0], {}, "both as dicts"),
        ([3, 1], [0.5, 0.5], {"statistic": "chi"}, "statistic"),
        ([3, 1], [0.5, 0.5], {"statistic": -1.0}, "statistic"),
        ([3, 1], [0.5, 0.5], {"min_expected": 0}, "min_expected"),
        ([3, 1], [0.5, 0.5], {"monte_carlo_draws": 0}, "monte_carlo_draws"),
    ],
)
def test_goodness_of_fit_errors_name_the_argument(observed, probs, kwargs, argument) -> None:
    with pytest.raises(ValueError, match=argument):
        goodness_of_fit(observed, probs, **kwargs)


def test_probabilities_within_tolerance_are_accepted() -> None:
    probs = np.full(1000, 1e-3)
    probs[0] += 5e-7  # off by 5e-7 < 1e-9 · 1000 = 1e-6
    assert goodness_of_fit(np.full(1000, 10), probs).method == "asymptotic"


def test_str_is_readable() -> None:
    text = str(goodness_of_fit([18, 14, 3, 3, 2], [0.5, 0.3, 0.1, 0.05, 0.05]))
    for fragment in ("pearson", "p-value=", "[asymptotic]", "n=40", "pooled 1 group(s): (2, 3, 4)"):
        assert fragment in text


# --------------------------------------------------------------------------------------------
# Power and sample size
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_cells", [2, 10, 1000])
@pytest.mark.parametrize("epsilon", [0.1, 0.01])
def test_sample_size_and_detectable_tv_are_inverse(num_cells: int, epsilon: float) -> None:
    level = dict(alpha=1e-4, power=0.99, num_cells=num_cells)
    n = sample_size_for_tv(epsilon, **level)
    assert power_at(n, epsilon, alpha=1e-4, num_cells=num_cells) >= 0.99
    assert power_at(n - 1, epsilon, alpha=1e-4, num_cells=num_cells) < 0.99
    assert detectable_tv(n, **level) <= epsilon < detectable_tv(n - 1, **level)
    assert sample_size_for_tv(detectable_tv(n, **level), **level) == n


def test_sample_size_monotonicity() -> None:
    base = dict(alpha=1e-3, power=0.95, num_cells=50)
    n = sample_size_for_tv(0.02, **base)
    assert sample_size_for_tv(0.01, **base) > n  # smaller deviations need more samples
    assert sample_size_for_tv(0.02, **{**base, "num_cells": 500}) > n  # more cells, more dof
    assert sample_size_for_tv(0.02, **{**base, "power": 0.99}) > n
    assert sample_size_for_tv(0.02, **{**base, "alpha": 1e-5}) > n
    assert detectable_tv(4 * n, **base) < detectable_tv(n, **base)
    assert power_at(2 * n, 0.02, alpha=1e-3, num_cells=50) > power_at(n, 0.02, alpha=1e-3, num_cells=50)


def test_sample_size_is_the_noncentrality_over_four_epsilon_squared() -> None:
    """n = ⌈λ*/(4ε²)⌉ with λ* solving P(χ'²_9(λ*) > χ²_{9,0.95}) = 0.9, computed here with scipy."""
    critical = sps.chi2.isf(0.05, 9)
    needed = optimize.brentq(lambda lam: sps.ncx2.sf(critical, 9, lam) - 0.9, 1e-6, 100, xtol=1e-12)
    assert sample_size_for_tv(0.1, alpha=0.05, power=0.9, num_cells=10) == math.ceil(needed / (4 * 0.1**2))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        (dict(epsilon=0.0, alpha=0.05, power=0.9, num_cells=10), "epsilon"),
        (dict(epsilon=0.1, alpha=1.5, power=0.9, num_cells=10), "alpha"),
        (dict(epsilon=0.1, alpha=0.05, power=0.01, num_cells=10), "power"),
        (dict(epsilon=0.1, alpha=0.05, power=0.9, num_cells=1), "num_cells"),
    ],
)
def test_sample_size_errors_name_the_argument(kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        sample_size_for_tv(**kwargs)


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("probs", "up"),
    [
        (np.full(10, 0.1), np.arange(10) < 5),
        (np.array([0.3, 0.2, 0.25, 0.15, 0.1]), np.array([True, True, False, False, False])),
        (np.full(40, 1 / 40), np.arange(40) % 2 == 0),
    ],
    ids=["uniform-10", "skewed-5", "uniform-40"],
)
def test_empirical_power_and_level(probs: np.ndarray, up: np.ndarray, specverify_base_seed: int) -> None:
    """At n = sample_size_for_tv(ε, α=0.05, power=0.9) the worst-case TV-ε alternative is rejected
    in ≥ 0.9 − POWER_SLACK of the runs, and the null (ε = 0) in ≤ α·LEVEL_SLACK; each bound is
    checked by a one-sided exact binomial test at CHECK_ALPHA / 2."""
    alpha, target, epsilon, reps = 0.05, 0.9, 0.1, 300
    n = sample_size_for_tv(epsilon, alpha=alpha, power=target, num_cells=probs.size)
    budget = Budget(CHECK_ALPHA, 2)
    seed = derive_seed("empirical-power", probs.tolist(), base=specverify_base_seed)
    alternative = half_mass_alternative(probs, up, epsilon)
    hits = rejection_count(probs, alternative, n, reps, alpha, seed)
    false_hits = rejection_count(probs, probs, n, reps, alpha, seed + 1)
    print(f"\n{probs.size} cells, n={n}: power {hits / reps:.3f} (target {target}), "
          f"level {false_hits / reps:.3f} (α {alpha})")
    assert not budget.rejects(binomial_test(hits, reps, target - POWER_SLACK, "less").pvalue)
    assert not budget.rejects(binomial_test(false_hits, reps, alpha * LEVEL_SLACK, "greater").pvalue)


@pytest.mark.statistical
def test_catches_a_buggy_rejection_sampler(specverify_base_seed: int) -> None:
    """A known bug: resampling from p instead of the residual max(0, p − q) after a rejection.
    Its output law is min(p, q) + (1 − α) p ≠ p; with n = sample_size_for_tv(TV, α=1e-3,
    power=0.999) the test rejects it, while the correct law passes."""
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    acceptance = np.minimum(p, q).sum()
    buggy = np.minimum(p, q) + (1 - acceptance) * p
    tv = 0.5 * np.abs(buggy - p).sum()
    n = sample_size_for_tv(tv, alpha=1e-3, power=0.999, num_cells=4)
    rng = np.random.default_rng(derive_seed("buggy-residual", base=specverify_base_seed))
    buggy_result = goodness_of_fit(rng.multinomial(n, buggy), p)
    correct_result = goodness_of_fit(rng.multinomial(n, p), p)
    print(f"\nTV(buggy, p) = {tv:.4f}, n = {n}: buggy {buggy_result}\ncorrect {correct_result}")
    assert buggy_result.pvalue <= 1e-3
    assert correct_result.pvalue > CHECK_ALPHA


def test_homogeneity_sample_size_is_about_twice_the_one_sample_size() -> None:
    one = sample_size_for_tv(0.03, alpha=1e-3, power=0.95, num_cells=20)
    two = homogeneity_sample_size(0.03, alpha=1e-3, power=0.95, num_cells=20)
    assert abs(two - 2 * one) <= 2


# --------------------------------------------------------------------------------------------
# Binomial test and its sample size
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("delta", "p0"), [(0.05, 0.5), (0.02, 0.9), (0.1, 0.0), (0.01, 0.3)])
def test_binomial_sample_size_achieves_power(delta: float, p0: float) -> None:
    n = binomial_sample_size(delta, p0=p0, alpha=1e-3, power=0.95)
    assert binomial_power(n, delta, p0=p0, alpha=1e-3) >= 0.95
    assert n == 1 or binomial_power(n - 1, delta, p0=p0, alpha=1e-3) < 0.95


def test_binomial_power_uses_the_binomial_test_rejection_region() -> None:
    n, p0, alpha = 200, 0.6, 1e-3
    rejects = [binomial_test(k, n, p0, "greater").pvalue <= alpha for k in range(n + 1)]
    critical = rejects.index(True)
    assert all(rejects[critical:]) and not any(rejects[:critical])
    assert binomial_power(n, 0.1, p0=p0, alpha=alpha) == pytest.approx(sps.binom.sf(critical - 1, n, 0.7), rel=1e-12)


def test_binomial_test_matches_scipy_and_reports_clopper_pearson() -> None:
    result = binomial_test(60, 100, 0.5, "two-sided")
    reference = sps.binomtest(60, 100, 0.5)
    assert result.pvalue == pytest.approx(reference.pvalue)
    assert result.estimate == 0.6
    assert result.ci_low < 0.6 < result.ci_high
    # Clopper–Pearson endpoints are beta quantiles
    assert result.ci_low == pytest.approx(sps.beta.ppf(0.025, 60, 41))
    assert result.ci_high == pytest.approx(sps.beta.ppf(0.975, 61, 40))
    greater = binomial_test(60, 100, 0.5, "greater")
    assert greater.ci_high == 1.0 and greater.pvalue == pytest.approx(sps.binom.sf(59, 100, 0.5))
    assert "Clopper–Pearson" in str(greater)


@pytest.mark.parametrize("alternative", ["greater", "less"])
@pytest.mark.parametrize(("k", "n", "p"), [(0, 10, 0.3), (10, 10, 0.3), (3, 10, 0.3), (61, 100, 0.5),
                                           (2, 1_000, 1e-4), (990, 1_000, 0.999), (5, 7, 0.0), (5, 7, 1.0)])
def test_one_sided_binomial_test_equals_scipys(k: int, n: int, p: float, alternative: str) -> None:
    """The one-sided tails and Clopper–Pearson bounds (scipy.special) against scipy.stats.binomtest."""
    result = binomial_test(k, n, p, alternative, confidence_level=0.9)
    reference = sps.binomtest(k, n, p, alternative=alternative)
    interval = reference.proportion_ci(confidence_level=0.9, method="exact")
    assert result.pvalue == pytest.approx(reference.pvalue, rel=1e-9, abs=1e-300)
    assert (result.ci_low, result.ci_high) == pytest.approx((interval.low, interval.high), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize(
    ("args", "argument"),
    [
        ((5, 3, 0.5), "successes"),
        ((1, 3, 1.5), "p"),
        ((1, 3, 0.5, "bigger"), "alternative"),
        ((1.0, 3, 0.5), "successes"),
    ],
)
def test_binomial_test_errors(args: tuple, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        binomial_test(*args)


# --------------------------------------------------------------------------------------------
# Family-wise budgets
# --------------------------------------------------------------------------------------------


def test_bonferroni_and_budget() -> None:
    assert bonferroni(0.05, 10) == pytest.approx(0.005)
    assert stats.bonferroni_alphas(1e-3, 4) == pytest.approx(2.5e-4)
    budget = Budget(1e-3, 20)
    assert budget.alpha_per_check == pytest.approx(5e-5)
    assert budget.rejects(5e-5) and not budget.rejects(6e-5)
    with pytest.raises(ValueError, match="num_checks"):
        Budget(0.05, 0)
    with pytest.raises(ValueError, match="alpha_total"):
        Budget(2.0, 3)


@pytest.mark.parametrize(
    ("pvalues", "alpha", "expected"),
    [
        ([0.01, 0.04, 0.03, 0.005], 0.05, [True, False, False, True]),  # .005 ≤ .0125, .01 ≤ .0167, .03 > .025
        ([0.01, 0.02, 0.03], 0.05, [True, True, True]),  # .01 ≤ .0167, .02 ≤ .025, .03 ≤ .05
        ([0.02, 0.01], 0.01, [False, False]),  # .01 > .005: stop at once
        ([0.2, 0.001, 0.2], 0.05, [False, True, False]),  # step-down stops at the first failure
        ([], 0.05, []),
    ],
)
def test_holm_hand_cases(pvalues: list[float], alpha: float, expected: list[bool]) -> None:
    assert holm(pvalues, alpha) == expected


def test_holm_rejects_at_least_what_bonferroni_rejects() -> None:
    pvalues = np.random.default_rng(derive_seed("holm-vs-bonferroni")).uniform(0, 0.02, size=30)
    holm_flags = holm(pvalues, 0.05)
    assert all(h or p > bonferroni(0.05, 30) for h, p in zip(holm_flags, pvalues))


# --------------------------------------------------------------------------------------------
# Two-sample test
# --------------------------------------------------------------------------------------------


def test_two_sample_statistic_matches_scipy_contingency() -> None:
    a, b = np.array([50, 60, 40, 70]), np.array([55, 50, 45, 90])
    result = two_sample_test(a, b)
    reference = sps.chi2_contingency(np.stack([a, b]), correction=False)
    assert result.method == "asymptotic" and result.dof == 3
    assert result.statistic == pytest.approx(reference.statistic, rel=1e-12)
    assert result.pvalue == pytest.approx(reference.pvalue, rel=1e-10)
    assert result.empirical_tv == pytest.approx(0.5 * np.abs(a / a.sum() - b / b.sum()).sum())


@pytest.mark.statistical
def test_two_sample_pools_sparse_columns_and_permutes_when_too_sparse(specverify_base_seed: int) -> None:
    """Pooling by the margins; the permutation p-value is deterministic for a seed and within 5
    standard errors of the exact conditional p-value (level ≈ 6e-7)."""
    pooled = two_sample_test([40, 30, 4, 3, 0], [35, 33, 3, 4, 0])  # columns 2, 3 pooled; 4 dropped
    assert pooled.method == "asymptotic" and pooled.pooled_cells == ((2, 3),) and pooled.dof == 2
    seed = derive_seed("two-sample-permutation", base=specverify_base_seed)
    sparse = two_sample_test([3, 1, 0, 0], [0, 2, 1, 1], seed=seed, monte_carlo_draws=2_000)
    again = two_sample_test([3, 1, 0, 0], [0, 2, 1, 1], seed=seed, monte_carlo_draws=2_000)
    assert sparse.method == "permutation" and sparse == again
    # exact conditional p-value of this table by enumerating the hypergeometric law of row a
    columns = np.array([3, 3, 1, 1])
    outcomes = [np.array(x) for x in np.ndindex(*(columns + 1)) if sum(x) == 4]
    weights = np.array([np.prod([math.comb(c, k) for c, k in zip(columns, x)]) for x in outcomes], dtype=float)
    statistics = np.array([stats._homogeneity_statistic(x, columns, 4, 4) for x in outcomes])
    exact = weights[statistics >= sparse.statistic - 1e-9].sum() / weights.sum()
    assert abs(sparse.pvalue - exact) < 5 * math.sqrt(exact * (1 - exact) / 2_000) + 1e-3


def test_two_sample_dict_input_and_errors() -> None:
    result = two_sample_test({"x": 40, "y": 60}, {"y": 50, "x": 50})
    assert result.statistic == pytest.approx(two_sample_test([40, 60], [50, 50]).statistic)
    with pytest.raises(ValueError, match="counts_a"):
        two_sample_test([0, 0], [1, 2])
    with pytest.raises(ValueError, match="length mismatch"):
        two_sample_test([1, 2], [1, 2, 3])


@pytest.mark.statistical
def test_two_sample_calibration_and_power(specverify_base_seed: int) -> None:
    """Same law: rejected in ≤ α·LEVEL_SLACK of runs; laws at TV ε with the per-sample n of
    homogeneity_sample_size(ε, α, 0.9): rejected in ≥ 0.9 − POWER_SLACK (binomial bounds)."""
    alpha, target, epsilon, reps = 0.05, 0.9, 0.1, 300
    probs = np.full(8, 1 / 8)
    other = half_mass_alternative(probs, np.arange(8) < 4, epsilon)
    n = homogeneity_sample_size(epsilon, alpha=alpha, power=target, num_cells=8)
    rng = np.random.default_rng(derive_seed("two-sample", base=specverify_base_seed))
    a, same, different = (rng.multinomial(n, law, size=reps) for law in (probs, probs, other))
    false_hits = sum(two_sample_test(x, y).pvalue <= alpha for x, y in zip(a, same))
    hits = sum(two_sample_test(x, y).pvalue <= alpha for x, y in zip(a, different))
    print(f"\ntwo-sample, n={n} per sample: level {false_hits / reps:.3f}, power {hits / reps:.3f}")
    budget = Budget(CHECK_ALPHA, 2)
    assert not budget.rejects(binomial_test(false_hits, reps, alpha * LEVEL_SLACK, "greater").pvalue)
    assert not budget.rejects(binomial_test(hits, reps, target - POWER_SLACK, "less").pvalue)


# --------------------------------------------------------------------------------------------
# Power table script
# --------------------------------------------------------------------------------------------


def test_power_table_script_prints_the_table() -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / "power_table.py"
    spec = importlib.util.spec_from_file_location("power_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.format_power_table()
    print("\n" + table)
    rows = dict(module.sample_size_rows())
    assert rows[10][0] == sample_size_for_tv(0.05, alpha=1e-4, power=0.99, num_cells=10)
    assert all(a < b < c for a, b, c in rows.values())  # smaller ε needs more samples
    assert "ε = 0.01" in table and "1000" in table
