"""Guarded calls of the function under audit, in a worker process or in the audit's own.

:class:`GuardedFunction` (SPEC §1) and :class:`GuardedGenerate` (SPEC §2) are what the checks
call.  Each call gets a deadline judged against the function's measured speed
(:class:`CallSpeed`), exception capture, output validation, input-mutation and output-aliasing
detection; with ``isolation="process"`` the call runs in a worker
(:mod:`specverify.auditing.isolation.process`) that is killed at the deadline and restarted after any
abnormal end.  Everything that goes wrong becomes a :class:`~specverify.auditing.isolation.faults.Fault`.
Input mutation: after a request the inputs are compared with what was presented, unless the
worker's write guard (:mod:`specverify.auditing.isolation.write_guard`) saw no write reach them.

Call plan and speed.  Which rows go into which call is the caller's (the harness's batches, a
check's group sizes) and nothing else: the partition, like every draw, is a function of the seed,
the budget and the level, never of how fast the function runs.  A function that draws its random
numbers per call (engines draw the whole batch's bonus tokens first) therefore returns the same
tokens on a fast machine and on a slow one.  Speed only sets deadlines: the first call of a
session is small (the first check's, or a probe of a few rows of the first large call, whose
output is validated and discarded, on a throwaway generator); its time gives the speed, and a
call is a hang only past ``max(timeout_s, HANG_FACTOR × its expected time)``, so a slow machine
or a slow-but-correct function gets a verdict and a real hang is still caught in bounded time.
In a worker, consecutive calls travel in one request of about :data:`TARGET_REQUEST_S` expected
seconds (fewer round trips for fast functions); a request carries whole calls, so this changes
no call.

Cutoff.  The caller may also set a moment past which no call starts and a running call is
stopped (:meth:`_Session.cut_off_at`; the audit's post-verdict budget,
:mod:`specverify.auditing.post_verdict`): such a call raises
:class:`~specverify.auditing.isolation.faults.CutOff` instead of a fault, and counts against
nothing of the function's.  A worker started again under a cutoff gets until the cutoff to load.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specverify.auditing.ahead import Gate
from specverify.auditing.audited import AuditedFunction, CallCounts
from specverify.auditing.isolation.faults import (
    CutOff,
    Fault,
    call_with_deadline,
    validate_emitted,
)
from specverify.auditing.isolation.presentation import Presenter, Slot, decoy_value, storage_shape
from specverify.auditing.isolation.process import (
    START_TIMEOUT_S,
    CapturedStream,
    LoadFailed,
    SharedBuffer,
    WorkerLost,
    WorkerProcess,
    WorkerTarget,
    check_isolation,
    global_rng_fingerprint,
    layout,
    worker_target,
)
from specverify.auditing.isolation.write_guard import PAGE_BYTES
from specverify.core.outputs import emitted_tensor

HANG_FACTOR = 20.0
"""A call is a hang when it runs this many times longer than its expected time (and past the floor)."""

TARGET_REQUEST_S = 10.0
"""Consecutive calls expected to take less than this in all travel to the worker in one request."""

PROBE_ELEMENTS = 1 << 18
"""A first call with more input entries than this is preceded by a probe of a few rows."""

DECLARED_ATTRIBUTES = ("draft_schemes", "arithmetic", "input_dtypes")
"""Attributes a function may declare about itself (SPEC §3 ``draft_schemes``; the precision of its
arithmetic, :mod:`specverify.core.rounding`; the input dtypes it accepts), read where it is loaded."""

MAX_WORKER_LOSSES = 2
"""After this many deadlines or abnormal ends, the audit stops calling the function."""

GUARD_AUDIT_EVERY = 64
"""Of the requests whose inputs the worker's write guard saw untouched, the 1st, 2nd, 4th, …,
this-many-th and then every this-many-th have their inputs compared with what was presented all
the same (:func:`guard_audited`): a write the guard cannot see (through another mapping, or after
the function changed the pages' protection itself) into inputs the session keeps is found at the
next such request (within this many), and one from the first request on at once.  Comparing
reads the inputs once more: at 1/64 of the requests that costs what the function's own reads of
1/64 of the calls cost."""


def guard_audited(request: int) -> bool:
    """Whether the ``request``-th request (1-based) of a session whose inputs the write guard saw
    untouched is compared all the same: powers of two up to :data:`GUARD_AUDIT_EVERY`, then its
    multiples."""
    return request % GUARD_AUDIT_EVERY == 0 or (request < GUARD_AUDIT_EVERY and request & (request - 1) == 0)


# --------------------------------------------------------------------------------------------
# Output checks shared by both modes
# --------------------------------------------------------------------------------------------


def checked_emitted(result: Any, draft_tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The function's output as a fresh int64 CPU tensor ``[B, K+1]`` validated against SPEC §1,
    or a :class:`Fault` (``malformed``) saying what is wrong, whatever the output is (a meta or
    sparse tensor, a tensor subclass, an object whose attributes raise)."""
    try:
        emitted, _ = validate_emitted(result, draft_tokens, vocab_size)
        return torch.Tensor.clone(emitted.detach()).as_subclass(torch.Tensor)
    except Fault:
        raise
    except Exception as error:  # reading the output itself failed
        raise Fault("malformed",
                    f"returned output the audit could not read ({type(error).__name__}: {error})") from None


def exception_message(error: BaseException, what: str) -> str:
    hint = {"KeyboardInterrupt": " (an interrupt raised by the function itself, not a Ctrl-C of the audit)",
            "SystemExit": " (the function tried to end the process)"}.get(type(error).__name__, "")
    return f"{what} raised {type(error).__name__}: {error}{hint}"


class AliasWatch:
    """Detects a function that returns a view of a buffer it overwrites on its next call: the
    previous output is kept with a copy of its values and compared after the next call."""

    def __init__(self) -> None:
        self.previous: tuple[torch.Tensor, torch.Tensor] | None = None
        self.lent = False

    def after_call(self, result: Any, copy: torch.Tensor | None = None) -> bool:
        """True when this call changed the tensor the previous call returned.  ``copy``: a tensor
        that holds ``result``'s values already (a plain CPU output copied out by the caller), kept
        as the copy until the next call; the caller keeps it unchanged until then, or calls
        :meth:`own_copy` first."""
        changed = False
        if self.previous is not None:
            kept, values = self.previous
            try:
                changed = kept.shape != values.shape or not torch.equal(kept.detach().cpu(), values)
            except Exception:
                changed = True
        self.lent = copy is not None
        if copy is not None:
            self.previous = (result, copy)
            return changed
        try:
            tensor = emitted_tensor(result)
            self.previous = (tensor, tensor.detach().cpu().clone()) if tensor.layout == torch.strided and \
                tensor.device.type not in ("meta",) else None
        except Exception:
            self.previous = None
        return changed

    def own_copy(self) -> None:
        """Copy the values kept from the caller's tensor (:meth:`after_call`'s ``copy``), which the
        caller is about to change."""
        if self.lent and self.previous is not None:
            self.previous = (self.previous[0], self.previous[1].clone())
        self.lent = False


ALIASING_MESSAGE = ("the function returns a view of a buffer that its next call overwrites (output aliasing): a "
                    "caller that keeps one step's output while running the next sees it change; return a fresh "
                    "tensor (e.g. .clone()). The audit copies every output at once, so its statistical checks "
                    "judged the values as returned")


# --------------------------------------------------------------------------------------------
# Call log and speed
# --------------------------------------------------------------------------------------------


@dataclass
class CallLog(CallCounts):
    """What the guards saw across all calls of one audit.

    Beyond the :class:`~specverify.auditing.audited.CallCounts`: mutations/aliasing/model_changes:
    contract findings (``where: what``); losses: deadlines and abnormal ends of the worker
    (``where: why``); probe_calls: calls made only to measure the speed; restarts: workers started
    after the first.
    """

    mutations: list[str] = field(default_factory=list)
    aliasing: list[str] = field(default_factory=list)
    model_changes: list[str] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)
    probe_calls: int = 0
    restarts: int = 0


