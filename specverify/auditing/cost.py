"""The expected time of an audit's plan, re-timed on the function's measured speed.

Every check states the cost of its plan (:meth:`specverify.auditing.checks.Check.cost`), a
:class:`Cost` whose seconds are

    seconds = own_s + rows · (p_row + work · s(scale)) + calls · c,    own_s = fixed_s + rows · harness_s

``rows``: the rows the plan hands the function (a step, a tree or a decoder call each); ``work``:
the units of the function's own work per row (the probability entries it reads: (2K + 1)·V for a
step of K drafts at vocabulary V, (2N + 1)·V for a tree of N nodes; 1 for a decoder call);
``s(scale)``: the function's seconds per unit at the check's ``scale`` (its vocabulary; 1 for a
decoder call); ``p_row`` its overheads a row; ``calls``: the calls the check makes (0 for a few
large batches, whose cost per call is negligible), ``c`` the function's seconds a call; ``own_s``: the audit's
own work (building the inputs, the transport, the statistics).  Before the function has run,
``s``, ``p_row`` and ``c`` are the check's priors: the reference implementation's speed on this
project's idle 2-core CPU (:data:`PRIOR_S_PER_ENTRY`: its fused C kernel, with
:data:`PRIOR_S_PER_ROW` of overheads a row and :data:`PRIOR_S_PER_CALL` a call;
:data:`PRIOR_S_PER_DECODER_CALL`).

:class:`Speeds` re-times the rest of the plan after each check that called the function, on the
function's own clock (:class:`specverify.auditing.audited.CallCounts`): its seconds per call,
measured on the checks calling with a row or a few, and its slowdown against the prior on rows,
measured per regime and scale (a row at a small vocabulary costs the function its overheads, at a
large one its entries).  A later check is priced at its calls' seconds and its rows' prior times
the slowdown at its scale, or at the nearest scale measured in its regime (in log scale) with, as
its range, the least and the greatest slowdown measured there (:class:`Estimate`: how far an
unmeasured scale may be from the nearest).  The audit's own seconds are scaled by the ratio of its
measured own time (wall time less the function's) to its planned own time on the checks done in
the same regime: a loaded machine slows both.  The estimate assumes every check runs to its final
look; a check that rejects early, or fail-fast, only ends the audit sooner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SECONDS_PER_CHECK = 0.02
"""The audit's own fixed seconds of a statistical check (its cells, exact laws and p-values): 0.012
fitted on its run from its start to its result (:data:`PRIOR_S_PER_CALL`), and ~0.01 of its first
look, which an audit of first looks first (fail-fast) runs apart, before the checks run in turn."""

SECONDS_UNSAMPLED = 0.1
"""The seconds of a check that draws no samples (exact and contract checks)."""

HARNESS_S_PER_ROW = 0.26e-6
"""The audit's own seconds per row of a sampled step (drawing the inputs, counting the outputs)."""

HARNESS_S_PER_ENTRY = 0.43e-9
"""The audit's own seconds per probability entry of a row (building the laws, presenting them to
the function, the token-level tests)."""

HARNESS_S_PER_CALL = 7e-6
"""The audit's own seconds per call beyond its rows (the worker's loop around the call, copying its
output, validating it), which a check calling the function with one row or a few pays per row."""

PRIOR_S_PER_ENTRY = 0.21e-9
"""The reference rule's seconds per probability entry of a row at a large vocabulary (its fused C
kernel, 2-core CPU; on ``truncated-vocabulary``, V = 8,192, K = 1, since it reads a whole row only
where it corrects)."""

PRIOR_S_PER_ROW = 0.07e-6
"""The reference rule's seconds of overheads per row (its calls, the worker's transport, amortised
over the thousands of rows of a call)."""

PRIOR_S_PER_CALL = 17e-6
"""The reference rule's seconds per call of its own beyond its rows (checking its arguments,
dispatching to its kernel), which a check calling it with one row or a few pays per row.  With
:data:`SECONDS_PER_CHECK`, :data:`HARNESS_S_PER_ROW` and :data:`HARNESS_S_PER_CALL`, fitted
(non-negative least squares) on the toy-shaped checks of the sampler battery at quick and
standard, the audit's own seconds taken as the check's wall time less the function's: what the
function's run does not hide (2-core AMD EPYC, the ``specverify`` command's allocator settings:
:mod:`specverify.auditing.isolation.allocator`)."""

