"""What an audit does after its verdict is known, and the one time budget that bounds it.

The verdict is known at the first failing check under fail-fast, else when the last check ends.
After it the audit still (1) runs the locating checks that have not run
(:attr:`specverify.auditing.checks.Locus.locating`; fail-fast only), (2) at the sampler level
looks for a minimal failing case (:mod:`specverify.auditing.minimal_case`), and (3) shuts the
worker process down.  None of them changes the verdict: they explain it, so they share one budget
proportional to the wait for it::

    budget = max(FLOOR_S, SHARE · t_verdict)

``t_verdict`` being the seconds from the audit's start (loading, planning, the checks) to its
verdict.  The locating checks may use the first :data:`LOCATING_SHARE` of the budget; the minimal
case the rest, with what the locating checks left; the shutdown what is left then.  Each share is
a hard deadline on the function's calls
(:meth:`specverify.auditing.audited.AuditedFunction.cut_off_at`: no call starts after it, a running
one is stopped at it: in a worker by killing the worker, whatever the function does), the minimal
case is sized to the function's measured speed (:func:`specverify.auditing.minimal_case.case_rows`)
and its reading against the catalog stops at the deadline too, and the worker's grace to stop is
what is left of the budget (:data:`specverify.auditing.isolation.process.STOP_GRACE_S` at most;
then it is killed).  So in a worker an audit ends within ``t_verdict + budget + KILL_BOUND_S``
(:data:`specverify.auditing.isolation.process.KILL_BOUND_S`, the reaping of a killed worker:
milliseconds unless the function left a process behind), plus one catalog entry's run on the
case (tens of milliseconds).  A step the budget cuts short is recorded with ``cut_off`` set and
its outcome says what was not done.  In-process (``isolation="none"``) a call is stopped at the
next Python bytecode (a ``time.sleep`` included), so a call blocked inside native code holds the
audit until it returns, and the exact check's direct calls (``uniforms=``) are not guarded one by
one: a slow function's exact check after the verdict is bounded only by its integration deadline
(10 × the per-call timeout).

Why these numbers.  ``SHARE = 0.5``: the explanation is worth at most half again the wait for the
verdict, so a slow function (a few hundred rows/s: minutes for the 6 × 20,000 rows of a full
minimal-case search) never holds a finished verdict for long: at ~500 rows/s
(``tests/auditing/hostile/lossy_slow_per_row.py``, three checks, in-process) the audit took
173.6 s without the budget and 23.6 s with it.  ``FLOOR_S = 10 s``: at the speed of the
reference implementation the post-verdict steps fit in it on this project's 2-core CPU (after the
quick audit of ``examples/buggy_bonus.py`` in a worker: the three locating checks 2.3 s and the
case 3.0 s at a load of 9; 3.7 s and 4.8 s at a load of 15, when the verdict itself took 69 s and
the budget was 35 s), so the budget does not cut a fast function's steps and its reports stay the
same from machine to machine.

Every duration is read from one clock (``time.perf_counter``) against the audit's start; the
report's ``timings`` carries :meth:`PostVerdict.timings`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

SHARE = 0.5
"""The post-verdict budget as a fraction of the seconds the audit took to reach its verdict."""

FLOOR_S = 10.0
"""The smallest post-verdict budget (seconds)."""

LOCATING_SHARE = 0.5
"""The fraction of the budget the locating checks may use (the minimal case has the rest)."""


@dataclass(frozen=True)
class Step:
    """One post-verdict step: its name, the seconds it took, what came of it, and whether the
    budget cut it short (the outcome then says what was not done)."""

    name: str
    seconds: float
    outcome: str
    cut_off: bool = False


class PostVerdict:
    """The budget of one audit's post-verdict steps and their record.

    ``started``: the audit's start (``time.perf_counter()``).  :meth:`open` marks the verdict
    (the first call counts); the deadlines are then ``verdict_at + LOCATING_SHARE · budget`` and
    ``verdict_at + budget``."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.verdict_at: float | None = None
        self.steps: list[Step] = []

    def open(self) -> None:
        """The verdict is known now (kept from the first call)."""
        if self.verdict_at is None:
            self.verdict_at = time.perf_counter()

    @property
    def verdict_s(self) -> float:
        """Seconds from the audit's start to its verdict."""
        if self.verdict_at is None:
            raise ValueError("PostVerdict: call open() when the verdict is known, before reading the budget")
        return self.verdict_at - self.started

    @property
    def budget_s(self) -> float:
        """``max(FLOOR_S, SHARE · t_verdict)``."""
        return max(FLOOR_S, SHARE * self.verdict_s)

    def locating_deadline(self) -> float:
        """The moment the locating checks' share ends."""
        return self.started + self.verdict_s + LOCATING_SHARE * self.budget_s

    def deadline(self) -> float:
        """The moment the whole budget ends."""
        return self.started + self.verdict_s + self.budget_s

    def seconds_left(self) -> float:
        return max(0.0, self.deadline() - time.perf_counter())

    def record(self, name: str, seconds: float, outcome: str, *, cut_off: bool = False) -> None:
        self.steps.append(Step(name, seconds, outcome, cut_off))

    def announcement(self, following: str) -> str:
        """The line said when the verdict is in: what follows (``following``) and the budget."""
        return (f"the verdict is in after {self.verdict_s:.0f} s; {following}; the steps after the verdict have "
                f"{self.budget_s:.0f} s in all (the post-verdict budget: {self.basis()})")

    def basis(self) -> str:
        """How the budget was set, in words."""
        if self.budget_s > FLOOR_S:
            return f"{SHARE:g} × the {self.verdict_s:.1f} s the verdict took"
        return f"the floor of {FLOOR_S:g} s, above {SHARE:g} × the {self.verdict_s:.1f} s the verdict took"

    def timings(self) -> dict[str, Any]:
        """The report's ``timings["post_verdict"]``."""
        return {"verdict_s": self.verdict_s, "budget_s": self.budget_s,
                "steps": [{"step": s.name, "seconds": s.seconds, "outcome": s.outcome, "cut_off": s.cut_off}
                          for s in self.steps]}
