"""Tests of specverify.core.sequential: the plan's arithmetic, the final-look inflation (printed
with ``-s``), and the calibration of a goodness-of-fit test applied at every look: under H0 the
chance of any rejection is at most α (random-seed mode measures it), and a gross loss stops the
test at the first look."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from specverify.core.seeding import derive_seed
from specverify.core.sequential import (
    DEFAULT_LOOKS,
    SequentialPlan,
    final_look_alpha,
    final_look_inflation,
    spending_function,
)
from specverify.core.stats import (
    binomial_test,
    detectable_tv,
    goodness_of_fit,
    sample_size_for_tv,
)

ALPHA_SHARES = (1e-3, 1e-4, 1e-5, 1e-6)
CELL_COUNTS = (2, 10, 100, 1000)
MAX_INFLATION = 0.15


def test_looks_and_levels():
    plan = SequentialPlan(1600, 0.01)
    assert plan.looks == (100, 400, 1600)
    assert math.isclose(sum(plan.alphas), 0.01, rel_tol=1e-12)
    assert plan.alphas == tuple(plan.alpha_at(j) for j in range(3))
    assert plan.alpha_at(0) == pytest.approx(0.01 / 16**3)
    assert plan.alpha_at(2) == pytest.approx(0.01 * 63 / 64) == final_look_alpha(0.01)
    assert all(a > 0 for a in plan.alphas)
    assert SequentialPlan(3, 0.05).looks == (1, 2, 3)  # tiny n: still increasing, last = n
    assert SequentialPlan(7, 0.05, fractions=(0.5, 1)).looks == (4, 7)


@pytest.mark.parametrize("spending", ["obrien-fleming", "pocock", 1.0, 3.0])
def test_spending_functions_rise_from_zero_to_alpha(spending):
    spent = spending_function(spending, 1e-4)
    values = [spent(t) for t in (0.0, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)]
    assert values[0] == 0.0 and values[-1] == pytest.approx(1e-4, rel=1e-9)
    assert all(a < b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 0, "alpha": 0.1}, "n: expected"), ({"n": 10, "alpha": 1.5}, "alpha: expected"),
    ({"n": 10, "alpha": 0.1, "fractions": (0.5, 0.25, 1)}, "fractions: expected"),
    ({"n": 10, "alpha": 0.1, "fractions": (0.5,)}, "fractions: expected"),
    ({"n": 10, "alpha": 0.1, "spending": "linear"}, "spending: expected"),
    ({"n": 2, "alpha": 0.1}, "n: expected at least 3"),
])
def test_plan_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SequentialPlan(**kwargs)
    with pytest.raises(ValueError, match="look: expected"):
        SequentialPlan(10, 0.1).alpha_at(5)


def test_first_rejection():
    plan = SequentialPlan(1600, 0.01)
    assert plan.first_rejection([0.5, 1e-9, 0.0]) == 1
    assert plan.first_rejection([0.5, 0.5, 0.0098]) == 2  # final level 0.01 * 63/64
    assert plan.first_rejection([0.5, 0.5, 0.0099]) is None


def test_final_look_inflation_table():
    """The final look's size at α_final against the fixed design at α (power 0.99, ε = 0.02):
    ≤ 15% everywhere; with the default spending it is ≤ 0.2%."""
    epsilon, power = 0.02, 0.99
    print(f"\nfinal-look inflation, power {power} at TV {epsilon}, looks {DEFAULT_LOOKS}, default spending "
          "(alpha t^3); in brackets: TV the first look alone detects with power 0.99, in units of epsilon")
    print("alpha share | " + " | ".join(f"{c} cells" for c in CELL_COUNTS))
    worst = 0.0
    for alpha in ALPHA_SHARES:
        row = []
        for cells in CELL_COUNTS:
            inflation = final_look_inflation(epsilon, alpha=alpha, power=power, num_cells=cells)
            plan = SequentialPlan.for_tv(epsilon, alpha=alpha, power=power, num_cells=cells)
            first = detectable_tv(plan.looks[0], alpha=plan.alpha_at(0), power=power, num_cells=cells) / epsilon
            final = plan.alpha_at(len(plan.looks) - 1)
            assert plan.n == sample_size_for_tv(epsilon, alpha=final, power=power, num_cells=cells)
            worst = max(worst, inflation)
            row.append(f"+{inflation:.2%} ({first:.1f} eps)")
        print(f"{alpha:g} | " + " | ".join(row))
    assert 0 < worst <= MAX_INFLATION


@pytest.mark.slow
@pytest.mark.parametrize("spending", ["obrien-fleming", "pocock", 2.0])
def test_final_look_inflation_of_other_spending_functions(spending):
    """The comparison behind the default (module docstring); Pocock stays ≤ 15% too."""
    row = [final_look_inflation(0.02, alpha=a, power=0.99, num_cells=c, spending=spending)
           for a in ALPHA_SHARES for c in CELL_COUNTS]
    print(f"\n{spending}: inflation {min(row):.2%}..{max(row):.2%}")
    assert max(row) <= MAX_INFLATION


# --------------------------------------------------------------------------------------------
# Calibration: a goodness-of-fit test at every look
# --------------------------------------------------------------------------------------------

NULL_PROBS = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.03, 0.01, 0.01])


def sequential_gof(plan: SequentialPlan, samples: np.ndarray, probs: np.ndarray, seed: int) -> int | None:
    """Look index at which the cumulative-sample Pearson test first rejects, or None."""
    for look, size in enumerate(plan.looks):
        counts = np.bincount(samples[:size], minlength=probs.size)
        if goodness_of_fit(counts, probs, seed=seed + look).pvalue <= plan.alpha_at(look):
            return look
    return None


def measured_false_positive_rate(plan: SequentialPlan, runs: int, base_seed: int) -> tuple[int, list[int]]:
    rng = np.random.default_rng(derive_seed("sequential-null", plan.n, plan.alpha, str(plan.spending), base=base_seed))
    stops = [0] * len(plan.looks)
    for run in range(runs):
        samples = rng.choice(NULL_PROBS.size, size=plan.n, p=NULL_PROBS)
        look = sequential_gof(plan, samples, NULL_PROBS, seed=run)
        if look is not None:
            stops[look] += 1
    return sum(stops), stops


@pytest.mark.statistical
@pytest.mark.parametrize(("spending", "runs"), [(3.0, 600), pytest.param("pocock", 4000, marks=pytest.mark.slow),
                                                pytest.param(3.0, 4000, marks=pytest.mark.slow)])
def test_null_rejects_at_most_alpha_over_all_looks(spending, runs, specverify_base_seed):
    """Under H0 the test applied at all its looks rejects with probability ≤ α = 0.05 (union
    bound).  Checked by a one-sided exact binomial test at level 1e-3 on the number of runs that
    rejected anywhere; run with ``--specverify-seed random -s`` to measure and print a fresh FPR."""
    plan = SequentialPlan(1600, 0.05, spending=spending)
    rejections, stops = measured_false_positive_rate(plan, runs, specverify_base_seed)
    print(f"\nsequential Pearson test, H0, alpha 0.05, spending {spending}, {runs} runs (base seed "
          f"{specverify_base_seed}): FPR {rejections / runs:.4f}; rejections by look {stops}; "
          f"levels {[f'{a:.2g}' for a in plan.alphas]}")
    assert binomial_test(rejections, runs, 0.05, "greater").pvalue > 1e-3


def test_gross_loss_stops_at_the_first_look(specverify_base_seed):
    """A lossy sampler (TV 0.3 from the target) against a plan sized for TV 0.02 at α = 1e-5:
    every run rejects at the first look, having drawn 1/16 of the samples."""
    plan = SequentialPlan.for_tv(0.02, alpha=1e-5, power=0.99, num_cells=NULL_PROBS.size)
    lossy = np.array([0.0, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.03, 0.01, 0.31])  # 0.3 moved from cell 0 to 9
    assert 0.5 * np.abs(lossy - NULL_PROBS).sum() == pytest.approx(0.3)
    rng = np.random.default_rng(derive_seed("sequential-gross", base=specverify_base_seed))
    looks = [sequential_gof(plan, rng.choice(lossy.size, size=plan.n, p=lossy), NULL_PROBS,
                            seed=run) for run in range(20)]
    assert looks == [0] * 20, looks


def test_moderate_loss_is_still_caught_by_the_final_look():
    """At the design's TV (0.05, power 0.99) most runs only reject late: the sequential test keeps
    the fixed design's power (it rejects whenever its final look does)."""
    plan = SequentialPlan.for_tv(0.05, alpha=1e-3, power=0.99, num_cells=NULL_PROBS.size)
    shifted = NULL_PROBS.copy()
    shifted[0] -= 0.05
    shifted[1] += 0.05
    rng = np.random.default_rng(derive_seed("sequential-moderate"))
    looks = [sequential_gof(plan, rng.choice(shifted.size, size=plan.n, p=shifted), NULL_PROBS,
                            seed=run) for run in range(40)]
    assert sum(look is not None for look in looks) >= 38
    assert sum(look == 0 for look in looks if look is not None) <= 5
