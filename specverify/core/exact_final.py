"""Exact law of the final draw at any vocabulary size, by the intervals of the inverse CDF.

:mod:`specverify.core.exact` integrates a rule over all its uniforms on a product grid and
enumerates every draft path, which is exact but costs ``V^K`` paths: it stops at toy vocabularies.
A tiling or rounding bug of the correction or bonus draw only shows at production vocabularies,
and there only the final uniform matters.  This module fixes everything else.

A *case* is one SPEC §1 step (``p [K+1, V]``, ``q [K, V]``) with the accept decisions fixed: a few
*branches*, each a draft path ``x`` and accept uniforms ``u_0..u_{K-1}`` under which the uniform
convention (docs/ARCHITECTURE.md: draft ``i`` accepted iff ``u_i q_i(x_i) < p_i(x_i)``) accepts the
first ``n`` drafts and, for ``n < K``, rejects draft ``n``; the branch's weight is its share of the
case.  What the final token must then follow is forced by losslessness on a context-free
(positional) chain, whatever rule is used:

- bonus (``n = K``): after an accepted path the bonus token must follow ``p_K`` (Leviathan et al.
  2023, Algorithm 1: the completed law of ``(x_0..x_{K-1}, y)`` is ``Π p_i(x_i) p_K(y)``, and the
  accepted path contributes ``Π min(p_i, q_i)(x_i)`` of it, so the law of ``y`` after it is ``p_K``);
- correction (``n < K``): averaged over the rejected draft ``x_n`` with weights
  ``(q_n − p_n)_+(x_n)`` the correction must follow ``(p_n − q_n)_+ / Σ (p_n − q_n)_+`` (eq. (1) of
  Leviathan et al.; a rule may make the correction depend on ``x_n`` as long as the average is
  right, so the branches of one case are the rejectable drafts and are averaged before comparing).

For one branch the function's output is a step function of ``u_K ∈ [0, 1)``.  The expected
output on the interval ``[C(t−1), C(t))`` of the law's CDF ``C`` is the accepted drafts then ``t``,
so the function is evaluated at both ends of every interval of positive length (``2S`` rows for
``S`` tokens of positive mass: V intervals at most, never a grid).  Where the two ends of an
interval, or the end of one and the start of the next, give different outputs than the law says,
the change points are located by bisection (all brackets of a case at once, one batch per
round).  Between two evaluated points with the same output the function is taken as constant,
which is exact for every draw whose token is non-decreasing in ``u_K`` (every inverse-CDF draw in
token order, whatever law it inverts); a function whose final token decreases somewhere along
``u_K`` is not one, and the case raises ValueError (it cannot be integrated this way).

The result is the exact TV between the function's law of the emitted tuple in the case (the
branches' laws averaged by weight) and the expected one, up to the mass of the brackets left
unresolved: ``tv_low ≤ TV ≤ tv_high``.  Refinement stops as soon as the verdict against a given
tolerance is decided, or the evaluation budget is spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

Evaluator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``evaluate(draft_tokens [N, K] int64, uniforms [N, K+1] float64) -> emitted [N, K+1] int64``:
the function under test on ``N`` rows of one case's laws (the evaluator owns the laws, dtype,
layout and chunking; it returns validated SPEC §1 outputs)."""

MAX_ROUNDS = 60
"""Bisection rounds at most (a bracket halves each round: 60 rounds take ``[0, 1)`` below 1e-18)."""


@dataclass(frozen=True)
class FinalDrawBranch:
    """One draft path with its accept uniforms (fixed), and its weight in the case."""

    draft_tokens: np.ndarray  # int64 [K]
    accept_uniforms: np.ndarray  # float64 [K]
    weight: float


@dataclass(frozen=True)
class FinalDrawCase:
    """A step with fixed accept decisions and the law its final token must follow.

    ``accepted``: the drafts the convention accepts in every branch (``n``); ``law [V]``: the
    expected law of the final token (``p_K`` for a bonus case, the normalised residual
    ``(p_n − q_n)_+`` for a correction case); ``branches``: the weighted draft paths (weights sum to 1).
    """

    label: str
    target: np.ndarray  # float64 [K+1, V], exactly the values the function receives
    draft: np.ndarray  # float64 [K, V]
    branches: tuple[FinalDrawBranch, ...]
    accepted: int
    law: np.ndarray  # float64 [V]

    @property
    def num_draft(self) -> int:
        return int(self.draft.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.target.shape[1])


