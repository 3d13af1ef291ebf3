"""Exact laws of speculative decoding by enumeration and exact integration over the uniforms.

All distributions are ``dict[tuple[int, ...], float]`` (token tuple -> probability, float64).

Notation: at draft position ``i`` the target's law is ``p_i`` and the draft's ``q_i`` (both for the
context extended by draft tokens ``0..i-1``); position ``K`` is the bonus position.  The correct
rule (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2, whose ``q`` is the target
and ``p`` the draft) accepts draft token ``x_i`` with probability ``min(1, p_i(x_i)/q_i(x_i))``,
and at the first rejection emits a token from ``(p_i - q_i)_+ / sum (p_i - q_i)_+``; if all ``K``
drafts pass it emits a bonus token from ``p_K``.  By Theorem 1 of Leviathan et al. the emitted
tokens, completed by target sampling, are distributed as target sampling:
``completed_step_distribution(step_distribution(rule, ...)) == target_sequence_distribution(chain, K+1)``
is the exact losslessness check of one step, and :func:`sequence_distribution` the check of a
whole run.

:func:`step_distribution` integrates *any* rule that follows the uniform convention of
``docs/ARCHITECTURE.md`` (column ``i < K`` accepts iff ``u_i * q_i(x_i) < p_i(x_i)``, column ``K``
samples by inverse CDF) exactly: the rule's output is piecewise constant in each uniform, so for
every draft path it evaluates the rule on a product grid of cells whose edges are candidate
breakpoints, checks that every cell is constant (random points and one-axis scans), locates any
breakpoint the candidates missed by bisection, and sums cell volumes times the path probability.

Tolerances: everything is float64.  Grid edges closer than :data:`MIN_CELL_WIDTH` are merged, so a
rule whose breakpoints are that close is integrated to within that width per merged edge; sums of
up to millions of cell volumes carry rounding errors around 1e-14.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specverify.core import outputs
from specverify.core.acceptance import (  # noqa: F401 - re-exported: part of this module's API
    acceptance_rates,
    check_num_draft,
    expected_accepted_length,
    expected_tokens_constant_alpha,
    expected_tokens_per_step,
)
from specverify.core.chains import Chain

Distribution = dict[tuple[int, ...], float]
Rule = Callable[..., Any]

MIN_CELL_WIDTH = 1e-13
"""Grid edges closer than this are merged (an integration error of at most this much per edge)."""

MAX_REFINEMENTS = 6
"""Rounds of breakpoint search :func:`step_distribution` runs before giving up on a rule."""

BISECTION_STEPS = 64
"""Halvings per located breakpoint: enough to pin a breakpoint in ``[0, 1]`` to below 1e-19."""

MAX_BISECTIONS_PER_PATH = 32
"""Non-constant cells per draft path whose breakpoints are located in one refinement round."""

SCAN_FRACTIONS = np.concatenate(
    [(np.arange(8) + 0.5) / 8, 8.0 ** -np.arange(2, 8), 1.0 - 8.0 ** -np.arange(2, 8)]
)
"""Relative positions in a cell's interval at which ``_scan_columns`` re-evaluates one uniform:
evenly spaced midpoints, and geometric points down to ``8**-7 ≈ 4.8e-7`` from either end."""

ROWS_PER_CHUNK_ELEMENTS = 1 << 21
"""A rule call gets at most this many ``target_probs`` elements (bounds memory)."""


# --------------------------------------------------------------------------------------------
# Acceptance rates and expected lengths
# --------------------------------------------------------------------------------------------


def acceptance_probability(p: np.ndarray | Mapping[Any, float], q: np.ndarray | Mapping[Any, float]) -> float:
    """``β = Σ_x min(p(x), q(x)) = 1 − TV(p, q)``: the probability that a draft token ``x ~ q`` is
    accepted with probability ``min(1, p(x)/q(x))`` (Leviathan et al. 2023, §3: Corollary 3.6 gives
    ``β = Σ_x min(p(x), q(x))``; ``α = E[β]`` is its average over contexts).

    ``p`` and ``q`` are arrays of equal shape or dicts (missing keys have probability 0).
    """
    if isinstance(p, Mapping) or isinstance(q, Mapping):
        if not (isinstance(p, Mapping) and isinstance(q, Mapping)):
            raise ValueError("q: pass both laws as arrays or both as dicts")
        return math.fsum(min(p.get(key, 0.0), q.get(key, 0.0)) for key in set(p) | set(q))
    p_array, q_array = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p_array.shape != q_array.shape:
        raise ValueError(f"q: expected the shape of p {list(p_array.shape)}, got {list(q_array.shape)}")
    return float(np.minimum(p_array, q_array).sum())


@dataclass(frozen=True)
class AcceptanceByPosition:
    """Exact acceptance statistics of one step of the correct rule.

    ``conditional[i]`` = P(draft ``i`` accepted | drafts ``0..i-1`` accepted), defined as 0 when
    the condition is impossible (so products stay correct); ``at_least[i]`` = P(at least ``i+1``
    drafts accepted) = ``Π_{j<=i} conditional[j]``.
    """

    conditional: np.ndarray
    at_least: np.ndarray

    @property
    def expected_accepted(self) -> float:
        """``E[#accepted drafts] = Σ_i P(at least i+1 accepted)``."""
        return float(self.at_least.sum())

    @property
    def expected_tokens(self) -> float:
        """``E[#emitted tokens] = 1 + E[#accepted drafts]``."""
        return 1.0 + self.expected_accepted


def exact_acceptance_by_position(chain: Chain, num_draft: int, prefix: tuple[int, ...] = ()) -> AcceptanceByPosition:
    """Acceptance probabilities of the correct rule by position, by enumerating draft paths.

    A path ``x_0..x_i`` is drawn and accepted with probability ``Π_j q_j(x_j) min(1, p_j(x_j)/q_j(x_j))
    = Π_j min(p_j(x_j), q_j(x_j))``, so ``P(at least i+1 accepted)`` is the sum of that product over
    all paths of length ``i+1``.  With context-dependent chains the ``conditional`` rates are
    averages over draft paths, and ``expected_tokens_per_step(conditional)`` is exact.
    """
    check_num_draft(num_draft)
    prefix = _as_prefix(prefix, chain)
    at_least = np.zeros(num_draft)
    level: dict[tuple[int, ...], float] = {(): 1.0}
    for position in range(num_draft):
        next_level: dict[tuple[int, ...], float] = {}
        for path, weight in level.items():
            accepted = np.minimum(chain.target(prefix + path), chain.draft(prefix + path))
            for token in np.flatnonzero(accepted):
                next_level[path + (int(token),)] = weight * accepted[token]
        at_least[position] = math.fsum(next_level.values())
        level = next_level
    previous = np.concatenate([[1.0], at_least])[:num_draft]
    conditional = np.divide(at_least, previous, out=np.zeros(num_draft), where=previous > 0)
    return AcceptanceByPosition(conditional=conditional, at_least=at_least)


def mean_emitted_length(step_dist: Mapping[tuple[int, ...], float]) -> float:
    """``Σ_e len(e) P(e)``: the mean number of tokens one step emits."""
    return math.fsum(len(emitted) * prob for emitted, prob in step_dist.items())


# --------------------------------------------------------------------------------------------
# Target laws and the correct rule's laws, by enumeration
# --------------------------------------------------------------------------------------------


def target_sequence_distribution(chain: Chain, length: int, prefix: tuple[int, ...] = ()) -> Distribution:
    """Law of the next ``length`` tokens of ancestral target sampling after ``prefix``:
    ``P(y_1..y_L) = Π_t p(y_t | prefix, y_<t)``, enumerated over positive-probability tuples."""
    if length < 0:
        raise ValueError(f"length: expected a non-negative integer, got {length}")
    prefix = _as_prefix(prefix, chain)
    law: Distribution = {(): 1.0}
    for _ in range(length):
        extended: Distribution = {}
        for sequence, weight in law.items():
            p = chain.target(prefix + sequence)
            for token in np.flatnonzero(p):
                extended[sequence + (int(token),)] = weight * p[token]
        law = extended
    return law


def ideal_step_distribution(chain: Chain, num_draft: int, prefix: tuple[int, ...] = ()) -> Distribution:
    """Analytic law of the tuple one step of the correct rule emits (Leviathan et al. 2023,
    Algorithm 1).  Along an accepted path ``x_0..x_{i-1}`` (weight ``Π_j min(p_j(x_j), q_j(x_j))``):

    - rejection at ``i`` emits ``x_0..x_{i-1}, y`` with probability
      ``weight · Σ_x (q_i(x) − p_i(x))_+ · (p_i(y) − q_i(y))_+ / Σ_z (p_i(z) − q_i(z))_+``;
    - acceptance of all ``K`` drafts emits ``x_0..x_{K-1}, y`` with ``weight · p_K(y)``.
    """
    check_num_draft(num_draft)
    prefix = _as_prefix(prefix, chain)
    law: Distribution = defaultdict(float)
    level: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(num_draft):
        next_level: dict[tuple[int, ...], float] = {}
        for path, weight in level.items():
            p, q = chain.target(prefix + path), chain.draft(prefix + path)
            rejection = np.maximum(q - p, 0.0).sum()
            residual = np.maximum(p - q, 0.0)
            residual_mass = residual.sum()
            if rejection > 0 and residual_mass > 0:
                for token in np.flatnonzero(residual):
                    law[path + (int(token),)] += weight * rejection * residual[token] / residual_mass
            accepted = np.minimum(p, q)
            for token in np.flatnonzero(accepted):
                next_level[path + (int(token),)] = weight * accepted[token]
        level = next_level
    for path, weight in level.items():
        bonus = chain.target(prefix + path)
        for token in np.flatnonzero(bonus):
            law[path + (int(token),)] += weight * bonus[token]
    return dict(law)


def completed_step_distribution(
    step_dist: Mapping[tuple[int, ...], float], chain: Chain, num_draft: int, prefix: tuple[int, ...] = ()
) -> Distribution:
    """Law of the first ``K+1`` tokens when each emitted tuple ``e`` is extended by target sampling:
    ``P(y) = Σ_{e prefix of y} P_step(e) · Π_{t>|e|} p(y_t | prefix, y_<t)``.  The step is lossless
    iff this equals ``target_sequence_distribution(chain, K+1, prefix)``."""
    check_num_draft(num_draft)
    prefix = _as_prefix(prefix, chain)
    law: Distribution = defaultdict(float)
    for emitted, prob in step_dist.items():
        if len(emitted) > num_draft + 1:
            raise ValueError(f"step_dist: tuple {emitted} is longer than K+1 = {num_draft + 1} tokens")
        if prob == 0:
            continue
        continuation = target_sequence_distribution(chain, num_draft + 1 - len(emitted), prefix + tuple(emitted))
        for tail, tail_prob in continuation.items():
            law[tuple(emitted) + tail] += prob * tail_prob
    return dict(law)


def sequence_distribution(
    rule: Rule | None, chain: Chain, num_draft: int, length: int, prefix: tuple[int, ...] = ()
) -> Distribution:
    """Exact law of the first ``length`` tokens of a whole speculative decoding run after ``prefix``.

    Dynamic programme over steps: every unfinished emitted sequence ``s`` is extended by the step
    law at ``prefix + s`` (:func:`step_distribution` of ``rule``, or the analytic
    :func:`ideal_step_distribution` when ``rule`` is None) and truncated to ``length``.  Step laws
    are memoised by the chain's context (``chain.context_after``, when the chain has one) or else
    by the prefix.  Lossless runs give ``target_sequence_distribution(chain, length, prefix)``.
    """
    check_num_draft(num_draft)
    if length < 0:
        raise ValueError(f"length: expected a non-negative integer, got {length}")
    prefix = _as_prefix(prefix, chain)
    step_laws: dict[Any, Distribution] = {}

    def step_law(at: tuple[int, ...]) -> Distribution:
        key = chain.context_after(at) if hasattr(chain, "context_after") else at
        if key not in step_laws:
            if rule is None:
                step_laws[key] = ideal_step_distribution(chain, num_draft, at)
            else:
                step_laws[key] = step_distribution(rule, chain, num_draft, at)
        return step_laws[key]

    return prefix_law_of_steps(step_law, prefix, length)


def prefix_law_of_steps(step_law: Callable[[tuple[int, ...]], Distribution], prefix: tuple[int, ...],
                        length: int) -> Distribution:
    """Exact law of the first ``length`` tokens of a decoding loop whose every step, after the
    context ``prefix + sequence``, emits a tuple of tokens with law ``step_law(prefix + sequence)``:
    P(x_1..x_L) = Σ over the step sequences that first reach length ≥ L with that prefix of the
    product of their step probabilities (breadth-first over the partial sequences)."""
    finished: Distribution = defaultdict(float)
    frontier: Distribution = {(): 1.0} if length > 0 else {}
    if length == 0:
        finished[()] = 1.0
    while frontier:
        next_frontier: Distribution = defaultdict(float)
        for sequence, weight in frontier.items():
            for emitted, prob in step_law(prefix + sequence).items():
                extended = sequence + emitted
                if len(extended) >= length:
                    finished[extended[:length]] += weight * prob
                else:
                    next_frontier[extended] += weight * prob
        frontier = next_frontier
    return dict(finished)


def total_variation(d1: Mapping[tuple[int, ...], float], d2: Mapping[tuple[int, ...], float]) -> float:
    """``TV(d1, d2) = ½ Σ_k |d1(k) − d2(k)|`` over the union of keys (missing keys count as 0)."""
    return 0.5 * math.fsum(abs(d1.get(key, 0.0) - d2.get(key, 0.0)) for key in set(d1) | set(d2))


def max_abs_difference(d1: Mapping[tuple[int, ...], float], d2: Mapping[tuple[int, ...], float]) -> float:
    """``max_k |d1(k) − d2(k)|`` over the union of keys (0 for two empty laws)."""
    return max((abs(d1.get(key, 0.0) - d2.get(key, 0.0)) for key in set(d1) | set(d2)), default=0.0)


def exact_step_tv(rule: Rule, chain: Chain, num_draft: int, prefix: tuple[int, ...] = (), *,
                  width: int | None = None) -> float:
    """TV between the rule's completed one-step law and the target's law of ``K+1`` tokens: 0 for
    a lossless rule (up to ~1e-13), the exact loss of one step otherwise.  ``width``: a ragged row
    (see :func:`step_distribution`), whose law is the chain's one-step law truncated at
    ``k = num_draft`` drafts."""
    step = step_distribution(rule, chain, num_draft, prefix, width=width)
    completed = completed_step_distribution(step, chain, num_draft, prefix)
    return total_variation(completed, target_sequence_distribution(chain, num_draft + 1, prefix))


# --------------------------------------------------------------------------------------------
# Exact integration of an arbitrary rule
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _DraftPaths:
    """Every draft path of positive probability with the laws a rule sees along it."""

    tokens: torch.Tensor  # int64 [n, K]
    probs: np.ndarray  # float64 [n]: Π_i q_i(x_i)
    target: torch.Tensor  # float64 [n, K+1, V]
    draft: torch.Tensor  # float64 [n, K, V]
    num_draft_tokens: torch.Tensor | None = None  # int64 [n]: the real drafts of padded (ragged) paths


@dataclass(frozen=True)
class _Grid:
    """Product-grid cells of several draft paths, one row per cell."""

    path: np.ndarray  # int64 [N]: index of the cell's draft path
    interval: np.ndarray  # int64 [N, K+1]: index of the cell's interval in each column
    low: np.ndarray  # float64 [N, K+1]: lower corner (inclusive)
    high: np.ndarray  # float64 [N, K+1]: upper corner (exclusive), at most 1
    width: np.ndarray  # float64 [N, K+1]: side lengths ``high - low``

    def points(self, fractions: np.ndarray, cells: np.ndarray | slice = slice(None)) -> np.ndarray:
        """``low + width * fractions`` of the ``cells`` (fractions in ``[0, 1)``, broadcast against
        ``[len(cells), K+1]``), kept inside ``[low, high)`` and so inside ``[0, 1)``.

        In float64 ``low + width * f`` rounds up to ``high`` when the gap ``width * (1 - f)`` is
        below half an ulp of ``high`` (a 1e-13-wide top cell with ``f = 1 - 8**-7`` gives exactly
        1.0, which no rule accepts as a uniform), so every point is clamped to the largest float
        below ``high``; edges are at least :data:`MIN_CELL_WIDTH` apart, so that float is ``>= low``.
        """
        low, high = self.low[cells], self.high[cells]
        return np.asarray(np.clip(low + (high - low) * fractions, low, np.nextafter(high, -np.inf)))


def step_distribution(rule: Rule, chain: Chain, num_draft: int, prefix: tuple[int, ...] = (), *,
                      width: int | None = None) -> Distribution:
    """Exact law of the tuple one step of ``rule`` emits after ``prefix``.

    ``width`` (at least ``num_draft``): a ragged row (docs/spec.md §1, ``num_draft_tokens=``): the
    rule gets ``width`` draft columns of which the first ``k = num_draft`` are real and the rest
    hold the audit's decoy padding (:func:`specverify.auditing.isolation.presentation.decoy_value`:
    uniform laws, the last token id), is called with ``num_draft_tokens = k`` and ``width + 1``
    uniforms, all of which are integrated over; a lossless rule's law is then the chain's one-step
    law truncated at ``k``, the same as with ``width = k``.

    ``P(e) = Σ_x Π_i q_i(x_i) · vol{u ∈ [0,1)^{K+1} : rule(p, q, x, u) emits e}``, the sum over
    draft paths ``x`` (each drawn from the draft law along the path).  ``rule`` is called as
    ``rule(target_probs, draft_probs, draft_tokens, None, uniforms=u)`` on float64 CPU tensors
    and returns a ``VerifyResult``-like object with ``.emitted`` or the emitted tensor ``[B, K+1]``.

    For every path the volume is computed on a product grid of cells whose edges are candidate
    breakpoints, clipped to ``[0, 1]``: in column ``i < K`` (token ``v = x_i``) the ratios
    ``p_j(v)/q_i(v)`` and ``p_i(v)/q_j(v)`` for ``j ∈ {i-1, i, i+1}``, ``p_i(v)``, ``q_i(v)/p_i(v)``
    and ``p_0(x_0)/q_0(x_0)``; in column ``K`` the cumulative-sum edges ``cumsum(r)/sum(r)`` of
    ``r = p_j`` (every ``j``), ``q_k``, ``(p_k − q_k)_+`` and ``p_k`` without ``x_k`` (every ``k``),
    and ``p_0(x_0)/q_0(x_0)``.  These cover the correct rule and the common bugs (wrong position,
    residual from ``p``, bonus from ``q``, ``u < p``, one uniform shared by all positions).  Every
    cell is evaluated at two random interior points (fixed seeds), and one cell per (column,
    interval, emitted length) is re-evaluated along that column at :data:`SCAN_FRACTIONS` of the
    interval; two different outputs in one cell reveal a breakpoint the candidates missed, which
    is located by bisection along one axis and added, and the path is integrated again (at most
    :data:`MAX_REFINEMENTS` rounds).  The result is exact (float64 rounding) whenever the rule's
    breakpoints are axis-aligned and each lies among the candidates or farther than ``8**-7`` of
    an interval's width from its ends; a breakpoint closer than that is found only if a random
    point falls beyond it, and otherwise costs at most that sliver's volume.

    Raises ValueError when the rule draws randomness other than ``uniforms`` (two calls on the same
    inputs and uniforms differ), when its breakpoints cannot be found (not axis-aligned), or when its
    output is malformed.
    """
    check_num_draft(num_draft)
    prefix = _as_prefix(prefix, chain)
    paths = _enumerate_draft_paths(chain, num_draft, prefix)
    if width is not None:
        paths = _padded_paths(paths, width)
    edges = [_candidate_breakpoints(paths, index) for index in range(len(paths.probs))]
    pending = np.arange(len(paths.probs))
    totals: dict[int, float] = defaultdict(float)
    for round_index in range(MAX_REFINEMENTS + 1):
        grid = _build_grid(edges, pending)
        rng = np.random.default_rng(round_index)
        first = grid.points(rng.uniform(0.05, 0.95, size=grid.low.shape))
        second = grid.points(rng.uniform(0.05, 0.95, size=grid.low.shape))
        first_codes = _evaluate(rule, paths, grid.path, first)
        second_codes = _evaluate(rule, paths, grid.path, second)
        pairs = _concatenate_pairs(
            _pairs_where(first_codes != second_codes, first, first_codes, second, second_codes),
            _scan_columns(rule, paths, grid, first, first_codes),
        )
        failed_paths = np.unique(grid.path[pairs.cell])
        _add_cell_masses(totals, paths, grid, first_codes, ~np.isin(grid.path, failed_paths))
        if len(failed_paths) == 0:
            return _decode_distribution(totals, chain.vocab_size)
        if round_index == MAX_REFINEMENTS:
            break
        pairs = _select_pairs(pairs, grid.path)
        cell_paths = grid.path[pairs.cell]
        _check_uses_only_uniforms(rule, paths, cell_paths, pairs.point_a, pairs.code_a)
        grown: set[int] = set()
        for path_index, column, value in _locate_breakpoints(rule, paths, cell_paths, pairs):
            before = len(edges[path_index][column])
            edges[path_index][column] = _merge_edges(np.append(edges[path_index][column], value))
            if len(edges[path_index][column]) > before:
                grown.add(path_index)
        # A breakpoint that merges into an existing edge lies within MIN_CELL_WIDTH of it: the rule
        # and the candidate edge disagree only by float64 rounding (e.g. ``u * sum < cumsum``
        # against ``cumsum / sum``), on a sliver of volume below MIN_CELL_WIDTH.  Such paths are
        # integrated as they are instead of being refined forever.
        settled = np.array([path for path in failed_paths if int(path) not in grown], dtype=np.int64)
        _add_cell_masses(totals, paths, grid, first_codes, np.isin(grid.path, settled))
        pending = np.setdiff1d(failed_paths, settled)
        if len(pending) == 0:
            return _decode_distribution(totals, chain.vocab_size)
    raise ValueError(
        f"rule: after {MAX_REFINEMENTS} rounds of breakpoint search its output is still not constant on "
        f"the integration cells of {len(failed_paths)} draft path(s): it has breakpoints in the uniforms "
        "that the integrator cannot find (not axis-aligned, e.g. depending on a sum of uniforms, or too "
        "many). Exact integration needs a rule that follows the uniform convention of "
        "docs/ARCHITECTURE.md; audit this rule statistically instead."
    )


def _enumerate_draft_paths(chain: Chain, num_draft: int, prefix: tuple[int, ...]) -> _DraftPaths:
    """All ``x_0..x_{K-1}`` with ``Π_i q_i(x_i) > 0``, with ``p_0..p_K`` and ``q_0..q_{K-1}`` along each."""
    level: list[tuple[tuple[int, ...], float, list[np.ndarray], list[np.ndarray]]] = [((), 1.0, [], [])]
    for _ in range(num_draft):
        next_level = []
        for path, prob, targets, drafts in level:
            p, q = chain.target(prefix + path), chain.draft(prefix + path)
            for token in np.flatnonzero(q):
                next_level.append((path + (int(token),), prob * q[token], targets + [p], drafts + [q]))
        level = next_level
    vocab_size = chain.vocab_size
    tokens = np.array([path for path, _, _, _ in level], dtype=np.int64).reshape(len(level), num_draft)
    probs = np.array([prob for _, prob, _, _ in level], dtype=np.float64)
    target = np.array(
        [targets + [chain.target(prefix + path)] for path, _, targets, _ in level], dtype=np.float64
    ).reshape(len(level), num_draft + 1, vocab_size)
    draft = np.array([drafts for _, _, _, drafts in level], dtype=np.float64).reshape(len(level), num_draft, vocab_size)
    return _DraftPaths(torch.from_numpy(tokens), probs, torch.from_numpy(target), torch.from_numpy(draft))


def _padded_paths(paths: _DraftPaths, width: int) -> _DraftPaths:
    """``paths`` (``k`` drafts each) widened to ``width`` draft columns with the decoy padding, and
    ``num_draft_tokens = k`` on every path."""
    from specverify.auditing.isolation.presentation import decoy_value

    count, num_draft = paths.tokens.shape
    if not (isinstance(width, int) and width >= max(num_draft, 1)):
        raise ValueError(f"width: expected an integer K >= max(num_draft, 1) = {max(num_draft, 1)}, got {width!r}")
    vocab = paths.target.shape[2]
    extra = width - num_draft
    target_padding = paths.target.new_full((count, extra, vocab), decoy_value("target_probs", vocab))
    draft_padding = paths.draft.new_full((count, extra, vocab), decoy_value("draft_probs", vocab))
    token_padding = paths.tokens.new_full((count, extra), decoy_value("draft_tokens", vocab))
    target = torch.cat([paths.target, target_padding], 1)
    draft = torch.cat([paths.draft, draft_padding], 1)
    tokens = torch.cat([paths.tokens, token_padding], 1)
    return _DraftPaths(tokens, paths.probs, target, draft, torch.full((count,), num_draft, dtype=torch.int64))


def _candidate_breakpoints(paths: _DraftPaths, index: int) -> list[np.ndarray]:
    """Initial grid edges of one draft path, one sorted array per uniform column (see step_distribution)."""
    tokens = paths.tokens[index].numpy()
    p, q = paths.target[index].numpy(), paths.draft[index].numpy()
    num_draft = len(tokens)
    positions = np.arange(num_draft)
    with np.errstate(divide="ignore", invalid="ignore"):
        acceptance_ratios = p[positions, tokens] / q[positions, tokens]
        columns = []
        for i, token in enumerate(tokens):
            p_i, q_i = p[i, token], q[i, token]
            neighbours = slice(max(i - 1, 0), i + 2)
            columns.append(
                np.concatenate(
                    [p[neighbours, token] / q_i, p_i / q[neighbours, token], [p_i, q_i / p_i], acceptance_ratios[:1]]
                )
            )
        laws = list(p) + list(q)
        for k, token in enumerate(tokens):
            laws += [np.maximum(p[k] - q[k], 0.0), _without(p[k], token)]
        cumulative_edges = [np.cumsum(law) / law.sum() for law in laws if law.sum() > 0]
        columns.append(np.concatenate(cumulative_edges + [acceptance_ratios[:1]]))
    return [_merge_edges(column) for column in columns]


def _without(law: np.ndarray, token: int) -> np.ndarray:
    removed = law.copy()
    removed[token] = 0.0
    return removed


def _merge_edges(values: np.ndarray) -> np.ndarray:
    """Sorted edges in ``[0, 1]`` including both ends, NaNs dropped, values clipped into
    ``[0, 1]`` (so ``±inf`` ratios become an end), neighbours closer than :data:`MIN_CELL_WIDTH`
    merged (the smaller is kept; ``0`` and ``1`` always stay).  Cells are the half-open intervals
    ``[edge_j, edge_{j+1})``, so every point of a cell lies in ``[0, 1)``."""
    values = np.clip(values[~np.isnan(values)], 0.0, 1.0)
    values = np.unique(np.concatenate([values, [0.0, 1.0]]))
    kept = [0.0]
    for value in values[1:-1]:
        if value - kept[-1] >= MIN_CELL_WIDTH and 1.0 - value >= MIN_CELL_WIDTH:
            kept.append(float(value))
    kept.append(1.0)
    return np.array(kept)


def _build_grid(edges: list[list[np.ndarray]], path_indices: np.ndarray) -> _Grid:
    """Every product cell of every listed path's edges."""
    paths, intervals, lows, highs = [], [], [], []
    for path_index in path_indices:
        columns = edges[path_index]
        mesh = np.meshgrid(*[np.arange(len(column) - 1) for column in columns], indexing="ij")
        interval = np.stack([index.ravel() for index in mesh], axis=1)
        low = np.stack([column[interval[:, c]] for c, column in enumerate(columns)], axis=1)
        high = np.stack([column[interval[:, c] + 1] for c, column in enumerate(columns)], axis=1)
        paths.append(np.full(len(low), path_index, dtype=np.int64))
        intervals.append(interval)
        lows.append(low)
        highs.append(high)
    low, high = np.concatenate(lows), np.concatenate(highs)
    return _Grid(np.concatenate(paths), np.concatenate(intervals), low, high, high - low)


def _evaluate(rule: Rule, paths: _DraftPaths, path_of_row: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Codes of the tuples ``rule`` emits on draft paths ``path_of_row`` with ``uniforms`` ``[N, K+1]``
    (called in chunks of bounded size).

    Points are capped one ulp below 1: a point placed in a cell that ends at 1 (``low + width *
    fraction``) rounds to exactly 1.0 when the cell is narrower than ~2e-10, outside the rules' [0, 1)."""
    uniforms = np.minimum(uniforms, np.nextafter(1.0, 0.0))
    num_rows = len(path_of_row)
    num_draft, vocab_size = paths.draft.shape[1], paths.target.shape[2]
    chunk = max(1, ROWS_PER_CHUNK_ELEMENTS // ((num_draft + 1) * vocab_size))
    codes = np.empty(num_rows, dtype=np.int64)
    for start in range(0, num_rows, chunk):
        rows = torch.from_numpy(path_of_row[start : start + chunk])
        emitted = _call_rule(
            rule,
            paths.target[rows],
            paths.draft[rows],
            paths.tokens[rows],
            torch.from_numpy(np.ascontiguousarray(uniforms[start : start + chunk])),
            None if paths.num_draft_tokens is None else paths.num_draft_tokens[rows],
        )
        codes[start : start + chunk] = _encode_emitted(emitted, vocab_size)
    return codes


def _call_rule(
    rule: Rule,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    num_draft_tokens: torch.Tensor | None = None,
) -> np.ndarray:
    """Call ``rule(target_probs, draft_probs, draft_tokens, None, uniforms=uniforms)`` (the uniforms
    are the only source of randomness; ragged rows add ``num_draft_tokens=``) and return its
    emitted tokens as int64 ``[B, K+1]``."""
    ragged = {} if num_draft_tokens is None else {"num_draft_tokens": num_draft_tokens}
    try:
        result = rule(target_probs, draft_probs, draft_tokens, None, uniforms=uniforms, **ragged)
    except TypeError as error:
        if "uniforms" in str(error):
            raise ValueError(
                "rule: does not accept the `uniforms=` keyword, so it cannot be integrated exactly; "
                "add `uniforms=None` following the convention of docs/ARCHITECTURE.md, or audit it statistically"
            ) from error
        raise
    try:
        # The layout only: the integrator also drives tree rules (specverify.core.tree_exact), whose
        # accepted slots hold path tokens rather than the row's draft tokens in order.
        emitted, _ = outputs.validate_emitted(result, None, target_probs.shape[-1], num_positions=target_probs.shape[1],
                                              num_draft_tokens=num_draft_tokens)
    except outputs.MalformedOutput as error:
        raise outputs.MalformedOutput([f"rule: {problem}" for problem in error.violations]) from None
    return emitted.numpy()


def _encode_emitted(emitted: np.ndarray, vocab_size: int) -> np.ndarray:
    """One integer per row: ``Σ_j (e_j + 1) (V+1)^j`` (emitted already validated, -1 padded)."""
    place_values = (vocab_size + 1) ** np.arange(emitted.shape[1], dtype=np.int64)
    return (emitted + 1) @ place_values


def _decode_distribution(totals: Mapping[int, float], vocab_size: int) -> Distribution:
    law: Distribution = {}
    for code, mass in totals.items():
        tokens = []
        while code:
            code, digit = divmod(code, vocab_size + 1)
            tokens.append(digit - 1)
        law[tuple(tokens)] = mass
    return law


@dataclass(frozen=True)
class _Pairs:
    """Pairs of points in one cell (``cell`` indexes the grid) where the rule's outputs differ."""

    cell: np.ndarray  # int64 [M]
    point_a: np.ndarray  # float64 [M, K+1]
    code_a: np.ndarray  # int64 [M]
    point_b: np.ndarray  # float64 [M, K+1]
    code_b: np.ndarray  # int64 [M]


def _pairs_where(
    differ: np.ndarray, point_a: np.ndarray, code_a: np.ndarray, point_b: np.ndarray, code_b: np.ndarray
) -> _Pairs:
    cells = np.flatnonzero(differ)
    return _Pairs(cells, point_a[cells], code_a[cells], point_b[cells], code_b[cells])


def _concatenate_pairs(*parts: _Pairs) -> _Pairs:
    return _Pairs(*(np.concatenate([getattr(part, name) for part in parts]) for name in _Pairs.__dataclass_fields__))


def _add_cell_masses(
    totals: dict[int, float], paths: _DraftPaths, grid: _Grid, codes: np.ndarray, selected: np.ndarray
) -> None:
    """Add ``P(path) × volume(cell)`` of the ``selected`` cells to the total of each cell's output."""
    weights = paths.probs[grid.path[selected]] * np.prod(grid.width[selected], axis=1)
    unique_codes, inverse = np.unique(codes[selected], return_inverse=True)
    for code, mass in zip(unique_codes, np.bincount(inverse.ravel(), weights=weights, minlength=len(unique_codes))):
        totals[int(code)] += float(mass)


def _scan_columns(rule: Rule, paths: _DraftPaths, grid: _Grid, points: np.ndarray, codes: np.ndarray) -> _Pairs:
    """Look for breakpoints inside cells along one axis at a time.

    Two random points per cell miss a breakpoint that only a few cells are sensitive to.  So for
    every path, column ``c``, interval of column ``c`` and emitted length (which tells how far the
    rule got, i.e. which distributions it used), one representative cell is evaluated at the
    :data:`SCAN_FRACTIONS` of the interval in ``u_c``, the other uniforms fixed: a breakpoint
    farther than ``8**-7`` of the interval's width from its ends is always found.  Returns the
    pairs whose outputs differ.
    """
    vocab_size, num_columns = paths.target.shape[2], points.shape[1]
    lengths = np.zeros(len(codes), dtype=np.int64)
    for position in range(num_columns):
        lengths += codes >= (vocab_size + 1) ** position
    representatives, columns = [], []
    for column in range(num_columns):
        keys = (grid.path * (int(grid.interval[:, column].max()) + 1) + grid.interval[:, column]) * (
            num_columns + 1
        ) + lengths
        _, first_rows = np.unique(keys, return_index=True)
        representatives.append(first_rows)
        columns.append(np.full(len(first_rows), column))
    num_fractions = len(SCAN_FRACTIONS)
    cells = np.repeat(np.concatenate(representatives), num_fractions)
    column_of = np.repeat(np.concatenate(columns), num_fractions)
    fractions = np.tile(SCAN_FRACTIONS, len(cells) // num_fractions)
    scan = points[cells].copy()
    rows = np.arange(len(cells))
    scan[rows, column_of] = grid.points(fractions[:, None], cells)[rows, column_of]
    scan_codes = _evaluate(rule, paths, grid.path[cells], scan)
    differ = scan_codes != codes[cells]
    return _Pairs(cells[differ], points[cells[differ]], codes[cells[differ]], scan[differ], scan_codes[differ])


def _select_pairs(pairs: _Pairs, path_of_cell: np.ndarray) -> _Pairs:
    """Up to :data:`MAX_BISECTIONS_PER_PATH` pairs of every failing path."""
    order = np.argsort(path_of_cell[pairs.cell], kind="stable")
    sorted_paths = path_of_cell[pairs.cell][order]
    rank_in_path = np.arange(len(order)) - np.searchsorted(sorted_paths, sorted_paths)
    chosen = order[rank_in_path < MAX_BISECTIONS_PER_PATH]
    return _Pairs(*(getattr(pairs, name)[chosen] for name in _Pairs.__dataclass_fields__))


def _check_uses_only_uniforms(
    rule: Rule, paths: _DraftPaths, path_of_row: np.ndarray, uniforms: np.ndarray, codes: np.ndarray
) -> None:
    """Re-run the rule on the same inputs and uniforms; any change means it draws randomness the
    integrator cannot see (a global RNG, or a generator of its own)."""
    again = _evaluate(rule, paths, path_of_row, uniforms)
    if not np.array_equal(again, codes):
        raise ValueError(
            "rule: called twice on the same inputs with the same `uniforms` (and generator=None) it emitted "
            "different tokens, so it draws randomness other than the injected uniforms (a global RNG or a "
            "generator of its own) and cannot be integrated exactly; make it use `uniforms` as in "
            "docs/ARCHITECTURE.md, or audit it statistically"
        )


def _locate_breakpoints(
    rule: Rule, paths: _DraftPaths, path_of_row: np.ndarray, pairs: _Pairs
) -> list[tuple[int, int, float]]:
    """For each pair of points with different outputs, one breakpoint ``(path, column, value)``.

    Walk from ``point_a`` to ``point_b`` changing one coordinate at a time; some single-coordinate
    step changes the output, and bisection on that coordinate pins the breakpoint.
    """
    num_rows, num_columns = pairs.point_a.shape
    walk = [pairs.point_a]
    for column in range(num_columns - 1):
        point = walk[-1].copy()
        point[:, column] = pairs.point_b[:, column]
        walk.append(point)
    walk.append(pairs.point_b)
    middle_codes = [_evaluate(rule, paths, path_of_row, point) for point in walk[1:-1]]
    walk_codes = np.stack([pairs.code_a, *middle_codes, pairs.code_b], axis=1)
    column = np.argmax(walk_codes[:, :-1] != walk_codes[:, 1:], axis=1)
    rows = np.arange(num_rows)
    base = np.stack(walk, axis=1)[rows, column].copy()  # [M, K+1]: the point before the changing step
    side_code = walk_codes[rows, column]
    low, high = base[rows, column], pairs.point_b[rows, column]
    for _ in range(BISECTION_STEPS):
        middle = 0.5 * (low + high)
        base[rows, column] = middle
        same = _evaluate(rule, paths, path_of_row, base) == side_code
        low, high = np.where(same, middle, low), np.where(same, high, middle)
    return [(int(path_of_row[r]), int(column[r]), float(0.5 * (low[r] + high[r]))) for r in rows]


def _as_prefix(prefix: Sequence[int], chain: Chain) -> tuple[int, ...]:
    tokens = tuple(int(t) for t in prefix)
    for token in tokens:
        if not 0 <= token < chain.vocab_size:
            raise ValueError(f"prefix: token {token} is outside the vocabulary 0..{chain.vocab_size - 1}")
    return tokens
