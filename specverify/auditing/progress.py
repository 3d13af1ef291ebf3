"""What an audit prints while it runs: a header with the expected time, then progress.

:func:`specverify.auditing.runner.audit` accepts ``progress=`` either as a plain callable
``progress(done, total, name)`` (called before each check) or as an :class:`AuditProgress`,
which is told when the audit started (``audit_started``: every duration it says counts from
there, as the report's do), the plan up front (``begin``), each check as it starts and finishes,
and can read the rows evaluated so far inside a check from the session's call log.  Two are provided:

- :class:`LineProgress` for logs (output not a terminal): the header at once, then one line per
  finished check — name, verdict, n, p-value, observed and detectable TV, seconds and, for a
  sequential check, the look that decided it — each flushed as it is written (checks that did
  not run are counted in one line at the end instead); a check still running after
  ``heartbeat_s`` (5 min) without a line adds one ``still running`` line (rows so far, rows/s)
  per period, so a long endpoint check never leaves a CI log silent for longer than that.
  ``per_check=False`` (``assert_lossless`` inside a captured pytest test) keeps the header, the
  measured speed and the last line only: the failure message holds the results;
- :class:`BarProgress` for a terminal: the header, then a bar redrawn in place twice a second
  (checks done, rows evaluated inside the current check, rows per second over the audit, and an
  ETA) so that it moves within long checks.

``end(total_s=…)`` comes at the audit's true end, after the steps that follow its verdict (the
locating checks, a minimal failing case, the worker's shutdown, :mod:`specverify.auditing.post_verdict`,
each announced by an ``after_verdict`` line with its bound), so ``audit finished in X`` is the report's
``total_s``, on the audit's clock from its start.

The expected time is the plan's cost (:mod:`specverify.auditing.cost`: each check states
its own, :meth:`specverify.auditing.checks.Check.cost`) at the reference implementation's speed on
a 2-core CPU.  A function of another speed is re-timed as soon as a check that called it has
finished: every later check is priced at the function's seconds per call and its slowdown against
the reference on rows measured at its scale (its vocabulary), or at the nearest scale measured,
with the range the slowdowns measured at every scale allow, and the audit's own work at the pace
measured so far; a line says so with the
function's seconds per call and the range, and again whenever the projected total moves by 2×
or more.  Inside a check the ETA follows the function's speed on that check's rows so far.  Only
the ETA and the deadlines follow the measured speed, never which rows go into which call.  The
ETA assumes every check runs to its final look and no check fails: a sequential check that
rejects early, or fail-fast, only makes the audit end sooner.  At the endpoint level the servers
set the pace: the ETA is the seconds per sample of the last finished statistical check times the
samples still planned, and ``—`` until one has finished.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TextIO

from specverify.auditing.audited import CallCounts
from specverify.auditing.checks import Check, CheckResult, Plan
from specverify.auditing.cost import MIN_OWN_SECONDS, Cost, Estimate, Speeds, planned

SETTLE_S = 2.0
"""Seconds an audit runs before its re-timed plan is said (unless the checks done were planned to
take :data:`specverify.auditing.cost.MIN_OWN_SECONDS` or more)."""


class AuditProgress:
    """What an audit tells its display as it runs (module docstring).  Every hook does nothing
    here: a display overrides the ones it shows.  ``says_notes``: whether :meth:`note` writes the
    plan's notes (checks left out, a power shortfall); the report then does not repeat them."""

    says_notes: ClassVar[bool] = False

    def audit_started(self, moment: float) -> None:
        """The audit started at ``moment`` (a ``time.perf_counter()`` reading), before it loaded the
        function and planned its checks: the start of the clock of every duration it reports."""

    def begin(self, *, target: str, level: str, budget: Any, alpha: float, checks: Sequence[Check],
              plans: Sequence[Plan], log: CallCounts) -> None:
        """The plan, before the first check; ``log`` is the call counts of the function under audit."""

    def note(self, text: str) -> None:
        """A line about the plan, after :meth:`begin`."""

    def check_started(self, index: int, check: Check, plan: Plan) -> None:
        """Check ``index`` of the plan starts."""

    def check_finished(self, index: int, result: CheckResult) -> None:
        """Check ``index`` has its result."""

    def after_verdict(self, text: str) -> None:
        """A step that follows the verdict, with its time bound (:mod:`specverify.auditing.post_verdict`)."""

    def end(self, *, total_s: float | None = None) -> None:
        """The audit has ended (after its post-verdict steps): ``total_s`` its seconds from its start."""