PRIOR_S_PER_DECODER_CALL = 0.1
"""The reference decoder's seconds per call (a request of a few dozen tokens on the tiny models)."""

ENTRY_BOUND_S = 10_000 * PRIOR_S_PER_ENTRY
"""The reference's seconds per row above which a row's entries, not the function's per-row and
per-call overheads, set its cost (:class:`Speeds`): 10,000 entries, a step of K drafts at
V ≳ 10,000 / (2K + 1)."""

MIN_OWN_SECONDS = 0.5
"""Planned own seconds done before the audit's own speed is measured (below it: the plan's)."""


@dataclass(frozen=True)
class Cost:
    """A check's time model (module docstring): ``fixed_s`` + ``rows`` · (``harness_s`` + ``work`` ·
    s) + ``calls`` · c, s the function's seconds per unit at ``scale`` (``prior_s`` before a
    measurement) and c its seconds per call (``prior_call_s`` before a measurement)."""

    rows: float
    fixed_s: float
    harness_s: float = 0.0
    work: float = 0.0
    prior_s: float = 0.0
    scale: float = 1.0
    prior_row_s: float = 0.0
    """The function's seconds of overheads per row before a measurement (with ``work`` · ``prior_s``)."""
    calls: float = 0.0
    """The calls the plan makes of the function (0 where it makes a few calls of many rows each,
    whose cost per call is negligible beside their rows')."""
    prior_call_s: float = 0.0
    """The function's seconds per call before a measurement."""

    @property
    def own_s(self) -> float:
        """The audit's own planned seconds."""
        return self.fixed_s + self.rows * self.harness_s

    @property
    def units(self) -> float:
        """The function's planned units of work."""
        return self.rows * self.work

    @property
    def prior_per_row(self) -> float:
        """The function's seconds per row before a measurement, beyond its calls'."""
        return self.prior_row_s + self.work * self.prior_s

    @property
    def prior_function_s(self) -> float:
        """The function's planned seconds at the prior speed: its rows' and its calls'."""
        return self.rows * self.prior_per_row + self.calls * self.prior_call_s

    def seconds(self) -> float:
        """The planned seconds at the prior speed."""
        return self.own_s + self.prior_function_s


def step_cost(rows: int, num_draft: float, vocab_size: int, rows_per_call: float = math.inf) -> Cost:
    """``rows`` steps of ``num_draft`` drafts at ``vocab_size``: (2K + 1)·V entries a row, in calls
    of ``rows_per_call`` rows on average (default: large batches, the per-call cost negligible)."""
    return _rows_cost(rows, num_draft, vocab_size, rows_per_call, 0.0, HARNESS_S_PER_CALL, PRIOR_S_PER_CALL)


def _rows_cost(rows: int, num_draft: float, vocab_size: int, rows_per_call: float, own_s_per_row: float,
               own_s_per_call: float, prior_s_per_call: float) -> Cost:
    """``rows`` rows of (2K + 1)·V entries (K = ``num_draft``), in calls of ``rows_per_call`` rows:
    the audit's own seconds a row (:data:`HARNESS_S_PER_ROW`, its entries', ``own_s_per_row`` and
    its share of ``own_s_per_call``) and the function's prior (:data:`PRIOR_S_PER_ROW` and its
    entries at :data:`PRIOR_S_PER_ENTRY` a row, ``prior_s_per_call`` a call)."""
    if not rows:
        return Cost(0, SECONDS_UNSAMPLED)
    entries = (2 * num_draft + 1) * vocab_size
    harness_s = HARNESS_S_PER_ROW + entries * HARNESS_S_PER_ENTRY + own_s_per_row + own_s_per_call / rows_per_call
    return Cost(rows, SECONDS_PER_CHECK, harness_s, entries, PRIOR_S_PER_ENTRY, vocab_size, PRIOR_S_PER_ROW,
                rows / rows_per_call, prior_s_per_call)


