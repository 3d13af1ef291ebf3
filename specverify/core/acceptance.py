"""Expected tokens per verification step from acceptance rates (no torch: the speedup model and
the command line import it without loading a tensor library).

With ``α_i`` the probability that draft ``i`` is accepted given that drafts ``0..i-1`` were, a
step emits ``1 + Σ_{j=1..K} Π_{i<j} α_i`` tokens in expectation; for a constant ``α`` that is
Leviathan et al. 2023, eq. (1).  :mod:`specverify.core.exact` re-exports these functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def expected_accepted_length(alphas: Sequence[float]) -> float:
    """Expected number of accepted drafts with position-dependent acceptance rates:
    ``Σ_{j=1..K} Π_{i=0..j-1} α_i``, where ``α_i`` is the probability that draft ``i`` is accepted
    given that drafts ``0..i-1`` were (``K = len(alphas)``)."""
    rates = acceptance_rates(alphas)
    return float(np.cumprod(rates).sum())


def expected_tokens_per_step(alphas: Sequence[float]) -> float:
    """Expected tokens emitted per step: ``1 + expected_accepted_length(alphas)`` (every step ends
    with one correction-or-bonus token).  For a constant ``α`` this is Leviathan et al. 2023,
    eq. (1): ``(1 − α^{K+1}) / (1 − α)``, see :func:`expected_tokens_constant_alpha`."""
    return 1.0 + expected_accepted_length(alphas)


def expected_tokens_constant_alpha(alpha: float, num_draft: int) -> float:
    """Leviathan et al. 2023, eq. (1): ``E[#tokens per step] = (1 − α^{K+1}) / (1 − α)`` for i.i.d.
    acceptance with rate ``α`` and ``K = num_draft`` drafts (``K + 1`` when ``α = 1``)."""
    acceptance_rates([alpha])
    check_num_draft(num_draft)
    if alpha == 1.0:
        return float(num_draft + 1)
    return (1.0 - alpha ** (num_draft + 1)) / (1.0 - alpha)


def acceptance_rates(alphas: Sequence[float]) -> np.ndarray:
    """``alphas`` as a float64 vector, or ``ValueError`` unless every entry is a probability."""
    rates = np.asarray(alphas, dtype=np.float64)
    if rates.ndim != 1 or np.any(~np.isfinite(rates)) or np.any(rates < 0) or np.any(rates > 1):
        raise ValueError(f"alphas: expected a sequence of acceptance probabilities in [0, 1], got {alphas!r}")
    return rates


def check_num_draft(num_draft: int) -> None:
    """``ValueError`` unless ``num_draft`` is a non-negative integer K."""
    if not isinstance(num_draft, (int, np.integer)) or isinstance(num_draft, bool) or num_draft < 0:
        raise ValueError(f"num_draft: expected a non-negative integer K, got {num_draft!r}")
