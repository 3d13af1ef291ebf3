"""Categorical draws by inverse CDF: the one definition every part of specverify samples with.

Given non-negative weights ``r`` over ``{0, ..., V-1}`` with ``sum(r) > 0`` and one uniform
``u ∈ [0, 1)``, the drawn token is the first ``t`` with ``cumsum(r)[t] > u · sum(r)``.  For
``u ~ U[0, 1)`` that token has probability ``r[t] / sum(r)``: it is drawn iff ``u · sum(r)`` lies in
``[cumsum(r)[t-1], cumsum(r)[t])``, an interval of length ``r[t]``.  A token with ``r[t] = 0`` has an
empty interval, and since the cumulative sum strictly increases at the drawn token it is never
returned, whatever the rounding.  Everything is float64.

This is the uniform convention's final draw (column ``K`` of ``uniforms``, docs/ARCHITECTURE.md),
used by the rules (:mod:`specverify.core.rules`), the bug catalog, the reference drafters and, in
its vectorised form :class:`TableSampler`, by the sampler harness.
"""

from __future__ import annotations

import numpy as np
import torch


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor, *, in_place: bool = False) -> torch.Tensor:
    """int64 ``[B]``: per row the first token ``t`` with ``cumsum(w)[t] > u · sum(w)``.

    ``weights [B, V]`` are non-negative with a positive sum per row (cast to float64);
    ``u [B]`` are uniforms in ``[0, 1)``.  ``sum(w)`` is the last cumulative sum.  For ``u < 1``
    and a normal ``sum(w)``, ``u · sum(w)`` rounds below ``sum(w)``; for a subnormal total (masses
    ~1e-320) it can round up to it, so the threshold is capped one ulp below the total and a
    token is always found.  ``in_place=True`` overwrites float64 ``weights`` with their cumulative
    sums (for callers that pass a temporary: no new ``[B, V]`` buffer).
    """
    weights = weights.to(torch.float64)
    return search_cdf(weights.cumsum_(-1) if in_place else weights.cumsum(-1), u)


def search_cdf(cumulative: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The search half of :func:`inverse_cdf`, for callers that form the float64 cumulative sums
    ``[B, V]`` themselves: per row the first ``t`` with ``cumulative[t] > min(u · total, total − 1 ulp)``,
    ``total = cumulative[:, -1]``."""
    total = cumulative[:, -1]
    threshold = torch.minimum(u.to(torch.float64) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cumulative, threshold.unsqueeze(-1), right=True).squeeze(-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """int64 ``[N]``: one token per row of ``probs [N, V]`` by :func:`inverse_cdf`, with
    ``u ~ U[0, 1)`` drawn from ``generator`` (one float64 uniform per row, in row order).  A
    one-hot row (temperature 0) returns its argmax."""
    u = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device=probs.device)
    return inverse_cdf(probs, u)


class TableSampler:
    """:func:`sample` from chosen rows of one fixed table ``[..., V]`` (flattened to ``[M, V]``),
    vectorised without an ``[N, V]`` gather.

    The rows' cumulative sums are concatenated into one increasing array, row ``k`` shifted by
    ``k``: its entries lie in ``(k, k+1]``, and token ``t`` of row ``k`` is drawn iff
    ``k + F_k(t−1) ≤ k + u·F_k(V−1) < k + F_k(t)``, the inverse-CDF rule above on row ``k``
    (probability ``r_k(t)/sum(r_k)``; a token of probability 0 is never drawn).  Adding ``k``
    rounds at ``ulp(k)`` (~1e-13 for ``M`` in the thousands), not at ``ulp(1)``; should that
    push ``k + u·F_k(V−1)`` across the row's ends (``u`` within ~1e-13 of 0 or 1), the row's first
    or last token of positive probability is returned.
    """

    def __init__(self, table: np.ndarray | torch.Tensor) -> None:
        table = torch.as_tensor(np.ascontiguousarray(table), dtype=torch.float64)
        flat = table.reshape(-1, table.shape[-1])
        cumulative = flat.cumsum(dim=-1)
        offsets = torch.arange(flat.shape[0], dtype=torch.float64)[:, None]
        self.vocab_size = flat.shape[-1]
        positive = (flat > 0).long()
        # numpy arrays: a draw is a handful of small vector operations, each a few times cheaper
        # in numpy than in torch at a thousand values; numpy's search (the same index as
        # torch.searchsorted(..., right=True)) runs on one thread, where torch's costs several
        # times its CPU time in thread hand-offs.
        self._totals = cumulative[:, -1].numpy().copy()
        self._shifted = (cumulative + offsets).reshape(-1).numpy()
        self._first_positive = positive.argmax(dim=-1).numpy()
        self._last_positive = (self.vocab_size - 1 - positive.flip(-1).argmax(dim=-1)).numpy()

    def sample(self, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """int64 ``[N]``: one token from each listed row (``rows [N]`` index the flattened table),
        one float64 uniform per row from ``generator``."""
        u = torch.rand(rows.shape[0], generator=generator, dtype=torch.float64).numpy()
        index = rows.numpy()
        values = index.astype(np.float64) + u * self._totals[index]
        tokens = np.searchsorted(self._shifted, values, side="right") - index * self.vocab_size
        clipped = np.maximum(np.minimum(tokens, self._last_positive[index]), self._first_positive[index])
        return torch.from_numpy(clipped.astype(np.int64, copy=False))