@dataclass(frozen=True)
class FinalDrawLaw:
    """Outcome of :func:`integrate_final_draw`.

    ``tv_low`` ≤ exact TV ≤ ``tv_high`` (their difference is the mass of unresolved brackets);
    ``other_mass``: the function's mass on tuples that are not "the accepted drafts then one
    token" (a wrong accept decision or layout); ``worst``: the token whose mass is farthest from the
    law, with both masses; ``evaluations``: rows evaluated; ``rounds``: bisection rounds run.
    """

    tv_low: float
    tv_high: float
    other_mass: float
    worst: tuple[int, float, float]
    evaluations: int
    rounds: int

    @property
    def tv(self) -> float:
        """The midpoint estimate ``(tv_low + tv_high) / 2``."""
        return 0.5 * (self.tv_low + self.tv_high)


def cdf_intervals(law: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tokens of positive mass and their inverse-CDF intervals ``[left, right)`` in ``[0, 1)``:
    ``C(t) = cumsum(law)[t] / sum(law)`` in float64, the last edge exactly 1."""
    law = np.asarray(law, dtype=np.float64)
    if law.ndim != 1 or not np.all(law >= 0) or not law.sum() > 0:
        raise ValueError("law: expected a non-negative float64 vector [V] with a positive sum")
    edges = np.cumsum(law) / law.sum()
    edges[-1] = 1.0
    tokens = np.flatnonzero(law > 0)
    rights = edges[tokens]
    lefts = np.concatenate([[0.0], edges[:-1]])[tokens]
    keep = rights > lefts
    return tokens[keep], lefts[keep], rights[keep]


def integrate_final_draw(case: FinalDrawCase, evaluate: Evaluator, *, tolerance: float | None = None,
                         precision: float = 1e-12, max_evaluations: int = 200_000) -> FinalDrawLaw:
    """The exact TV of ``case`` (module docstring), refined until ``tv_high − tv_low ≤ precision``,
    or, given a ``tolerance``, as soon as the verdict against it is decided (``tv_low >
    tolerance``, or ``tv_high ≤ tolerance`` with ``tv_high − tv_low ≤ tolerance / 2``), or after
    ``max_evaluations`` rows; every branch's brackets are bisected together.

    Raises ValueError when the function's final token is not non-decreasing in ``u_K`` on a branch
    whose accepted drafts are right (it is not an inverse-CDF draw in token order)."""
    _, lefts, rights = cdf_intervals(case.law)
    # Points: both ends of every interval (the right end is the last float below it).
    points = np.concatenate([lefts, np.nextafter(rights, 0.0)])
    points = np.sort(points, kind="stable")
    branches = case.branches
    # One batch for every branch's points; per branch the sorted points and their outputs.
    codes = _codes(case, evaluate, np.repeat(np.arange(len(branches)), len(points)), np.tile(points, len(branches)))
    segments = [[points, codes[b * len(points):(b + 1) * len(points)]] for b in range(len(branches))]
    evaluations = len(codes)
    rounds = 0
    while True:
        low, high, other, worst, brackets = _bounds(case, segments)
        decided = high - low <= precision or (tolerance is not None and (
            low > tolerance or (high <= tolerance and high - low <= tolerance / 2)))
        if decided or not brackets or rounds >= MAX_ROUNDS or evaluations + len(brackets) > max_evaluations:
            break
        branch_of = np.array([b for b, _ in brackets], dtype=np.int64)
        middles = np.array([0.5 * (segments[b][0][i] + segments[b][0][i + 1]) for b, i in brackets])
        new_codes = _codes(case, evaluate, branch_of, middles)
        evaluations += len(middles)
        rounds += 1
        for b in range(len(branches)):
            mine = branch_of == b
            if mine.any():
                u, c = segments[b]
                u = np.concatenate([u, middles[mine]])
                c = np.concatenate([c, new_codes[mine]])
                order = np.argsort(u, kind="stable")
                segments[b] = [u[order], c[order]]
    _check_monotone(case, segments)
    return FinalDrawLaw(max(0.0, low), min(1.0, high), other, worst, evaluations, rounds)


def _codes(case: FinalDrawCase, evaluate: Evaluator, branch_of: np.ndarray, u_final: np.ndarray) -> np.ndarray:
    """Per row: the final token when the emitted tuple is the branch's accepted drafts then one
    token, else ``-1`` (any other tuple)."""
    n, num_draft = case.accepted, case.num_draft
    drafts = np.stack([case.branches[b].draft_tokens for b in branch_of]).astype(np.int64).reshape(-1, num_draft)
    accept = np.stack([case.branches[b].accept_uniforms for b in branch_of]).astype(np.float64).reshape(-1, num_draft)
    uniforms = np.concatenate([accept, u_final[:, None]], axis=1)
    emitted = evaluate(torch.from_numpy(drafts), torch.from_numpy(uniforms)).numpy()
    lengths = (emitted >= 0).sum(axis=1)
    right = (lengths == n + 1) & np.all(emitted[:, :n] == drafts[:, :n], axis=1)
    return np.where(right, emitted[:, n], -1)


def _bounds(case: FinalDrawCase, segments: Sequence[list[np.ndarray]]) -> tuple[float, float, float,
                                                                                tuple[int, float, float],
                                                                                list[tuple[int, int]]]:
    """TV bounds from the evaluated points of every branch, and the open brackets ``(branch, i)``
    (consecutive points ``i, i+1`` with different outputs, farther apart than one ulp)."""
    vocab = case.vocab_size
    mass = np.zeros(vocab + 1)  # index vocab: tuples other than "accepted drafts then a token"
    unresolved = 0.0
    brackets: list[tuple[int, int]] = []
    for b, (u, c) in enumerate(segments):
        weight = case.branches[b].weight
        widths = np.diff(np.append(u, 1.0))
        # The first point is the left end of the first interval, 0 for every law.
        same = np.append(c[:-1] == c[1:], True)
        # Equal neighbours: the span belongs to that output; the last point owns up to 1.
        owners = np.where(c >= 0, c, vocab)
        np.add.at(mass, owners[same], weight * widths[same])
        # A step between neighbours whose values differ: the span [u_i, u_{i+1}) holds the change.
        open_spans = np.flatnonzero(~same)
        for i in open_spans:
            gap = float(u[i + 1] - u[i])
            if u[i + 1] <= np.nextafter(u[i], 2.0):  # adjacent floats: the change is at u[i+1]
                mass[owners[i]] += weight * gap
            else:
                unresolved += weight * gap
                brackets.append((b, int(i)))
    expected = np.append(np.asarray(case.law, dtype=np.float64) / case.law.sum(), 0.0)
    resolved_tv = 0.5 * float(np.abs(mass - expected).sum())
    # The unresolved mass, wherever it belongs, moves the TV by at most half of it either way
    # (mass and expected differ in total by exactly that much).
    low, high = resolved_tv - 0.5 * unresolved, resolved_tv + 0.5 * unresolved
    diff = np.abs(mass[:vocab] - expected[:vocab])
    token = int(np.argmax(diff))
    return low, high, float(mass[vocab]), (token, float(mass[token]), float(expected[token])), brackets


def _check_monotone(case: FinalDrawCase, segments: Sequence[list[np.ndarray]]) -> None:
    for b, (_, c) in enumerate(segments):
        valid = c[c >= 0]
        if len(valid) > 1 and np.any(np.diff(valid) < 0):
            at = int(np.flatnonzero(np.diff(valid) < 0)[0])
            raise ValueError(
                f"rule: in {case.label} (branch {b}) its final token decreases along u_K (token {int(valid[at])} "
                f"then {int(valid[at + 1])}): it is not an inverse-CDF draw in token order, so its law cannot be "
                "integrated by CDF intervals; the statistical checks judge it")


def weighted_branches(draft_paths: Sequence[np.ndarray], accept_uniforms: Sequence[np.ndarray],
                      weights: Sequence[float]) -> tuple[FinalDrawBranch, ...]:
    """Branches from parallel lists, weights normalised to sum 1."""
    total = math.fsum(weights)
    if not total > 0:
        raise ValueError("weights: expected positive branch weights")
    return tuple(FinalDrawBranch(np.asarray(x, dtype=np.int64), np.asarray(u, dtype=np.float64), float(w) / total)
                 for x, u, w in zip(draft_paths, accept_uniforms, weights))


__all__ = ["Evaluator", "FinalDrawBranch", "FinalDrawCase", "FinalDrawLaw", "cdf_intervals",
           "integrate_final_draw", "weighted_branches", "MAX_ROUNDS"]