PRODUCTION_FIXED_S = 0.2
"""The audit's own fixed seconds of a production-shape step check that the function's run does
not hide (its first look's token-level and coarse tests; the later looks' are made while the next
look draws, and the identity designs ahead: :mod:`specverify.auditing.ahead`): 0.16 fitted on its
run in turn (:data:`PRIOR_S_PER_BYTE`), and its first look's share run apart
(:data:`SECONDS_PER_CHECK`)."""

PRODUCTION_S_PER_BYTE = 0.013e-9
"""The audit's own seconds per byte of a production-shape row's inputs that the function's run
does not hide (the worker's write guard comparing a request's inputs with what was presented, the
transport).  Not per row: drawing the drafts, validating and completing the outputs run while the
function does."""

PRODUCTION_PRIOR_S_PER_ROW = 2.3e-6
"""The reference rule's seconds per row at production shapes beyond the bytes it reads."""

PRIOR_S_PER_BYTE = 0.039e-9
"""The reference rule's seconds per byte of input at production shapes (its fused C kernel on 2
cores; it reads every position's entries only where a row is corrected).  With the three constants
above, fitted (non-negative least squares) on the five production-shape checks of the sampler
battery at quick and standard, three audits each, the audit's own seconds taken as the check's
wall time less the function's (2-core AMD EPYC, the ``specverify`` command's allocator settings)."""


def production_step_cost(rows: int, num_draft: int, vocab_size: int, entry_bytes: int, rows_per_call: int) -> Cost:
    """``rows`` production-shape steps of ``num_draft`` drafts at ``vocab_size`` in a dtype of
    ``entry_bytes`` bytes, in calls of ``rows_per_call`` rows: (2K + 1)·V entries a row, each read
    by the function once; their bytes, not their count, set the function's time, rows and
    positions the audit's own."""
    if not rows:
        return Cost(0, SECONDS_UNSAMPLED)
    entries = (2 * num_draft + 1) * vocab_size
    row_bytes = entries * entry_bytes
    return Cost(rows, PRODUCTION_FIXED_S, row_bytes * PRODUCTION_S_PER_BYTE, entries, entry_bytes * PRIOR_S_PER_BYTE,
                vocab_size, PRODUCTION_PRIOR_S_PER_ROW, math.ceil(rows / rows_per_call), PRIOR_S_PER_CALL)


TREE_HARNESS_S_PER_NODE = 0.6e-6
"""The audit's own seconds per drafted node of a tree row (drafting the tree, following the
emitted path, completing it)."""

TREE_HARNESS_S_PER_CALL = 0.6e-3
"""The audit's own seconds per tree call beyond its rows (presenting the four inputs, validating
the emitted paths against the trees)."""

TREE_PRIOR_S_PER_CALL = 0.25e-3
"""The reference tree rule's seconds per call beyond its rows (its argument checks, its walk over
the tree's nodes in Python).  With the two constants above, fitted (non-negative least squares)
on the tree battery's sampled checks at quick and standard (2-core AMD EPYC)."""


EXACT_TREE_CASE_S = 0.06
"""Seconds per case of the exact tree step (the reference's calls with uniforms= at every interval
of the inverse CDFs of a small tree, and the integration over them; 2-core AMD EPYC)."""


def tree_cost(samples: int, nodes: float, vocab_size: int, rows_per_sample: float = 1.0,
              rows_per_call: float = math.inf) -> Cost:
    """``rows_per_sample`` trees of ``nodes`` drafted nodes at ``vocab_size`` per sample: (2N + 1)·V
    entries a row (the target's laws at the N nodes and the root, the drafts' at the N nodes), in
    calls of ``rows_per_call`` rows on average (default: large batches)."""
    return _rows_cost(int(math.ceil(samples * rows_per_sample)), nodes, vocab_size, rows_per_call,
                      nodes * TREE_HARNESS_S_PER_NODE, TREE_HARNESS_S_PER_CALL, TREE_PRIOR_S_PER_CALL)