class CallbackProgress(AuditProgress):
    """A plain callable ``progress(done, total, name)`` as a display: called before each check
    with the check's name, and once at the end with ``done == total`` and ``"done"``."""

    def __init__(self, callback: Callable[[int, int, str], None]) -> None:
        self.callback = callback
        self.total = 0

    def begin(self, *, target: str, level: str, budget: Any, alpha: float, checks: Sequence[Check],
              plans: Sequence[Plan], log: CallCounts) -> None:
        self.total = len(checks)

    def check_started(self, index: int, check: Check, plan: Plan) -> None:
        self.callback(index, self.total, check.name)

    def end(self, *, total_s: float | None = None) -> None:
        self.callback(self.total, self.total, "done")


def as_progress(progress: AuditProgress | Callable[[int, int, str], None] | None) -> AuditProgress:
    """The display an audit drives for its ``progress=`` argument: an :class:`AuditProgress` as
    it is, a plain callable through :class:`CallbackProgress`, None as a display that shows nothing."""
    if progress is None:
        return AuditProgress()
    if isinstance(progress, AuditProgress):
        return progress
    if callable(progress):
        return CallbackProgress(progress)
    raise TypeError(f"progress: expected an AuditProgress or a callable progress(done, total, name), "
                    f"got {type(progress).__name__}; subclass specverify.auditing.progress.AuditProgress")


def expected_seconds(checks: Sequence[Check], plans: Sequence[Plan]) -> float:
    """The plan's seconds at the reference implementation's speed (:func:`specverify.auditing.cost.planned`)."""
    return planned([check.cost(plan) for check, plan in zip(checks, plans)])


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``1.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def eta_text(seconds: float | None) -> str:
    """:func:`duration`, or ``—`` when there is no estimate."""
    return "—" if seconds is None else duration(seconds)


def header(*, target: str, level: str, budget: Any, alpha: float, checks: Sequence[Check],
           plans: Sequence[Plan], elapsed_s: float = 0.0) -> str:
    """``specverify: auditing T at level L, budget B; C checks, N samples; expected ~X``: X the
    ``elapsed_s`` since the audit started and the plan's seconds."""
    samples = sum(p.n for p in plans)
    unit = "calls" if level == "decoder" else "samples"
    if level == "endpoint":  # the servers set the pace: no cost model of theirs
        return (f"specverify: auditing {target} at level {level}, budget {budget.describe()}, α = {alpha:g}: "
                f"{len(checks)} checks, {samples:,} {unit} in all; the time depends on the servers' speed "
                f"(SmolLM2-135M on llama-cpp-python, 2 shared cores: ~30 min at `--budget quick`, ~50 min at standard)")
    faster = "" if budget.name == "quick" else "; `--budget quick` or SPECVERIFY_BUDGET=quick for a fast run"
    return (f"specverify: auditing {target} at level {level}, budget {budget.describe()}, α = {alpha:g}: "
            f"{len(checks)} checks, {samples:,} {unit} in all; "
            f"expected ~{duration(elapsed_s + expected_seconds(checks, plans))} "
            f"(at the reference implementation's speed on a 2-core CPU{faster})")


