"""Coarse views of a large-vocabulary law: the law of a token's id tile and of its probability level.

A token-level identity test (:mod:`specverify.core.identity`) detects *every* deviation of total
variation ε from a law on V tokens with about √V/ε² samples, so at V ≈ 150,000 the samples an
audit can afford (rows of ~1 MB each) rule out only large deviations (TV 0.7 at ~8,000 rows).
The losses of large-vocabulary kernels are structured, and most of them move mass between a few
coarse cells:

- a tiling bug loses or duplicates a range of ids (a partial last tile, the ids past 65,535): mass
  moves between **id tiles**, the ranges ``[k·w, (k+1)·w)`` with ``w`` the smallest power of two
  that makes at most :data:`TILE_COUNT` of them (the last one partial);
- a precision or truncation bug (a tail cut at a probability floor, fp16 underflow, a default
  top-k, a temperature applied on one path) moves mass between **probability levels**, the
  dyadic levels ``⌊log₂ p(t)⌋`` of the tokens' target probabilities;
- a law read at the wrong position or row, or a permuted vocabulary, moves the heavy tokens to
  other tiles and other levels.

Each view maps a token ``t`` to a cell ``c(t)``; under H0 (tokens drawn from ``p``) the cell
counts are multinomial with the coarse law ``P(c) = Σ_{t: c(t) = c} p(t)``, so the Pearson
goodness-of-fit test on them (:func:`specverify.core.stats.goodness_of_fit`, cells pooled by
expected count) keeps its level.  Its power is that of :func:`specverify.core.stats.power_at`
on the pooled cells: every alternative whose coarse law is at TV ≥ ε from ``p``'s (in either
view, each tested at its share of the level) is detected with the stated power.  The coarse TV
never exceeds the token-level TV (data processing), so this is a guarantee for the deviations
these views see, stated beside the token-level one, never instead of it.  Tokens of probability
0 are not in any cell of positive mass: the identity test's ``zeros`` part fails on them.

The partition depends on ``p`` (and V) only, fixed before sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specverify.core import stats

__all__ = ["TILE_COUNT", "CoarseView", "coarse_detectable_tv", "coarse_sample_size", "coarse_views"]

TILE_COUNT = 32
"""At most this many id tiles per vocabulary (tiles of a power-of-two width)."""

MIN_EXPECTED = 5.0
"""Cells are pooled to expected counts of at least this (:func:`specverify.core.stats.pool_cells`)."""


@dataclass(frozen=True)
class CoarseView:
    """One coarse view of a law on V tokens: ``labels [V]`` the cell of each token (-1 for tokens of
    probability 0) and ``probs [M]`` the coarse law; ``name`` says what the cells are."""

    name: str
    labels: np.ndarray
    probs: np.ndarray

    def counts(self, token_counts: np.ndarray) -> np.ndarray:
        """int64 ``[M]``: the cell counts of per-token counts ``[V]`` (tokens of probability 0 left out)."""
        kept = self.labels >= 0
        return np.bincount(self.labels[kept], weights=token_counts[kept], minlength=len(self.probs)).astype(np.int64)

    def cells_tested(self, n: int) -> int:
        """The cells the goodness-of-fit test keeps at ``n`` samples, after pooling by expected count."""
        return len(stats.pool_cells(n * self.probs[self.probs > 0], MIN_EXPECTED))


def _view(name: str, labels: np.ndarray, probs: np.ndarray) -> CoarseView:
    labels = np.where(probs > 0, labels, -1)
    used, dense = np.unique(labels[labels >= 0], return_inverse=True)
    cells = np.full(len(labels), -1, dtype=np.int64)
    cells[labels >= 0] = dense
    return CoarseView(name, cells, np.bincount(dense, weights=probs[labels >= 0], minlength=len(used)))


def coarse_views(probs: np.ndarray) -> tuple[CoarseView, CoarseView]:
    """The id-tile and probability-level views of the law ``probs [V]`` (module docstring)."""
    probs = np.asarray(probs, dtype=np.float64)
    vocab = len(probs)
    width = 1 << max(0, math.ceil(math.log2(vocab / TILE_COUNT))) if vocab > TILE_COUNT else 1
    tiles = np.arange(vocab, dtype=np.int64) // width
    levels = np.floor(np.log2(np.where(probs > 0, probs, 1.0))).astype(np.int64)
    return (_view(f"id tiles of {width:,}", tiles, probs),
            _view("probability levels ⌊log₂ p⌋", levels - levels.min(), probs))


def coarse_detectable_tv(views: tuple[CoarseView, ...], n: int, *, alpha: float, power: float) -> float:
    """The TV between coarse laws that the views' tests, each at level ``alpha``, detect with
    ``power`` at ``n`` samples: the largest over the views of
    :func:`specverify.core.stats.detectable_tv` on the cells each keeps (1 where a view keeps
    fewer than two cells: it detects nothing)."""
    found = 0.0
    for view in views:
        cells = view.cells_tested(n)
        found = max(found, 1.0 if cells < 2 else stats.detectable_tv(n, alpha=alpha, power=power, num_cells=cells))
    return min(found, 1.0)


def coarse_sample_size(views: tuple[CoarseView, ...], epsilon: float, *, alpha: float, power: float) -> int:
    """The smallest n (up to 1%) at which :func:`coarse_detectable_tv` is at most ``epsilon``: a
    doubling search, then a bisection, each step verified (pooling makes the bound not quite
    monotone in n, so the n returned is one where it was checked)."""
    low, high = 1, 16
    while coarse_detectable_tv(views, high, alpha=alpha, power=power) > epsilon:
        low, high = high, high * 2
        if high > 1 << 40:
            raise ValueError(f"epsilon: {epsilon} is not detectable by these views at any sample size")
    while high - low > max(1, high // 100):
        middle = (low + high) // 2
        if coarse_detectable_tv(views, middle, alpha=alpha, power=power) <= epsilon:
            high = middle
        else:
            low = middle
    return high
