"""Calibrated statistics: goodness of fit, power and sample size, family-wise budgets.

Every function returns a small frozen result object in the style of ``scipy.stats``.  The
statistics side of specverify works in float64 numpy.

Goodness of fit (:func:`goodness_of_fit`) tests observed counts against known probabilities with
a Cressie–Read power-divergence statistic (Cressie & Read 1984)::

    T_λ = 2 / (λ (λ + 1)) · Σ_i O_i ((O_i / E_i)^λ − 1)        E_i = n p_i

λ = 1 is Pearson's X² = Σ (O_i − E_i)² / E_i and λ → 0 is the likelihood-ratio G = 2 Σ O_i log(O_i/E_i).
Under H0 and with every E_i large, T_λ is approximately χ² with (cells − 1) degrees of freedom.

Power (:func:`power_at`, :func:`sample_size_for_tv`, :func:`detectable_tv`) is stated against a
deviation of total variation ε, the distance the audit reports; see :func:`power_at` for the
Cauchy–Schwarz bound that turns ε into a noncentrality.

Family-wise budgets (:func:`bonferroni`, :func:`holm`, :class:`Budget`) split one false-positive
budget over many checks without assuming they are independent.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, combinations
from typing import Any, Literal, TypeVar

import numpy as np
from scipy import special
from scipy.special import gammaln, xlogy

from specverify.core.roots import crossing

__all__ = [
    "BinomialResult",
    "Budget",
    "GoodnessOfFit",
    "Homogeneity",
    "binomial_power",
    "binomial_sample_size",
    "binomial_test",
    "bonferroni",
    "bonferroni_alphas",
    "detectable_tv",
    "goodness_of_fit",
    "holm",
    "homogeneity_sample_size",
    "pool_cells",
    "power_at",
    "sample_size_for_tv",
    "two_sample_test",
    "BOUND_SHARE",
    "POWER",
    "monte_carlo_draws",
    "relative_entropy_tail_bound",
]

DEFAULT_MONTE_CARLO_DRAWS = 9_999
"""Default number of Monte-Carlo draws; the smallest attainable p-value is 1/(1 + draws) = 1e-4."""

POWER = 0.99
"""The power every statistical test of the project is sized for: a deviation of the stated TV is
missed with probability at most 0.01 (the audit's checks, the property suite, the benchmarks)."""

MAX_MONTE_CARLO_DRAWS = 1_000_000
"""A Monte-Carlo p-value draws at most this many tables: a test whose level is below
1/(1 + MAX_MONTE_CARLO_DRAWS) cannot reject on a Monte-Carlo p-value (its level is then unused,
never spent on an invalid rejection).  Only tiny early looks of sequential checks fall back to it."""


def monte_carlo_draws(level: float) -> int:
    """Monte-Carlo draws for a test at ``level``: enough that its smallest p-value 1/(1 + draws)
    lies below the level (twice 1/level, at least :data:`DEFAULT_MONTE_CARLO_DRAWS`), capped at
    :data:`MAX_MONTE_CARLO_DRAWS`.  With fewer, the test could not reject."""
    return min(MAX_MONTE_CARLO_DRAWS, max(DEFAULT_MONTE_CARLO_DRAWS, math.ceil(2.0 / level)))

BOUND_SHARE = 0.1
"""Share of a ``confirm_below`` level given to the analytic tail bound; the Monte-Carlo
confirmation gets the rest, so that the two together reject a null table with probability ≤ α."""

EXACT_MAX_OUTCOMES = 100_000
"""Enumerate the multinomial exactly when it has at most this many outcomes C(n + k − 1, k − 1)."""

_SUM_TOLERANCE_PER_CELL = 1e-9
_MONTE_CARLO_CHUNK_ENTRIES = 2_000_000  # draws × cells simulated at once (16 MB of int64)
_TIE_RTOL = 1e-10  # statistics within this relative distance of the observed one count as ties

Labels = tuple[Hashable, ...]
CellKey = TypeVar("CellKey", bound=Hashable)  # the labels of counts and probabilities given as dicts


# --------------------------------------------------------------------------------------------
# Result objects
# --------------------------------------------------------------------------------------------


def _format_groups(groups: tuple[tuple[Hashable, ...], ...], limit: int = 4) -> str:
    shown = ", ".join("(" + ", ".join(map(repr, g)) + ")" for g in groups[:limit])
    more = f", … {len(groups) - limit} more" if len(groups) > limit else ""
    return shown + more


@dataclass(frozen=True)
class GoodnessOfFit:
    """Result of :func:`goodness_of_fit`.

    statistic: the power divergence T_λ on the cells tested (``inf`` for ``impossible-cell``).
    pvalue: P(T ≥ statistic | H0) by the method named in ``method``.
    dof: degrees of freedom, (number of cells tested) − 1.
    n: number of samples.
    method: ``"asymptotic"`` (χ²_dof tail), ``"exact"`` (full multinomial enumeration),
        ``"monte-carlo"`` ((1 + #{T* ≥ T}) / (1 + draws)) or ``"impossible-cell"`` (samples fell
        in a cell of probability 0: p-value 0, a certain failure).
    pooled_cells: the groups of original cells merged into one cell for the statistic (labels are
        indices for array input, keys for dict input); empty when nothing was merged.
    empirical_tv: ½ Σ_i |O_i / n − p_i| over all cells, the plug-in total-variation distance.
    impossible_count: samples observed in cells of probability 0.
    statistic_name: ``"pearson"``, ``"g"`` or ``"cressie-read(λ)"``.
    confirmed_by: for an asymptotic p-value at most the ``confirm_below`` level it was asked to
        confirm, the valid test that agreed (``"relative-entropy-bound"`` or ``"monte-carlo"``);
        empty otherwise.
    """

    statistic: float
    pvalue: float
    dof: int
    n: int
    method: str
    pooled_cells: tuple[tuple[Hashable, ...], ...]
    empirical_tv: float
    impossible_count: int
    statistic_name: str = "pearson"
    confirmed_by: str = ""

    def __str__(self) -> str:
        text = (
            f"goodness of fit ({self.statistic_name}): statistic={self.statistic:.6g}, dof={self.dof}, "
            f"p-value={self.pvalue:.4g} [{self.method}]; n={self.n}, empirical TV={self.empirical_tv:.4g}"
        )
        if self.pooled_cells:
            text += f"; pooled {len(self.pooled_cells)} group(s): {_format_groups(self.pooled_cells)}"
        if self.impossible_count:
            text += f"; {self.impossible_count} sample(s) in zero-probability cells: certain failure"
        return text


@dataclass(frozen=True)
class Homogeneity:
    """Result of :func:`two_sample_test` (χ² test of homogeneity on a 2 × k table).

    Fields as in :class:`GoodnessOfFit`; ``n_a``/``n_b`` are the two sample sizes, ``method`` is
    ``"asymptotic"`` or ``"permutation"`` and ``empirical_tv`` is ½ Σ_i |a_i / n_a − b_i / n_b|.
    """

    statistic: float
    pvalue: float
    dof: int
    n_a: int
    n_b: int
    method: str
    pooled_cells: tuple[tuple[Hashable, ...], ...]
    empirical_tv: float

    def __str__(self) -> str:
        text = (
            f"two-sample homogeneity (pearson): statistic={self.statistic:.6g}, dof={self.dof}, "
            f"p-value={self.pvalue:.4g} [{self.method}]; n_a={self.n_a}, n_b={self.n_b}, "
            f"empirical TV={self.empirical_tv:.4g}"
        )
        if self.pooled_cells:
            text += f"; pooled {len(self.pooled_cells)} group(s): {_format_groups(self.pooled_cells)}"
        return text


@dataclass(frozen=True)
class BinomialResult:
    """Result of :func:`binomial_test`: exact p-value, estimate k/n and Clopper–Pearson interval."""

    successes: int
    trials: int
    null_p: float
    alternative: str
    pvalue: float
    estimate: float
    ci_low: float
    ci_high: float
    confidence_level: float

    def __str__(self) -> str:
        return (
            f"binomial test ({self.alternative}, p0={self.null_p:.6g}): {self.successes}/{self.trials} "
            f"= {self.estimate:.6g}, p-value={self.pvalue:.4g}, "
            f"{self.confidence_level:.0%} Clopper–Pearson CI [{self.ci_low:.6g}, {self.ci_high:.6g}]"
        )


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


def _counts_array(values: Any, name: str) -> np.ndarray:
    """A 1-D int64 array of non-negative whole-number counts, or ValueError naming ``name``."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D sequence of counts, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: counts must be finite, got {array}")
    if np.any(array < 0):
        raise ValueError(f"{name}: counts must be non-negative; cell {int(np.argmax(array < 0))} is {array.min()}")
    if np.any(array != np.floor(array)):
        raise ValueError(f"{name}: counts must be whole numbers (sample counts), got {array}")
    return array.astype(np.int64)


def _probability_array(values: Any, name: str) -> np.ndarray:
    """A 1-D float64 probability vector summing to 1 within 1e-9·V, renormalised exactly."""
    probs = np.asarray(values, dtype=np.float64)
    if probs.ndim != 1 or probs.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D probability vector, got shape {probs.shape}")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise ValueError(f"{name}: probabilities must be finite and non-negative, got {probs}")
    total = float(probs.sum())
    tolerance = _SUM_TOLERANCE_PER_CELL * probs.size
    if abs(total - 1.0) > tolerance:
        raise ValueError(
            f"{name}: probabilities sum to {total!r}, not 1 within {tolerance:.3g} (1e-9 per cell); "
            "normalise them in float64 first"
        )
    return probs / total


def _aligned_cells(observed: Any, expected_probs: Any) -> tuple[np.ndarray, np.ndarray, Labels | None]:
    """Counts and probabilities as aligned arrays; for dict input also the keys (cell labels).

    Dict input: cells are the keys of ``expected_probs`` in order, then keys only in ``observed``
    (probability 0).  Keys only in ``expected_probs`` have count 0.
    """
    if isinstance(observed, Mapping) != isinstance(expected_probs, Mapping):
        raise ValueError(
            "observed, expected_probs: pass both as dicts (key -> count, key -> probability) or both as arrays"
        )
    if isinstance(observed, Mapping):
        labels = tuple(expected_probs) + tuple(k for k in observed if k not in expected_probs)
        counts = _counts_array([observed.get(k, 0) for k in labels], "observed")
        probs = _probability_array([expected_probs.get(k, 0.0) for k in labels], "expected_probs")
        return counts, probs, labels
    counts = _counts_array(observed, "observed")
    probs = _probability_array(expected_probs, "expected_probs")
    if counts.size != probs.size:
        raise ValueError(
            f"observed, expected_probs: length mismatch ({counts.size} counts vs {probs.size} probabilities); "
            "pass one count per cell"
        )
    return counts, probs, None


def _divergence_power(statistic: str | float) -> tuple[float, str]:
    """The Cressie–Read λ and a display name for ``statistic``."""
    if isinstance(statistic, str):
        named = {"pearson": 1.0, "g": 0.0}
        if statistic.lower() not in named:
            raise ValueError(f"statistic: expected 'pearson', 'g' or a float λ > -1, got {statistic!r}")
        return named[statistic.lower()], statistic.lower()
    if isinstance(statistic, bool) or not isinstance(statistic, (int, float)) or not math.isfinite(statistic):
        raise ValueError(f"statistic: expected 'pearson', 'g' or a float λ > -1, got {statistic!r}")
    if statistic <= -1:
        raise ValueError(
            f"statistic: λ = {statistic} ≤ -1 makes the divergence infinite whenever a cell is empty; use λ > -1"
        )
    lam = float(statistic)
    name = {1.0: "pearson", 0.0: "g"}.get(lam, f"cressie-read({lam:g})")
    return lam, name


def _check_positive(value: float, name: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")


def _check_positive_int(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------


def pool_cells(expected_counts: np.ndarray, min_expected: float) -> list[list[int]]:
    """Group cells so that every group has expected count ≥ ``min_expected``.

    Algorithm (a deterministic function of the expected counts alone, never of the observed
    counts, so the pooled test keeps its level):

    1. sort the cells by expected count, ascending, ties by index (a stable sort);
    2. walk that order, adding cells to an open group; close the group as soon as its expected
       total reaches ``min_expected`` (cells that already reach it alone become singletons);
    3. a final open group still short of ``min_expected`` is merged into the last closed group
       (or is the only group when none closed).

    Returns the groups as lists of cell indices (ascending within a group), in the order formed.
    Fewer than two groups means no χ² test on pooled cells is possible.
    """
    order = np.argsort(expected_counts, kind="stable")
    groups: list[list[int]] = []
    open_group: list[int] = []
    open_total = 0.0
    for index, expected in zip(order.tolist(), np.asarray(expected_counts, dtype=np.float64)[order].tolist()):
        open_group.append(index)
        open_total += expected
        if open_total >= min_expected:
            groups.append(sorted(open_group))
            open_group, open_total = [], 0.0
    if open_group:
        if groups:
            groups[-1] = sorted(groups[-1] + open_group)
        else:
            groups.append(sorted(open_group))
    return groups


def _merged_groups(groups: list[list[int]], labels: Labels | None) -> tuple[tuple[Hashable, ...], ...]:
    """The groups with more than one cell, as tuples of labels (indices when ``labels`` is None)."""
    name = (lambda i: i) if labels is None else (lambda i: labels[i])
    return tuple(tuple(name(i) for i in g) for g in groups if len(g) > 1)


def _sum_groups(values: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """Sum the last axis of ``values`` within each group (one reduction over the cells taken in
    group order)."""
    sizes = np.fromiter((len(g) for g in groups), dtype=np.intp, count=len(groups))
    order = np.fromiter(chain.from_iterable(groups), dtype=np.intp, count=int(sizes.sum()))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
    sums: np.ndarray = np.add.reduceat(values[..., order], starts, axis=-1)
    return sums


# --------------------------------------------------------------------------------------------
# Goodness of fit
# --------------------------------------------------------------------------------------------


def _power_divergence(observed: np.ndarray, expected: np.ndarray, lam: float) -> np.ndarray:
    """Cressie–Read T_λ along the last axis (vectorised over leading axes)."""
    observed = observed.astype(np.float64)
    if lam == 1.0:
        return np.asarray(np.sum((observed - expected) ** 2 / expected, axis=-1))
    if lam == 0.0:
        return np.asarray(2.0 * np.sum(xlogy(observed, observed / expected), axis=-1))
    # O ((O/E)^λ − 1) written as O^(λ+1) E^(−λ) − O, which is 0 at O = 0 for every λ > −1.
    terms = np.power(observed, lam + 1.0) * np.power(expected, -lam) - observed
    return np.asarray(2.0 / (lam * (lam + 1.0)) * np.sum(terms, axis=-1))


def _tail_fraction(simulated: np.ndarray, observed_statistic: float) -> np.ndarray:
    """Mask of simulated statistics at least the observed one (ties within a relative 1e-10)."""
    return simulated >= observed_statistic - _TIE_RTOL * max(1.0, abs(observed_statistic))


def _exact_pvalue(counts: np.ndarray, probs: np.ndarray, lam: float) -> float:
    """P(T ≥ T_obs) by enumerating every multinomial outcome (stars and bars)."""
    n, k = int(counts.sum()), counts.size
    if k == 1:
        return 1.0  # a single cell has a single outcome
    bars = np.array(list(combinations(range(n + k - 1), k - 1)), dtype=np.int64).reshape(-1, k - 1)
    edges = np.concatenate(
        [np.full((bars.shape[0], 1), -1), bars, np.full((bars.shape[0], 1), n + k - 1)], axis=1
    )
    outcomes = np.diff(edges, axis=1) - 1
    log_pmf = gammaln(n + 1) - gammaln(outcomes + 1).sum(axis=1) + xlogy(outcomes, probs).sum(axis=1)
    expected = n * probs
    observed_statistic = float(_power_divergence(counts, expected, lam))
    tail = _tail_fraction(_power_divergence(outcomes, expected, lam), observed_statistic)
    return float(min(1.0, np.exp(log_pmf[tail]).sum()))


def _monte_carlo_pvalue(counts: np.ndarray, probs: np.ndarray, lam: float, draws: int, seed: int,
                        *, stop_above: float | None = None) -> float:
    """(1 + #{T* ≥ T_obs}) / (1 + draws) with T* from multinomial(n, probs) draws.  With
    ``stop_above``, the draws stop once that p-value can no longer be ≤ ``stop_above``, and the
    value returned is its lower bound so far, (1 + #{T* ≥ T_obs}) / (1 + draws) > ``stop_above``:
    the decision at ``stop_above`` is the full run's."""
    if stop_above is not None and 1.0 / (1 + draws) > stop_above:
        return 1.0 / (1 + draws)  # no run of this many draws could reach stop_above
    rng = np.random.default_rng(seed)
    n = int(counts.sum())
    expected = n * probs
    observed_statistic = float(_power_divergence(counts, expected, lam))
    chunk = max(1, _MONTE_CARLO_CHUNK_ENTRIES // probs.size)
    at_least, done = 0, 0
    while done < draws:
        size = min(chunk, draws - done)
        simulated = rng.multinomial(n, probs, size=size)
        at_least += int(_tail_fraction(_power_divergence(simulated, expected, lam), observed_statistic).sum())
        done += size
        if stop_above is not None and (1 + at_least) / (1 + draws) > stop_above:
            break
    return (1 + at_least) / (1 + draws)


def relative_entropy_tail_bound(counts: np.ndarray, probs: np.ndarray) -> float:
    """A valid upper bound on P(D(p̂ ‖ p) ≥ D_obs) under multinomial(n, ``probs``), where p̂ = counts / n.

    Agrawal's bound (IEEE Trans. Inf. Theory 66(10), 2020): for k cells and t = n·D_obs > k − 1,
    P(n·D(p̂ ‖ p) ≥ t) ≤ e^{−t} (e·t / (k − 1))^{k−1}, the Chernoff bound of a Gamma(k − 1, 1)
    variable.  It needs no approximation and decays exponentially in t, so it confirms gross
    deviations at any level, however small, without simulation; for t ≤ k − 1 it returns 1."""
    n = float(counts.sum())
    degrees = probs.size - 1
    t = float(np.sum(xlogy(counts, counts / (n * probs))))
    if degrees < 1 or t <= degrees:
        return 1.0
    return math.exp(min(0.0, -t + degrees * (1.0 + math.log(t / degrees))))


def goodness_of_fit(
    observed: Sequence[int] | np.ndarray | Mapping[CellKey, int],
    expected_probs: Sequence[float] | np.ndarray | Mapping[CellKey, float],
    *,
    statistic: Literal["pearson", "g"] | float = "pearson",
    min_expected: float = 5.0,
    seed: int = 0,
    monte_carlo_draws: int = DEFAULT_MONTE_CARLO_DRAWS,
    confirm_below: float | None = None,
    monte_carlo_max_entries: int | None = None,
) -> GoodnessOfFit:
    """Test H0: the samples counted in ``observed`` were drawn i.i.d. from ``expected_probs``.

    Inputs: counts and probabilities as equal-length arrays, or as dicts key -> count and
    key -> probability (keys missing from the probability dict have probability 0).  The
    probabilities must sum to 1 within 1e-9·V in float64.

    Statistic: Cressie–Read power divergence T_λ (module docstring); ``"pearson"`` is λ = 1,
    ``"g"`` is λ = 0, a float is λ (> −1).

    Procedure:

    1. Samples in a cell of probability 0 cannot occur under H0: the verdict is method
       ``"impossible-cell"``, statistic ``inf``, p-value 0.0.
    2. The cells of positive probability are pooled by expected counts n·p_i alone
       (:func:`pool_cells`), so that each group has expected count ≥ ``min_expected``.
    3. Rule for the asymptotic approximation: it is used iff at least two groups remain, i.e.
       iff the pooled table meets Cochran's rule (every expected count ≥ ``min_expected``,
       5 by default).  Then p = P(χ²_{G−1} ≥ T_λ) on the G pooled groups.
    4. Otherwise (fewer than two groups) the unpooled cells are tested with a p-value that
       needs no approximation: exact enumeration of all C(n + k − 1, k − 1) multinomial
       outcomes when there are at most ``EXACT_MAX_OUTCOMES`` of them (method ``"exact"``),
       else a Monte-Carlo p-value (1 + #{T* ≥ T}) / (1 + draws) from ``monte_carlo_draws``
       multinomial(n, p) draws seeded by ``seed`` (method ``"monte-carlo"``, valid at every
       level: P(p ≤ α) ≤ α).  The smallest Monte-Carlo p-value is 1/(1 + draws): pass
       ``monte_carlo_draws ≥ 1/α`` when testing at level α.
    5. ``confirm_below`` (a test's level α): an asymptotic p-value ≤ α stands only if a valid
       test of the same pooled table also rejects, so the decision's false-positive rate is ≤ α
       whatever the approximation's error in the far tail.  The level is split by the union
       bound: :func:`relative_entropy_tail_bound` at ``BOUND_SHARE``·α (no simulation; confirms
       gross deviations at any level), else the Monte-Carlo p-value of the pooled table at the
       remaining (1 − ``BOUND_SHARE``)·α (``monte_carlo_draws`` draws, stopped once it exceeds
       that share).  When neither confirms, the Monte-Carlo p-value is returned, method
       ``"monte-carlo"``.  With ``monte_carlo_max_entries``, a simulation of more than that many
       draws × pooled groups is not run: the bound alone confirms, at the whole α, and is the
       p-value returned when it does not (method ``"relative-entropy-bound"``).  The choice depends
       on n and the expected counts only, so each way the decision's false-positive rate is ≤ α.

    Calibration of the asymptotic path (measured, 400 000 null runs, uniform cells with expected
    count 5): the level of Pearson's X² is within ±6% of α at α ≥ 0.01 but 1.2–1.5 × α at
    α = 1e-3…1e-4; λ = 2/3 stays at 0.87–0.96 × α throughout; G is liberal, 1.4–2 × α at
    α = 0.05 and up to 5 × α at 1e-4 (still 1.3 × α with expected counts 20).  For very small
    α prefer ``statistic=2/3`` or a larger ``min_expected``; avoid ``"g"`` unless counts are large.

    Pooling hides deviations inside a group; the power statements of :func:`power_at` hold for
    the TV distance between the pooled distributions, which equals the full TV when no cell is
    pooled (n·min p ≥ ``min_expected``).
    """
    counts, probs, labels = _aligned_cells(observed, expected_probs)
    lam, name = _divergence_power(statistic)
    _check_positive(min_expected, "min_expected")
    _check_positive_int(monte_carlo_draws, "monte_carlo_draws")
    n = int(counts.sum())
    if n == 0:
        raise ValueError("observed: no samples (all counts are 0); a goodness-of-fit test needs n ≥ 1")

    empirical_tv = 0.5 * float(np.abs(counts / n - probs).sum())
    possible = probs > 0
    impossible_count = int(counts[~possible].sum())
    cell_counts, cell_probs = counts[possible], probs[possible]
    cell_labels = tuple(int(i) if labels is None else labels[i] for i in np.flatnonzero(possible))
    groups = pool_cells(n * cell_probs, min_expected)
    common: dict[str, Any] = dict(n=n, empirical_tv=empirical_tv, impossible_count=impossible_count,
                                  statistic_name=name)

    if impossible_count:
        return GoodnessOfFit(
            statistic=math.inf, pvalue=0.0, dof=max(len(groups) - 1, 0), method="impossible-cell",
            pooled_cells=_merged_groups(groups, cell_labels), **common,
        )
    if len(groups) >= 2:
        pooled_counts = _sum_groups(cell_counts, groups)
        pooled_expected = n * _sum_groups(cell_probs, groups)
        value = float(_power_divergence(pooled_counts, pooled_expected, lam))
        dof = len(groups) - 1
        pvalue, method, confirmed_by = float(special.chdtrc(dof, value)), "asymptotic", ""
        if confirm_below is not None and pvalue <= confirm_below:
            pooled_probs = pooled_expected / n
            bound = relative_entropy_tail_bound(pooled_counts, pooled_probs)
            simulates = (monte_carlo_max_entries is None
                         or monte_carlo_draws * len(groups) <= monte_carlo_max_entries)
            if bound <= confirm_below * (BOUND_SHARE if simulates else 1.0):
                confirmed_by = "relative-entropy-bound"
            elif not simulates:
                pvalue, method = bound, "relative-entropy-bound"
            else:
                simulated_level = confirm_below * (1.0 - BOUND_SHARE)
                simulated = _monte_carlo_pvalue(pooled_counts, pooled_probs, lam, monte_carlo_draws, seed,
                                                stop_above=simulated_level)
                if simulated <= simulated_level:
                    confirmed_by = "monte-carlo"
                else:
                    pvalue, method = simulated, "monte-carlo"
        return GoodnessOfFit(
            statistic=value, pvalue=pvalue, dof=dof, method=method,
            pooled_cells=_merged_groups(groups, cell_labels), confirmed_by=confirmed_by, **common,
        )
    value = float(_power_divergence(cell_counts, n * cell_probs, lam))
    k = cell_probs.size  # log C(n + k − 1, k − 1), without building a huge integer
    log_outcomes = gammaln(n + k) - gammaln(n + 1) - gammaln(k)
    if log_outcomes <= math.log(EXACT_MAX_OUTCOMES):
        pvalue, method = _exact_pvalue(cell_counts, cell_probs, lam), "exact"
    else:
        pvalue = _monte_carlo_pvalue(cell_counts, cell_probs, lam, monte_carlo_draws, seed)
        method = "monte-carlo"
    return GoodnessOfFit(
        statistic=value, pvalue=pvalue, dof=k - 1, method=method, pooled_cells=(), **common,
    )


# --------------------------------------------------------------------------------------------
# Two-sample homogeneity
# --------------------------------------------------------------------------------------------


def _homogeneity_statistic(row_a: np.ndarray, column_totals: np.ndarray, n_a: int, n_b: int) -> np.ndarray:
    """Pearson X² of the 2 × k table (row_a, column_totals − row_a), vectorised over leading axes.

    With E_a = n_a c_i / N and E_b = n_b c_i / N the two rows' deviations are equal and opposite,
    so X² = Σ_i (a_i − E_a,i)² (1/E_a,i + 1/E_b,i).
    """
    total = n_a + n_b
    expected_a = n_a * column_totals / total
    expected_b = n_b * column_totals / total
    return np.asarray(np.sum((row_a - expected_a) ** 2 * (1.0 / expected_a + 1.0 / expected_b), axis=-1))


def _aligned_pair(counts_a: Any, counts_b: Any) -> tuple[np.ndarray, np.ndarray, Labels | None]:
    if isinstance(counts_a, Mapping) != isinstance(counts_b, Mapping):
        raise ValueError("counts_a, counts_b: pass both as dicts (key -> count) or both as arrays")
    if isinstance(counts_a, Mapping):
        labels = tuple(counts_a) + tuple(k for k in counts_b if k not in counts_a)
        a = _counts_array([counts_a.get(k, 0) for k in labels], "counts_a")
        b = _counts_array([counts_b.get(k, 0) for k in labels], "counts_b")
        return a, b, labels
    a, b = _counts_array(counts_a, "counts_a"), _counts_array(counts_b, "counts_b")
    if a.size != b.size:
        raise ValueError(f"counts_a, counts_b: length mismatch ({a.size} vs {b.size}); pass one count per cell")
    return a, b, None


def two_sample_test(
    counts_a: Sequence[int] | np.ndarray | Mapping[CellKey, int],
    counts_b: Sequence[int] | np.ndarray | Mapping[CellKey, int],
    *,
    min_expected: float = 5.0,
    seed: int = 0,
    monte_carlo_draws: int = DEFAULT_MONTE_CARLO_DRAWS,
) -> Homogeneity:
    """Test H0: the two samples come from the same (unknown) distribution.

    Pearson χ² test of homogeneity on the 2 × k table with rows a and b.  Conditioning on the
    margins (row sizes n_a, n_b and column totals c_i = a_i + b_i) the table's law under H0 is
    known (multivariate hypergeometric), so pooling may use the margins without affecting the
    level: cells with c_i = 0 are dropped, and columns are pooled by :func:`pool_cells` on the
    smaller row's expected count min(n_a, n_b)·c_i / N until every group reaches
    ``min_expected``.  With at least two groups the p-value is the χ²_{G−1} tail (method
    ``"asymptotic"``); otherwise the unpooled columns are tested by a Monte-Carlo permutation
    p-value (1 + #{X²* ≥ X²}) / (1 + draws), the row-a counts redrawn as n_a of the N pooled
    samples without replacement, seeded by ``seed`` (method ``"permutation"``).
    """
    a, b, labels = _aligned_pair(counts_a, counts_b)
    _check_positive(min_expected, "min_expected")
    _check_positive_int(monte_carlo_draws, "monte_carlo_draws")
    n_a, n_b = int(a.sum()), int(b.sum())
    if n_a == 0 or n_b == 0:
        raise ValueError(f"counts_a, counts_b: both samples need n ≥ 1, got n_a={n_a}, n_b={n_b}")
    empirical_tv = 0.5 * float(np.abs(a / n_a - b / n_b).sum())
    occupied = (a + b) > 0
    a, column_totals = a[occupied], (a + b)[occupied]
    cell_labels = tuple(int(i) if labels is None else labels[i] for i in np.flatnonzero(occupied))
    total = n_a + n_b
    groups = pool_cells(min(n_a, n_b) * column_totals / total, min_expected)
    common: dict[str, Any] = dict(n_a=n_a, n_b=n_b, empirical_tv=empirical_tv)

    if len(groups) >= 2:
        pooled_a, pooled_totals = _sum_groups(a, groups), _sum_groups(column_totals, groups)
        value = float(_homogeneity_statistic(pooled_a, pooled_totals, n_a, n_b))
        dof = len(groups) - 1
        return Homogeneity(
            statistic=value, pvalue=float(special.chdtrc(dof, value)), dof=dof, method="asymptotic",
            pooled_cells=_merged_groups(groups, cell_labels), **common,
        )
    value = float(_homogeneity_statistic(a, column_totals, n_a, n_b))
    rng = np.random.default_rng(seed)
    chunk = max(1, _MONTE_CARLO_CHUNK_ENTRIES // column_totals.size)
    at_least, done = 0, 0
    while done < monte_carlo_draws:
        size = min(chunk, monte_carlo_draws - done)
        permuted_a = rng.multivariate_hypergeometric(column_totals, n_a, size=size)
        simulated = _homogeneity_statistic(permuted_a, column_totals, n_a, n_b)
        at_least += int(_tail_fraction(simulated, value).sum())
        done += size
    return Homogeneity(
        statistic=value, pvalue=(1 + at_least) / (1 + monte_carlo_draws), dof=column_totals.size - 1,
        method="permutation", pooled_cells=(), **common,
    )


# --------------------------------------------------------------------------------------------
# Power and sample size
# --------------------------------------------------------------------------------------------


def _check_level_and_power(alpha: float, power: float | None, num_cells: int) -> None:
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha: expected a level in (0, 1), got {alpha!r}")
    if power is not None and not (isinstance(power, (int, float)) and alpha < power < 1):
        raise ValueError(f"power: expected a value in (alpha, 1) = ({alpha}, 1), got {power!r}")
    if isinstance(num_cells, bool) or not isinstance(num_cells, (int, np.integer)) or num_cells < 2:
        raise ValueError(f"num_cells: expected an integer ≥ 2, got {num_cells!r}")


def _check_epsilon(epsilon: float, name: str = "epsilon") -> None:
    if not (isinstance(epsilon, (int, float)) and 0 < epsilon <= 1):
        raise ValueError(f"{name}: expected a total-variation distance in (0, 1], got {epsilon!r}")


def _chi2_power(noncentrality: float, alpha: float, dof: int) -> float:
    """P(χ'²_dof(λ) > χ²_{dof, 1−α}): power of the level-α χ² test at noncentrality λ."""
    critical = special.chdtri(dof, alpha)
    return float(1.0 - special.chndtr(critical, dof, noncentrality)) if noncentrality > 0 else float(alpha)


def _smallest_n(power_of_n: Any, power: float) -> int:
    """Smallest integer n ≥ 1 with power_of_n(n) ≥ power, for power_of_n non-decreasing in n.

    Doubling finds an upper bracket, then bisection keeps power_of_n(lo) < power ≤ power_of_n(hi).
    """
    if power_of_n(1) >= power:
        return 1
    lo, hi = 1, 2
    while power_of_n(hi) < power:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power_of_n(mid) >= power:
            hi = mid
        else:
            lo = mid
    return hi


@functools.lru_cache(maxsize=1024)
def _required_noncentrality(alpha: float, power: float, dof: int) -> float:
    """The λ at which the level-α χ²_dof test has exactly ``power`` (root of a monotone function;
    kept per arguments: an audit's plans ask for a few hundred times a handful of them)."""
    upper = 1.0
    while _chi2_power(upper, alpha, dof) < power:
        upper *= 2.0
    return crossing(lambda lam: _chi2_power(lam, alpha, dof) - power, 0.0, upper)[1]


def power_at(n: int, epsilon: float, *, alpha: float, num_cells: int) -> float:
    """Guaranteed power of the level-α Pearson test with n samples against any TV-ε deviation.

    Derivation.  Let the samples come from p' = p + d with TV(p, p') = ½ Σ|d_i| = ε.  Under
    such an alternative Pearson's X² is approximately noncentral χ²_dof(λ) with dof = cells − 1
    and λ = n Σ_i d_i² / p_i (the standard local-alternative approximation).  By Cauchy–Schwarz,
    (Σ|d_i|)² = (Σ (|d_i|/√p_i)·√p_i)² ≤ Σ d_i²/p_i · Σ p_i = Σ d_i²/p_i, hence

        λ ≥ n (2ε)² = 4 n ε²,

    with equality when |d_i| ∝ p_i (half the mass moved up by a factor 1 + 2ε, half down).  The
    power P(χ'²_dof(λ) > χ²_{dof,1−α}) increases with λ, so every TV-ε deviation is detected
    with probability at least P(χ'²_dof(4nε²) > χ²_{dof,1−α}), which this returns.  It assumes
    no pooling (n·min p ≥ min_expected); with pooling it holds for the pooled TV.
    """
    _check_positive_int(n, "n")
    _check_epsilon(epsilon)
    _check_level_and_power(alpha, None, num_cells)
    return _chi2_power(4.0 * n * epsilon**2, alpha, num_cells - 1)


def sample_size_for_tv(epsilon: float, *, alpha: float, power: float, num_cells: int) -> int:
    """Smallest n for which :func:`power_at` (n, ε) ≥ ``power``: the Pearson test at level α then
    detects every deviation of total variation ε with at least that power.

    Found by bisection on the integer n (the bound P(χ'²_{cells−1}(4nε²) > χ²_{cells−1,1−α}) is
    increasing in n); see :func:`power_at` for the derivation.
    """
    _check_epsilon(epsilon)
    _check_level_and_power(alpha, power, num_cells)
    dof = num_cells - 1
    return _smallest_n(lambda n: _chi2_power(4.0 * n * epsilon**2, alpha, dof), power)


def detectable_tv(n: int, *, alpha: float, power: float, num_cells: int) -> float:
    """Smallest TV distance ε that the level-α Pearson test with n samples detects with at least
    ``power`` (the inverse of :func:`sample_size_for_tv`): ε = √(λ*/(4n)) where λ* solves
    P(χ'²_{cells−1}(λ*) > χ²_{cells−1,1−α}) = power.

    The value is nudged up to the next float where needed so that power_at(n, ε) ≥ power holds
    exactly.  A result ≥ 1 means no deviation is guaranteed detectable at this n (TV ≤ 1).
    """
    _check_positive_int(n, "n")
    _check_level_and_power(alpha, power, num_cells)
    dof = num_cells - 1
    epsilon = math.sqrt(_required_noncentrality(alpha, power, dof) / (4.0 * n))
    while _chi2_power(4.0 * n * epsilon**2, alpha, dof) < power:
        epsilon = math.nextafter(epsilon, math.inf)
    return epsilon


def homogeneity_sample_size(epsilon: float, *, alpha: float, power: float, num_cells: int) -> int:
    """Per-sample size n (both samples of size n) for the two-sample test of :func:`two_sample_test`
    to detect TV(p_a, p_b) = ε with at least ``power`` at level α.

    Bound.  For rows of sizes n_a, n_b the homogeneity test's noncentrality is
    λ = (n_a n_b / (n_a + n_b)) Σ_i d_i² / p̄_i with d = p_a − p_b and p̄ the size-weighted mean;
    Cauchy–Schwarz as in :func:`power_at` gives Σ d_i²/p̄_i ≥ (Σ|d_i|)² = 4ε², so with
    n_a = n_b = n, λ ≥ (n/2)·4ε² = 2nε²: each sample needs about twice the one-sample n.
    """
    _check_epsilon(epsilon)
    _check_level_and_power(alpha, power, num_cells)
    dof = num_cells - 1
    return _smallest_n(lambda n: _chi2_power(2.0 * n * epsilon**2, alpha, dof), power)


def _check_rate_alternative(delta: float, p0: float, alpha: float, power: float | None) -> None:
    if not (isinstance(p0, (int, float)) and 0 <= p0 < 1):
        raise ValueError(f"p0: expected a null rate in [0, 1), got {p0!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta <= 1 - p0):
        raise ValueError(f"delta: expected a rate increase in (0, 1 − p0] = (0, {1 - p0}], got {delta!r}")
    _check_level_and_power(alpha, power, 2)


def _binomial_critical_count(n: int, p0: float, alpha: float) -> int:
    """Smallest c with P_{p0}(X ≥ c) ≤ α for X ~ Binomial(n, p0): the one-sided test rejects iff X ≥ c."""
    if p0 <= 0:
        return 1
    c = min(n + 1, max(1, int(n * p0 + 3.0 * math.sqrt(n * p0 * (1.0 - p0))) + 1))  # near the tail's start
    while c > 0 and binomial_sf(c - 2, n, p0) <= alpha:  # P(X ≥ c − 1) ≤ α: c − 1 already suffices
        c -= 1
    while c <= n and binomial_sf(c - 1, n, p0) > alpha:
        c += 1
    return c


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X > k) for X ~ Binomial(n, p) (1 for k < 0, 0 for k ≥ n)."""
    if k < 0:
        return 1.0
    if k >= n:
        return 0.0
    return float(special.bdtrc(k, n, p))


def binomial_power(n: int, delta: float, *, p0: float, alpha: float) -> float:
    """Exact power at rate p0 + δ of the level-α one-sided binomial test of H0: rate ≤ p0 with n trials.

    The test rejects iff X ≥ c, c the smallest count with P_{p0}(X ≥ c) ≤ α (the test
    :func:`binomial_test` with ``alternative="greater"`` performs); power = P_{p0+δ}(X ≥ c).
    """
    _check_positive_int(n, "n")
    _check_rate_alternative(delta, p0, alpha, None)
    c = _binomial_critical_count(int(n), p0, alpha)
    return binomial_sf(c - 1, int(n), p0 + delta)


def binomial_sample_size(delta: float, *, p0: float, alpha: float, power: float) -> int:
    """Number of trials for the one-sided exact binomial test of H0: rate ≤ p0 at level α to detect
    a rate ≥ p0 + δ with at least ``power``.

    Used by the coupling-inequality check: a single-draft verifier is lossless only if its
    acceptance rate is ≤ 1 − TV(p, q) (the maximal coupling), so a rate ≥ p0 + δ with
    p0 = 1 − TV proves loss.  The exact test's power (:func:`binomial_power`) is a saw-tooth in
    n (the critical count is an integer), so the search is a bisection on the predicate
    "power(n) ≥ target": the returned n achieves the power exactly and n − 1 does not; a
    slightly smaller n on an earlier tooth may also achieve it, and a larger n may dip just
    below it — run the test with exactly this n.
    """
    _check_rate_alternative(delta, p0, alpha, power)
    return _smallest_n(lambda n: binomial_power(n, delta, p0=p0, alpha=alpha), power)


# --------------------------------------------------------------------------------------------
# Exact binomial test
# --------------------------------------------------------------------------------------------


def binomial_test(
    successes: int,
    trials: int,
    p: float,
    alternative: Literal["greater", "less", "two-sided"] = "greater",
    *,
    confidence_level: float = 0.95,
) -> BinomialResult:
    """Exact binomial test of H0: rate = p (one-sided tails from ``scipy.special``, the two-sided test
    from ``scipy.stats.binomtest``), with estimate k/n and the
    Clopper–Pearson interval at ``confidence_level`` (one-sided for one-sided alternatives:
    [low, 1] for ``"greater"``, [0, high] for ``"less"``).
    """
    for value, name in ((successes, "successes"), (trials, "trials")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name}: expected an integer, got {value!r}")
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(
            f"successes, trials: expected 0 ≤ successes ≤ trials and trials ≥ 1, got {successes}/{trials}"
        )
    if not (isinstance(p, (int, float)) and 0 <= p <= 1):
        raise ValueError(f"p: expected a null rate in [0, 1], got {p!r}")
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative: expected 'greater', 'less' or 'two-sided', got {alternative!r}")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level: expected a value in (0, 1), got {confidence_level!r}")
    k, n = int(successes), int(trials)
    if alternative == "two-sided":
        from scipy import stats as sps  # the two-sided p-value's likelihood ordering (imported when used)

        result = sps.binomtest(k, n, float(p), alternative=alternative)
        interval = result.proportion_ci(confidence_level=confidence_level, method="exact")
        pvalue, low, high = float(result.pvalue), float(interval.low), float(interval.high)
    elif alternative == "greater":  # P(X ≥ k); Clopper–Pearson [Beta⁻¹(1 − c; k, n − k + 1), 1]
        pvalue = binomial_sf(k - 1, n, float(p))
        low = float(special.betaincinv(k, n - k + 1, 1.0 - confidence_level)) if k > 0 else 0.0
        high = 1.0
    else:  # P(X ≤ k); [0, Beta⁻¹(c; k + 1, n − k)]
        pvalue = float(special.bdtr(k, n, float(p))) if k < n else 1.0
        low = 0.0
        high = float(special.betaincinv(k + 1, n - k, confidence_level)) if k < n else 1.0
    return BinomialResult(
        successes=k, trials=n, null_p=float(p), alternative=alternative, pvalue=min(1.0, max(0.0, pvalue)),
        estimate=successes / trials, ci_low=low, ci_high=high, confidence_level=float(confidence_level),
    )


# --------------------------------------------------------------------------------------------
# Family-wise budgets
# --------------------------------------------------------------------------------------------


def bonferroni(alpha: float, num_tests: int) -> float:
    """Per-test level α/m: by the union bound P(any of m true nulls rejected) ≤ m·(α/m) = α,
    whatever the dependence between the tests."""
    _check_level_and_power(alpha, None, 2)
    _check_positive_int(num_tests, "num_tests")
    return alpha / num_tests


bonferroni_alphas = bonferroni  # the name used in docs/ARCHITECTURE.md


def holm(pvalues: Sequence[float] | np.ndarray, alpha: float) -> list[bool]:
    """Holm's step-down procedure (Holm 1979): reject flags, in the input order.

    Sort the m p-values ascending p_(1) ≤ … ≤ p_(m); reject H_(1), …, H_(j) where j is the
    largest index with p_(i) ≤ α/(m − i + 1) for every i ≤ j (stop at the first failure).
    Controls the family-wise error rate at α under any dependence, and rejects everything
    Bonferroni rejects.
    """
    _check_level_and_power(alpha, None, 2)
    values = np.asarray(pvalues, dtype=np.float64)
    if values.ndim != 1 or np.any(~np.isfinite(values)) or np.any((values < 0) | (values > 1)):
        raise ValueError(f"pvalues: expected a 1-D sequence of p-values in [0, 1], got {pvalues!r}")
    m = values.size
    rejected = [False] * m
    for rank, index in enumerate(np.argsort(values, kind="stable")):
        if values[index] > alpha / (m - rank):
            break
        rejected[int(index)] = True
    return rejected


@dataclass(frozen=True)
class Budget:
    """A family-wise false-positive budget ``alpha_total`` split evenly over ``num_checks`` checks.

    Each check runs at ``alpha_per_check`` = alpha_total / num_checks (Bonferroni), so the chance
    that any of the checks fails on a correct implementation is at most ``alpha_total``,
    whatever the dependence between the checks.
    """

    alpha_total: float
    num_checks: int

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha_total, (int, float)) and 0 < self.alpha_total < 1):
            raise ValueError(f"alpha_total: expected a level in (0, 1), got {self.alpha_total!r}")
        _check_positive_int(self.num_checks, "num_checks")

    @property
    def alpha_per_check(self) -> float:
        """The level each check runs at: alpha_total / num_checks."""
        return bonferroni(self.alpha_total, self.num_checks)

    def rejects(self, pvalue: float) -> bool:
        """Whether a check with this p-value fails within the budget (p ≤ alpha_per_check)."""
        return pvalue <= self.alpha_per_check