class CallSpeed:
    """Expected seconds of ``calls`` calls with ``elements`` input entries in all:
    ``max(calls × per_call, elements × per_element)``, both exponential averages of measured
    requests (per_call from requests of small calls, per_element from the others)."""

    SMALL = 4096  # entries per call below which a call's cost is mostly fixed

    def __init__(self) -> None:
        self.per_call: float | None = None
        self.per_element: float | None = None

    @property
    def known(self) -> bool:
        return self.per_call is not None or self.per_element is not None

    def record(self, calls: int, elements: int, seconds: float) -> None:
        seconds = max(seconds, 1e-6)
        if elements / max(calls, 1) <= self.SMALL:
            self.per_call = seconds / calls if self.per_call is None else 0.5 * (self.per_call + seconds / calls)
        else:
            rate = seconds / max(elements, 1)
            self.per_element = rate if self.per_element is None else 0.5 * (self.per_element + rate)

    def expected(self, calls: int, elements: int) -> float:
        per_element = self.per_element if self.per_element is not None else (self.per_call or 0.0) / self.SMALL
        per_call = self.per_call if self.per_call is not None else per_element * self.SMALL
        return max(calls * per_call, elements * per_element)

    def deadline(self, calls: int, elements: int, floor: float) -> float:
        if not self.known:
            return floor
        return max(floor, HANG_FACTOR * self.expected(calls, elements))


# --------------------------------------------------------------------------------------------
# The session's function, in a worker or in-process
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionGenerator:
    """A generator of the function's, living in the worker: created there from ``seed`` on first
    use (the worker's global RNGs then seeded from ``global_seed``, the audit's global RNG state
    when the handle was made), and advanced by every call it is passed to."""

    key: int
    seed: int
    global_seed: int


_generator_keys = itertools.count(1)


