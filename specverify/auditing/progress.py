"""What an audit prints while it runs: a header with the expected time, then progress.

:func:`specverify.auditing.runner.audit` accepts ``progress=`` either as a plain callable
``progress(done, total, name)`` (called before each check) or as an :class:`AuditProgress`,
which is told the plan up front (``begin``), each check as it starts and finishes, and can read
the rows evaluated so far inside a check from the session's call log.  Two are provided:

- :class:`LineProgress` for logs (output not a terminal): the header at once, then one line per
  finished check — name, verdict, n, p-value, seconds and, for a sequential check, the look that
  decided it — each flushed as it is written; a check still running after ``heartbeat_s``
  (5 min) without a line adds one ``still running`` line (rows so far, rows/s) per period, so a
  long endpoint check never leaves a CI log silent for longer than that;
- :class:`BarProgress` for a terminal: the header, then a bar redrawn in place twice a second
  (checks done, rows evaluated inside the current check, rows per second over the audit, and an
  ETA) so that it moves within long checks.

The expected time (:func:`expected_seconds`) is a cost model of the harness driving the
reference rule (its fused C kernel, :mod:`specverify.core.native_rules`) on this project's idle
2-core CPU: ``0.05 s`` per statistical check (cells, exact laws, p-values), ``2e-6 s`` per sampled
step plus ``3e-9 s`` per probability entry handed to the function (``(2K+1)·V`` per row),
``5e-6 s`` per whole decoding loop, ``0.1 s`` per decoder-level call (the standard audit of
``reference``: model 18.5 s, measured 19 s at load 1; 63 s at load 4; about 212 s without a C
compiler, where the rules run on torch; ``tests/auditing/test_newuser_run.py`` checks the order
of magnitude on a measured audit).  A slower function takes longer: once checks have run, the
ETA rescales the rest of the plan by the measured/expected ratio so far.  The ETA assumes every
check runs to its final look and no check fails: a sequential check that rejects early, or
fail-fast, only makes the audit end sooner.  At the endpoint level the servers set the pace: the
ETA is the seconds per sample of the last finished statistical check times the samples still
planned, and ``—`` until one has finished.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol, TextIO

SECONDS_PER_CHECK = 0.05
SECONDS_PER_STEP = 2e-6
SECONDS_PER_ENTRY = 3e-9
SECONDS_PER_LOOP = 5e-6
SECONDS_PER_DECODER_CALL = 0.1


class AuditProgress(Protocol):
    """The richer progress interface (see the module docstring)."""

    def begin(self, *, target: str, level: str, budget: Any, alpha: float, checks: Sequence[Any],
              plans: Sequence[Any], log: Any) -> None: ...

    def check_started(self, index: int, check: Any, plan: Any) -> None: ...

    def check_finished(self, index: int, result: Any) -> None: ...

    def end(self) -> None: ...


def expected_seconds_of(level: str, check: Any, plan: Any) -> float:
    """Expected seconds of one check under the cost model of the module docstring."""
    n = getattr(plan, "n", 0) or 0
    if not n:
        return 0.1
    if level == "decoder":
        return SECONDS_PER_CHECK + n * SECONDS_PER_DECODER_CALL
    parameters = getattr(check, "parameters", {}) or {}
    if "L" in parameters:  # a whole decoding loop per sample
        return SECONDS_PER_CHECK + n * SECONDS_PER_LOOP
    k, v = int(parameters.get("K", 1)), int(parameters.get("V", 4))
    return SECONDS_PER_CHECK + n * (SECONDS_PER_STEP + SECONDS_PER_ENTRY * (2 * k + 1) * v)


def expected_seconds(level: str, checks: Sequence[Any], plans: Sequence[Any]) -> float:
    """Expected wall time of the whole plan (see the module docstring)."""
    return sum(expected_seconds_of(level, c, p) for c, p in zip(checks, plans))


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


def measured_estimate(level: str, log: Any, remaining_plans: Sequence[Any]) -> tuple[float, float] | None:
    """Decoder level, once the function has been called: its measured seconds per call and the
    expected seconds of the remaining plan (one call per sample) at that rate."""
    calls = getattr(log, "calls", 0) or 0
    remaining = sum(getattr(p, "n", 0) or 0 for p in remaining_plans)
    if level != "decoder" or not calls or not remaining:
        return None
    per_call = (getattr(log, "function_seconds", 0.0) or 0.0) / calls
    return per_call, per_call * remaining


def header(*, target: str, level: str, budget: Any, alpha: float, checks: Sequence[Any], plans: Sequence[Any]) -> str:
    """``specverify: auditing T at level L, budget B; C checks, N samples; expected ~X``."""
    samples = sum(getattr(p, "n", 0) or 0 for p in plans)
    unit = "calls" if level == "decoder" else "samples"
    if level == "endpoint":  # the servers set the pace: no cost model of theirs
        return (f"specverify: auditing {target} at level {level}, budget {budget.describe()}, α = {alpha:g}: "
                f"{len(checks)} checks, {samples:,} {unit} in all; the time depends on the servers' speed "
                f"(SmolLM2-135M on llama-cpp-python, 2 shared cores: ~30 min at `--budget quick`, ~50 min at standard)")
    return (f"specverify: auditing {target} at level {level}, budget {budget.describe()}, α = {alpha:g}: "
            f"{len(checks)} checks, {samples:,} {unit} in all; expected ~{duration(expected_seconds(level, checks, plans))} "
            f"(at the reference implementation's speed on a 2-core CPU; `--budget quick` or "
            f"SPECVERIFY_BUDGET=quick for a fast run)")


class _Tracker:
    """State shared by both displays: the plan, the rows read from the call log, the ETA."""

    def begin(self, *, target: str, level: str, budget: Any, alpha: float, checks: Sequence[Any],
              plans: Sequence[Any], log: Any) -> None:
        self.level, self.checks, self.plans, self.log = level, list(checks), list(plans), log
        self.expected = [expected_seconds_of(level, c, p) for c, p in zip(checks, plans)]
        self.started = time.perf_counter()
        self.done_expected = 0.0
        self.current = 0
        self.check_started_at = self.started
        self.rows_before = 0
        self.write(header(target=target, level=level, budget=budget, alpha=alpha, checks=checks, plans=plans) + "\n")

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def rows_in_check(self) -> int:
        return (getattr(self.log, "rows", 0) or 0) - self.rows_before

    def eta(self) -> float | None:
        """Seconds left, or None where there is no estimate yet (an endpoint audit before its first
        statistical check has finished: the servers set the pace)."""
        if self.level == "endpoint":
            return self._endpoint_eta()
        elapsed = time.perf_counter() - self.started
        ratio = elapsed / self.done_expected if self.done_expected > 1.0 else 1.0
        remaining = sum(self.expected[self.current:])
        return max(0.0, ratio * remaining - (time.perf_counter() - self.check_started_at))

    def check_started(self, index: int, check: Any, plan: Any) -> None:
        self.current = index
        self.check_started_at = time.perf_counter()
        self.rows_before = getattr(self.log, "rows", 0) or 0

    def _endpoint_eta(self) -> float | None:
        """The servers' measured seconds per sample (of the last finished statistical check) times
        the samples still planned: the current check's, less its elapsed time, and the later ones'."""
        if not getattr(self, "seconds_per_sample", None):
            return None
        planned = [getattr(p, "n", 0) or 0 for p in self.plans[self.current:]]
        if not planned:
            return 0.0
        in_check = time.perf_counter() - self.check_started_at
        return max(0.0, self.seconds_per_sample * planned[0] - in_check) + self.seconds_per_sample * sum(planned[1:])

    def _finished(self, index: int, result: Any = None) -> None:
        self.done_expected += self.expected[index]
        self.current = index + 1
        if result is not None and getattr(result, "n", None) and getattr(result, "seconds", None):
            self.seconds_per_sample = result.seconds / result.n


class LineProgress(_Tracker):
    """One flushed line per finished check (for logs: CI, pipes, files), and a ``still running``
    line per ``heartbeat_s`` of a check that runs longer."""

    def __init__(self, stream: TextIO, heartbeat_s: float = 300.0) -> None:
        self.stream, self.heartbeat_s = stream, heartbeat_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, **plan: Any) -> None:
        super().begin(**plan)
        self._last_line_at = time.perf_counter()
        self._thread = threading.Thread(target=self._beat, name="specverify-heartbeat", daemon=True)
        self._thread.start()

    def write(self, text: str) -> None:
        with self._lock:
            super().write(text)
            self._last_line_at = time.perf_counter()

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

    def check_finished(self, index: int, result: Any) -> None:
        self._finished(index, result)
        pvalue = "—" if result.pvalue is None else f"{result.pvalue:.3g}"
        n = f"{result.n:,}" if result.n else "—"
        look = f" look {result.look}/{result.num_looks}" if getattr(result, "look", None) else ""
        self.write(f"[{index + 1:>2}/{len(self.checks)}] {result.name:<22} {str(result.verdict):<7} n={n:<9} "
                   f"p={pvalue:<9} {result.seconds:6.1f} s{look}\n")
        measured = measured_estimate(self.level, self.log, self.plans[index + 1:])
        if measured is not None and not getattr(self, "_measured_said", False):
            self._measured_said = True
            self.write(f"specverify: measured {measured[0]:.2f} s per call of the function: the rest takes "
                       f"~{duration(measured[1])}\n")

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.write(f"specverify: audit finished in {duration(time.perf_counter() - self.started)}\n")


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
        all_rows = getattr(self.log, "rows", 0) or 0
        rate = f" {all_rows / elapsed:,.0f} rows/s" if all_rows and elapsed > 0 else ""
        return (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {elapsed:5.0f}s "
                f"ETA {eta_text(self.eta()):>8}  {name[:24]}{rows}{rate}")

    def draw(self) -> None:
        with self._lock:
            text = self.line()
            self.stream.write("\r" + text.ljust(len(self._last)))
            self.stream.flush()
            self._last = text

    def check_finished(self, index: int, result: Any) -> None:
        self._finished(index, result)
        self.draw()

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self.stream.write("\r" + " " * len(self._last) + "\r")
            self.stream.flush()


def progress_for(stream: TextIO, *, quiet: bool = False) -> AuditProgress | None:
    """The display for ``stream``: nothing under ``quiet``, a bar on a terminal, lines otherwise."""
    if quiet:
        return None
    isatty = getattr(stream, "isatty", None)
    return BarProgress(stream) if isatty is not None and isatty() else LineProgress(stream)