def mean_nodes(shapes: Sequence[Sequence[int]]) -> float:
    """The mean number of drafted nodes of the trees ``shapes`` (each a tuple of parent indices)."""
    return sum(len(shape) for shape in shapes) / max(1, len(shapes))


def call_cost(calls: int, fixed_s: float = SECONDS_PER_CHECK) -> Cost:
    """``calls`` calls of a decoder, each one unit of work (``fixed_s``: the check's own fixed seconds)."""
    if not calls:
        return Cost(0, SECONDS_UNSAMPLED)
    return Cost(calls, fixed_s, 0.0, 1.0, PRIOR_S_PER_DECODER_CALL, 1.0)


@dataclass(frozen=True)
class Estimate:
    """Expected seconds, and the range the speeds measured so far allow (``low`` ≤ ``seconds`` ≤ ``high``)."""

    seconds: float
    low: float
    high: float

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(self.seconds + other.seconds, self.low + other.low, self.high + other.high)


ZERO = Estimate(0.0, 0.0, 0.0)


FEW_ROWS_PER_CALL = 2
"""Rows per call up to which a check's calls measure the function's cost per call (:class:`Speeds`)."""


@dataclass(frozen=True)
class Measured:
    """A finished check's calls of the function: ``function_s`` of its own seconds for ``rows`` rows
    in ``calls`` calls, which the check's cost priced at ``prior_rows_s`` for their rows and
    ``prior_calls_s`` for their calls at the prior speed; ``bound`` and ``scale``: the cost's regime
    (:func:`entry_bound`) and scale."""

    bound: bool
    scale: float
    rows: int
    calls: int
    prior_rows_s: float
    prior_calls_s: float
    function_s: float

    @property
    def per_call(self) -> bool:
        """Whether its calls are of a row or a few (:data:`FEW_ROWS_PER_CALL`): its seconds are the
        function's cost per call."""
        return self.rows <= FEW_ROWS_PER_CALL * self.calls


