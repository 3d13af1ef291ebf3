"""The expected time of an audit's plan, re-timed on the function's measured speed.

Every check states the cost of its plan (:meth:`specverify.auditing.checks.Check.cost`), a
:class:`Cost` whose seconds are

    seconds = own_s + rows · work · s(scale),    own_s = fixed_s + rows · harness_s

``rows``: the rows the plan hands the function (a step, a tree or a decoder call each); ``work``:
the units of the function's own work per row (the probability entries it reads: (2K + 1)·V for a
step of K drafts at vocabulary V, (2N + 1)·V for a tree of N nodes; 1 for a decoder call);
``s(scale)``: the function's seconds per unit at the check's ``scale`` (its vocabulary; 1 for a
decoder call); ``own_s``: the audit's own work (building the inputs, the transport, the
statistics).  Before the function has run, ``s`` is the check's ``prior_s``: the reference
implementation's speed on this project's idle 2-core CPU (:data:`PRIOR_S_PER_ENTRY`: its fused
C kernel, with :data:`PRIOR_S_PER_ROW` of overheads a row; :data:`PRIOR_S_PER_DECODER_CALL`).

:class:`Speeds` re-times the rest of the plan after each check that called the function: the
function's seconds per unit at that check's scale, on the function's own clock
(:class:`specverify.auditing.audited.CallCounts`), prices every later check at that scale; a
scale not measured yet takes the speed measured at the nearest scale (in log scale) and, as its
range, the slowest and the fastest speed measured at any scale (:class:`Estimate`: how far an
unmeasured scale may be from the nearest), both among the scales of its regime: a row at a small
vocabulary costs the function its overheads, at a large one its entries (:class:`Speeds`).  The
audit's own seconds are scaled by the ratio of its measured own time (wall time less the
function's) to its planned own time on the checks done in the same regime: a loaded machine
slows both.  The estimate assumes every check runs to its final look; a check that rejects
early, or fail-fast, only ends the audit sooner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SECONDS_PER_CHECK = 0.02
"""The audit's own fixed seconds of a statistical check (its cells, exact laws and p-values)."""

SECONDS_UNSAMPLED = 0.1
"""The seconds of a check that draws no samples (exact and contract checks)."""

HARNESS_S_PER_ROW = 0.2e-6
"""The audit's own seconds per row of a sampled step (drawing the inputs, counting the outputs)."""

HARNESS_S_PER_ENTRY = 0.4e-9
"""The audit's own seconds per probability entry of a row (building the laws, presenting them to
the function, the token-level tests)."""

HARNESS_S_PER_CALL = 17e-6
"""The audit's own seconds per call beyond its rows (the worker's loop around the call, copying its
output, validating it), which a check calling the function with one row or a few pays per row."""

PRIOR_S_PER_ENTRY = 0.3e-9
"""The reference rule's seconds per probability entry of a row at a large vocabulary (its fused C
kernel, 2-core CPU; measured on ``truncated-vocabulary``, V = 8,192, K = 1: 0.23–0.3 ns, since it
reads a whole row only where it corrects)."""

PRIOR_S_PER_ROW = 0.1e-6
"""The reference rule's seconds of overheads per row (its calls, the worker's transport, amortised
over the thousands of rows of a call)."""

PRIOR_S_PER_CALL = 19e-6
"""The reference rule's seconds per call of its own beyond its rows (checking its arguments,
dispatching to its kernel), which a check calling it with one row or a few pays per row.  With
:data:`SECONDS_PER_CHECK`, :data:`HARNESS_S_PER_ROW` and :data:`HARNESS_S_PER_CALL`, fitted
(non-negative least squares) on the toy-shaped checks of the sampler battery at quick and
standard, the audit's own seconds taken as the check's wall time less the function's: what the
function's run does not hide (2-core AMD EPYC)."""

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
    s), s the function's seconds per unit at ``scale`` (``prior_s`` before a measurement)."""

    rows: float
    fixed_s: float
    harness_s: float = 0.0
    work: float = 0.0
    prior_s: float = 0.0
    scale: float = 1.0
    prior_row_s: float = 0.0
    """The function's seconds of overheads per row before a measurement (with ``work`` · ``prior_s``)."""

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
        """The function's seconds per row before a measurement."""
        return self.prior_row_s + self.work * self.prior_s

    def seconds(self) -> float:
        """The planned seconds at the prior speed."""
        return self.own_s + self.rows * self.prior_per_row


