"""Token-level identity tests for large vocabularies: were n tokens drawn from a known law p?

H0: counts ~ Multinomial(n, p) over V tokens (V up to 262,144 and beyond).  A pooled χ² test
needs n·p_x ≥ 5 in every cell it keeps, so at large V it pools the tail away and cannot see a loss
inside it; the identity-testing literature detects every deviation of total variation ε with about
√V/ε² samples (Acharya, Daskalakis & Kamath 2015, "Optimal testing for properties of
distributions"; Valiant & Valiant 2014; Diakonikolas & Kane 2016), far fewer on Zipf-like laws.

The test is made of *parts*, each a valid test at its own share of the level (weighted
Bonferroni: the combined p-value is min_j p_j / share_j, a valid p-value at every level at once,
whatever the dependence between the parts):

- ``zeros``: a sample on a token with p_x = 0 is impossible under H0: p-value 0 (no share needed).
- ``tokens``: the ADK statistic (Acharya et al. 2015, §3, eq. (2)) with flattened weights::

      Z = Σ_{x: p_x > 0} ((N_x − λ_x)² − N_x) / w_x,      w_x = max(λ_x, c)

  over every token of positive probability.  Tokens with λ_x ≥ c form the heavy set A (ADK's
  weights 1/λ_x, null variance 2 each); the light tokens get weight 1/c, so each adds null
  variance 2(λ_x/c)² < 2 instead of 2 — the flattening of Diakonikolas & Kane (2016) — and yet
  a loss that concentrates light mass on few tokens (a half-precision CDF) is seen by their
  collisions N_x(N_x − 1).
- ``light-mass``: the total count of the light tokens, N_L ~ Poisson(Σ_{x∈L} λ_x) (exact,
  two-sided).  A tail scaled up or down (a default top-k, a temperature on one path) moves it.
- ``light-ids``: the light tokens in blocks of consecutive ids: aligned ranges of a power-of-two
  width (vocabulary tiles), merged in id order until each block expects ≥ ``block_min_expected``
  samples; tested by the same statistic on the block counts.  A kernel that loses an id range
  (tokens past 65,535, a partial last tile) moves mass between blocks.
- ``light-levels``: the light tokens by dyadic probability level, merged the same way: a tail cut
  at a probability floor (fp16 underflow, min-p) moves mass between levels.

The partition (c, the blocks, the shares) is a function of (p, n) and the options only, fixed
before sampling.

Calibration (rigorous; no Monte Carlo, no asymptotics).

1. Exact Poissonization.  With N' ~ Poisson(n'), n' chosen so that P(N' > n) ≤ 1e-4, a uniformly
   random subset of N' of the n samples is kept (N' > n: no test, p-value 1); each kept sample
   of token x is then kept again with probability ρ_x = λ_x / (n' p_x), where λ_x is n' p_x
   rounded down to the grid c·r^j (r = 1.005).  The counts N_x are then exactly independent
   Poisson(λ_x), and the λ_x take few distinct values (this is what makes the bound fast).  The
   p-value is valid: P(p ≤ a) = Σ_{m ≤ n} P(N' = m) P(p(Mult_m) ≤ a) ≤ P(p(Poisson) ≤ a) ≤ a.
   The sample used is N' ≈ n − 3.7√n, thinned by < 0.5%.
2. Chernoff bound with truncation.  Poisson variables make Y_x = ((N_x − λ_x)² − N_x)/w_x
   independent, but E e^{θ Y_x} = ∞ for every θ > 0 (e^{θk²} outgrows k!), so the bound is
   taken on the event E = {N_x ≤ M_x for all x}::

       P(Z ≥ z) ≤ P(Z ≥ z, E) + P(Eᶜ) ≤ e^{−θz} Π_x E[e^{θ Y_x}; N_x ≤ M_x] + Σ_x P(N_x > M_x)

   for every θ > 0; M_x is the smallest integer with P(Poisson(λ_x) > M_x) ≤ 1e-13 / V, and the
   truncation mass Σ_x P(N_x > M_x) (≤ 1e-13) is added to the p-value.  Each truncated MGF is a
   finite sum of the Poisson pmf over a window of k; below the window (k < λ − 12√λ) the sum is
   bounded by Σ_j exp(−j²(1 − 2θ)/(2λ)) (Poisson lower tail P(N ≤ λ − j) ≤ e^{−j²/(2λ)} and
   Y ≤ j²/λ there).  The minimum over θ is taken on a fixed geometric grid of θ (ratio 1.25,
   from 0.3/σ₀ to min(0.25, 12/σ₀), σ₀² = Σ 2λ_x²/w_x²): every grid point gives a valid bound.
3. ``light-mass`` is an exact Poisson tail; ``light-ids`` and ``light-levels`` use step 2 on the
   block counts (sums of independent Poissons are Poisson).

Planning (:func:`identity_power`, :func:`identity_sample_size`, :func:`identity_joint_sample_size`,
:func:`identity_detectable_tv`) is a worst case over EVERY alternative q with TV(p, q) ≥ ε, from
the ``tokens`` and ``zeros`` parts alone (the light parts only add power); see :func:`identity_power` for the bound.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import gammaln, ndtri, pdtr, pdtrc

from specverify.core import plan_cache
from specverify.core.roots import crossing
from specverify.core.stats import _counts_array, _probability_array, pool_cells, sample_size_for_tv

__all__ = [
    "IdentityDesign",
    "IdentityPart",
    "IdentityTest",
    "PooledChiSquareSize",
    "identity_design",
    "identity_detectable_tv",
    "identity_joint_sample_size",
    "identity_power",
    "identity_sample_size",
    "identity_test",
    "pooled_chi2_sample_size",
]

PART_NAMES = ("zeros", "tokens", "light-mass", "light-ids", "light-levels")
DEFAULT_SHARES: Mapping[str, float] = {"tokens": 0.4, "light-mass": 0.2, "light-ids": 0.2, "light-levels": 0.2}
"""α shares of the parts (renormalised over the parts a design has; ``zeros`` takes none)."""

SUBSAMPLE_OVERFLOW = 1e-4
"""P(N' > n) for the Poisson sub-sample size N' ~ Poisson(n'): the chance that no test is possible."""

TRUNCATION_MASS = 1e-13
"""Budget of Σ_x P(N_x > M_x), the part of every Chernoff p-value that truncation costs (its floor)."""

MEAN_GRID_RATIO = 1.005
"""Poisson means are rounded down to c·r^j with this r (thinning keeps each sample with ρ ≥ 1/r)."""

THETA_GRID_RATIO = 1.25
"""Ratio of the geometric θ grid of the Chernoff bound (a p-value at z = 6σ₀ is ≤ 1.3× the optimum
over all θ; the critical value moves by < 0.1σ₀)."""

_THETA_MAX = 0.25  # the lower-window remainder bound needs θ < 1/2
_LOWER_WINDOW_SDS = 12.0
_DESIGN_CACHE_SIZE = 8
_BOUND_CACHE_SIZE = 1024  # a look of production-batch-1024 bounds 63 id-block cell sets, and shares two


# --------------------------------------------------------------------------------------------
# Result objects
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdentityPart:
    """One part of :class:`IdentityTest`.

    name: one of ``PART_NAMES``; statistic: the part's statistic; pvalue: a valid p-value
    (P(pvalue ≤ a | H0) ≤ a); share: its share of the level; cells: tokens or blocks it sums
    over; expected: its expected count under H0; observed: its observed count (in the Poisson
    sub-sample, except ``zeros``, which reads all n samples); calibration: how the p-value was
    bounded.
    """

    name: str
    statistic: float
    pvalue: float
    share: float
    cells: int
    expected: float
    observed: int
    calibration: str


@dataclass(frozen=True)
class IdentityTest:
    """Result of :func:`identity_test`.

    statistic: Z of the ``tokens`` part; heavy_statistic: the heavy tokens' terms of Z;
    pvalue: min(1, min_j p_j / share_j) over the parts (0 when a zero-probability token was
    observed); n: samples given; n_used: samples in the Poisson sub-sample after thinning;
    vocab_size: V; heavy_size: |A|, the tokens with λ_x ≥ c; parts: in ``PART_NAMES`` order,
    those the design has; pooled: what was merged into blocks; calibration: the bound used;
    impossible_count: samples on zero-probability tokens; empirical_tv: ½ Σ_x |N_x/n − p_x| on
    all n samples.
    """

    statistic: float
    heavy_statistic: float
    pvalue: float
    n: int
    n_used: int
    vocab_size: int
    heavy_size: int
    parts: tuple[IdentityPart, ...]
    pooled: str
    calibration: str
    impossible_count: int
    empirical_tv: float

    def part(self, name: str) -> IdentityPart:
        """The part called ``name``."""
        for part in self.parts:
            if part.name == name:
                return part
        raise ValueError(f"name: this test has no part {name!r}; it has {[p.name for p in self.parts]}")

    def rejects(self, alpha: float) -> bool:
        """pvalue ≤ alpha."""
        return self.pvalue <= alpha

    def __str__(self) -> str:
        parts = "; ".join(f"{p.name} p={p.pvalue:.3g} (share {p.share:.2g})" for p in self.parts)
        return (f"identity test: p-value={self.pvalue:.4g}; Z={self.statistic:.6g}, n={self.n} (used {self.n_used}), "
                f"V={self.vocab_size}, heavy {self.heavy_size}; {parts}; empirical TV={self.empirical_tv:.4g}")


@dataclass(frozen=True)
class PooledChiSquareSize:
    """Pearson χ² sample sizes for comparison (:func:`pooled_chi2_sample_size`).

    nominal: the n of ``stats.sample_size_for_tv`` on the number of cells left after pooling to
    ≥ ``min_expected`` at that n (a fixed point); its power statement holds only for the TV
    between the *pooled* laws, so a loss inside a pooled cell is not covered.  cells: that number
    of cells.  unpooled: the smallest n at which nothing is pooled (n·min p ≥ min_expected) and
    the noncentral-χ² bound on V cells holds: the n at which Pearson's guarantee covers every
    TV-ε deviation (as approximately as the noncentral χ² does; it is not a rigorous bound).
    """

    nominal: int
    cells: int
    unpooled: int


# --------------------------------------------------------------------------------------------
# Poisson cells and their Chernoff bound
# --------------------------------------------------------------------------------------------


def _truncation_points(means: np.ndarray, tail: float) -> np.ndarray:
    """Smallest integers M with P(Poisson(μ) > M) ≤ ``tail``, for each mean μ (bisection on
    pdtrc from Bennett's bound P(N ≥ μ + t) ≤ exp(−t²/(2(μ + t/3))), which is above every M)."""
    log_tail = math.log(1.0 / tail)
    high = np.ceil(means + log_tail / 3.0 + np.sqrt(log_tail**2 / 9.0 + 2.0 * log_tail * means)) + 1.0
    low = np.floor(means) - 1.0  # P(N > ⌊μ⌋ − 1) > tail for every tail < 1/2
    while np.any(high - low > 1):
        middle = np.floor((low + high) / 2.0)
        ok = pdtrc(middle, means) <= tail
        high = np.where(ok, middle, high)
        low = np.where(ok, low, middle)
    return high.astype(np.int64)


@dataclass(frozen=True)
class PoissonCells:
    """Independent Poisson cells N_g ~ Poisson(λ_g), each ``multiplicity_g`` times, with terms
    Y_g = ((N_g − λ_g)² − N_g) / w_g, and everything the Chernoff bound on Σ Y needs.

    For each distinct cell the truncated MGF E[e^{θY}; N ≤ M] is a sum over k ∈ [lo, M] of
    exp(log pmf(k) + θ y(k)) (the flat arrays ``log_pmf``, ``terms`` with segment ``starts``),
    plus, when lo > 0, the lower remainder bound of the module docstring.
    """

    means: np.ndarray
    weights: np.ndarray
    multiplicity: np.ndarray
    log_pmf: np.ndarray
    terms: np.ndarray
    starts: np.ndarray
    remainder_gap: np.ndarray  # j₁ = λ − lo + 1 where lo > 0, else inf (no remainder)
    truncation: float  # Σ_x P(N_x > M_x)
    null_sd: float  # σ₀ = √(Σ 2λ²/w²)

    @classmethod
    def build(cls, means: np.ndarray, weights: np.ndarray, multiplicity: np.ndarray, tail: float) -> PoissonCells:
        means = np.asarray(means, dtype=np.float64)
        weights = np.asarray(weights, dtype=np.float64)
        multiplicity = np.asarray(multiplicity, dtype=np.float64)
        if np.any(weights < means * (1 - 1e-12)):
            raise ValueError("weights: every weight must be ≥ its mean (the lower remainder bound needs it)")
        top = _truncation_points(means, tail)
        low = np.maximum(0, np.ceil(means - _LOWER_WINDOW_SDS * np.sqrt(means))).astype(np.int64)
        width = top - low + 1
        starts = np.concatenate([[0], np.cumsum(width)[:-1]]).astype(np.int64)
        cell = np.repeat(np.arange(means.size), width)
        k = (np.arange(int(width.sum())) - np.repeat(starts, width) + np.repeat(low, width)).astype(np.float64)
        mean_k, weight_k = means[cell], weights[cell]
        log_pmf = -mean_k + k * np.log(mean_k) - gammaln(k + 1.0)
        terms = ((k - mean_k) ** 2 - k) / weight_k
        gap = np.where(low > 0, means - low + 1.0, np.inf)
        truncation = float(np.sum(multiplicity * pdtrc(top.astype(np.float64), means)))
        null_sd = math.sqrt(float(np.sum(multiplicity * 2.0 * means**2 / weights**2)))
        return cls(means, weights, multiplicity, log_pmf, terms, starts, gap, truncation, null_sd)

    def log_mgf(self, theta: float) -> float:
        """An upper bound on Σ_x log E[e^{θ Y_x}; N_x ≤ M_x], for 0 < θ < 1/2."""
        sums = np.add.reduceat(np.exp(self.log_pmf + theta * self.terms), self.starts)
        finite = np.isfinite(self.remainder_gap)
        if np.any(finite):
            a = (1.0 - 2.0 * theta) / (2.0 * self.means[finite])
            j1 = self.remainder_gap[finite]
            sums[finite] += np.exp(-a * j1**2) * (1.0 + 1.0 / (2.0 * a * j1))
        return float(np.sum(self.multiplicity * np.log(sums)))


@dataclass(frozen=True)
class ChernoffBound:
    """P(Σ Y ≥ z) ≤ min_j exp(−θ_j z + K_j) + truncation over the grid θ_j (K_j = log-MGF bound)."""

    thetas: np.ndarray
    log_mgfs: np.ndarray
    truncation: float
    null_sd: float

    @classmethod
    def of(cls, cells: PoissonCells) -> ChernoffBound:
        sd = max(cells.null_sd, 1e-300)
        low, high = 0.3 / sd, min(_THETA_MAX, 12.0 / sd)
        count = max(2, math.ceil(math.log(high / low) / math.log(THETA_GRID_RATIO)) + 1) if high > low else 1
        thetas = np.geomspace(min(low, high), high, count)
        log_mgfs = np.array([cells.log_mgf(float(t)) for t in thetas])
        return cls(thetas, log_mgfs, cells.truncation, cells.null_sd)

    def pvalue(self, z: float) -> float:
        bound = float(np.min(np.exp(np.minimum(-self.thetas * z + self.log_mgfs, 700.0))))
        return min(1.0, bound + self.truncation)

    def critical_value(self, level: float) -> float:
        """Smallest z with :meth:`pvalue` (z) ≤ level (inf if the truncation floor is above it)."""
        room = level - self.truncation
        if room <= 0:
            return math.inf
        return float(np.min((self.log_mgfs - math.log(room)) / self.thetas))


def chernoff_bound(means: np.ndarray, weights: np.ndarray, multiplicity: np.ndarray, tail: float) -> ChernoffBound:
    """The Chernoff bound of the Poisson cells ``(means, weights, multiplicity)`` truncated at ``tail``
    (:meth:`PoissonCells.build`, :meth:`ChernoffBound.of`), kept by the cells' content: the laws of
    a production check are permutations of one law, so at one n their token cells and their
    probability-level blocks are the same cells, bounded once."""
    arrays = [np.ascontiguousarray(a, dtype=np.float64) for a in (means, weights, multiplicity)]
    key = hashlib.blake2b(b"".join(a.tobytes() for a in arrays) + struct.pack("<d", tail), digest_size=16).digest()
    return _bound_of_cells(key, _Carried((*arrays, tail)))


@functools.lru_cache(maxsize=_BOUND_CACHE_SIZE)
def _bound_of_cells(key: bytes, cells: _Carried) -> ChernoffBound:
    means, weights, multiplicity, tail = cells.value
    return ChernoffBound.of(PoissonCells.build(means, weights, multiplicity, tail))


def _term_floors(means: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """b = −min over integers k ≥ 0 of ((k − λ)² − k)/w, clipped at 0 (the minimum over real k is
    at λ + ½, so the integer minimum is at its floor or ceiling)."""
    lows = np.floor(means + 0.5)
    values = np.minimum(((lows - means) ** 2 - lows), ((lows + 1 - means) ** 2 - lows - 1))
    values = np.minimum(values, means**2)  # k = 0
    return np.asarray(np.maximum(0.0, -values / weights))


def _adk_terms(counts: np.ndarray, means: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """((N − λ)² − N) / w per cell."""
    counts = counts.astype(np.float64)
    return np.asarray(((counts - means) ** 2 - counts) / weights)


# --------------------------------------------------------------------------------------------
# Design: everything fixed by (p, n) before sampling
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdentityDesign:
    """Everything about the test that is fixed by (p, n) and the options before sampling.

    n: the sample size; n_poisson: n' (mean of the Poisson sub-sample); vocab_size: V;
    flatten: c; means: λ_x (n'p_x rounded down to the grid, 0 where p_x = 0); keep: ρ_x, the
    thinning probability; heavy / light / zero_ids: token ids with λ ≥ c, 0 < λ < c, p = 0;
    id_blocks / level_blocks: the light partitions (tuples of id arrays); shares: part -> share
    (over the parts present); tokens / ids_bound / levels_bound: the Chernoff bounds of the parts.
    """

    n: int
    n_poisson: float
    vocab_size: int
    flatten: float
    means: np.ndarray
    keep: np.ndarray
    weights: np.ndarray
    heavy: np.ndarray
    light: np.ndarray
    zero_ids: np.ndarray
    id_blocks: tuple[np.ndarray, ...]
    level_blocks: tuple[np.ndarray, ...]
    shares: Mapping[str, float]
    tokens: ChernoffBound
    ids_bound: ChernoffBound | None
    levels_bound: ChernoffBound | None
    light_mean: float
    id_labels: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    level_labels: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    id_block_means: np.ndarray = field(default_factory=lambda: np.empty(0))
    level_block_means: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Σ λ over each id block and each level block: the cells of ``ids_bound`` and ``levels_bound``."""
    type_means: np.ndarray = field(default_factory=lambda: np.empty(0))
    type_weights: np.ndarray = field(default_factory=lambda: np.empty(0))
    type_counts: np.ndarray = field(default_factory=lambda: np.empty(0))
    type_floors: np.ndarray = field(default_factory=lambda: np.empty(0))
    """The distinct (λ, w) of the tokens of positive probability, how many tokens have each, and
    b = −min_k ((k − λ)² − k)/w ≥ 0 (the terms are ≥ −b): what planning needs."""


@functools.lru_cache(maxsize=1024)
def _poisson_mean(n: int) -> float:
    """Largest n' with P(Poisson(n') > n) ≤ SUBSAMPLE_OVERFLOW."""
    if pdtrc(float(n), 1e-12) > SUBSAMPLE_OVERFLOW:
        return 0.0
    return crossing(lambda mu: pdtrc(float(n), mu) - SUBSAMPLE_OVERFLOW, 1e-12, float(n))[0]


def _grid_means(raw: np.ndarray, c: float) -> np.ndarray:
    """raw rounded down to c·r^j (0 stays 0)."""
    out = np.zeros_like(raw)
    positive = raw > 0
    step = math.log(MEAN_GRID_RATIO)
    exponent = np.floor(np.log(raw[positive] / c) / step)
    value = c * np.exp(exponent * step)
    value = np.where(value > raw[positive], c * np.exp((exponent - 1) * step), value)
    out[positive] = value
    return out


def _merge_in_order(groups: list[np.ndarray], expected: np.ndarray, minimum: float) -> list[np.ndarray]:
    """Merge consecutive groups until each expects ≥ ``minimum`` (a short last one joins the one
    before); ``expected[i]`` is group i's expected count."""
    merged: list[np.ndarray] = []
    open_ids: list[np.ndarray] = []
    total = 0.0
    for ids, mean in zip(groups, expected):
        open_ids.append(ids)
        total += float(mean)
        if total >= minimum:
            merged.append(np.concatenate(open_ids))
            open_ids, total = [], 0.0
    if open_ids:
        if merged:
            merged[-1] = np.concatenate([merged[-1], *open_ids])
        else:
            merged.append(np.concatenate(open_ids))
    return merged


def _id_blocks(light: np.ndarray, means: np.ndarray, vocab_size: int, count: int, minimum: float) -> list[np.ndarray]:
    """Light ids in aligned ranges of width 2^⌈log2(V/count)⌉, merged in id order to ≥ minimum."""
    width = 1 << max(0, math.ceil(math.log2(max(1.0, vocab_size / count))))
    tile = light // width
    edges = np.flatnonzero(np.diff(tile)) + 1
    groups = np.split(light, edges)
    return _merge_in_order(groups, np.array([means[g].sum() for g in groups]), minimum)


def _level_blocks(light: np.ndarray, probs: np.ndarray, minimum: float, means: np.ndarray) -> list[np.ndarray]:
    """Light ids by dyadic level ⌊−log2 p⌋ (heaviest level first), merged to ≥ minimum."""
    level = np.floor(-np.log2(probs[light])).astype(np.int64)
    order = np.argsort(level, kind="stable")
    sorted_ids, sorted_levels = light[order], level[order]
    edges = np.flatnonzero(np.diff(sorted_levels)) + 1
    groups = [np.sort(g) for g in np.split(sorted_ids, edges)]
    return _merge_in_order(groups, np.array([means[g].sum() for g in groups]), minimum)


def _block_labels(blocks: Sequence[np.ndarray], vocab_size: int) -> np.ndarray:
    """Block index of every token id (−1 outside the blocks)."""
    labels = np.full(vocab_size, -1, dtype=np.int64)
    for index, ids in enumerate(blocks):
        labels[ids] = index
    return labels


def _block_means(labels: np.ndarray, num_blocks: int, types: np.ndarray, type_means: np.ndarray) -> np.ndarray:
    """Σ λ over each block (``labels``: each id's block, −1 outside; ``types``: each id's index in
    the sorted distinct means ``type_means``), summed as Σ_t (ids of type t in the block) · λ_t:
    blocks that hold the same means under other ids (a permuted law's probability levels) get the
    same sums, bit for bit, and so the same cells (:func:`chernoff_bound`)."""
    inside = labels >= 0
    counts = np.bincount(labels[inside] * type_means.size + types[inside], minlength=num_blocks * type_means.size)
    sums: np.ndarray = (counts.reshape(num_blocks, type_means.size) * type_means).sum(axis=1)
    return sums


def _block_bound(block_means: np.ndarray) -> ChernoffBound:
    return chernoff_bound(block_means, block_means, np.ones(len(block_means)), TRUNCATION_MASS / len(block_means))


def _check_options(flatten: float, id_block_count: int, block_min_expected: float,
                   shares: Mapping[str, float] | None) -> dict[str, float]:
    if not (isinstance(flatten, (int, float)) and math.isfinite(flatten) and flatten > 0):
        raise ValueError(f"flatten: expected the heavy cut c > 0 (expected count), got {flatten!r}")
    if isinstance(id_block_count, bool) or not isinstance(id_block_count, (int, np.integer)) or id_block_count < 1:
        raise ValueError(f"id_block_count: expected a positive integer, got {id_block_count!r}")
    if not (isinstance(block_min_expected, (int, float)) and block_min_expected >= 1):
        raise ValueError(f"block_min_expected: expected an expected count ≥ 1, got {block_min_expected!r}")
    chosen = dict(DEFAULT_SHARES if shares is None else shares)
    unknown = set(chosen) - set(PART_NAMES[1:])
    if unknown or not chosen or any(not (isinstance(v, (int, float)) and v >= 0) for v in chosen.values()) \
            or chosen.get("tokens", 0) <= 0:
        raise ValueError(f"shares: expected non-negative shares of {PART_NAMES[1:]} with tokens > 0, got {shares!r}")
    return chosen


def _digest(probs: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(probs).tobytes(), digest_size=16).hexdigest()


def identity_design(
    probs: Sequence[float] | np.ndarray,
    n: int,
    *,
    flatten: float = 1.0,
    id_block_count: int = 64,
    block_min_expected: float = 16.0,
    shares: Mapping[str, float] | None = None,
) -> IdentityDesign:
    """The design of the test of ``n`` samples against ``probs``: the Poisson sub-sample mean n',
    the rounded means and thinning, the heavy/light split at c = ``flatten``, the light blocks,
    the shares and the Chernoff bounds of the parts.  Cached by a digest of ``probs``, n and the
    options (the last few designs are kept)."""
    p = _probability_array(probs, "probs")
    _check_n(n)
    chosen = _check_options(flatten, id_block_count, block_min_expected, shares)
    share_key = tuple(sorted(chosen.items()))
    return _cached_design(_digest(p), int(n), float(flatten), int(id_block_count), float(block_min_expected),
                          share_key, _Carried(p))


class _Carried:
    """Carries a value (an array, the cells) into a cached builder without being part of the cache
    key: the key is the value's digest."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Carried)


@functools.lru_cache(maxsize=_DESIGN_CACHE_SIZE)
def _cached_design(digest: str, n: int, c: float, id_block_count: int, block_min: float,
                   share_key: tuple[tuple[str, float], ...], holder: _Carried) -> IdentityDesign:
    p = holder.value
    vocab_size = p.size
    n_poisson = _poisson_mean(n)
    raw = n_poisson * p
    means = _grid_means(raw, c)
    keep = np.divide(means, raw, out=np.zeros_like(raw), where=raw > 0)
    positive = p > 0
    weights = np.where(positive, np.maximum(means, c), 1.0)
    heavy = np.flatnonzero(positive & (means >= c))
    light = np.flatnonzero(positive & (means < c))
    zero_ids = np.flatnonzero(~positive)

    unique_means, inverse, multiplicity = np.unique(means[positive], return_inverse=True, return_counts=True)
    unique_weights = np.maximum(unique_means, c)
    types = np.full(vocab_size, -1, dtype=np.int64)
    types[positive] = inverse
    tokens = chernoff_bound(unique_means, unique_weights, multiplicity, TRUNCATION_MASS / max(1, positive.sum()))

    light_mean = float(means[light].sum())
    wanted = dict(share_key)
    present: dict[str, float] = {"tokens": wanted.get("tokens", 0.0)}
    id_blocks: list[np.ndarray] = []
    level_blocks: list[np.ndarray] = []
    ids_bound = levels_bound = None
    if light.size and heavy.size and light_mean > 0 and wanted.get("light-mass", 0) > 0:
        present["light-mass"] = wanted["light-mass"]
    if light.size and wanted.get("light-ids", 0) > 0:
        id_blocks = _id_blocks(light, means, vocab_size, id_block_count, block_min)
        if len(id_blocks) >= 2:
            present["light-ids"] = wanted["light-ids"]
        else:
            id_blocks = []
    if light.size and wanted.get("light-levels", 0) > 0:
        level_blocks = _level_blocks(light, p, block_min, means)
        if len(level_blocks) >= 2:
            present["light-levels"] = wanted["light-levels"]
        else:
            level_blocks = []
    id_labels, level_labels = _block_labels(id_blocks, vocab_size), _block_labels(level_blocks, vocab_size)
    id_block_means = _block_means(id_labels, len(id_blocks), types, unique_means)
    level_block_means = _block_means(level_labels, len(level_blocks), types, unique_means)
    if id_blocks:
        ids_bound = _block_bound(id_block_means)
    if level_blocks:
        levels_bound = _block_bound(level_block_means)
    total = sum(present.values())
    shares = {name: value / total for name, value in present.items()}
    return IdentityDesign(
        n=n, n_poisson=n_poisson, vocab_size=vocab_size, flatten=c, means=means, keep=keep, weights=weights,
        heavy=heavy, light=light, zero_ids=zero_ids, id_blocks=tuple(id_blocks), level_blocks=tuple(level_blocks),
        shares=shares, tokens=tokens, ids_bound=ids_bound, levels_bound=levels_bound, light_mean=light_mean,
        id_labels=id_labels, level_labels=level_labels, id_block_means=id_block_means,
        level_block_means=level_block_means, type_means=unique_means, type_weights=unique_weights,
        type_counts=multiplicity.astype(np.float64),
        type_floors=_term_floors(unique_means, unique_weights),
    )


# --------------------------------------------------------------------------------------------
# The test
# --------------------------------------------------------------------------------------------


def _poisson_subsample(counts: np.ndarray, design: IdentityDesign, rng: np.random.Generator) -> np.ndarray | None:
    """Counts of a Poisson(n') sub-sample, thinned by ``design.keep``: independent Poisson(λ_x)
    under H0.  None when N' > n (probability ≤ SUBSAMPLE_OVERFLOW)."""
    n = int(counts.sum())
    size = int(rng.poisson(design.n_poisson))
    if size > n:
        return None
    dropped = rng.choice(n, size=n - size, replace=False) if size < n else np.empty(0, dtype=np.int64)
    tokens = np.searchsorted(np.cumsum(counts), dropped, side="right")
    kept = counts - np.bincount(tokens, minlength=counts.size)
    return rng.binomial(kept, design.keep)


def _block_part(name: str, labels: np.ndarray, bound: ChernoffBound | None, counts: np.ndarray,
                block_means: np.ndarray, share: float) -> IdentityPart:
    inside = labels >= 0
    size = len(block_means)
    block_counts = np.bincount(labels[inside], weights=counts[inside], minlength=size)
    statistic = float(_adk_terms(block_counts, block_means, block_means).sum())
    assert bound is not None, f"the design gives {name} a share, so it builds its bound"
    return IdentityPart(name, statistic, bound.pvalue(statistic), share, size, float(block_means.sum()),
                        int(block_counts.sum()), "chernoff-truncated (exact Poissonization)")


def _light_mass_part(count: int, mean: float, share: float, cells: int) -> IdentityPart:
    """Two-sided exact Poisson test: p = min(1, 2 min(P(X ≤ x), P(X ≥ x)))."""
    upper = float(pdtrc(count - 1, mean)) if count > 0 else 1.0  # P(N ≥ count)
    pvalue = min(1.0, 2.0 * min(float(pdtr(count, mean)), upper))
    return IdentityPart("light-mass", float(count - mean), pvalue, share, cells, mean, count, "exact Poisson tail")


def identity_test(
    counts: Sequence[int] | np.ndarray,
    probs: Sequence[float] | np.ndarray,
    *,
    seed: int = 0,
    flatten: float = 1.0,
    id_block_count: int = 64,
    block_min_expected: float = 16.0,
    shares: Mapping[str, float] | None = None,
    design: IdentityDesign | None = None,
) -> IdentityTest:
    """Test H0: the n = Σ counts samples were drawn i.i.d. from ``probs`` (counts[x] = how many
    samples were token x; both of length V).

    ``seed`` drives the Poisson sub-sample and the thinning (derive it from the check's
    parameters and look with :func:`specverify.core.seeding.derive_seed`).  The p-value is valid
    at every level a: P(pvalue ≤ a | H0) ≤ a (module docstring); its floor is about 1e-13 / share.
    ``design``: :func:`identity_design` of these ``probs`` and n with these options, made ahead
    (e.g. while the samples were drawn); made here when None.
    """
    observed = _counts_array(counts, "counts")
    p = _probability_array(probs, "probs")
    if observed.size != p.size:
        raise ValueError(f"counts, probs: length mismatch ({observed.size} counts vs {p.size} probabilities); "
                         "pass one count per token")
    n = int(observed.sum())
    if n == 0:
        raise ValueError("counts: no samples (all counts are 0); the identity test needs n ≥ 1")
    if design is None:
        design = identity_design(p, n, flatten=flatten, id_block_count=id_block_count,
                                 block_min_expected=block_min_expected, shares=shares)
    elif (design.n, design.vocab_size) != (n, p.size):
        raise ValueError(f"design: made for n = {design.n} samples of V = {design.vocab_size} tokens, the counts "
                         f"hold n = {n} of V = {p.size}; pass identity_design(probs, n) of these counts, or None")
    empirical_tv = 0.5 * float(np.abs(observed / n - p).sum())
    impossible = int(observed[design.zero_ids].sum())
    zeros = IdentityPart("zeros", float(impossible), 0.0 if impossible else 1.0, 0.0, int(design.zero_ids.size),
                         0.0, impossible, "certain: a token of probability 0 cannot be drawn")
    sub = _poisson_subsample(observed, design, np.random.default_rng(seed))
    calibration = (f"exact Poissonization (N' ~ Poisson({design.n_poisson:.6g}) of n, thinned to means on a "
                   f"{MEAN_GRID_RATIO}-grid); Chernoff bound truncated at mass {TRUNCATION_MASS:g}, "
                   f"θ grid of {design.tokens.thetas.size}; no Monte Carlo")
    pooled = (f"light tokens (n'p < {design.flatten:g}): {len(design.id_blocks)} id blocks, "
              f"{len(design.level_blocks)} probability levels, each expecting ≥ {block_min_expected:g}")
    if sub is None:
        untested = (zeros,) + tuple(IdentityPart(name, math.nan, 1.0, share, 0, 0.0, 0, "no test: N' > n")
                                    for name, share in design.shares.items())
        return IdentityTest(math.nan, math.nan, 0.0 if impossible else 1.0, n, 0, p.size, int(design.heavy.size),
                            untested, pooled, calibration + "; this draw had N' > n: parts not tested",
                            impossible, empirical_tv)

    positive = p > 0
    terms = _adk_terms(sub[positive], design.means[positive], design.weights[positive])
    statistic = float(terms.sum())
    heavy_statistic = float(_adk_terms(sub[design.heavy], design.means[design.heavy],
                                       design.weights[design.heavy]).sum())
    tokens = IdentityPart("tokens", statistic, design.tokens.pvalue(statistic), design.shares["tokens"],
                          int(positive.sum()), float(design.means.sum()), int(sub.sum()),
                          "chernoff-truncated (exact Poissonization)")
    parts: list[IdentityPart] = [zeros, tokens]
    if "light-mass" in design.shares:
        parts.append(_light_mass_part(int(sub[design.light].sum()), design.light_mean, design.shares["light-mass"],
                                      int(design.light.size)))
    if "light-ids" in design.shares:
        parts.append(_block_part("light-ids", design.id_labels, design.ids_bound, sub, design.id_block_means,
                                 design.shares["light-ids"]))
    if "light-levels" in design.shares:
        parts.append(_block_part("light-levels", design.level_labels, design.levels_bound, sub,
                                 design.level_block_means, design.shares["light-levels"]))
    pvalue = 0.0 if impossible else min(1.0, min(part.pvalue / part.share for part in parts[1:]))
    return IdentityTest(statistic, heavy_statistic, pvalue, n, int(sub.sum()), p.size, int(design.heavy.size),
                        tuple(parts), pooled, calibration, impossible, empirical_tv)


# --------------------------------------------------------------------------------------------
# Planning: the worst case over every alternative at TV ≥ ε
# --------------------------------------------------------------------------------------------


_EVENT_FRACTIONS = np.array([0.5, 0.7, 0.85, 0.95])[:, None]
"""γ: the event piece bounds Y on {N ≥ λ + γΔ} (see :func:`_token_sups`)."""
_SMALL_REACH = 1.5
"""κ: the moment piece covers −λ ≤ Δ ≤ Δ₁ = λ + κ√(w/θ); the event piece covers Δ > Δ₁."""


def _poly_mul(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Product of polynomials in d (coefficients ascending along the last axis, broadcast in front)."""
    p, q = np.broadcast_arrays(p[..., :, None], q[..., None, :])
    out = np.zeros(p.shape[:-2] + (p.shape[-2] + q.shape[-1] - 1,))
    for i in range(p.shape[-2]):
        out[..., i:i + q.shape[-1]] += p[..., i, :] * q[..., i, :]
    return out


def _pad(p: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate([p, np.zeros(p.shape[:-1] + (size - p.shape[-1],))], axis=-1)


_NESTED_RANGES = 4
"""The moment piece's range [0, R] is split at R/4^j, j < this; each part gets its own bound."""


def _quadratic_sup(poly: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """An upper bound on max_{lo ≤ d ≤ hi} Σ_k c_k d^k (0 ≤ lo ≤ hi): every term of degree k ≥ 3 is
    bounded by max(c_k, 0) hi^{k−2} d², and the quadratic's maximum on [lo, hi] is closed-form."""
    c0, c1 = poly[..., 0], poly[..., 1]
    powers = hi[..., None] ** np.arange(1, poly.shape[-1] - 2)
    c2 = poly[..., 2] + np.sum(np.maximum(poly[..., 3:], 0.0) * powers, axis=-1)
    concave = c2 < 0
    inner = np.clip(-c1 / (2.0 * np.where(concave, c2, -1.0)), lo, hi)
    at_inner = c0 + c1 * inner + c2 * inner**2
    at_ends = np.maximum(c0 + c1 * lo + c2 * lo**2, c0 + c1 * hi + c2 * hi**2)
    return np.asarray(np.where(concave, at_inner, at_ends))


@dataclass(frozen=True)
class _MomentPolynomials:
    """The θ-independent polynomials in d of the moment piece for one side (Δ = sign·d):
    μ = λ + sign·d, u = 1 + 2d, s/a = 1 − 2 sign d, padded to degree 8."""

    mu: np.ndarray
    mu_u2: np.ndarray
    mu_s: np.ndarray
    mu2: np.ndarray
    mu2_u: np.ndarray
    mu3_u2: np.ndarray
    mu4_u4: np.ndarray

    @classmethod
    def of(cls, lam: np.ndarray, sign: float) -> _MomentPolynomials:
        one = np.ones_like(lam)
        mu = np.stack([lam, sign * one], axis=-1)
        u = np.stack([one, 2.0 * one], axis=-1)
        s_poly = np.stack([one, -2.0 * sign * one], axis=-1)
        mu2, u2 = _poly_mul(mu, mu), _poly_mul(u, u)
        size = 9
        return cls(_pad(mu, size), _pad(_poly_mul(mu, u2), size), _pad(_poly_mul(mu, s_poly), size),
                   _pad(mu2, size), _pad(_poly_mul(mu2, u), size), _pad(_poly_mul(_poly_mul(mu2, mu), u2), size),
                   _pad(_poly_mul(_poly_mul(mu2, mu2), _poly_mul(u2, u2)), size))


def _moment_polynomial(theta: float, nu: float, lam: np.ndarray, w: np.ndarray, hi: np.ndarray,
                       sign: float, polys: _MomentPolynomials) -> np.ndarray:
    """Coefficients in d of an upper bound on log E e^{−θY} + ν d at Δ = sign·d, valid for
    0 ≤ d ≤ hi (see :func:`_token_sups`)."""
    a = theta / w
    es = np.exp(a * (1.0 + 2.0 * hi))  # e^S, |s| ≤ a(1 + 2d) ≤ S
    growth = np.exp(a * (lam + (hi if sign > 0 else 0.0)))  # e^{aμ}, μ ≤ λ + hi (or λ)

    def col(v: np.ndarray) -> np.ndarray:
        return v[..., None]

    total = col(es * a**2 / 2.0) * polys.mu_u2 - col(a**2) * polys.mu_s  # ψ(s) ≤ μs²e^S/2; −aμe₁ ≤ −aμs
    total[..., 2] -= a  # −aΔ²
    total[..., 1] += nu  # ν|Δ|
    q4 = (col(es) * polys.mu + 2.0 * polys.mu2 + col(14.0 * es**2 * a) * polys.mu2_u
          + col((a * es) ** 2 * np.maximum(6.0 * es - 2.0, 0.0)) * polys.mu3_u2 + col((a * es) ** 4) * polys.mu4_u4)
    return np.asarray(total + col(a**2 * growth / 2.0) * q4)


def _moment_piece(theta: float, nu: float, lam: np.ndarray, w: np.ndarray, reach: np.ndarray,
                  sign: float, polys: _MomentPolynomials) -> np.ndarray:
    """sup over 0 ≤ d ≤ reach of the moment bound + ν d, over the parts [reach/4^{j+1}, reach/4^j]
    (the last part from 0), each with the constants (e^S, e^{aμ}) of its own upper end."""
    best = np.full(lam.shape, -np.inf)
    for j in range(_NESTED_RANGES):
        hi = reach / 4.0**j
        lo = reach / 4.0 ** (j + 1) if j < _NESTED_RANGES - 1 else np.zeros_like(reach)
        best = np.maximum(best, _quadratic_sup(_moment_polynomial(theta, nu, lam, w, hi, sign, polys), lo, hi))
    return best


def _token_sups(theta: float, nu: float, lam: np.ndarray, w: np.ndarray, floor: np.ndarray,
                polys: tuple[_MomentPolynomials, _MomentPolynomials] | None = None) -> np.ndarray:
    """For each cell type (λ, w, b = −min_k y(k)), an upper bound on
    H = sup_{μ ≥ 0} [log E_{Poisson(μ)} e^{−θY} + ν|μ − λ|],  Y = ((N − λ)² − N)/w,  Δ = μ − λ.

    Moment piece, −min(λ, Δ₁) ≤ Δ ≤ Δ₁ = κ√(w/θ).  With D = N − μ, a = θ/w, s = a(1 − 2Δ):
    −θY = −aΔ² − x + sD, x = a(D² − μ) ≥ −aμ, and e^{−x} ≤ 1 − x + x² e^{aμ}/2 there, so with the
    Poisson moments of D tilted by e^{sD} (ψ(s) = μ(e^s − 1 − s), e₁ = e^s − 1)::

        log E e^{−θY} ≤ −aΔ² + ψ(s) − aμe₁ − aμ²e₁² + (a²/2) e^{aμ} Q₄(s),
        Q₄ = μe^s + μ²(7e^{2s} − 6e^s + 1) + μ³e₁²(6e^s − 2) + μ⁴e₁⁴   (= E[(D² − μ)² e^{sD}]/E e^{sD}),

    using log(1 + y) ≤ y.  On the range, with |s| ≤ S = a(1 + 2Δ₁): ψ ≤ μs²e^S/2, e₁ ≥ s,
    −aμ²e₁² ≤ 0, 7e^{2s} − 6e^s + 1 ≤ 2 + 14e^{2S}|s|, |e₁| ≤ |s|e^S: a polynomial in |Δ|, and its
    maximum plus ν|Δ| on the range is bounded by :func:`_quadratic_sup`.  At Δ = 0 the bound is
    θ²λ²/w² + O(θ²/λ): the null variance, exactly.
    Event pieces.  Excess, Δ > Δ₁ (≥ 1): on N ≥ λ + γΔ, Y ≥ (γ²Δ² − λ − γΔ)/w (y increases
    beyond λ + ½); the rest has probability ≤ exp(−(1 − γ)²Δ²/(2μ)) (Poisson lower tail) and
    there e^{−θY} ≤ e^{θb}.  Deficit, Δ₁ < −Δ = d ≤ λ: on N ≤ λ − γd, Y ≥ (γ²d² + γd − λ)/w;
    the rest has probability ≤ exp(−(1 − γ)²d²/(2λ)) (Bennett's upper tail, μ + (1 − γ)d/3 ≤ λ).
    Each branch plus ν|Δ| is concave with a closed-form maximum on its range, and
    log(e^{sup a} + e^{sup b}) bounds the piece; the best γ of a few is kept.
    """
    if polys is None:
        polys = (_MomentPolynomials.of(lam, +1.0), _MomentPolynomials.of(lam, -1.0))
    reach = np.maximum(_SMALL_REACH * np.sqrt(w / theta), 1.0)
    upper = _moment_piece(theta, nu, lam, w, reach, +1.0, polys[0])
    lower = _moment_piece(theta, nu, lam, w, np.minimum(lam, reach), -1.0, polys[1])

    gamma = _EVENT_FRACTIONS
    k = (1.0 - gamma) ** 2 / 2.0
    d = np.maximum(reach, (gamma + nu * w / theta) / (2.0 * gamma**2))
    branch_a = -theta * (gamma**2 * d**2 - lam - gamma * d) / w + nu * d
    turn = lam * (1.0 / np.sqrt(np.maximum(1.0 - nu / k, 1e-300)) - 1.0)
    d = np.maximum(reach, np.minimum(turn, 1e300))
    with np.errstate(over="ignore", invalid="ignore"):
        branch_b = np.where(nu < k, theta * floor - k * d**2 / (lam + d) + nu * d, np.inf)
    excess = np.logaddexp(branch_a, branch_b).min(axis=0)

    top = np.maximum(reach, lam)
    d = np.clip((nu * w / theta - gamma) / (2.0 * gamma**2), reach, top)
    deficit_a = -theta * (gamma**2 * d**2 + gamma * d - lam) / w + nu * d
    d = np.clip(nu * lam / (1.0 - gamma) ** 2, reach, top)
    deficit_b = theta * floor - (1.0 - gamma) ** 2 * d**2 / (2.0 * np.maximum(lam, 1e-300)) + nu * d
    deficit = np.where(lam > reach, np.logaddexp(deficit_a, deficit_b).min(axis=0), -np.inf)
    return np.asarray(np.maximum(np.maximum(upper, lower), np.maximum(excess, deficit)))


def _log_miss(design: IdentityDesign, threshold: float, deviation: float, goal: float = -math.inf) -> float:
    """log of an upper bound on P(Z < t) over every alternative with Σ_x |μ_x − λ_x| ≥ ``deviation``:
    Chernoff, P(Z < t) ≤ e^{θt} Π_x E e^{−θY_x}, and Lagrangian duality with ν ≥ 0:
    Σ_x log E e^{−θY_x} ≤ Σ_x [H_x(θ, ν) − ν|Δ_x|] ≤ Σ_x H_x(θ, ν) − ν·deviation.  Every (θ, ν)
    gives a valid bound; the best found by a search around the normal approximation is returned
    (the search stops once the bound is ≤ ``goal``)."""
    lam, w, count, floor = design.type_means, design.type_weights, design.type_counts, design.type_floors
    sum_w = float(np.sum(count * w))
    mean = deviation**2 / sum_w
    if mean <= threshold:
        return 0.0
    polys = (_MomentPolynomials.of(lam, +1.0), _MomentPolynomials.of(lam, -1.0))
    variance = design.tokens.null_sd**2 + 4.0 * mean
    theta0 = min(_THETA_MAX, (mean - threshold) / variance)

    def objective(theta: float, ratio: float) -> float:
        nu = ratio * 2.0 * theta * deviation / sum_w
        if not 0 < theta <= _THETA_MAX:
            return math.inf
        sups = _token_sups(theta, nu, lam, w, floor, polys)
        return theta * threshold + float(np.sum(count * sups)) - nu * deviation

    best = (0.0, theta0, 1.0)
    worse = 0
    for theta in theta0 * 2.0 ** -np.arange(0, 20):
        previous = best[0]
        for ratio in (1.0, 0.75):
            value = objective(float(theta), ratio)
            if value < best[0]:
                best = (value, float(theta), ratio)
        if best[0] <= goal:
            return best[0]
        worse = worse + 1 if best[0] >= previous else 0
        if worse >= 2 and best[0] < 0:
            break
    if best[0] >= 0.0:
        return 0.0
    for spread in (1.4, 1.12):
        _, theta_c, ratio_c = best
        for a in (1 / spread, 1.0, spread):
            for b in (1 / spread, 1.0, min(spread, 1.0 / ratio_c)):
                if a == 1.0 and b == 1.0:
                    continue
                value = objective(theta_c * a, ratio_c * b)
                if value < best[0]:
                    best = (value, theta_c * a, ratio_c * b)
        if best[0] <= goal:
            break
    return best[0]


def _power_of_design(design: IdentityDesign, epsilon: float, alpha: float, goal: float = 0.0) -> float:
    """The power bound of :func:`identity_power` on ``design`` (the search may stop once the power
    bound reaches ``goal``)."""
    threshold = design.tokens.critical_value(alpha * design.shares["tokens"])
    if not math.isfinite(threshold):
        return 0.0
    n_p = design.n_poisson
    rho_min = 1.0 / MEAN_GRID_RATIO

    enough = math.log(max(1e-300, 1.0 - SUBSAMPLE_OVERFLOW - goal)) if goal > 0 else -math.inf

    def log_miss(low: float, high: float) -> float:
        """The cell low ≤ η ≤ high of off-support mass η, which leaves Σ_{p>0}|q − p| ≥ 2ε − high; its
        term e^{−n'·low}·miss is below the goal once log miss ≤ log(goal room) + n'·low."""
        return _log_miss(design, threshold, max(0.0, rho_min * n_p * (2.0 * epsilon - high)), enough + n_p * low)

    if design.zero_ids.size == 0:
        miss = math.exp(log_miss(0.0, 0.0))
    else:
        grid = np.linspace(0.0, 2.0 * epsilon, 41)
        miss = max(math.exp(-n_p * grid[i] + log_miss(float(grid[i]), float(grid[i + 1])))
                   for i in range(grid.size - 1))
        miss = max(miss, math.exp(-2.0 * n_p * epsilon))
    return max(0.0, 1.0 - SUBSAMPLE_OVERFLOW - miss)


def identity_power(
    probs: Sequence[float] | np.ndarray,
    n: int,
    epsilon: float,
    *,
    alpha: float,
    flatten: float = 1.0,
    id_block_count: int = 64,
    block_min_expected: float = 16.0,
    shares: Mapping[str, float] | None = None,
) -> float:
    """A lower bound on the power of :func:`identity_test` at level ``alpha`` with ``n`` samples,
    valid for EVERY alternative q with TV(p, q) ≥ ``epsilon`` (the worst case; rigorous).

    Derivation (from the ``tokens`` and ``zeros`` parts; the light parts only add power).  On the
    Poisson sub-sample the counts are independent N_x ~ Poisson(μ_x), μ_x = ρ_x n' q_x, and the
    tokens part rejects whenever Z ≥ t, t its critical value at level α·share on the θ grid.
    Chernoff's bound for the lower tail, P(Z < t) ≤ e^{θt} Π_x E e^{−θY_x} (finite for every
    θ > 0: Y_x ≥ −b_x), is bounded for all q at once by Lagrangian duality: for every ν ≥ 0,
    Σ_x log E e^{−θY_x} ≤ Σ_x H_x(θ, ν) − ν Σ_x |μ_x − λ_x|, with H_x the per-token supremum of
    :func:`_token_sups` (closed-form pieces: a second-order Taylor bound for small deviations,
    Poisson tail events for large ones).  If q puts mass η on tokens with p = 0, then
    Σ_{p>0} |q_x − p_x| ≥ 2ε − η, so Σ_x |μ_x − λ_x| ≥ ρ_min n'(2ε − η) (ρ_min = 1/r), and those
    samples are Poisson(n'η), independent of Z, each a certain rejection:
    P(miss) ≤ e^{−n'η} exp(min_{θ,ν} [θt + Σ_x H_x − ν ρ_min n'(2ε − η)]), maximised over η
    on a grid (the two factors are monotone in η, so grid cells are bounded by their ends).
    Finally the sub-sample exists with probability ≥ 1 − SUBSAMPLE_OVERFLOW.  The normal
    approximation would ask E − t ≈ 2.33 sd for power 0.99; this bound asks roughly 3 sd.
    """
    _check_epsilon(epsilon)
    _check_alpha(alpha)
    design = identity_design(probs, n, flatten=flatten, id_block_count=id_block_count,
                             block_min_expected=block_min_expected, shares=shares)
    return _power_of_design(design, float(epsilon), float(alpha))


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: expected a positive integer sample size, got {n!r}")


def _check_epsilon(epsilon: float) -> None:
    if not (isinstance(epsilon, (int, float)) and 0 < epsilon <= 1):
        raise ValueError(f"epsilon: expected a total-variation distance in (0, 1], got {epsilon!r}")


def _check_alpha(alpha: float) -> None:
    if isinstance(alpha, bool) or not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha: expected a level in (0, 1), got {alpha!r}")


def _check_power(power: float, alpha: float) -> None:
    if not (isinstance(power, (int, float)) and alpha < power < 1 - SUBSAMPLE_OVERFLOW):
        raise ValueError(f"power: expected a value in (alpha, 1 − {SUBSAMPLE_OVERFLOW:g}), got {power!r}")


def identity_sample_size(
    probs: Sequence[float] | np.ndarray,
    epsilon: float,
    *,
    alpha: float,
    power: float,
    flatten: float = 1.0,
    id_block_count: int = 64,
    block_min_expected: float = 16.0,
    shares: Mapping[str, float] | None = None,
) -> int:
    """An n at which :func:`identity_power` (probs, n, ε) ≥ ``power`` at level ``alpha``: from a
    normal-approximation guess g, doubling until the bound holds, then bisection to 1% between the
    last failing n (or g/2) and the first passing one; the upper end is returned, its bound
    verified, so the n is sufficient whatever the bound's shape in n.  Cached (the last 256 calls,
    by a digest of ``probs`` and the arguments); at V = 131,072 a fresh call takes a few seconds."""
    _check_epsilon(epsilon)
    _check_alpha(alpha)
    _check_power(power, alpha)
    p = _probability_array(probs, "probs")
    chosen = _check_options(flatten, id_block_count, block_min_expected, shares)
    arguments = (_digest(p), float(epsilon), float(alpha), float(power), float(flatten), int(id_block_count),
                 float(block_min_expected), tuple(sorted(chosen.items())))
    return plan_cache.remembered("identity_sample_size", arguments, int,
                                 lambda: _cached_sample_size(*arguments, _Carried(p)))


@functools.lru_cache(maxsize=256)
def _cached_sample_size(digest: str, epsilon: float, alpha: float, power: float, flatten: float,
                        id_block_count: int, block_min_expected: float, share_key: tuple[tuple[str, float], ...],
                        holder: _Carried) -> int:
    p = holder.value
    options: dict[str, Any] = dict(flatten=flatten, id_block_count=id_block_count,
                                   block_min_expected=block_min_expected, shares=dict(share_key))

    def enough(m: int) -> bool:
        return _power_verified(p, m, epsilon, alpha, power, options)

    guess = _normal_sample_size(p, float(epsilon), float(alpha), float(power), options)
    low, high = max(1, guess // 2), guess
    while not enough(high):
        low, high = high, high * 2
        if high > 10**13:
            raise ValueError(f"epsilon: TV {epsilon} needs more than 1e13 samples at this level and power")
    while high - low > max(1, high // 100):
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle
    return high


def _power_verified(p: np.ndarray, n: int, epsilon: float, alpha: float, power: float,
                    options: Mapping[str, Any]) -> bool:
    """Whether :func:`identity_power` (p, n, ε) ≥ ``power`` at level ``alpha``."""
    design = identity_design(p, n, **options)
    return _power_of_design(design, float(epsilon), float(alpha), goal=power) >= power


def identity_joint_sample_size(
    laws: Sequence[np.ndarray],
    epsilon: float,
    *,
    alpha: float,
    power: float,
    step: int = 1,
) -> int:
    """The smallest n on a 1% ladder, a multiple of ``step``, at which :func:`identity_power`
    (law, n, ε) ≥ ``power`` at level ``alpha`` holds for EVERY law of ``laws``, verified at that n.

    The power bound is not monotone in n (the design's grid means and truncation move with n), so
    the largest of the laws' :func:`identity_sample_size` is a start, not an answer: a law sized
    for fewer samples is checked again at the common n, which then climbs by 1% (rounded up to
    the step) until every law holds.  Tests that draw one n for several laws (chains tested at a
    shared per-chain n; steps of ``step`` tokens) thereby detect TV ε at their n with no further
    search.  Kept on disk (:mod:`specverify.core.plan_cache`)."""
    _check_epsilon(epsilon)
    _check_alpha(alpha)
    _check_power(power, alpha)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step: expected a positive integer (samples per draw), got {step!r}")
    arrays = [_probability_array(law, "laws") for law in laws]
    if not arrays:
        raise ValueError("laws: expected at least one law")
    arguments = (tuple(_digest(p) for p in arrays), float(epsilon), float(alpha), float(power), step)

    def search() -> int:
        options: dict[str, Any] = {}  # the test's default design, as identity_sample_size's
        start = max(identity_sample_size(p, epsilon, alpha=alpha, power=power) for p in arrays)
        n = -(-start // step) * step
        while not all(_power_verified(p, n, epsilon, alpha, power, options) for p in arrays):
            n = -(-math.ceil(n * 1.01) // step) * step
            if n > 10**13:
                raise ValueError(f"epsilon: TV {epsilon} needs more than 1e13 samples at this level and power")
        return n

    return plan_cache.remembered("identity_joint_sample_size", arguments, int, search)


def _normal_sample_size(p: np.ndarray, epsilon: float, alpha: float, power: float, options: dict[str, Any]) -> int:
    """A starting guess for the bisection (not a guarantee): the n at which the normal
    approximation, E_min − t ≥ z_β √(σ₀² + 4E_min), holds, found on a factor-2 ladder and refined
    once at the guess's design."""
    z_beta = float(-ndtri(1.0 - power))
    n = max(64, int(math.sqrt(np.count_nonzero(p)) / epsilon**2))
    for _ in range(60):
        design = identity_design(p, n, **options)
        threshold = design.tokens.critical_value(alpha * design.shares["tokens"])
        deviation = design.n_poisson * 2.0 * epsilon / MEAN_GRID_RATIO
        mean = deviation**2 / float(np.sum(design.type_counts * design.type_weights))
        gap = mean - threshold - z_beta * math.sqrt(design.tokens.null_sd**2 + 4.0 * mean)
        if gap >= 0:
            return n
        n *= 2
    return n


def identity_detectable_tv(
    probs: Sequence[float] | np.ndarray,
    n: int,
    *,
    alpha: float,
    power: float,
    flatten: float = 1.0,
    id_block_count: int = 64,
    block_min_expected: float = 16.0,
    shares: Mapping[str, float] | None = None,
) -> float:
    """Smallest ε (to 0.1% relative) with :func:`identity_power` (probs, n, ε) ≥ ``power``:
    every alternative at TV ≥ ε is detected with at least that power (``inf`` if none ≤ 1)."""
    _check_alpha(alpha)
    _check_power(power, alpha)
    p = _probability_array(probs, "probs")
    _check_n(n)
    chosen = _check_options(flatten, id_block_count, block_min_expected, shares)
    arguments = (_digest(p), int(n), float(alpha), float(power), float(flatten), int(id_block_count),
                 float(block_min_expected), tuple(sorted(chosen.items())))
    return plan_cache.remembered("identity_detectable_tv", arguments, float, lambda: _detectable_tv(
        identity_design(probs, n, flatten=flatten, id_block_count=id_block_count, block_min_expected=block_min_expected,
                        shares=shares), float(alpha), float(power)))


def _detectable_tv(design: IdentityDesign, alpha: float, power: float) -> float:
    """The bisection of :func:`identity_detectable_tv` on ``design``."""
    if _power_of_design(design, 1.0, alpha, goal=power) < power:
        return math.inf
    low, high = 0.0, 1.0
    while high - low > 1e-3 * high:
        middle = (low + high) / 2
        if _power_of_design(design, middle, alpha, goal=power) >= power:
            high = middle
        else:
            low = middle
    return high


# --------------------------------------------------------------------------------------------
# The pooled χ² for comparison
# --------------------------------------------------------------------------------------------


def pooled_chi2_sample_size(
    probs: Sequence[float] | np.ndarray,
    epsilon: float,
    *,
    alpha: float,
    power: float,
    min_expected: float = 5.0,
) -> PooledChiSquareSize:
    """The Pearson χ² sample sizes for the same ε, α and power (see :class:`PooledChiSquareSize`).

    nominal: iterate n ← stats.sample_size_for_tv(ε, num_cells = #groups of
    stats.pool_cells(n·p, min_expected)) from n = sample_size_for_tv on V cells, to a fixed point
    (the largest n of a cycle if it cycles).  unpooled: max(sample_size_for_tv on all V' cells of
    positive probability, ⌈min_expected / min p⌉).
    """
    _check_epsilon(epsilon)
    p = _probability_array(probs, "probs")
    positive = p[p > 0]
    full = sample_size_for_tv(epsilon, alpha=alpha, power=power, num_cells=max(2, positive.size))
    seen: list[int] = []
    n = full
    while n not in seen:
        seen.append(n)
        cells = max(2, len(pool_cells(n * positive, min_expected)))
        n = sample_size_for_tv(epsilon, alpha=alpha, power=power, num_cells=cells)
    cycle = seen[seen.index(n):]
    nominal = max(cycle)
    cells = max(2, len(pool_cells(nominal * positive, min_expected)))
    unpooled = max(full, math.ceil(min_expected / float(positive.min())))
    return PooledChiSquareSize(nominal=nominal, cells=cells, unpooled=unpooled)