class _Tracker(AuditProgress):
    """State shared by both displays: the plan, the rows read from the call log, the ETA."""

    says_notes: ClassVar[bool] = True
    stream: TextIO
    audit_started_at: float | None = None

    def audit_started(self, moment: float) -> None:
        self.audit_started_at = moment

    def begin(self, *, target: str, level: str, budget: Any, alpha: float, checks: Sequence[Check],
              plans: Sequence[Plan], log: CallCounts) -> None:
        self.level, self.checks, self.plans, self.log = level, list(checks), list(plans), log
        self.costs: list[Cost] = [check.cost(plan) for check, plan in zip(checks, plans)]
        self.speeds = Speeds()
        now = time.perf_counter()
        self.started = now if self.audit_started_at is None else self.audit_started_at
        self.current = 0
        self.check_started_at = now
        self.rows_before = 0
        self.calls_before = 0
        self.function_s_before = 0.0
        self.running: int | None = None
        self.said_total: float | None = None
        self.not_run: dict[str, int] = {}
        self.seconds_per_sample: float | None = None
        self.write(header(target=target, level=level, budget=budget, alpha=alpha, checks=checks, plans=plans,
                          elapsed_s=now - self.started) + "\n")

    def note(self, text: str) -> None:
        """A line about the plan (a power shortfall, checks left out), written after the header."""
        self.write(f"specverify: {text}\n")

    def after_verdict(self, text: str) -> None:
        """A line on what follows the verdict and its time bound (:mod:`specverify.auditing.post_verdict`)."""
        self.write(f"specverify: {text}\n")

    def replanned(self, index: int) -> str | None:
        """After check ``index`` finished: the rest of the plan re-timed at the speeds measured so far
        (:class:`specverify.auditing.cost.Speeds`) as a line, when the function's speed is first
        known or the projected total has moved by 2× since it was last said; None otherwise (and at
        the endpoint level, whose servers set the pace)."""
        if self.not_run or self.level == "endpoint" or not self.speeds.measured or not self.log.calls:
            return None  # the audit is stopping (fail-fast, an interrupt), or nothing is measured yet
        elapsed = time.perf_counter() - self.started
        if index + 1 >= len(self.costs) or (elapsed < SETTLE_S and planned(self.costs[:index + 1]) < MIN_OWN_SECONDS):
            return None  # nothing left, or too little has run to say anything the plan did not
        rest = self.speeds.estimate(self.costs[index + 1:])
        total = elapsed + rest.seconds
        if self.said_total is not None and self.said_total / 2 < total < self.said_total * 2:
            return None
        first = self.said_total is None
        self.said_total = total
        per_call = self.log.function_seconds / self.log.calls
        return (f"specverify: measured {_seconds(per_call)} per call of the function: the rest takes "
                f"~{duration(rest.seconds)}{_range(rest)} at the speeds measured so far (planned "
                f"~{duration(planned(self.costs[index + 1:]))}), the audit ~{duration(total)} in all, "
                f"{self.log.calls:,} calls so far" + ("" if first else "; re-planned") + "\n")

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def rows_in_check(self) -> int:
        return self.log.rows - self.rows_before

    def eta(self) -> float | None:
        """Seconds left, or None where there is no estimate yet (an endpoint audit before its first
        statistical check has finished: the servers set the pace): the current check's rows left
        at the function's speed on its rows so far (the measured or planned speed before its first
        row), and the later checks at the speeds measured so far."""
        if self.level == "endpoint":
            return self._endpoint_eta()
        if self.current >= len(self.costs):
            return 0.0
        return self._current_left() + self.speeds.estimate(self.costs[self.current + 1:]).seconds

    def _current_left(self) -> float:
        """Seconds left of the current check (:meth:`eta`)."""
        cost = self.costs[self.current]
        rows = self.rows_in_check()
        function_s = self.log.function_seconds - self.function_s_before
        if rows and function_s > 0 and cost.work and cost.rows:
            left = max(0.0, 1.0 - rows / cost.rows)
            return left * (self.speeds.own_ratio(cost) * cost.own_s + cost.rows * function_s / rows)
        return max(0.0, self.speeds.estimate([cost]).seconds - (time.perf_counter() - self.check_started_at))

    def check_started(self, index: int, check: Check, plan: Plan) -> None:
        self.current = index
        self.check_started_at = time.perf_counter()
        self.rows_before = self.log.rows
        self.calls_before = self.log.calls
        self.function_s_before = self.log.function_seconds
        self.running = index

    def _endpoint_eta(self) -> float | None:
        """The servers' measured seconds per sample (of the last finished statistical check) times
        the samples still planned: the current check's, less its elapsed time, and the later ones'."""
        if not self.seconds_per_sample:
            return None
        planned = [p.n for p in self.plans[self.current:]]
        if not planned:
            return 0.0
        in_check = time.perf_counter() - self.check_started_at
        return max(0.0, self.seconds_per_sample * planned[0] - in_check) + self.seconds_per_sample * sum(planned[1:])

    def _finished(self, index: int, result: CheckResult | None = None) -> None:
        if index == self.running:  # fail-fast and interrupts report checks that never started
            self.running = None
            self.speeds.record(self.costs[index], self.rows_in_check(), self.log.function_seconds
                               - self.function_s_before, time.perf_counter() - self.check_started_at,
                               calls=self.log.calls - self.calls_before)
        self.current = index + 1
        if result is not None and result.n and result.seconds:
            self.seconds_per_sample = result.seconds / result.n

    def _not_run(self, result: CheckResult) -> bool:
        """Count a check that did not run (fail-fast, an interrupt, a stopped function) by its reason."""
        message = result.message
        if result.verdict != "skipped" or not message.startswith("not run"):
            return False
        reason = message.split(" (", 1)[0].split(";", 1)[0].removeprefix("not run: ")
        self.not_run[reason] = self.not_run.get(reason, 0) + 1
        return True

    def not_run_lines(self) -> list[str]:
        return [f"specverify: {count} check(s) not run: {reason}\n" for reason, count in self.not_run.items()]


