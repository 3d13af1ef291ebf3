"""The statistical budget of the property suite: one family-wise α split over every statistical
test execution, and the sample size each execution needs.

Family-wise error.  A run of ``pytest properties`` executes a fixed number ``M`` of sampled
statistical tests: each ``@pytest.mark.statistical`` test function listed in
:data:`STATISTICAL_TESTS` runs at most ``examples`` times (its Hypothesis ``max_examples``; the
profile is derandomized, so the examples, and their count, are the same on every run and every
xdist worker).  Every execution tests at level ``α_suite / M`` (Bonferroni), so by the union
bound a correct implementation fails *any* of them with probability at most ``α_suite``
(``--specverify-alpha``, default 1e-3), whatever the dependence between them.  ``M`` counts the
slow tests too, so the bound is conservative for the default run.

Power.  Each goodness-of-fit execution draws the smallest ``n`` for which the level-α Pearson
test detects *every* deviation of total variation :data:`DETECTABLE_TV` on its cells with
probability at least :data:`POWER` (``specverify.core.stats.sample_size_for_tv``: noncentral χ² with
noncentrality ``≥ 4 n ε²``, by Cauchy–Schwarz).  The guarantee is for the law of the tested
cells after pooling by expected counts; it is exactly the TV of the tested law when no cell is
pooled.
"""

from __future__ import annotations

from dataclasses import dataclass

from specverify.core.stats import POWER, bonferroni, detectable_tv, sample_size_for_tv

DETECTABLE_TV = 0.03
"""Total-variation deviation of the tested law that every statistical check detects with
probability at least :data:`POWER`."""


@dataclass(frozen=True)
class StatisticalTest:
    """One statistical test function of the suite and how many times a run executes it."""

    name: str
    examples: int
    what: str


STATISTICAL_TESTS: tuple[StatisticalTest, ...] = (
    StatisticalTest("test_first_token_marginal", 8, "law of the first emitted token"),
    StatisticalTest("test_step_joint_with_frequent_rejection", 8, "joint law of one completed "
                    "step, corrections at every position"),
    StatisticalTest("test_bonus_position", 6, "law of the bonus token when every draft is accepted (q = p)"),
    StatisticalTest("test_decoding_loop_joint", 8, "joint law of the first L tokens of whole decoding loops"),
    StatisticalTest("test_batched_rows_that_differ", 6, "per-row step laws in batches mixing different requests"),
    StatisticalTest("test_long_drafts", 6, "joint law of one completed step with K = 4..8 drafts"),
    StatisticalTest("test_acceptance_rate_is_one_minus_tv", 8, "acceptance rate of one draft = 1 - TV(p, q)"),
    StatisticalTest("test_output_depends_on_the_generator", 1, "two generator seeds give different outputs"),
    StatisticalTest("test_continuations_follow_the_target_law", 16, "reference decoder: 3-token continuation law vs "
                    "enumeration, 8 settings x 2 prompts"),
    StatisticalTest("test_continuations_follow_the_target_law_closely", 8, "reference decoder, "
                    "slow: 4 settings x 2 prompts"),
    StatisticalTest("test_tokens_per_pass_match_the_exact_expectation", 8, "reference decoder: first-pass tokens per "
                    "pass + acceptance by position, 2 settings"),
    StatisticalTest("test_false_positive_rate_fast", 1, "binomial test of the checks' false-positive rate (20 seeds)"),
    StatisticalTest("test_false_positive_rate", 1,
                    "binomial test of the checks' false-positive rate (200 seeds, slow)"),
)

NUM_EXECUTIONS = sum(test.examples for test in STATISTICAL_TESTS)
"""``M``: the number of statistical test executions the suite's α is split over."""


def examples(test_name: str) -> int:
    """The Hypothesis ``max_examples`` of a statistical test (its share of :data:`NUM_EXECUTIONS`)."""
    for test in STATISTICAL_TESTS:
        if test.name == test_name:
            return test.examples
    raise ValueError(f"test_name: {test_name!r} is not in budget.STATISTICAL_TESTS; add it there")


def is_budgeted(test_name: str) -> bool:
    """Whether ``test_name`` is one of :data:`STATISTICAL_TESTS`."""
    return any(test.name == test_name for test in STATISTICAL_TESTS)


def alpha_per_execution(suite_alpha: float) -> float:
    """``α_suite / M``: the level of every statistical test execution (Bonferroni)."""
    return bonferroni(suite_alpha, NUM_EXECUTIONS)


def sample_size(num_cells: int, *, alpha: float, tv: float = DETECTABLE_TV, power: float = POWER) -> int:
    """Samples for the level-``alpha`` Pearson test on ``num_cells`` cells to detect a TV deviation
    ``tv`` with probability ``power`` (``specverify.core.stats.sample_size_for_tv``)."""
    return sample_size_for_tv(tv, alpha=alpha, power=power, num_cells=max(num_cells, 2))


def describe(suite_alpha: float) -> str:
    """One line stating the budget (printed in the pytest header and by the tests)."""
    alpha = alpha_per_execution(suite_alpha)
    return (
        f"suite alpha={suite_alpha:g} over M={NUM_EXECUTIONS} statistical executions -> alpha={alpha:.3g} each; "
        f"detectable TV={DETECTABLE_TV:g} with power {POWER:g} "
        f"(n={sample_size(2, alpha=alpha)} for 2 cells .. n={sample_size(512, alpha=alpha)} for 512 cells)"
    )


def detectable_at(n: int, num_cells: int, *, alpha: float, power: float = POWER) -> float:
    """The TV deviation that ``n`` samples on ``num_cells`` cells detect at level ``alpha`` with ``power``."""
    return detectable_tv(n, alpha=alpha, power=power, num_cells=max(num_cells, 2))
