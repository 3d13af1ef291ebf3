"""The function under audit as the audit's runner, reports and progress display see it.

Each level wraps the function it audits in an object of its own: the guarded SPEC §1, §2 and §3
functions (:class:`specverify.auditing.isolation.guarded.GuardedFunction` and its siblings, in a
worker process or in the audit's own) and the endpoint's HTTP client of the candidate server
(:class:`specverify.auditing.endpoint.client.EndpointClient`).  A battery's session
(:class:`AuditSession`) holds it as ``session.function``.  :class:`AuditedFunction` declares what
the audit reads of it whatever the level: the call counts (:class:`CallCounts`), the function as
a plain callable, the report's isolation entry, the seconds a restart costs, why it may no longer
be called, the caller's cutoff (the post-verdict budget, :mod:`specverify.auditing.post_verdict`)
and the shutdown.  Importable without torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specverify.auditing.ahead import Gate, WorkAhead


@dataclass
class CallCounts:
    """The calls of the function that returned, their rows, and the seconds spent in them (in a
    worker: as measured there); the timings of the report, the ETA of the progress display."""

    calls: int = 0
    rows: int = 0
    function_seconds: float = 0.0


class AuditedFunction(ABC):
    """The function under audit behind its guards, as every level exposes it to the runner.

    ``log``: its :class:`CallCounts` (a level's log may count more).  ``raw``: the function as a
    plain callable whose signature is the function's (for the signature check and the direct calls
    of the exact checks, each counted in ``log``), None where there is no Python function (an
    endpoint).  The defaults are those of a function that needs no process of the audit's own:
    nothing to restart, never stopped by the audit, no declared attributes."""

    log: CallCounts
    raw: Callable[..., Any] | None
    gate: Gate | None = None
    """Open while the audit waits for a reply of the function's worker process (None: the function
    runs in the audit's own process); work made ahead runs then (:mod:`specverify.auditing.ahead`)."""

    @abstractmethod
    def cut_off_at(self, moment: float | None) -> None:
        """Start no call after ``moment`` (a ``time.perf_counter()`` reading; None: no cutoff) and
        stop a call still running then, raising :class:`~specverify.auditing.isolation.faults.CutOff`."""

    @abstractmethod
    def close(self, grace_s: float | None = None) -> None:
        """Release what the function holds; a worker process is asked to stop and killed after
        ``grace_s`` seconds (None: the transport's own grace)."""

    def worker_running(self) -> bool:
        """Whether a worker process the audit started for the function is running now (:meth:`close` stops it)."""
        return False

    def runs_in_worker(self) -> bool:
        """Whether the function's calls run in a worker process of the audit's, not in the audit's
        own process (:data:`~specverify.auditing.isolation.process.AUDIT_THREADS`)."""
        return False

    def describe(self) -> dict[str, Any]:
        """The report's ``isolation`` entry beyond its ``mode`` (a note, restarts, captured output)."""
        return {}

    def startup_s(self) -> float:
        """Seconds the next call first spends starting the function (a worker process) again."""
        return 0.0

    def stop_reason(self) -> str | None:
        """Why the function must not be called again (None while it may)."""
        return None

    def declared(self, name: str) -> Any:
        """The function's declared attribute ``name`` (``arithmetic``, ``input_dtypes``,
        ``draft_schemes``), None when absent."""
        return None


class AuditSession:
    """What a battery's ``open_session`` returns: the function under audit (``function``) and
    whatever the level's checks share; :meth:`close` releases the function and anything else the
    session opened."""

    function: AuditedFunction
    _ahead: WorkAhead | None = None

    @property
    def ahead(self) -> WorkAhead:
        """The work its checks make ahead (:mod:`specverify.auditing.ahead`): the runner's, which
        works while the audit waits for the function; else one of the session's own, which makes
        each item when it is claimed, in a thread that ends with the item."""
        if self._ahead is None:
            from specverify.auditing.ahead import WorkAhead

            self._ahead = WorkAhead()
        return self._ahead

    def use_ahead(self, ahead: WorkAhead) -> None:
        """Make the checks' work ahead in ``ahead`` from now on."""
        self._ahead = ahead

    def close(self, grace_s: float | None = None) -> None:
        self.function.close(grace_s)