def _range(estimate: Estimate) -> str:
    """`` (40 s–3 min)`` where the speeds measured so far leave a range, else nothing."""
    if duration(estimate.low) == duration(estimate.high):
        return ""
    return f" ({duration(estimate.low)}–{duration(estimate.high)})"


def _seconds(seconds: float) -> str:
    """``0.41 s``, ``2.3 ms``, ``85 µs``."""
    if seconds >= 0.1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.2g} ms"
    return f"{seconds * 1e6:.2g} µs"


class LineProgress(_Tracker):
    """One flushed line per finished check (for logs: CI, pipes, files), and a ``still running``
    line per ``heartbeat_s`` of a check that runs longer."""

    def __init__(self, stream: TextIO, heartbeat_s: float = 300.0, *, per_check: bool = True) -> None:
        self.stream, self.heartbeat_s, self.per_check = stream, heartbeat_s, per_check
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, **plan: Any) -> None:
        self.counts: dict[str, int] = {}
        super().begin(**plan)
        self._last_line_at = time.perf_counter()
        if self.per_check:
            self._thread = threading.Thread(target=self._beat, name="specverify-heartbeat", daemon=True)
            self._thread.start()

    def write(self, text: str) -> None:
        with self._lock:
            super().write(text)
            self._last_line_at = time.perf_counter()

    def after_verdict(self, text: str) -> None:
        if self.per_check:  # else the plan, the measured speed and the end only
            super().after_verdict(text)

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat_s / 4)):
            now = time.perf_counter()
            if now - self._last_line_at >= self.heartbeat_s and self.current < len(self.checks):
                self.write(self.still_running(now))

    def still_running(self, now: float) -> str:
        """``       pit-T1-top8 still running: 1,204 rows in 5.0 min (4.0 rows/s), ETA 38 min``."""
        seconds = now - self.check_started_at
        rows = self.rows_in_check()
        rate = f" ({rows / seconds:,.1f} rows/s)" if seconds > 0 else ""
        eta = self.eta()
        left = "" if eta is None else f", ETA {duration(eta)}"
        return (f"       {self.checks[self.current].name} still running: {rows:,} rows in {duration(seconds)}"
                f"{rate}{left}\n")

    def check_finished(self, index: int, result: CheckResult) -> None:
        self._finished(index, result)
        self.counts[str(result.verdict)] = self.counts.get(str(result.verdict), 0) + 1
        if not self._not_run(result) and self.per_check:
            self.write(check_line(index, len(self.checks), result))
        line = self.replanned(index)
        if line is not None:
            self.write(line)

    def end(self, *, total_s: float | None = None) -> None:
        """``specverify: audit finished in X``: ``total_s`` (the audit's own clock, from its start),
        else the time since :meth:`begin`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for line in self.not_run_lines():
            self.write(line)
        counts = ", ".join(f"{count} {verdict}" for verdict, count in self.counts.items())
        seconds = time.perf_counter() - self.started if total_s is None else total_s
        self.write(f"specverify: audit finished in {duration(seconds)}"
                   + (f" ({counts})" if counts and not self.per_check else "") + "\n")


def check_line(index: int, total: int, result: CheckResult) -> str:
    """``[ 3/26] step-K1   pass   n=9,466   p=0.333   TV 0.0123 (detects 0.0500)   0.0 s look 3/3``."""
    pvalue = "—" if result.pvalue is None else f"{result.pvalue:.3g}"
    n = f"{result.n:,}" if result.n else "—"
    look = f" look {result.look}/{result.num_looks}" if result.look else ""
    seen, detect = result.empirical_tv, result.detectable_tv
    tv = ""
    if detect is not None:
        coarse = "" if result.coarse_tv is None else f"; {result.coarse_tv:.2f} in its {result.coarse_views}"
        tv = f" TV {'—' if seen is None else format(seen, '.4f')} (detects {detect:.4f}{coarse})"
    return (f"[{index + 1:>2}/{total}] {result.name:<22} {str(result.verdict):<7} n={n:<9} "
            f"p={pvalue:<9}{tv} {result.seconds:6.1f} s{look}\n")


class BarProgress(_Tracker):
    """A bar redrawn in place on a terminal, twice a second, moving within long checks."""

    def __init__(self, stream: TextIO, width: int = 24, interval_s: float = 0.5) -> None:
        self.stream, self.width, self.interval_s = stream, width, interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last = ""

    def begin(self, **plan: Any) -> None:
        super().begin(**plan)
        self._thread = threading.Thread(target=self._tick, name="specverify-progress", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.draw()

    def line(self) -> str:
        total = len(self.checks)
        done = min(self.current, total)
        within = 0.0
        if done < total and self.plans[done].n:
            within = min(1.0, self.rows_in_check() / self.plans[done].n)
        filled = int(self.width * (done + within) / max(1, total))
        elapsed = time.perf_counter() - self.started
        name = self.checks[done].name if done < total else "done"
        rows = f" {self.rows_in_check():,} rows" if done < total and self.plans[done].n else ""
        all_rows = self.log.rows
        rate = f" {all_rows / elapsed:,.0f} rows/s" if all_rows and elapsed > 0 else ""
        return (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {elapsed:5.0f}s "
                f"ETA {eta_text(self.eta()):>8}  {name[:24]}{rows}{rate}")

    def draw(self) -> None:
        with self._lock:
            text = self.line()
            self.stream.write("\r" + text.ljust(len(self._last)))
            self.stream.flush()
            self._last = text

    def check_finished(self, index: int, result: CheckResult) -> None:
        self._finished(index, result)
        self._not_run(result)
        line = self.replanned(index)
        if line is not None:
            self.write(line)
        self.draw()

    def write(self, text: str) -> None:
        """A line above the bar: the bar is cleared first and redrawn at the next tick."""
        with self._lock:
            self.stream.write("\r" + " " * len(self._last) + "\r" + text)
            self.stream.flush()
            self._last = ""

    def end(self, *, total_s: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self.stream.write("\r" + " " * len(self._last) + "\r")
            self.stream.flush()
        for line in self.not_run_lines():
            self.write(line)


def progress_for(stream: TextIO, *, quiet: bool = False, summary_only: bool = False) -> AuditProgress | None:
    """The display for ``stream``: nothing under ``quiet``, a bar on a terminal, lines otherwise
    (``summary_only``: the header, the measured speed and the end, no line per check)."""
    if quiet:
        return None
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return BarProgress(stream)
    return LineProgress(stream, per_check=not summary_only)
