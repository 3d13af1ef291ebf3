"""Slow calibration of goodness_of_fit: its false-positive rate on samples drawn from H0.

For each case, NULL_RUNS multinomial samples are drawn from the expected probabilities
themselves and tested; the fraction with p ≤ α estimates the test's true level at α = 0.05 and
α = 0.01.  Each observed count is checked against "level ≤ α" by a one-sided exact binomial
test; the whole file's checks share one family-wise budget CHECK_ALPHA (Bonferroni).

The cases cover every p-value path: asymptotic without pooling, asymptotic after pooling
sparse expected probabilities, exact enumeration, and Monte-Carlo.  Run with
``pytest -m slow tests/core/test_stats_calibration.py -s`` to see the figures.
"""

from __future__ import annotations

import numpy as np
import pytest

from specverify.core.seeding import derive_seed
from specverify.core.stats import Budget, binomial_test, goodness_of_fit

NULL_RUNS = 2_000
LEVELS = (0.05, 0.01)
CHECK_ALPHA = 1e-3


def _geometric(cells: int, ratio: float) -> np.ndarray:
    weights = ratio ** np.arange(cells)
    return weights / weights.sum()


def _zipf(cells: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, cells + 1)
    return weights / weights.sum()


# (id, expected probabilities, n, goodness_of_fit keyword arguments, method every run must use)
CASES = [
    ("uniform-10", np.full(10, 0.1), 200, {}, "asymptotic"),
    ("uniform-100", np.full(100, 0.01), 1_000, {}, "asymptotic"),
    ("geometric-30-pooled", _geometric(30, 0.7), 100, {}, "asymptotic"),
    ("geometric-30-pooled-cressie-read", _geometric(30, 0.7), 100, {"statistic": 2 / 3}, "asymptotic"),
    ("zipf-200-pooled", _zipf(200), 300, {}, "asymptotic"),
    ("zipf-1000-pooled", _zipf(1000), 150, {}, "asymptotic"),
    ("three-cells-exact", np.array([0.5, 0.3, 0.2]), 8, {}, "exact"),
    ("dominant-cell-monte-carlo", np.array([0.95] + [0.05 / 40] * 40), 60, {"monte_carlo_draws": 999}, "monte-carlo"),
    ("dominant-cell-monte-carlo-g", np.array([0.95] + [0.05 / 40] * 40), 60,
     {"monte_carlo_draws": 999, "statistic": "g"}, "monte-carlo"),
]
BUDGET = Budget(CHECK_ALPHA, len(CASES) * len(LEVELS))


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize(("probs", "n", "kwargs", "method"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_false_positive_rate_is_at_most_alpha(
    probs: np.ndarray, n: int, kwargs: dict, method: str, specverify_base_seed: int
) -> None:
    seed = derive_seed("gof-calibration", probs.size, n, sorted(kwargs.items()), base=specverify_base_seed)
    samples = np.random.default_rng(seed).multinomial(n, probs, size=NULL_RUNS)
    results = [goodness_of_fit(x, probs, seed=seed + i, **kwargs) for i, x in enumerate(samples)]
    assert {r.method for r in results} == {method}
    pvalues = np.array([r.pvalue for r in results])
    print(f"\n{results[0].statistic_name}, {probs.size} cells, n={n}, {method}, dof={results[0].dof}, "
          f"pooled groups={len(results[0].pooled_cells)}:")
    for alpha in LEVELS:
        false_positives = int((pvalues <= alpha).sum())
        check = binomial_test(false_positives, NULL_RUNS, alpha, "greater")
        print(f"  α={alpha}: {false_positives}/{NULL_RUNS} = {false_positives / NULL_RUNS:.4f} "
              f"(95% CI [{check.ci_low:.4f}, 1]), binomial p={check.pvalue:.3g} "
              f"vs per-check α {BUDGET.alpha_per_check:.2g}")
        assert not BUDGET.rejects(check.pvalue), f"false-positive rate at α={alpha} exceeds α: {check}"
