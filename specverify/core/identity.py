"""Token-level identity tests for large vocabularies: is a sample of n tokens drawn from a known law p?

STUB (API first; implementation follows on this branch).  Signatures and result fields are the
contract other modules code against; see /work/notes/identity-api.md.

H0: counts ~ Multinomial(n, p) over V tokens (V up to 262,144).  The test is made of parts, each
a level-α_j test with α_j = share_j · α (weighted Bonferroni: the combined p-value is
min_j p_j / share_j, valid for every α at once and under any dependence between the parts):

- ``zeros``: a sample on a token with p_x = 0 is impossible under H0: p-value 0 (takes no share).
- ``tokens``: the statistic of Acharya, Daskalakis & Kamath (2015, eq. (2)) with flattened weights
  Z = Σ_{p_x > 0} ((N_x − λ_x)² − N_x) / max(λ_x, c),  λ_x = n' p_x; tokens with λ_x ≥ c are the
  heavy set A (ADK weights 1/λ_x), the light ones are down-weighted to 1/c so that each adds null
  variance 2(λ_x/c)² < 2 (the flattening of Diakonikolas & Kane 2016).
- ``light-mass``: the total count of the light tokens against its law (exact Poisson test).
- ``light-ids``: the light tokens in pre-specified blocks of consecutive ids (aligned ranges of a
  power-of-two width, merged in id order until each block expects ≥ ``block_min_expected``).
- ``light-levels``: the light tokens in pre-specified probability levels (dyadic in p).

Calibration (rigorous, no Monte Carlo): the counts are Poissonized exactly by a random
sub-sample of N' ~ Poisson(n') of the n samples (seeded), so that the N_x are independent
Poisson(n' p_x); a Chernoff bound P(Z ≥ z) ≤ min_θ e^{−θz} Π_x E[e^{θ Y_x}; N_x ≤ M_x] +
Σ_x P(N_x > M_x) is computed numerically (truncation at M_x is what makes the MGF finite).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "IdentityDesign",
    "IdentityPart",
    "IdentityTest",
    "PooledChiSquareSize",
    "identity_design",
    "identity_detectable_tv",
    "identity_power",
    "identity_sample_size",
    "identity_test",
    "pooled_chi2_sample_size",
]

PART_NAMES = ("zeros", "tokens", "light-mass", "light-ids", "light-levels")
DEFAULT_SHARES: Mapping[str, float] = {"tokens": 0.4, "light-mass": 0.2, "light-ids": 0.2, "light-levels": 0.2}
"""α shares of the parts (renormalised over the parts a design has; ``zeros`` takes none)."""


@dataclass(frozen=True)
class IdentityDesign:
    """Everything about the test that is fixed by (p, n) before sampling.

    n: the sample size the design is for; n_poisson: n' (the Poisson mean of the sub-sample);
    vocab_size: V; flatten: c; heavy: ids with λ_x ≥ c; light: ids with 0 < λ_x < c; zero_ids:
    ids with p_x = 0; id_blocks / level_blocks: tuples of id arrays (the light partitions);
    shares: part -> α share (summing to 1 over the parts present).
    """

    n: int
    n_poisson: float
    vocab_size: int
    flatten: float
    heavy: np.ndarray
    light: np.ndarray
    zero_ids: np.ndarray
    id_blocks: tuple[np.ndarray, ...]
    level_blocks: tuple[np.ndarray, ...]
    shares: Mapping[str, float]


@dataclass(frozen=True)
class IdentityPart:
    """One part of :class:`IdentityTest`.

    name: one of ``PART_NAMES``; statistic; pvalue (a valid p-value: P(p ≤ a | H0) ≤ a);
    share: its α share; cells: tokens or blocks it sums over; expected: its expected count under
    H0 (n'·mass); observed: its observed count; calibration: how the p-value was bounded.
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

    statistic: Z of the ``tokens`` part; pvalue: min(1, min_j p_j / share_j) (``0`` when a
    zero-probability token was observed); n, n_used (N', the Poisson sub-sample), vocab_size;
    heavy_size: |A|; parts: every part in ``PART_NAMES`` order (those the design has);
    pooled: a one-line description of what was pooled (the light blocks);
    calibration: the bound used (Chernoff + truncation, exact Poissonization, no Monte Carlo);
    impossible_count: samples on zero-probability tokens; empirical_tv: ½ Σ|N_x/n − p_x|.
    """

    statistic: float
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
        """The part called ``name`` (ValueError if the design has no such part)."""
        raise NotImplementedError

    def rejects(self, alpha: float) -> bool:
        """pvalue ≤ alpha."""
        return self.pvalue <= alpha


@dataclass(frozen=True)
class PooledChiSquareSize:
    """Pearson χ² sample size for comparison (:func:`pooled_chi2_sample_size`).

    nominal: the n of ``stats.sample_size_for_tv`` on the number of cells that remain after
    pooling to ≥ ``min_expected`` at that n (a fixed point; its power statement holds only for
    the TV between the *pooled* laws); cells: that number of cells; unpooled: the smallest n
    that also needs no pooling (n·min p ≥ min_expected), the n at which its guarantee covers
    every TV-ε deviation.
    """

    nominal: int
    cells: int
    unpooled: int


def identity_design(
    probs: Sequence[float] | np.ndarray,
    n: int,
    *,
    flatten: float = 1.0,
    id_block_count: int = 64,
    block_min_expected: float = 16.0,
    shares: Mapping[str, float] | None = None,
) -> IdentityDesign:
    """The pre-specified design of the test of ``n`` samples against ``probs`` (cached by a digest
    of ``probs`` and the options)."""
    raise NotImplementedError


def identity_test(
    counts: Sequence[int] | np.ndarray,
    probs: Sequence[float] | np.ndarray,
    *,
    seed: int = 0,
    flatten: float = 1.0,
    id_block_count: int = 64,
    block_min_expected: float = 16.0,
    shares: Mapping[str, float] | None = None,
) -> IdentityTest:
    """Test H0: the n = Σ counts samples were drawn i.i.d. from ``probs`` (length V each).

    ``seed`` drives the Poisson sub-sample (derive it from the check's parameters and look).
    The p-value is valid at every level: P(pvalue ≤ a | H0) ≤ a, for a down to ~1e-12.
    """
    raise NotImplementedError


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
    valid for EVERY alternative q with TV(p, q) ≥ ``epsilon`` (the worst case; the bound comes
    from the ``tokens`` and ``zeros`` parts alone)."""
    raise NotImplementedError


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
    """Smallest n with :func:`identity_power` (probs, n, ε) ≥ ``power`` at level ``alpha``."""
    raise NotImplementedError


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
    """Smallest ε with :func:`identity_power` (probs, n, ε) ≥ ``power`` (``inf`` if none ≤ 1)."""
    raise NotImplementedError


def pooled_chi2_sample_size(
    probs: Sequence[float] | np.ndarray,
    epsilon: float,
    *,
    alpha: float,
    power: float,
    min_expected: float = 5.0,
) -> PooledChiSquareSize:
    """The Pearson χ² sample sizes for the same ε, α and power (see :class:`PooledChiSquareSize`)."""
    raise NotImplementedError