class _Session(AuditedFunction):
    """The worker (or in-process) machinery common to the sampler, decoder and tree levels."""

    level = "sampler"

    def __init__(self, fn: Callable[..., Any] | str, *, timeout_s: float, device: str = "cpu",
                 isolation: str = "none") -> None:
        self.alias_watch = AliasWatch()
        self.timeout_s = float(timeout_s)
        self.device = torch.device(device)
        self.log: CallLog = CallLog()
        self.speed = CallSpeed()
        self.stdout, self.stderr = CapturedStream(), CapturedStream()
        self.note: str | None = None
        self.worker: WorkerProcess | None = None
        self.info: dict[str, Any] = {}
        self.buffer: SharedBuffer | None = None  # shared memory of the calls' tensors (worker sessions)
        self.threads = torch.get_num_threads()  # the worker's intra-op threads: this process's at the start
        self._layout: tuple[tuple, list[int], list[torch.Tensor]] | None = None  # :meth:`_regions`
        self.presenter = Presenter()  # the storages of the inputs, kept across calls
        self.settled = 0  # requests whose inputs were settled (the mutation check)
        self.isolation = check_isolation(isolation)
        self.life_calls = self.life_rows = 0  # calls and rows since the current worker started
        self.fn: Callable[..., Any] | None = None if isinstance(fn, str) else fn
        self.target: WorkerTarget | None = None
        self.cutoff: float | None = None
        self.start_s = 0.0  # seconds the last worker start took (loading the target included)
        if self.isolation == "process":
            target = worker_target(fn)
            if isinstance(target, str):
                self.isolation, self.note = "none", f"ran in the audit's own process: {target}"
            else:
                self.target = target
                try:
                    self._worker()
                except LoadFailed as error:
                    if target.kind == "spec":
                        from specverify.auditing.loading import LoadError

                        self.close()
                        raise LoadError(str(error)) from None
                    self.close()
                    self.isolation, self.target = "none", None
                    self.note = f"ran in the audit's own process: the worker process could not load it ({error})"
                except WorkerLost as lost:
                    from specverify.auditing.loading import LoadError

                    self.close()
                    raise LoadError(f"the worker process could not start: {lost.fault.message}") from None
        self.raw: Callable[..., Any]  # the function called directly, counted in the log (in a worker: RawProxy)
        if self.isolation == "none":
            if isinstance(fn, str):
                from specverify.auditing.loading import load_target

                fn = load_target(fn, self.level)
            self.fn = fn
            self.raw = counted_calls(fn, self.log)
        else:
            self.raw = RawProxy(self)
            self.gate = Gate()

    def _held(self) -> Callable[..., Any]:
        """The function itself, which an in-process session holds."""
        assert self.fn is not None, "an in-process session holds its function"
        return self.fn

    # -- worker lifecycle --------------------------------------------------------------------

    def _worker(self) -> WorkerProcess:
        if self.worker is not None and self.worker.alive():
            return self.worker
        if self.worker is not None:
            self.log.restarts += 1
            self.worker.kill()
        self.life_calls = self.life_rows = 0
        assert self.target is not None, "a worker session knows what its worker loads"
        start_timeout_s, _ = self._within_cutoff(max(START_TIMEOUT_S, self.timeout_s), "starting the worker process")
        began = time.perf_counter()
        self.worker = WorkerProcess(self.target, level=self.level, device=str(self.device),
                                    start_timeout_s=start_timeout_s, stdout=self.stdout, stderr=self.stderr,
                                    threads=self.threads)
        self.info = self.worker.load()
        self.start_s = time.perf_counter() - began
        return self.worker

    def worker_running(self) -> bool:
        return self.worker is not None and self.worker.alive()

    def runs_in_worker(self) -> bool:
        return self.isolation == "process"

    def startup_s(self) -> float:
        """Seconds the next call first spends starting a worker: 0 in-process or while one runs,
        else what the last start took."""
        if self.isolation == "none" or (self.worker is not None and self.worker.alive()):
            return 0.0
        return self.start_s

    def cut_off_at(self, moment: float | None) -> None:
        """Start no call after ``moment`` (a ``time.perf_counter()`` reading; None: no cutoff) and
        stop a call still running then (in a worker: killed; in-process: interrupted as at a
        deadline), raising :class:`~specverify.auditing.isolation.faults.CutOff`."""
        self.cutoff = moment

    def _within_cutoff(self, deadline_s: float, what: str) -> tuple[float, bool]:
        """The deadline of a call starting now: ``deadline_s``, or the seconds to the cutoff when
        fewer (then True); :class:`CutOff` when the cutoff has passed."""
        if self.cutoff is None:
            return deadline_s, False
        left = self.cutoff - time.perf_counter()
        if left <= 0:
            raise CutOff(f"{what}: not started, the caller's cutoff has passed")
        return (left, True) if left < deadline_s else (deadline_s, False)

    def _request(self, message: dict[str, Any], deadline_s: float, what: str, where: str) -> tuple:
        self._send(message, what, where)
        return self._receive(deadline_s, what, where)

    def _send(self, message: dict[str, Any], what: str, where: str) -> None:
        """Send a request to the worker (started first when none runs), not waiting for its reply."""
        try:
            worker = self._worker()
        except WorkerLost:
            if self.cutoff is not None:
                raise CutOff(f"{what}: the worker process did not start before the caller's cutoff") from None
            raise
        self._within_cutoff(0.0, what)
        try:
            worker.send(message, what)
        except WorkerLost as lost:
            self.log.losses.append(f"{where}: {lost.fault.message}")
            raise lost.fault from None

    def _receive(self, deadline_s: float, what: str, where: str) -> tuple:
        """The reply to the oldest request sent, within ``deadline_s`` seconds and the cutoff (a
        request still running at the cutoff is stopped: :class:`CutOff`)."""
        assert self.worker is not None, "a reply is awaited only after a request was sent"
        cut = False
        if self.cutoff is not None:
            left = max(0.0, self.cutoff - time.perf_counter())
            if left < deadline_s:
                deadline_s, cut = left, True
        try:
            assert self.gate is not None, "a worker session has a gate"
            with self.gate.opened():
                return self.worker.receive(deadline_s, what)
        except WorkerLost as lost:
            if cut and lost.fault.kind == "timeout":
                raise CutOff(f"{what}: stopped at the caller's cutoff (the worker process was killed)") from None
            self.log.losses.append(f"{where}: {lost.fault.message}")
            raise lost.fault from None

    def stop_reason(self) -> str | None:
        """Why the function must not be called again (None while it may)."""
        if self.isolation == "none" and any("did not return" in loss for loss in self.log.losses):
            return f"the function hung in {self.log.losses[0].split(':')[0]} (in-process calls cannot be killed)"
        if len(self.log.losses) >= MAX_WORKER_LOSSES:
            places = ", ".join(loss.split(":")[0] for loss in self.log.losses)
            return f"the function hung or ended its process {len(self.log.losses)} times ({places})"
        return None

    def close(self, grace_s: float | None = None) -> None:
        if self.worker is not None:
            self.worker.stop(grace_s)
        self.presenter.forget()
        self._layout = None
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None

    def generator(self, seed: int) -> Any:
        """A fresh generator for the function, seeded with ``seed`` (a handle to one in the worker)."""
        if self.isolation == "none":
            return torch.Generator(device=self.device).manual_seed(seed)
        return FunctionGenerator(next(_generator_keys), int(seed), global_rng_fingerprint())

    def _returned(self, calls: int, rows: int) -> None:
        """Count calls that returned (valid output or not)."""
        self.log.calls += calls
        self.log.rows += rows
        self.life_calls += calls
        self.life_rows += rows

    def _ensure_buffer(self, nbytes: int) -> SharedBuffer:
        if self.buffer is None or self.buffer.size < nbytes:
            self.presenter.forget()
            self._layout = None
            if self.buffer is not None:
                self.buffer.close()
            self.buffer = SharedBuffer.create(nbytes)
        return self.buffer

    def _share_arguments(self, args: Sequence[Any],
                         kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[Slot, torch.Tensor]]]:
        """The fields of a ``raw`` request: ``args`` and ``kwargs`` with every dense CPU tensor
        replaced by its place in the shared buffer, which holds the span of storage it views (so a
        strided view arrives with its strides, its padding and its storage offset), and
        ``shared``: per replaced argument (position or keyword, offset, dtype, span, shape, strides,
        offset in the span); with them, each argument's slot and span, for :meth:`_settle_raw`.

        The spans are presented in the slots of the request's layout: a span the slot holds
        already (the same memory, unchanged, and left as presented by the last call: the worker's
        write guard saw it untouched) is not written again, so a check that calls with the same
        laws again and again copies them once; a view within the span the slot holds (the leading
        rows of the last call's laws) is passed in that span, so calls of fewer rows copy nothing
        either (:meth:`_raw_span`)."""
        places = [(index, value) for index, value in enumerate(args)] + list(kwargs.items())
        tensors = [(key, value) for key, value in places if _shareable(value)]
        if not tensors:
            return {"args": tuple(args), "kwargs": dict(kwargs)}, []
        spans = [self._raw_span(("raw", number), tensor) for number, (_, tensor) in enumerate(tensors)]
        parts: list[tuple[torch.dtype, tuple[int, ...]]] = [(tensor.dtype, (span,))
                                                             for (_, tensor), (_, span) in zip(tensors, spans)]
        offsets, nbytes = layout(parts)
        buffer = self._ensure_buffer(nbytes)
        self.presenter.use_regions(("raw", buffer.path, buffer.size),
                                   {("raw", number): (offset, part) for number, (offset, part)
                                    in enumerate(zip(offsets, parts))})
        shared, presented = [], []
        for number, ((key, tensor), (start, span), offset) in enumerate(zip(tensors, spans, offsets)):
            flat = tensor.as_strided((span,), (1,), start)
            slot = self.presenter.adopt(("raw", number), buffer.tensor(offset, tensor.dtype, (span,)))
            self.presenter.present(slot, flat, 0)
            presented.append((slot, flat))
            shared.append((key, offset, str(tensor.dtype).removeprefix("torch."), span, tuple(tensor.shape),
                           tuple(tensor.stride()), tensor.storage_offset() - start))
        keys = {key for key, _ in tensors}
        return ({"args": tuple(None if index in keys else value for index, value in enumerate(args)),
                 "kwargs": {name: value for name, value in kwargs.items() if name not in keys},
                 "buffer": (buffer.path, buffer.size), "shared": shared,
                 "inputs_bytes": -(-nbytes // PAGE_BYTES) * PAGE_BYTES}, presented)

    def _raw_span(self, key: Hashable, tensor: torch.Tensor) -> tuple[int, int]:
        """``(start, length)`` of the storage elements a ``raw`` argument travels in: the span the
        slot ``key`` holds when ``tensor`` views memory within it, unchanged since it was presented
        (same storage, same version), else the span ``tensor`` reaches (:func:`_storage_span`)."""
        start, span = _storage_span(tensor)
        held = self.presenter.kept(key)
        if held is None or held.source is None:
            return start, span
        source = held.source
        first = int(source.storage_offset())
        if (source.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
                and source.dtype == tensor.dtype and tensor._version == held.version
                and first <= start and start + span <= first + source.numel()):
            return first, int(source.numel())
        return start, span

    def _settle_raw(self, presented: list[tuple[Slot, torch.Tensor]], untouched: bool) -> None:
        """After a ``raw`` call: its slots keep their spans when the worker's write guard saw them
        ``untouched`` (compared all the same on :func:`guard_audited` calls, as :meth:`_mutated`
        does); otherwise they stay unsettled, and the next call writes them
        again.  A direct call's writes into its arguments are not findings: the contract checks
        (``inputs-unchanged``) look for those."""
        if not untouched:
            return
        audited = self._audited()
        for slot, flat in presented:
            self.presenter.settle(slot, flat, compare=audited)

    def _share(self, inputs: dict[str, torch.Tensor], output_shape: tuple[int, int], strided: bool,
               vocab: int) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """Present ``inputs`` in the shared buffer (each in its own region, as a view of a wider
        buffer when ``strided``; a region that holds its input already is not written again,
        :class:`~specverify.auditing.isolation.presentation.Presenter`), after them an int64 output
        region of ``output_shape``; return the input views, the output view and the request fields
        that let the worker rebuild them."""
        shapes = [tuple(t.shape) for t in inputs.values()] + [output_shape]
        parts = tuple((t.dtype, storage_shape(tuple(t.shape),
                                              strided)) for t in inputs.values()) + ((torch.int64, output_shape),)
        buffer, offsets, storages = self._regions(parts)
        header = {"buffer": (buffer.path, buffer.size), "offsets": offsets,
                  "dtypes": [str(dtype).removeprefix("torch.") for dtype, _ in parts],
                  "shapes": [shape for _, shape in parts], "views": shapes, "inputs_bytes": offsets[-1]}
        self.presenter.use_regions((buffer.path, buffer.size),
                                   {name: (offset, part) for name, offset, part in zip(inputs, offsets, parts)})
        views = [self.presenter.present(self.presenter.adopt(name, storage), tensor, decoy_value(name, vocab))
                 for storage, (name, tensor) in zip(storages, inputs.items())]
        return views + [storages[-1]], header

    def _regions(self, parts: tuple[tuple[torch.dtype, tuple[int, ...]], ...]
                 ) -> tuple[SharedBuffer, list[int], list[torch.Tensor]]:
        """The shared buffer, the offsets of ``parts`` (dtype, shape) in it, the last on a page of its
        own (:func:`~specverify.auditing.isolation.process.layout`), and their tensors; kept while
        the buffer and the parts stay the same (a new buffer forgets them: :meth:`_ensure_buffer`)."""
        if self._layout is None or self._layout[0] != parts:
            offsets, nbytes = layout(list(parts), last_on_page=True)
            buffer = self._ensure_buffer(nbytes)
            storages = [buffer.tensor(offset, dtype, shape) for offset, (dtype, shape) in zip(offsets, parts)]
            self._layout = parts, offsets, storages
        assert self.buffer is not None, "the regions are kept with the buffer they were made in"
        _, offsets, storages = self._layout
        return self.buffer, offsets, storages

    def _present(self, inputs: dict[str, torch.Tensor], strided: bool, vocab: int) -> dict[str, torch.Tensor]:
        """``inputs`` in storages of this process kept across calls (in-process sessions; as views of
        wider buffers when ``strided``)."""
        presenter = self.presenter
        return {name: presenter.present(presenter.slot(name, storage_shape(tuple(tensor.shape), strided), tensor.dtype,
                                                       self.device), tensor, decoy_value(name, vocab))
                for name, tensor in inputs.items()}

    def _mutated(self, inputs: dict[str, torch.Tensor], untouched: bool = False) -> list[str]:
        """The inputs a request's calls modified in place, compared with what was presented
        (:meth:`~specverify.auditing.isolation.presentation.Presenter.settle`) where the worker's
        write guard cannot vouch for them (not ``untouched``) and on :func:`guard_audited`
        requests all the same, so that a write the guard cannot see is found too."""
        compare = self._audited() or not untouched
        return [name for name, tensor in inputs.items()
                if self.presenter.settle(self.presenter.slots[name], tensor, compare=compare)]

    def _audited(self) -> bool:
        """Count a settled request; whether it is one whose guarded inputs are compared all the
        same (:func:`guard_audited`)."""
        self.settled += 1
        return guard_audited(self.settled)

    def declared(self, name: str) -> Any:
        """The function's declared attribute ``name`` (one of :data:`DECLARED_ATTRIBUTES`), None when absent."""
        if self.isolation == "none":
            return getattr(self.fn, name, None)
        return self.info.get("declared", {}).get(name)

    def describe(self) -> dict[str, Any]:
        """The report's ``isolation`` entry: mode, note, restarts, captured output."""
        entry: dict[str, Any] = {"mode": self.isolation}
        if self.note:
            entry["note"] = self.note
        if self.log.restarts:
            entry["worker_restarts"] = self.log.restarts
        for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)):
            summary = stream.summary()
            if summary:
                entry[name] = summary
        return entry

    def _in_process(self, call: Callable[[], Any], deadline_s: float, what: str, where: str) -> Any:
        deadline_s, cut = self._within_cutoff(deadline_s, what)
        try:
            return call_with_deadline(call, (), deadline_s, what=what)
        except Fault as fault:
            if fault.kind == "timeout" and cut:
                raise CutOff(f"{what}: stopped at the caller's cutoff") from None
            if fault.kind == "timeout":
                self.log.losses.append(f"{where}: {fault.message}")
            raise


class GuardedFunction(_Session):
    """The SPEC §1 function of an audit, called on a harness proposal (``target_probs``,
    ``draft_probs``, ``draft_tokens``) with every guard: see the module docstring.

    ``isolation="none"`` (the default for direct use, e.g. in tests of the harness) calls it in
    this process; :func:`specverify.audit` uses ``"process"``.
    """

    level = "sampler"

    # -- calls -------------------------------------------------------------------------------

    def __call__(self, proposal: Any, generator: Any, *, where: str,
                 strided: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One call on the whole proposal; returns ``(emitted, lengths)``."""
        return self.call_groups(proposal, generator, [proposal.target_probs.shape[0]], where=where, strided=strided)

    def call_groups(self, proposal: Any, generator: Any, sizes: Sequence[int], *, where: str,
                    strided: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One call per group of consecutive rows (``sizes`` sum to the proposal's rows), all with
        ``generator``: how engines call a sampler with one row, small batches or ragged ones.
        ``strided``: the inputs arrive as views of wider buffers (:mod:`specverify.auditing.isolation.presentation`).

        The output is validated against SPEC §1 (a broken layout is a ``malformed`` fault) and
        against the law: tokens no lossless rule emits (a non-draft token in an accepted slot, a
        token of target probability 0) are an ``impossible`` fault, a loss."""
        vocab = proposal.target_probs.shape[-1]
        _check_sizes(proposal, sizes)
        if self.isolation == "none":
            emitted = self._groups_in_process(proposal, generator, sizes, where, strided)
        else:
            emitted = self._groups_in_worker(proposal, generator, sizes, where, strided)
        return validate_emitted(emitted, proposal.draft_tokens, vocab, proposal.target_probs,
                                num_draft_tokens=_num_draft_tokens(proposal))

    def _chunks(self, sizes: Sequence[int], per_row: int) -> list[tuple[int, int]]:
        """Consecutive ranges of groups, each one request of about TARGET_REQUEST_S expected seconds
        (the first request of a session: one group, to measure the speed).  Only the transport
        depends on the speed: every group is one call of the function, whatever the ranges."""
        chunks, start = [], 0
        while start < len(sizes):
            stop = start + 1
            if self.speed.known:
                rows = sizes[start]
                while stop < len(sizes) and self.speed.expected(stop + 1 - start,
                                                                (rows + sizes[stop]) * per_row) <= TARGET_REQUEST_S:
                    rows += sizes[stop]
                    stop += 1
            chunks.append((start, stop))
            start = stop
        return chunks

    def _probe_first(self, proposal: Any, sizes: Sequence[int], where: str, strided: bool) -> None:
        """Before a first call of unknown speed and more than PROBE_ELEMENTS entries, call the
        function on a few of its rows (throwaway generator, output validated and discarded)."""
        per_row = _entries_per_row(proposal)
        if self.speed.known or sizes[0] == 1 or sizes[0] * per_row <= PROBE_ELEMENTS:
            return
        rows = max(1, min(sizes[0] - 1, PROBE_ELEMENTS // per_row))
        probe = type(proposal)(*(t[:rows] for t in proposal))
        self.call_groups(probe, self.generator(0), [rows], where=f"{where}, speed probe", strided=strided)
        self.log.calls -= 1
        self.log.rows -= rows
        self.log.probe_calls += 1

    def _groups_in_process(self, proposal: Any, generator: Any, sizes: Sequence[int], where: str,
                           strided: bool) -> torch.Tensor:
        self._probe_first(proposal, sizes, where, strided)
        vocab = proposal.target_probs.shape[-1]
        per_row = _entries_per_row(proposal)
        names = ("target_probs", "draft_probs", "draft_tokens")
        passed = self._present({name: getattr(proposal, name) for name in names}, strided, vocab)
        ragged = _num_draft_tokens(proposal)
        outputs, start = [], 0
        for number, rows in enumerate(sizes):
            what = (f"the function (in {where})" if len(sizes) == 1
                    else f"the function (in {where}, call {number + 1} of {len(sizes)})")
            args = tuple(passed[name][start:start + rows] for name in names) + (generator,)
            keywords = {} if ragged is None else {
                "num_draft_tokens": ragged[start:start + rows].clone().to(self.device)}
            started = time.perf_counter()
            try:
                result = self._in_process(functools.partial(self._held(), *args, **keywords),
                                          self.speed.deadline(1, rows * per_row, self.timeout_s),
                                          what, where)
            except Fault as fault:
                if fault.kind == "exception" and fault.__cause__ is not None:
                    raise Fault("exception", exception_message(fault.__cause__, what)) from None
                raise
            seconds = time.perf_counter() - started
            self.speed.record(1, rows * per_row, seconds)
            self.log.function_seconds += seconds
            self._returned(1, rows)
            if self.alias_watch.after_call(result) and not self.log.aliasing:
                self.log.aliasing.append(f"{where}: {ALIASING_MESSAGE}")
            outputs.append(checked_emitted(result, proposal.draft_tokens[start:start + rows], vocab))
            start += rows
        changed = self._mutated({name: getattr(proposal, name) for name in names})
        if changed:
            self.log.mutations.append(f"{where}: modified {', '.join(changed)} in place")
        return torch.cat(outputs)

    def _groups_in_worker(self, proposal: Any, generator: Any, sizes: Sequence[int], where: str,
                          strided: bool) -> torch.Tensor:
        self._probe_first(proposal, sizes, where, strided)
        inputs, views, header = self._shared_proposal(proposal, generator, where, strided)
        per_row = _entries_per_row(proposal)
        first_row = [0]
        for size in sizes:
            first_row.append(first_row[-1] + size)
        untouched = True
        for start, stop in self._chunks(sizes, per_row):
            rows = first_row[stop] - first_row[start]
            deadline = self.speed.deadline(stop - start, rows * per_row, self.timeout_s)
            what = _calls_phrase(where, start, stop, len(sizes))
            header.update(groups=list(sizes[start:stop]), row=first_row[start])
            self._send(dict(header), what, where)
            reply = self._receive(deadline, what, where)
            untouched = self._accounted(reply, sizes, start, stop, per_row, where) and untouched
        self._settle(inputs, untouched, where)
        return views[-1].clone()

    def _shared_proposal(self, proposal: Any, generator: Any, where: str,
                         strided: bool) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], dict[str, Any]]:
        """The proposal's inputs by name, their views in the shared buffer (the output region last)
        and the header of a ``steps`` request on them (:meth:`_share`)."""
        if not isinstance(generator, FunctionGenerator):
            raise ValueError("generator: pass a generator made by GuardedFunction.generator(seed)")
        target, draft, tokens = proposal.target_probs, proposal.draft_probs, proposal.draft_tokens
        batch, width, vocab = target.shape
        inputs = {"target_probs": target, "draft_probs": draft, "draft_tokens": tokens}
        ragged = _num_draft_tokens(proposal)
        if ragged is not None:
            inputs["num_draft_tokens"] = ragged
        views, header = self._share(inputs, (batch, width), strided, vocab)
        header.update(op="steps", generator=generator, where=where, ragged=ragged is not None)
        return inputs, views, header

    def _accounted(self, reply: tuple, sizes: Sequence[int], start: int, stop: int, per_row: int,
                   where: str) -> bool:
        """Count the calls ``start..stop−1`` of a ``steps`` reply (a fault reply raises its Fault,
        counting the calls that returned); True when the write guard saw the inputs untouched."""
        if reply[0] == "fault":
            _, kind, message, number = reply
            returned = number + (kind in ("malformed", "impossible"))
            self._returned(returned, sum(sizes[start:start + returned]))
            call = f"call {start + number + 1} of {len(sizes)}, " if len(sizes) > 1 else ""
            raise Fault(kind, message.replace("{what}", f"the function (in {call}{where})"))
        _, seconds, aliased, untouched = reply
        rows = sum(sizes[start:stop])
        self._returned(stop - start, rows)
        self.speed.record(stop - start, rows * per_row, seconds)
        self.log.function_seconds += seconds
        if aliased and not self.log.aliasing:
            self.log.aliasing.append(f"{where}: {ALIASING_MESSAGE}")
        return bool(untouched)

    def _settle(self, inputs: dict[str, torch.Tensor], untouched: bool, where: str) -> None:
        changed = self._mutated(inputs, untouched)
        if changed:
            self.log.mutations.append(f"{where}: modified {', '.join(changed)} in place")

    # -- calls whose audit work overlaps the function's --------------------------------------

    def call_each(self, items: Iterable[tuple[Any, Any]], generator: Any, *, where: str,
                  strided: bool = False) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        """One call on each ``(tag, proposal)`` of ``items``, in order, all with ``generator``;
        yields ``(tag, emitted, lengths)``, each as :meth:`__call__` returns it (``tag`` is
        whatever the caller needs back, e.g. the rows' chains); the audit's work overlaps the
        function's as in :meth:`call_each_in_groups`."""
        return self.call_each_in_groups(((tag, proposal, None) for tag, proposal in items), generator,
                                        where=where, strided=strided)

    def call_each_in_groups(self, items: Iterable[tuple[Any, Any, Sequence[int] | None]], generator: Any, *,
                            where: str, strided: bool = False) -> Iterator[tuple[Any, torch.Tensor, torch.Tensor]]:
        """One call per group of each ``(tag, proposal, sizes)`` of ``items``, in order, all with
        ``generator`` (``sizes`` None: one call on the whole proposal); yields ``(tag, emitted,
        lengths)``, each as :meth:`call_groups` returns it.

        The audit's work overlaps the function's: ``items`` is advanced (building proposal i+1)
        before the output of proposal i is awaited, and in a worker proposal i+1 is sent before the
        output of proposal i is validated and yielded, so the function runs on i+1 while the caller
        uses the output of i.  The calls, their arguments and their order are those of one
        :meth:`call_groups` per proposal; in-process the items are taken in the same order.  A
        request still running when the caller stops (an exception, a ``break``) is awaited and
        its output discarded, so the next call finds the worker idle."""
        iterator = iter(items)
        current = next(iterator, None)
        if self.isolation == "none":
            while current is not None:
                upcoming = next(iterator, None)
                tag, proposal, sizes = current
                yield (tag, *self.call_groups(proposal, generator, _sizes(proposal, sizes), where=where,
                                              strided=strided))
                current = upcoming
            return
        in_flight: _InFlight | None = None
        try:
            while current is not None:
                tag, proposal, sizes = current
                if in_flight is None:
                    in_flight = self._sent(proposal, _sizes(proposal, sizes), generator, where, strided)
                upcoming = next(iterator, None)
                done, in_flight = in_flight, None
                output = self._output(done)
                if upcoming is not None:
                    in_flight = self._sent(upcoming[1], _sizes(upcoming[1], upcoming[2]), generator, where, strided)
                yield (tag, *validate_emitted(output, proposal.draft_tokens, proposal.target_probs.shape[-1],
                                              proposal.target_probs, num_draft_tokens=_num_draft_tokens(proposal)))
                current = upcoming
        finally:
            if in_flight is not None and in_flight.header is not None:
                try:
                    self._output(in_flight)
                except (Fault, CutOff):  # counted in the log; the caller's own exception is what propagates
                    pass

    def _sent(self, proposal: Any, sizes: Sequence[int], generator: Any, where: str, strided: bool) -> _InFlight:
        """The calls on the groups ``sizes`` of ``proposal``, sent to the worker in one request, not
        awaited; while the function's speed is not known yet (the first call of a session, its
        speed probe), made at once instead."""
        _check_sizes(proposal, sizes)
        if not self.speed.known:
            return _InFlight(output=self._groups_in_worker(proposal, generator, sizes, where, strided))
        inputs, views, header = self._shared_proposal(proposal, generator, where, strided)
        per_row = _entries_per_row(proposal)
        header.update(groups=list(sizes), row=0)
        what = _calls_phrase(where, 0, len(sizes), len(sizes))
        self._send(header, what, where)
        return _InFlight(header=header, inputs=inputs, output=views[-1], sizes=list(sizes), per_row=per_row,
                         what=what, where=where,
                         deadline_s=self.speed.deadline(len(sizes), sum(sizes) * per_row, self.timeout_s))

    def _output(self, call: _InFlight) -> torch.Tensor:
        """The output of ``call`` (awaited when it was sent), accounted and settled as
        :meth:`_groups_in_worker` does; a fresh tensor."""
        if call.header is None:
            return call.output
        reply = self._receive(call.deadline_s, call.what, call.where)
        untouched = self._accounted(reply, call.sizes, 0, len(call.sizes), call.per_row, call.where)
        self._settle(call.inputs, untouched, call.where)
        return call.output.clone()


@dataclass
class _InFlight:
    """A call of :meth:`GuardedFunction.call_each`: sent to the worker (``header`` set; ``output``
    is its output region, ``inputs`` what it was given) or already made (``header`` None,
    ``output`` its output)."""

    output: torch.Tensor
    header: dict[str, Any] | None = None
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)
    per_row: int = 0
    what: str = ""
    where: str = ""
    deadline_s: float = 0.0


def _check_sizes(proposal: Any, sizes: Sequence[int]) -> None:
    """Raise when the groups ``sizes`` are not positive sizes summing to ``proposal``'s rows."""
    rows = proposal.target_probs.shape[0]
    if sum(sizes) != rows or any(size < 1 for size in sizes):
        raise ValueError(f"sizes: expected positive group sizes summing to {rows}, got {list(sizes)[:8]}…")


def _calls_phrase(where: str, start: int, stop: int, count: int) -> str:
    """Who a request of calls ``start..stop−1`` of ``count`` is, in a fault's message."""
    return (f"the function (in {where})" if count == 1 else
            f"the function (in {where}, calls {start + 1}–{stop} of {count})")


def _sizes(proposal: Any, sizes: Sequence[int] | None) -> Sequence[int]:
    """The groups of calls on ``proposal``: ``sizes``, or one call on all its rows when None."""
    return [proposal.target_probs.shape[0]] if sizes is None else sizes


def _entries_per_row(proposal: Any) -> int:
    """Probability entries of one row of ``proposal`` (K+1 target and K draft laws of V entries)."""
    _, width, vocab = proposal.target_probs.shape
    return (2 * width - 1) * vocab


def _num_draft_tokens(proposal: Any) -> torch.Tensor | None:
    """The rows' draft counts of a :class:`~specverify.testing.harness.RaggedProposal` (the call then
    passes ``num_draft_tokens=``, docs/spec.md §1); None for a plain proposal."""
    from specverify.testing.harness import RaggedProposal

    return proposal.num_draft_tokens if isinstance(proposal, RaggedProposal) else None


def _shareable(value: Any) -> bool:
    """A dense CPU tensor with elements, which the shared buffer can carry with its layout."""
    return (isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.layout == torch.strided
            and value.numel() > 0 and not value.requires_grad)


def _storage_span(tensor: torch.Tensor) -> tuple[int, int]:
    """``(start, length)``: the elements of ``tensor``'s storage its view reaches, from its first
    to its last (strides are non-negative in torch)."""
    reach = sum((int(size) - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return int(tensor.storage_offset()), reach + 1


class RawProxy:
    """``session.raw`` in a worker session: calls the function there with arbitrary arguments,
    e.g. ``uniforms=`` for the exact checks; CPU tensors among them travel through the shared
    buffer with their layout (:meth:`_Session._share_arguments`), the rest pickled.  Its signature
    is the function's; each call that returns is counted in the log, with the seconds the worker
    measured around it."""

    def __init__(self, function: _Session) -> None:
        self._function = function

    @property
    def __signature__(self) -> inspect.Signature:
        parameters = [inspect.Parameter(name, kind, default=None if has_default else inspect.Parameter.empty)
                      for name, kind, has_default in self._function.info.get("parameters", ())]
        try:
            return inspect.Signature(parameters)
        except ValueError:
            return inspect.Signature()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        function = self._function
        fields, presented = function._share_arguments(args, kwargs)
        reply = function._request({"op": "raw", **fields}, function.timeout_s, "the function", "a direct call")
        if reply[0] == "raw-error":
            _, name, message = reply
            raise type(name, (Exception,), {})(message)
        _, result, seconds, untouched = reply
        function._settle_raw(presented, untouched)
        function.log.function_seconds += seconds
        function.log.calls += 1
        return result


def counted_calls(fn: Callable[..., Any], log: CallCounts) -> Callable[..., Any]:
    """``session.raw`` in-process: ``fn`` itself (its signature and attributes), each call that
    returns counted in ``log`` with its seconds, as :class:`RawProxy` counts a worker's."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        log.function_seconds += time.perf_counter() - started
        log.calls += 1
        return result

    return call


class GuardedGenerate(_Session):
    """The SPEC §2 function of an audit, called with the tiny models of
    :class:`specverify.auditing.decoder.battery.DecoderModels`: in a worker, which builds the same models
    itself (deterministic construction) and checks after every call that their parameters and
    ``input_ids`` are unchanged (restoring the models when they changed); in-process, on the
    parent's models."""

    level = "decoder"

    def __init__(self, fn: Callable[..., Any] | str, models: Any, *, timeout_s: float, isolation: str = "none") -> None:
        self.models = models
        super().__init__(fn, timeout_s=timeout_s, device=str(models.device), isolation=isolation)

    def __call__(self, stratum: Any, max_new_tokens: int, seed: int, *, where: str) -> torch.Tensor:
        """One call on ``stratum`` (a :class:`~specverify.auditing.decoder.battery.Stratum`: settings,
        prompt, and the model pair it runs on)."""
        from specverify.auditing.isolation.faults import validate_new_tokens

        setting, prompt = stratum.setting, stratum.prompt
        what = f"generate (in {where})"
        deadline = self.speed.deadline(1, 0, self.timeout_s)
        if self.isolation == "process":
            message = {"op": "generate", "models": stratum.models, "prompt": list(prompt),
                       "max_new_tokens": max_new_tokens,
                       "temperature": setting.temperature, "top_k": setting.top_k, "top_p": setting.top_p,
                       "seed": seed, "global_seed": global_rng_fingerprint()}
            reply = self._request(message, deadline, what, where)
            if reply[0] == "fault":
                self.log.calls += reply[1] == "malformed"  # it returned, but not a valid output
                raise Fault(reply[1], reply[2].replace("{what}", what))
            _, tokens, seconds, mutated, changed = reply
            tokens = torch.tensor(tokens, dtype=torch.int64)
            if changed:
                self.log.model_changes.append(f"{where}: modified the parameters of the {' and '.join(changed)} model")
        else:
            original = torch.tensor([prompt], dtype=torch.int64, device=self.models.device)
            passed = original.clone()

            target, draft = self.models.pair(stratum.models)

            def call() -> Any:
                return self._held()(target, draft, passed, max_new_tokens=max_new_tokens,
                                    temperature=setting.temperature, top_k=setting.top_k, top_p=setting.top_p,
                                    seed=seed)

            started = time.perf_counter()
            try:
                result = self._in_process(call, deadline, what, where)
            except Fault as fault:
                if fault.kind == "exception" and fault.__cause__ is not None:
                    raise Fault("exception", exception_message(fault.__cause__, what)) from None
                raise
            seconds = time.perf_counter() - started
            tokens = validate_new_tokens(result, max_new_tokens, self.models.vocab_size).clone()
            mutated = not torch.equal(passed, original)
        self.speed.record(1, 0, seconds)
        self.log.function_seconds += seconds
        self.log.calls += 1
        self.log.rows += 1
        if mutated:
            self.log.mutations.append(f"{where}: modified input_ids in place")
        return tokens


TREE_INPUTS = ("target_probs", "draft_probs", "tree_tokens", "parents")


class GuardedTreeFunction(_Session):
    """The SPEC §3 ``verify_tree`` function of an audit, called on a harness tree proposal
    (``target_probs``, ``draft_probs``, ``tree_tokens``, ``parents``) with every guard of
    :class:`GuardedFunction`: in a worker (the four tensors and the output cross by shared
    memory; killed at the deadline, restarted after an abnormal end) or in this process.
    ``draft_schemes`` is the function's declared ``draft_schemes`` attribute (None when absent)."""

    level = "tree"

    def __init__(self, fn: Callable[..., Any] | str, *, timeout_s: float, device: str = "cpu",
                 isolation: str = "none") -> None:
        super().__init__(fn, timeout_s=timeout_s, device=device, isolation=isolation)
        self.draft_schemes = self.declared("draft_schemes")

    def __call__(self, proposal: Any, generator: Any, *, where: str,
                 strided: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One call on the whole proposal; returns ``(emitted, lengths, last_node)`` (SPEC §3
        validated: the accepted tokens are a root-to-node path of each row's tree, else an
        ``impossible`` fault, as is a token of target probability 0).  ``strided``: the inputs
        arrive as views of wider buffers (:mod:`specverify.auditing.isolation.presentation`)."""
        from specverify.auditing.isolation.faults import validate_tree_emitted

        batch, nodes = proposal.tree_tokens.shape
        vocab = proposal.target_probs.shape[-1]
        elements = (2 * nodes + 1) * vocab * batch
        deadline = self.speed.deadline(1, elements, self.timeout_s)
        what = f"the function (in {where})"
        if self.isolation == "none":
            emitted, seconds = self._tree_in_process(proposal, generator, deadline, what, where, strided)
        else:
            emitted, seconds = self._tree_in_worker(proposal, generator, deadline, what, where, strided)
        self.speed.record(1, elements, seconds)
        self.log.function_seconds += seconds
        return validate_tree_emitted(emitted, proposal.tree_tokens, proposal.parents, vocab, proposal.target_probs)

    def _tree_in_process(self, proposal: Any, generator: Any, deadline: float, what: str,
                         where: str, strided: bool) -> tuple[Any, float]:
        originals = {name: getattr(proposal, name) for name in TREE_INPUTS}
        passed = self._present(originals, strided, proposal.target_probs.shape[-1])
        started = time.perf_counter()
        try:
            result = self._in_process(lambda: self._held()(*passed.values(), generator), deadline, what, where)
        except Fault as fault:
            if fault.kind == "exception" and fault.__cause__ is not None:
                raise Fault("exception", exception_message(fault.__cause__, what)) from None
            raise
        seconds = time.perf_counter() - started
        self._returned(1, proposal.tree_tokens.shape[0])
        if self.alias_watch.after_call(result) and not self.log.aliasing:
            self.log.aliasing.append(f"{where}: {ALIASING_MESSAGE}")
        changed = self._mutated(originals)
        if changed:
            self.log.mutations.append(f"{where}: modified {', '.join(changed)} in place")
        try:
            emitted = emitted_tensor(result)
            return torch.Tensor.clone(emitted.detach()).as_subclass(torch.Tensor), seconds
        except Exception:
            return result, seconds  # validated (and reported as malformed) by the caller

    def _tree_in_worker(self, proposal: Any, generator: Any, deadline: float, what: str,
                        where: str, strided: bool) -> tuple[torch.Tensor, float]:
        if not isinstance(generator, FunctionGenerator):
            raise ValueError("generator: pass a generator made by GuardedTreeFunction.generator(seed)")
        named = {name: getattr(proposal, name) for name in TREE_INPUTS}
        batch, nodes = proposal.tree_tokens.shape
        views, message = self._share(named, (batch, nodes + 1), strided, proposal.target_probs.shape[-1])
        message.update(op="tree", generator=generator)
        reply = self._request(message, deadline, what, where)
        if reply[0] == "fault":
            _, kind, text, _ = reply
            returned = kind in ("malformed", "impossible")
            self._returned(int(returned), batch if returned else 0)
            raise Fault(kind, text.replace("{what}", what))
        _, seconds, aliased, untouched = reply
        self._returned(1, batch)
        if aliased and not self.log.aliasing:
            self.log.aliasing.append(f"{where}: {ALIASING_MESSAGE}")
        changed = self._mutated(named, untouched)
        if changed:
            self.log.mutations.append(f"{where}: modified {', '.join(changed)} in place")
        return views[4].clone(), seconds
