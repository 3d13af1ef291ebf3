"""Calibration: the statistical checks' false-positive rate on the correct rule matches their α.

Every check of ``sampled_checks.all_checks()`` runs on its probe case against the reference rule
(``specverify.core.rules.verify``, lossless) at level :data:`CALIBRATION_ALPHA` = 0.05, once for each of
many seeds derived from the run's base seed, with the sample size the budget gives at that level.
Under a calibrated test every run rejects with probability at most 0.05, so the number of
rejections among ``m`` runs is stochastically at most Binomial(m, 0.05).  The test asserts that
the one-sided exact binomial test of H0: rate ≤ 0.05 does not reject at the budget's per-execution
level (Bonferroni over the pooled count and the per-check counts), and prints the observed rates
with Clopper–Pearson intervals.  A level as large as 0.05 is what makes the rate measurable with a
few hundred runs; the suite's own checks use the far smaller budgeted α, whose calibration rests on
the same p-values.
"""

from __future__ import annotations

import pytest

from specverify.core import rules, stats
from specverify.core.seeding import derive_seed
from specverify.properties import budget
from specverify.properties.sampled_checks import all_checks

CALIBRATION_ALPHA = 0.05


def false_positive_counts(num_seeds: int, base_seed: int) -> dict[str, tuple[int, int]]:
    """``check name -> (rejections, runs)`` of every check on the reference over ``num_seeds`` seeds."""
    counts: dict[str, tuple[int, int]] = {}
    for check in all_checks():
        n = check.default_n(CALIBRATION_ALPHA)
        rejections = 0
        for index in range(num_seeds):
            seed = derive_seed("calibration", check.name, index, base=base_seed)
            rejections += check(rules.verify, alpha=CALIBRATION_ALPHA, seed=seed, n=n).rejected
        counts[check.name] = (rejections, num_seeds)
    return counts


def assert_calibrated(counts: dict[str, tuple[int, int]], level: float) -> None:
    """Print the rates and assert that no binomial test (pooled, then per check, each at
    ``level / (checks + 1)``) finds a false-positive rate above :data:`CALIBRATION_ALPHA`."""
    rejections = sum(r for r, _ in counts.values())
    runs = sum(m for _, m in counts.values())
    rows = [("all checks (pooled)", rejections, runs)] + [(name, r, m) for name, (r, m) in counts.items()]
    per_test_level = level / len(rows)
    failures = []
    print(f"\nfalse-positive rate at alpha={CALIBRATION_ALPHA} (binomial test at {per_test_level:.3g} each):")
    for name, r, m in rows:
        test = stats.binomial_test(r, m, CALIBRATION_ALPHA, "greater")
        interval = stats.binomial_test(r, m, CALIBRATION_ALPHA, "two-sided", confidence_level=0.95)
        print(f"  {name:<22} {r:>4}/{m:<5} = {r / m:.4f}  (95% CI [{interval.ci_low:.4f}, {interval.ci_high:.4f}]; "
              f"p(rate > {CALIBRATION_ALPHA}) = {test.pvalue:.3g})")
        if test.pvalue <= per_test_level:
            failures.append(f"{name}: {r}/{m} rejections, p={test.pvalue:.3g}")
    assert not failures, f"false-positive rate above {CALIBRATION_ALPHA}: {failures}"


@pytest.mark.statistical
def test_false_positive_rate_fast(specverify_base_seed, specverify_suite_alpha):
    """20 seeds per check (7 checks: 140 runs)."""
    counts = false_positive_counts(20, derive_seed("fast", base=specverify_base_seed))
    assert_calibrated(counts, budget.alpha_per_execution(specverify_suite_alpha))


@pytest.mark.slow
@pytest.mark.statistical
def test_false_positive_rate(specverify_base_seed, specverify_suite_alpha):
    """200 seeds per check (7 checks: 1400 runs)."""
    counts = false_positive_counts(200, derive_seed("slow", base=specverify_base_seed))
    assert_calibrated(counts, budget.alpha_per_execution(specverify_suite_alpha))