class Speeds:
    """The function's measured speed, and the audit's measured own-time ratio (module docstring);
    :meth:`estimate` prices costs with them.

    The function's seconds for a check of ``calls`` calls and ``rows`` rows are

        f = c · calls + σ(regime, scale) · rows · p,

    ``p`` the prior seconds of a row (the reference's), ``c`` the function's seconds per call and
    ``σ`` its slowdown against the prior on rows.  ``c`` is measured on the checks calling with a
    row or a few (:attr:`Measured.per_call`): the least of their seconds per call, an upper bound
    that counts their one row in.  ``σ`` is measured per regime and scale, pooled over the checks
    there (Σ (f − c · calls)⁺ / Σ rows · p, over the checks of larger calls); before ``c`` is
    measured, ``c`` is σ times the prior's per-call seconds, and σ is measured on both.  A row the
    reference reads in under :data:`ENTRY_BOUND_S` (a small vocabulary) costs a function its
    overheads, above it its entries: so a check is priced from the slowdowns of its own regime, at
    its scale or the nearest one measured (in log scale), within the least and the greatest
    measured there.  The slowdown, not the seconds per entry, carries across shapes: a check at the
    same vocabulary in another dtype, with more drafts, or reading only some positions, costs the
    reference differently, and a function k× slower than the reference is k× slower on it too."""

    def __init__(self) -> None:
        self.runs: list[Measured] = []
        self.own_planned = {False: 0.0, True: 0.0}
        self.own_measured = {False: 0.0, True: 0.0}

    def record(self, cost: Cost, rows: int, function_s: float, wall_s: float, calls: int = 0) -> None:
        """A finished check of ``cost`` whose function evaluated ``rows`` rows in ``calls`` calls and
        ``function_s`` of its own seconds, within ``wall_s`` of the check's wall time.  A cost without
        work (an exact check) prices the function's direct calls in its fixed seconds: its whole
        wall time is its own."""
        bound = entry_bound(cost)
        if rows > 0 and function_s > 0 and cost.work > 0:
            prior_calls_s = calls * cost.prior_call_s if cost.calls else 0.0
            self.runs.append(Measured(bound, cost.scale, rows, calls, rows * cost.prior_per_row, prior_calls_s,
                                      function_s))
        done = min(1.0, rows / cost.rows) if cost.rows else 1.0
        self.own_planned[bound] += cost.fixed_s + done * cost.rows * cost.harness_s
        self.own_measured[bound] += max(0.0, wall_s - function_s) if cost.work > 0 else wall_s

    @property
    def measured(self) -> bool:
        """Whether the function's speed has been measured."""
        return bool(self.runs)

    @property
    def call_s(self) -> float | None:
        """The function's seconds per call (class docstring), None before a check of a row or a few a call."""
        per_call = [run.function_s / run.calls for run in self.runs if run.per_call]
        return min(per_call) if per_call else None

    def slowdowns(self, bound: bool) -> dict[float, float]:
        """σ by scale in the regime ``bound`` (class docstring)."""
        call_s = self.call_s
        spent: dict[float, float] = {}
        prior: dict[float, float] = {}
        for run in self.runs:
            if run.bound != bound or (call_s is not None and run.per_call):
                continue
            if call_s is None:
                spent[run.scale] = spent.get(run.scale, 0.0) + run.function_s
                prior[run.scale] = prior.get(run.scale, 0.0) + run.prior_rows_s + run.prior_calls_s
            else:
                spent[run.scale] = spent.get(run.scale, 0.0) + max(0.0, run.function_s - call_s * run.calls)
                prior[run.scale] = prior.get(run.scale, 0.0) + run.prior_rows_s
        return {scale: spent[scale] / prior[scale] for scale in spent if prior[scale] > 0}

    def function_s(self, cost: Cost) -> Estimate:
        """The function's seconds for ``cost`` (class docstring): at the slowdown measured at its
        scale in its regime; else at the nearest measured scale's there, within the least and the
        greatest measured there; before any measurement in its regime, at the prior, within the
        prior times the least and the greatest slowdown measured in the other regime (a function 6×
        slower than the reference on small vocabularies may be so on large ones too: the range says
        it, the estimate waits for a measurement)."""
        call_s = self.call_s
        if call_s is None:  # the calls at the prior, slowed down as the rows are
            calls_s, rows_s = 0.0, cost.prior_function_s
        else:
            calls_s, rows_s = cost.calls * call_s, cost.rows * cost.prior_per_row
        measured = self.slowdowns(entry_bound(cost))
        if not measured:
            other = list(self.slowdowns(not entry_bound(cost)).values())
            return Estimate(calls_s + rows_s, calls_s + rows_s * min([1.0, *other]),
                            calls_s + rows_s * max([1.0, *other]))
        if cost.scale in measured:
            return Estimate(*(calls_s + rows_s * measured[cost.scale] for _ in range(3)))
        nearest = min(measured, key=lambda s: abs(math.log(max(s, 1.0)) - math.log(max(cost.scale, 1.0))))
        return Estimate(calls_s + rows_s * measured[nearest], calls_s + rows_s * min(measured.values()),
                        calls_s + rows_s * max(measured.values()))

    def own_ratio(self, cost: Cost) -> float:
        """Measured over planned own seconds on the checks done in ``cost``'s regime (an entry-bound
        check's own work is its entries', an overhead-bound one's its rows'), 1 before
        :data:`MIN_OWN_SECONDS` of them are planned."""
        bound = entry_bound(cost)
        planned = self.own_planned[bound]
        return self.own_measured[bound] / planned if planned >= MIN_OWN_SECONDS else 1.0

    def estimate(self, costs: Sequence[Cost]) -> Estimate:
        """The seconds of ``costs`` at the speeds measured so far."""
        total = ZERO
        for cost in costs:
            own = self.own_ratio(cost) * cost.own_s
            total += Estimate(own, own, own)
            if cost.work:
                total += self.function_s(cost)
        return total


def entry_bound(cost: Cost) -> bool:
    """Whether a row of ``cost`` is priced by its entries (:class:`Speeds`)."""
    return cost.work * cost.prior_s >= ENTRY_BOUND_S


def planned(costs: Sequence[Cost]) -> float:
    """The seconds of ``costs`` at the prior speed."""
    return sum(cost.seconds() for cost in costs)