def step_cost(rows: int, num_draft: float, vocab_size: int, rows_per_call: float = math.inf) -> Cost:
    """``rows`` steps of ``num_draft`` drafts at ``vocab_size``: (2K + 1)·V entries a row, in calls
    of ``rows_per_call`` rows on average (default: large batches, the per-call cost negligible)."""
    return _rows_cost(rows, num_draft, vocab_size, rows_per_call, 0.0, HARNESS_S_PER_CALL, PRIOR_S_PER_CALL)


def _rows_cost(rows: int, num_draft: float, vocab_size: int, rows_per_call: float, own_s_per_row: float,
               own_s_per_call: float, prior_s_per_call: float) -> Cost:
    """``rows`` rows of (2K + 1)·V entries (K = ``num_draft``), in calls of ``rows_per_call`` rows:
    the audit's own seconds a row (:data:`HARNESS_S_PER_ROW`, its entries', ``own_s_per_row`` and
    its share of ``own_s_per_call``) and the function's prior (:data:`PRIOR_S_PER_ROW`, its share of
    ``prior_s_per_call``, its entries at :data:`PRIOR_S_PER_ENTRY`)."""
    if not rows:
        return Cost(0, SECONDS_UNSAMPLED)
    entries = (2 * num_draft + 1) * vocab_size
    harness_s = HARNESS_S_PER_ROW + entries * HARNESS_S_PER_ENTRY + own_s_per_row + own_s_per_call / rows_per_call
    return Cost(rows, SECONDS_PER_CHECK, harness_s, entries, PRIOR_S_PER_ENTRY, vocab_size,
                PRIOR_S_PER_ROW + prior_s_per_call / rows_per_call)


PRODUCTION_FIXED_S = 0.38
"""The audit's own fixed seconds of a production-shape step check (its token-level and coarse
tests at every look, over every chain and position)."""

PRODUCTION_S_PER_ROW = 7e-6
"""The audit's own seconds per row of a production-shape step check that the function's run does
not hide (drawing the drafts, the transport, validating and completing the output).  Not per byte:
the laws reach the function as views kept in its buffer, and the worker's write guard spares
reading them back after a call.  Not per position either: completing and counting a row's K + 1
positions are a few vectorised operations per call."""

PRODUCTION_PRIOR_S_PER_ROW = 4e-6
"""The reference rule's seconds per row at production shapes beyond the bytes it reads."""

PRIOR_S_PER_BYTE = 0.044e-9
"""The reference rule's seconds per byte of input at production shapes (its fused C kernel on 2
cores; it reads every position's entries only where a row is corrected).  With the three constants
above, fitted (least squares) on the five production-shape checks of the sampler battery at quick
and standard, the audit's own seconds taken as the check's wall time less the function's (2-core
AMD EPYC)."""


def production_step_cost(rows: int, num_draft: int, vocab_size: int, entry_bytes: int) -> Cost:
    """``rows`` production-shape steps of ``num_draft`` drafts at ``vocab_size`` in a dtype of
    ``entry_bytes`` bytes: (2K + 1)·V entries a row, each read by the function once; their bytes,
    not their count, set the function's time, rows and positions the audit's own."""
    if not rows:
        return Cost(0, SECONDS_UNSAMPLED)
    entries = (2 * num_draft + 1) * vocab_size
    return Cost(rows, PRODUCTION_FIXED_S, PRODUCTION_S_PER_ROW, entries, entry_bytes * PRIOR_S_PER_BYTE, vocab_size,
                PRODUCTION_PRIOR_S_PER_ROW)


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


