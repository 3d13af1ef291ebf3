"""Work a check makes ahead from its plan alone, done while the audit waits for the function.

While the function runs in a worker process the audit's own process waits for its reply.  What a
check computes from its plan alone (the identity tests' designs of every look of a production
check, :meth:`specverify.auditing.sampler.production.ProductionStepCheck.work_ahead`) can be made
then, instead of on the audit's critical path when the check reaches that look.

:class:`WorkAhead` runs such items in one thread, in the order given, each started only while
the function's :class:`Gate` has been open for :data:`SETTLE_S` (the audit's main thread waits
for the worker), or at once when a check claims it (:meth:`WorkAhead.claim`): a claimed item
that has not started goes to the head of the queue and runs whatever the gate, as the check's
own thread would.  The runner starts it once the first looks are done (an audit that a first
look ends needs none of it).  An item is a pure function of its check's plan, so when it runs
changes no result, only when the audit waits for it.  The gate closes as soon as the reply is
there; an item that is running then finishes first, sharing the GIL with the main thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

SETTLE_S = 0.002
"""A queued item starts only once the gate has been open this long: most waits for the function
are shorter (a call at toy shapes), and an item still running when the reply comes delays the
audit's main thread, which needs the GIL back."""


class Gate:
    """Open while the audit's main thread waits for the function (:meth:`opened`, since
    ``opened_at``); its condition also guards the queue of the :class:`WorkAhead` that watches it."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.is_open = False
        self.opened_at = 0.0

    @contextmanager
    def opened(self) -> Iterator[None]:
        with self.condition:
            self.is_open = True
            self.opened_at = time.perf_counter()
            self.condition.notify_all()
        try:
            yield
        finally:
            with self.condition:
                self.is_open = False


@dataclass(eq=False)
class AheadItem:
    """One piece of work made ahead: ``make()`` gives what the check later claims by ``key``;
    ``look`` is the 0-based look that needs it (the queue runs the first looks' items first,
    as the runner reaches them first)."""

    key: Hashable
    look: int
    make: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)


class WorkAhead:
    """The items of an audit's checks, made in one thread while ``gate`` is open or when claimed
    (module docstring).  Without a gate (the function runs in the audit's own process, so the
    audit never waits for it) only claimed items run, each in that thread while the claiming
    check draws its samples."""

    def __init__(self, gate: Gate | None = None) -> None:
        self._gate = gate or Gate()
        self._gated = gate is not None
        self._queue: list[AheadItem] = []
        self._items: dict[Hashable, AheadItem] = {}
        self._urgent: list[AheadItem] = []
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False

    def add(self, items: Iterable[AheadItem]) -> None:
        """Queue ``items`` after those already queued (a key queued twice keeps its first item)."""
        with self._gate.condition:
            for item in items:
                if item.key not in self._items:
                    self._items[item.key] = item
                    self._queue.append(item)
            self._queue.sort(key=lambda queued: queued.look > 0)  # stable: the first looks', then in order
            self._gate.condition.notify_all()

    def claim(self, key: Hashable, make: Callable[[], Any]) -> Future[Any]:
        """The future of item ``key`` (queued by :meth:`add`; else ``make`` becomes that item), which
        this object then forgets; an item not yet started runs next, gate open or not."""
        with self._gate.condition:
            item = self._items.pop(key, None)
            if item is None:
                item = AheadItem(key, 0, make)
            elif item in self._queue:
                self._queue.remove(item)
            else:
                return item.future  # running or done
            self._urgent.append(item)
            self._gate.condition.notify_all()
        self._ensure_thread()
        return item.future

    def start(self) -> None:
        """Make the queued items from now on (until then only claimed ones run)."""
        with self._gate.condition:
            self._started = True
            self._gate.condition.notify_all()
        if self._gated and self._queue:
            self._ensure_thread()

    def close(self) -> None:
        """Stop after the running item; what was not made is dropped (its futures cancelled)."""
        with self._gate.condition:
            self._closed = True
            for item in self._queue + self._urgent:
                item.future.cancel()
            self._queue.clear()
            self._urgent.clear()
            self._items.clear()
            self._gate.condition.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _ensure_thread(self) -> None:
        with self._gate.condition:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="specverify-ahead", daemon=True)
        self._thread.start()

    def _next(self) -> AheadItem | None:
        """The next item to run, waiting until one may; None once closed, or once no claimed item
        is left while queued ones may not run (no gate, or not started): the thread ends, and the
        next claim, or :meth:`start`, starts another."""
        with self._gate.condition:
            while True:
                if self._urgent and not self._closed:
                    return self._urgent.pop(0)
                if self._closed or not self._gated or not self._started:
                    self._thread = None
                    return None
                if self._queue and self._gate.is_open:
                    settling = self._gate.opened_at + SETTLE_S - time.perf_counter()
                    if settling <= 0:
                        return self._queue.pop(0)
                    self._gate.condition.wait(settling)
                    continue
                self._gate.condition.wait()

    def _run(self) -> None:
        while (item := self._next()) is not None:
            if not item.future.set_running_or_notify_cancel():
                continue
            try:
                item.future.set_result(item.make())
            except BaseException as error:  # noqa: BLE001 - the claiming check raises it
                item.future.set_exception(error)
