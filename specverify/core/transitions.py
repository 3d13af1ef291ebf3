"""Goodness of fit of sequences position by position: each token's law given the state before it.

Samples are ``n`` independent sequences ``x_1..x_L``.  H0: given ``x_<j``, the token ``x_j`` has
the known law ``p_m`` of the *block* ``m = m(j, x_<j)`` the sequence is in at position ``j``
(for an order-``k`` Markov target: the chain, the position ``j`` and the last ``k`` tokens).
Every sequence is in exactly one block per position, and different positions are different
blocks.  ``counts[m, t]`` counts the sequences in block ``m`` whose token there is ``t``;
``T_m = Σ_t counts[m, t]``.

Statistic (Pearson's X² of the transition counts, Anderson & Goodman 1957, "Statistical
inference about Markov chains", Ann. Math. Statist. 28, §3; Billingsley 1961, "Statistical
methods in Markov chains", Ann. Math. Statist. 32, §3):

    X² = Σ_m Σ_g (N_mg − T_m p_mg)² / (T_m p_mg),

the cells of block ``m`` pooled into groups ``g`` by their expected counts ``T_m p_m(t)``
(:func:`specverify.core.stats.pool_cells`, at least ``min_expected`` each; a function of the
block totals and the laws only), ``dof = Σ_m (G_m − 1)``; a block with fewer than two groups
adds nothing.  A sample in a cell of probability 0 is impossible under H0: p-value 0.

Null distribution.  Given every sequence's tokens before position ``j``, the tokens at ``j`` of
the ``T_m`` sequences in block ``m`` are i.i.d. ``p_m`` (the sequences are independent and each
one's next token depends on its own past only through its block), so the position-``j`` blocks
are independent multinomials given the past, and X² is a sum over positions of terms that are
each asymptotically ``χ²`` given the past: ``X² → χ²_dof`` (the cited theorem).  The p-value is
``P(χ²_dof ≥ X²)``, with the accuracy of Pearson's test on pooled cells
(:func:`specverify.core.stats.goodness_of_fit` documents its calibration).

Power.  Let the sequences come from another law under which the block of position ``j`` is
``s`` with probability ``π_js`` and the token there has law ``p'_js``.  The noncentrality is
``λ = n Σ_j Σ_s π_js Σ_t (p'_js(t) − p_s(t))² / p_s(t) ≥ n Σ_j Σ_s π_js (2 TV_js)² ≥
4 n Σ_j ε_j²`` (Cauchy–Schwarz, as in :func:`specverify.core.stats.power_at`, then Jensen),
where ``ε_j = Σ_s π_js TV(p'_js, p_s)`` is the deviation of position ``j``'s token given the
state before it.  So :func:`specverify.core.stats.sample_size_for_tv` with ``dof + 1`` cells
gives an ``n`` that detects ``ε_j ≥ ε`` at any one position (or ``Σ_j ε_j² ≥ ε²``) with the
stated power, every position using all ``n`` sequences (a joint test of the ``V^L`` sequences
would need cells for all of them).  It holds without pooling; with pooling, for the pooled laws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import chdtrc

from specverify.core.stats import pool_cells

__all__ = ["TransitionFit", "transition_goodness_of_fit"]


@dataclass(frozen=True)
class TransitionFit:
    """Result of :func:`transition_goodness_of_fit`.

    statistic: Pearson's X² summed over the blocks (``inf`` when a sample fell in a cell of
    probability 0); pvalue: ``P(χ²_dof ≥ statistic)`` (0 for an impossible cell, 1 with ``dof = 0``);
    dof: Σ over the blocks of (pooled groups − 1); n: samples counted (Σ of all block totals,
    so a sequence counts once per position); blocks: blocks with at least two groups (tested);
    impossible_count: samples in cells of probability 0; block_tv: per block the plug-in TV
    ``½ Σ_t |N_mt / T_m − p_m(t)|`` (0 for an empty block); method: ``"asymptotic"``,
    ``"impossible-cell"`` or ``"no-test"`` (no block reached two groups).
    """

    statistic: float
    pvalue: float
    dof: int
    n: int
    blocks: int
    impossible_count: int
    block_tv: np.ndarray
    method: str

    def __str__(self) -> str:
        return (f"transition goodness of fit (pearson): statistic={self.statistic:.6g}, dof={self.dof}, "
                f"p-value={self.pvalue:.4g} [{self.method}]; {self.blocks} blocks tested, n={self.n}")


def transition_goodness_of_fit(counts: np.ndarray, probs: np.ndarray, *, min_expected: float = 5.0) -> TransitionFit:
    """Test H0 of the module docstring on block counts ``counts [M, V]`` (non-negative integers)
    against the blocks' laws ``probs [M, V]`` (each row sums to 1 within 1e-9·V)."""
    counts = np.asarray(counts)
    probs = np.asarray(probs, dtype=np.float64)
    if counts.ndim != 2 or probs.shape != counts.shape:
        raise ValueError(f"counts, probs: expected two arrays [M, V] of one shape, got {list(counts.shape)} "
                         f"and {list(probs.shape)}")
    if np.any(counts < 0) or not np.all(np.equal(np.mod(counts, 1), 0)):
        raise ValueError("counts: expected non-negative integer counts")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise ValueError("probs: expected finite non-negative probabilities")
    if np.any(np.abs(probs.sum(-1) - 1.0) > 1e-9 * probs.shape[1]):
        raise ValueError("probs: every block's law must sum to 1; normalise each row")
    if min_expected <= 0:
        raise ValueError(f"min_expected: expected a positive number, got {min_expected!r}")
    counts = counts.astype(np.int64)
    totals = counts.sum(-1)
    frequencies = counts / np.maximum(totals, 1)[:, None]
    block_tv = np.where(totals > 0, 0.5 * np.abs(frequencies - probs).sum(-1), 0.0)
    impossible = int(counts[probs == 0].sum())
    statistic, dof, blocks = 0.0, 0, 0
    for m in np.flatnonzero(totals):
        possible = probs[m] > 0
        expected = totals[m] * probs[m, possible]
        groups = pool_cells(expected, min_expected)
        if len(groups) < 2:
            continue
        observed = counts[m, possible]
        group_observed = np.array([observed[g].sum() for g in groups], dtype=np.float64)
        group_expected = np.array([expected[g].sum() for g in groups])
        statistic += float(((group_observed - group_expected) ** 2 / group_expected).sum())
        dof += len(groups) - 1
        blocks += 1
    common: dict[str, Any] = dict(n=int(totals.sum()), blocks=blocks, impossible_count=impossible,
                                  block_tv=block_tv)
    if impossible:
        return TransitionFit(statistic=float("inf"), pvalue=0.0, dof=dof, method="impossible-cell", **common)
    if dof == 0:
        return TransitionFit(statistic=0.0, pvalue=1.0, dof=0, method="no-test", **common)
    return TransitionFit(statistic=statistic, pvalue=float(chdtrc(dof, statistic)), dof=dof,
                         method="asymptotic", **common)