class Speeds:
    """The function's measured speed by scale, and the audit's measured own-time ratio (module
    docstring); :meth:`estimate` prices costs with them.

    A row the reference reads in under :data:`ENTRY_BOUND_S` (a small vocabulary) costs a function
    its per-row and per-call overheads, whatever its entries; above it, its entries.  So a check is
    priced from the measurements of its own regime only: an entry-bound one at the seconds per unit
    measured at its scale (or the nearest entry-bound scale measured), an overhead-bound one at its
    prior seconds per row times the slowdown against the prior measured at its scale (or the
    nearest overhead-bound scale measured): its prior counts its calls' overheads per row, so a
    check of one row a call and one of thousands at the same scale are each priced as such."""

    def __init__(self) -> None:
        self.per_unit: dict[tuple[bool, float], float] = {}
        self.slowdown: dict[bool, list[float]] = {False: [], True: []}
        self.own_planned = {False: 0.0, True: 0.0}
        self.own_measured = {False: 0.0, True: 0.0}

    def record(self, cost: Cost, rows: int, function_s: float, wall_s: float) -> None:
        """A finished check of ``cost`` whose function evaluated ``rows`` rows in ``function_s`` of its
        own seconds, within ``wall_s`` of the check's wall time.  A cost without work (an exact
        check) prices the function's direct calls in its fixed seconds: its whole wall time is
        its own."""
        bound = entry_bound(cost)
        if rows > 0 and function_s > 0 and cost.work > 0:
            self.per_unit[bound, cost.scale] = function_s / (rows * _units_per_row(cost))
            if cost.prior_per_row > 0:
                self.slowdown[bound].append(function_s / rows / cost.prior_per_row)
        done = min(1.0, rows / cost.rows) if cost.rows else 1.0
        self.own_planned[bound] += cost.fixed_s + done * cost.rows * cost.harness_s
        self.own_measured[bound] += max(0.0, wall_s - function_s) if cost.work > 0 else wall_s

    @property
    def measured(self) -> bool:
        """Whether the function's speed has been measured at some scale."""
        return bool(self.per_unit)

    def own_ratio(self, cost: Cost) -> float:
        """Measured over planned own seconds on the checks done in ``cost``'s regime (an entry-bound
        check's own work is its entries', an overhead-bound one's its rows'), 1 before
        :data:`MIN_OWN_SECONDS` of them are planned."""
        bound = entry_bound(cost)
        planned = self.own_planned[bound]
        return self.own_measured[bound] / planned if planned >= MIN_OWN_SECONDS else 1.0

    def per_row(self, cost: Cost) -> tuple[float, float, float]:
        """(expected, lowest, highest) seconds of the function per row of ``cost``: measured at its
        scale in its regime; else the nearest measured scale's of that regime (in log scale), within
        the slowest and fastest measured there; before any measurement of the regime, the prior,
        within the prior times the slowest and the fastest slowdown against the prior measured in
        the other regime (a function 6× slower than the reference on small vocabularies may be so
        on large ones too: the range says it, the estimate waits for a measurement)."""
        bound = entry_bound(cost)
        units = _units_per_row(cost)
        measured = {scale: speed for (regime, scale), speed in self.per_unit.items() if regime == bound}
        if not measured:  # the prior; its range: the slowdown against the prior measured in the other regime
            prior, other = cost.prior_per_row, self.slowdown[not bound]
            return prior, prior * min([1.0, *other]), prior * max([1.0, *other])
        if cost.scale in measured:
            speed = measured[cost.scale]
            return units * speed, units * speed, units * speed
        nearest = min(measured, key=lambda s: abs(math.log(max(s, 1.0)) - math.log(max(cost.scale, 1.0))))
        return units * measured[nearest], units * min(measured.values()), units * max(measured.values())

    def estimate(self, costs: Sequence[Cost]) -> Estimate:
        """The seconds of ``costs`` at the speeds measured so far."""
        total = ZERO
        for cost in costs:
            own = self.own_ratio(cost) * cost.own_s
            if not cost.work:
                total += Estimate(own, own, own)
                continue
            row, low, high = self.per_row(cost)
            total += Estimate(own + cost.rows * row, own + cost.rows * low, own + cost.rows * high)
        return total


def _units_per_row(cost: Cost) -> float:
    """What :class:`Speeds` measures a row of ``cost`` in: its entries when it is entry-bound; else
    its prior seconds, per-call overheads included, so that a speed measured with one row a call
    prices a check of large calls at the same scale by the same slowdown, not the same seconds."""
    return cost.work if entry_bound(cost) else (cost.prior_per_row or 1.0)


def entry_bound(cost: Cost) -> bool:
    """Whether a row of ``cost`` is priced by its entries (:class:`Speeds`)."""
    return cost.work * cost.prior_s >= ENTRY_BOUND_S


def planned(costs: Sequence[Cost]) -> float:
    """The seconds of ``costs`` at the prior speed."""
    return sum(cost.seconds() for cost in costs)
