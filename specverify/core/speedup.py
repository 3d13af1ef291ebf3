"""Analytic speedup model of speculative decoding (Leviathan et al. 2023, §3.3–3.4).

Each target pass verifies γ drafts and emits the accepted ones plus one correction-or-bonus
token.  With acceptance rates ``α_i`` (the probability that draft ``i`` is accepted given that the
earlier ones were) the expected number of tokens per target pass is

    E[tokens] = 1 + sum_{j=1..γ} prod_{i<=j} α_i,

which for a constant α is Leviathan et al. eq. (1): ``(1 − α^{γ+1}) / (1 − α)`` (``γ + 1`` at α = 1).

Cost of one pass, in units of one plain target decoding step:

    cost = γ c + 1 + γ v,

``c`` the cost of one draft token (Leviathan et al.'s ``c``) and ``v`` the extra cost of each verified
token beyond the first.  Leviathan et al. assume ``v = 0`` (a small-batch target step is memory
bound, so scoring γ + 1 tokens costs as much as scoring one).  At large batch sizes a target
step becomes compute bound and each extra scored token costs a fraction of a step, up to
``v ≈ 1`` when fully compute bound: then speculation can be slower than plain decoding.  The walltime improvement
over plain decoding (Leviathan et al. Theorem 3.8 when ``v = 0``) is

    speedup = E[tokens] / cost = (1 − α^{γ+1}) / ((1 − α)(γ c + 1 + γ v)).

Speculation pays iff some γ ≥ 1 has speedup > 1.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from specverify.core.acceptance import expected_tokens_constant_alpha, expected_tokens_per_step

DEFAULT_MAX_GAMMA = 16


@dataclass(frozen=True)
class SpeedupEstimate:
    """The model's prediction for one draft length.

    gamma: draft tokens per pass γ.
    alphas: the per-position acceptance rates used (γ of them; all equal for a constant α).
    draft_cost, verify_cost: ``c`` and ``v`` in target steps per token.
    tokens_per_pass: ``E[tokens] = 1 + Σ_j Π_{i≤j} α_i``.
    pass_cost: ``γ c + 1 + γ v`` target steps.
    speedup: ``tokens_per_pass / pass_cost``, walltime of plain decoding over speculative decoding.
    """

    gamma: int
    alphas: tuple[float, ...]
    draft_cost: float
    verify_cost: float
    tokens_per_pass: float
    pass_cost: float
    speedup: float

    @property
    def pays(self) -> bool:
        """Whether this γ beats plain decoding (speedup > 1)."""
        return self.speedup > 1.0


@dataclass(frozen=True)
class BestGamma:
    """Result of :func:`best_gamma`: the γ with the largest speedup among those evaluated.

    gamma, speedup: the best draft length and its speedup.
    pays: whether speculation beats plain decoding at all (best speedup > 1); when False, decode
        without a draft.
    table: the estimate for every γ evaluated, in increasing γ.
    """

    gamma: int
    speedup: float
    pays: bool
    table: tuple[SpeedupEstimate, ...]


def expected_tokens_per_pass(alpha: float, gamma: int) -> float:
    """Leviathan et al. 2023 eq. (1): ``(1 − α^{γ+1}) / (1 − α)`` for a constant acceptance rate α,
    and its limit ``γ + 1`` at α = 1 (:func:`specverify.core.acceptance.expected_tokens_constant_alpha`)."""
    _check_alpha(alpha, "alpha")
    _check_gamma(gamma)
    return expected_tokens_constant_alpha(alpha, gamma)


def expected_tokens_per_pass_by_position(alphas: Sequence[float]) -> float:
    """Position-dependent form ``1 + Σ_{j=1..γ} Π_{i≤j} α_i`` with ``γ = len(alphas)``: the pass
    emits draft ``j`` iff drafts ``1..j`` are all accepted, plus one final token
    (:func:`specverify.core.acceptance.expected_tokens_per_step`, for ``γ ≥ 1``)."""
    return expected_tokens_per_step(_check_alphas(alphas))


def pass_cost(gamma: int, draft_cost: float, verify_cost: float = 0.0) -> float:
    """Cost of one speculative pass in target steps: ``γ c + 1 + γ v`` (γ draft tokens, then one
    target pass over γ + 1 tokens)."""
    _check_gamma(gamma)
    _check_cost(draft_cost, "draft_cost")
    _check_cost(verify_cost, "verify_cost")
    return gamma * draft_cost + 1.0 + gamma * verify_cost


def speedup(alpha: float | Sequence[float], gamma: int, draft_cost: float, verify_cost: float = 0.0) -> SpeedupEstimate:
    """Predicted walltime improvement ``E[tokens] / (γ c + 1 + γ v)`` at draft length ``gamma``.

    ``alpha``: a constant acceptance rate (closed form, eq. (1)) or per-position rates, of which
    the first ``gamma`` are used.  Leviathan et al. Theorem 3.8 is the case ``verify_cost = 0``.
    """
    _check_gamma(gamma)
    if isinstance(alpha, numbers.Real):  # numbers.Real: numpy scalars too; mypy reads it as not float
        _check_alpha(cast(float, alpha), "alpha")
        alphas = (float(alpha),) * gamma
        tokens = expected_tokens_per_pass(float(alpha), gamma)
    else:
        rates = _check_alphas(cast(Sequence[float], alpha))
        if gamma > len(rates):
            raise ValueError(f"gamma: {gamma} exceeds the {len(rates)} per-position rates in alpha; pass more rates")
        alphas = rates[:gamma]
        tokens = expected_tokens_per_pass_by_position(alphas)
    cost = pass_cost(gamma, draft_cost, verify_cost)
    return SpeedupEstimate(
        gamma=gamma, alphas=alphas, draft_cost=float(draft_cost), verify_cost=float(verify_cost),
        tokens_per_pass=tokens, pass_cost=cost, speedup=tokens / cost,
    )


def speedup_table(
    alpha: float | Sequence[float], gammas: Sequence[int], draft_cost: float, verify_cost: float = 0.0
) -> tuple[SpeedupEstimate, ...]:
    """:func:`speedup` at every γ in ``gammas`` (sorted, duplicates removed)."""
    if not gammas:
        raise ValueError("gammas: expected at least one draft length")
    return tuple(speedup(alpha, gamma, draft_cost, verify_cost) for gamma in sorted(set(gammas)))


def best_gamma(
    alpha: float | Sequence[float],
    draft_cost: float,
    verify_cost: float = 0.0,
    *,
    max_gamma: int | None = None,
    gammas: Sequence[int] | None = None,
) -> BestGamma:
    """The draft length with the largest predicted speedup, and whether speculation pays at all.

    Evaluates ``gammas`` if given, else ``1..max_gamma`` (default: ``DEFAULT_MAX_GAMMA``, or the
    number of per-position rates).  Ties go to the smaller γ (less draft work for the same gain).
    """
    if gammas is not None and max_gamma is not None:
        raise ValueError("gammas/max_gamma: pass one of them, not both")
    if gammas is None:
        if max_gamma is None:
            max_gamma = DEFAULT_MAX_GAMMA if isinstance(alpha, numbers.Real) else len(cast(Sequence[float], alpha))
        _check_gamma(max_gamma, "max_gamma")
        gammas = range(1, max_gamma + 1)
    table = speedup_table(alpha, list(gammas), draft_cost, verify_cost)
    best = max(table, key=lambda estimate: (estimate.speedup, -estimate.gamma))
    return BestGamma(gamma=best.gamma, speedup=best.speedup, pays=best.pays, table=table)


def _check_alpha(alpha: float, name: str) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"{name}: expected an acceptance rate in [0, 1], got {alpha!r}")


def _check_alphas(alphas: Sequence[float]) -> tuple[float, ...]:
    if isinstance(alphas, (str, bytes)) or not isinstance(alphas, Sequence) or len(alphas) == 0:
        raise ValueError(f"alphas: expected a non-empty sequence of acceptance rates in [0, 1], got {alphas!r}")
    for position, rate in enumerate(alphas):
        _check_alpha(rate, f"alphas[{position}]")
    return tuple(float(rate) for rate in alphas)


def _check_gamma(gamma: int, name: str = "gamma") -> None:
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Integral) or gamma < 1:
        raise ValueError(f"{name}: expected an integer number of draft tokens >= 1, got {gamma!r}")


def _check_cost(cost: float, name: str) -> None:
    if isinstance(cost, bool) or not isinstance(cost, numbers.Real) or not math.isfinite(cost) or cost < 0:
        raise ValueError(f"{name}: expected a finite cost >= 0 in target steps per token, got {cost!r}")
