"""Process isolation of the function under audit: a worker process, shared-memory transport,
deadlines enforced by killing, restart, and the mapping of every abnormal end to a :class:`Fault`.

The audit runs third-party code.  With ``isolation="process"`` (the default of
:func:`specverify.audit` and of ``specverify audit``) that code runs in a worker process; the
harness, the statistics and the verdict stay in the parent, which the function cannot reach:

- **Spawned, not forked.**  The worker is a fresh interpreter (``python -m
  specverify.auditing.isolation.worker``) started in its own session (a terminal's Ctrl-C reaches only the
  parent), in a scratch temporary working directory (files it deletes or writes there are not the
  user's), with its stdout and stderr on pipes that the parent drains into capped buffers (the
  first :data:`CAPTURE_BYTES` of each are kept and shown in the report, the rest only counted).
  It loads the target itself from its target string (``file.py:fn``, ``pkg.mod:fn``, a built-in
  name, ``catalog:<name>``), or unpickles a module-level callable by reference.  (A
  ``multiprocessing`` spawn context would re-import the caller's ``__main__`` in the worker,
  re-running an unguarded user script; a plain interpreter does not.)  Starting it is
  :mod:`specverify.auditing.isolation.spawn`'s; ``specverify audit`` starts the first one early.
- **Shared memory.**  Tensors cross through one memory-mapped file (in ``/dev/shm`` where there is
  room), preallocated and reused by every call, grown by doubling when a call needs more: the
  parent writes a call's inputs into it, the worker passes views of it to the function and copies
  the output into it at once, before the next call could overwrite a buffer the function reuses.
  Only small headers are pickled over the control socket.
- **Deadlines by killing.**  The parent waits for each reply for at most the call's deadline
  (see :class:`specverify.auditing.isolation.guarded.CallSpeed`); past it the worker's process group is
  killed (``SIGKILL``), whatever the function did to its signals, and a fresh worker is started
  for the next call.
- **Every abnormal end is a Fault** of a kind that makes the audit "could not audit" (exit 2):
  an exit of the process (``os._exit``, ``sys.exit`` from a thread) → "the function ended the
  process (exit status N)"; a signal → "killed by signal SIGSEGV" (``SIGKILL`` not sent by the
  audit names the out-of-memory killer as the likely sender); a lost socket → "lost the
  connection"; the deadline → "did not return within … s".  ``KeyboardInterrupt`` and
  ``SystemExit`` raised by the function are exceptions of the function (the worker ignores
  ``SIGINT``), not the user's Ctrl-C.
- **Nothing keeps the audit alive**: the worker is asked to stop (it ends with ``os._exit``), and
  its process group is killed after :data:`STOP_GRACE_S` if it has not (a function that holds the
  worker's main thread, e.g. a thread that never yields the GIL), so non-daemon threads the
  function started die with it; no wait of the shutdown is unbounded
  (:data:`SHUTDOWN_BOUND_S` in all).

``isolation="none"`` calls the function in the audit's own process (faster to start, needed for
closures and lambdas, which cannot cross a process boundary; a callable that cannot be sent to
a worker falls back to it with a note in the report).  Then the caller's torch default dtype,
torch thread count and numpy error state are saved and restored around the audit
(:func:`preserved_process_state`).
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
import pickle
import random
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specverify.auditing.isolation.faults import Fault
from specverify.auditing.isolation.spawn import spawn, take
from specverify.errors import SpecverifyError

ISOLATION_MODES = ("process", "none")

CAPTURE_BYTES = 64 * 1024
"""Bytes of the worker's stdout and of its stderr kept for the report (the rest is counted only)."""

REPORT_LINES = 20
"""Lines of captured output shown in the report."""

START_TIMEOUT_S = 180.0
"""Longest wait for a worker to import torch and load the target (never below the call timeout)."""

STOP_GRACE_S = 1.0
"""How long a worker asked to stop may take to end by itself before its process group is killed."""

REAP_TIMEOUT_S = 2.0
"""Longest wait for a killed worker to be reaped (one that outlives SIGKILL is stuck in the kernel
and left behind)."""

DRAIN_TIMEOUT_S = 1.0
"""Longest wait, per pipe, for the last output of an ended worker (a pipe still held open by a
process the function started in another session is abandoned)."""

KILL_BOUND_S = REAP_TIMEOUT_S + 2 * DRAIN_TIMEOUT_S
"""The longest a kill of the worker (:meth:`WorkerProcess.kill`: SIGKILL, reaping, draining its
pipes) takes, whatever the function does; milliseconds unless the function left a process behind."""

SHUTDOWN_BOUND_S = STOP_GRACE_S + KILL_BOUND_S
"""The longest a worker's shutdown (:meth:`WorkerProcess.stop`) takes, whatever the function does."""

_ALIGN = 64
_FILE_MODULE_PREFIX = "_specverify_target_"


def check_isolation(isolation: str) -> str:
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation: expected 'process' (run the function in a worker process) or 'none' "
                         f"(in the audit's process), got {isolation!r}")
    return isolation


# --------------------------------------------------------------------------------------------
# What the worker loads
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerTarget:
    """How the worker obtains the function: ``kind`` ``"spec"`` (a target string for
    :func:`specverify.auditing.loading.load_target`) or ``"pickle"`` (a callable pickled by
    reference); ``value`` the string or the bytes."""

    kind: str
    value: Any


def worker_target(fn: Callable[..., Any] | str) -> WorkerTarget | str:
    """The :class:`WorkerTarget` for ``fn``, or the reason (a string) why it cannot run in a worker.

    Target strings travel as they are (a file path made absolute, since the worker runs in a
    scratch directory).  A callable loaded from a file travels as ``path:qualname``; other
    callables are pickled by reference (module-level functions and classes); lambdas, closures
    and functions of ``__main__`` cannot be.
    """
    if isinstance(fn, str):
        return WorkerTarget("spec", absolute_spec(fn))
    module_name = getattr(fn, "__module__", None) or ""
    qualname = getattr(fn, "__qualname__", "")
    module_file = getattr(sys.modules.get(module_name), "__file__", None)
    if module_name.startswith(_FILE_MODULE_PREFIX) and module_file and "<" not in qualname and "." not in qualname:
        return WorkerTarget("spec", f"{module_file}:{qualname}")
    if module_name == "__main__":
        return "it is defined in __main__, which a worker process does not re-run"
    try:
        return WorkerTarget("pickle", pickle.dumps(fn))
    except Exception as error:  # lambdas, closures, local classes
        return f"it cannot be pickled by reference ({type(error).__name__}: {error})"


def absolute_spec(spec: str) -> str:
    """``spec`` with a relative ``file.py`` location made absolute (the worker runs elsewhere)."""
    if ":" not in spec or spec.startswith("catalog:"):
        return spec
    location, attribute = spec.rsplit(":", 1)
    if location.endswith(".py") or "/" in location or "\\" in location:
        return f"{Path(location).resolve()}:{attribute}"
    return spec


# --------------------------------------------------------------------------------------------
# Shared memory
# --------------------------------------------------------------------------------------------


class SharedBuffer:
    """A memory-mapped file both processes map; tensors are views of it at aligned offsets.

    The parent creates it (:meth:`create`), the worker opens it by path (:meth:`open`).  It lives
    in ``/dev/shm`` when that has room for it, otherwise in the temporary directory.
    """

    def __init__(self, path: str, size: int, *, owner: bool) -> None:
        self.path, self.size, self.owner = path, size, owner
        descriptor = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)

    @classmethod
    def create(cls, size: int) -> SharedBuffer:
        size = max(1 << 20, 1 << (size - 1).bit_length())
        directory = "/dev/shm" if _has_room("/dev/shm", 2 * size) else tempfile.gettempdir()
        descriptor, path = tempfile.mkstemp(prefix="specverify-shm-", dir=directory)
        try:
            os.ftruncate(descriptor, size)
        finally:
            os.close(descriptor)
        return cls(path, size, owner=True)

    @classmethod
    def open(cls, path: str, size: int) -> SharedBuffer:
        return cls(path, size, owner=False)

    @functools.cached_property
    def address(self) -> int:
        """Where this process maps the buffer (a page boundary)."""
        return torch.frombuffer(self.map, dtype=torch.uint8, count=1).data_ptr()

    def tensor(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        count = int(np.prod(shape)) if shape else 1
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.map, dtype=dtype, count=count, offset=offset).view(shape)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view is still alive; the mapping goes with the process
            pass
        if self.owner:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _has_room(directory: str, size: int) -> bool:
    try:
        stat = os.statvfs(directory)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize > size


def layout(parts: list[tuple[torch.dtype, tuple[int, ...]]], *,
           last_on_page: bool = False) -> tuple[list[int], int]:
    """Aligned byte offsets of consecutive tensors and the bytes they need in all; ``last_on_page``:
    the last tensor starts on a page boundary, so that the ones before it fill whole pages of their
    own (:class:`~specverify.auditing.isolation.write_guard.WriteGuard`)."""
    offsets, position = [], 0
    for number, (dtype, shape) in enumerate(parts):
        if last_on_page and number == len(parts) - 1:
            position = -(-position // mmap.PAGESIZE) * mmap.PAGESIZE
        offsets.append(position)
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size() if shape else 8
        position += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return offsets, max(position, _ALIGN)


# --------------------------------------------------------------------------------------------
# Global state
# --------------------------------------------------------------------------------------------


def global_rng_fingerprint() -> int:
    """A 63-bit digest of the caller's global torch, numpy and ``random`` RNG states (without
    advancing them).  The worker seeds its own global RNGs from it, so a function that draws from
    the global RNGs sees the same states whenever the audit has seeded its own RNGs the same way,
    and other states when it has not: the randomness-source and determinism checks mean the same
    in a worker as in-process."""
    digest = hashlib.sha256(torch.random.get_rng_state().numpy().tobytes())
    kind, keys, position, *_ = np.random.get_state()
    digest.update(np.asarray(keys).tobytes() + int(position).to_bytes(8, "little"))
    digest.update(repr(random.getstate()).encode())
    return int.from_bytes(digest.digest()[:8], "little") >> 1


AUDIT_THREADS = 1
"""Torch intra-op threads of the audit's own process while the function's calls run in a worker
process, which keeps the threads the audit's process had when the session opened.  The audit
builds and checks one call while the function runs another
(:meth:`~specverify.auditing.isolation.guarded.GuardedFunction.call_each`): on more threads its
parallel operations would wait for threads that the function's process holds the cores from
(on 2 cores the production-shape checks took 1.1× as long)."""


def use_audit_threads() -> None:
    """This process's torch intra-op threads set to :data:`AUDIT_THREADS` (the caller restores them:
    :func:`preserved_process_state`)."""
    torch.set_num_threads(AUDIT_THREADS)


@contextmanager
def preserved_process_state() -> Iterator[None]:
    """Restore the torch default dtype, the torch thread count and numpy's error state on exit
    (for functions called in the audit's own process, which may change them)."""
    dtype, threads, errors = torch.get_default_dtype(), torch.get_num_threads(), np.geterr()
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        np.seterr(**errors)


# --------------------------------------------------------------------------------------------
# Captured output
# --------------------------------------------------------------------------------------------


class CapturedStream:
    """The first :data:`CAPTURE_BYTES` of a stream, and how many bytes it carried in all."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.total = 0
        self._lock = threading.Lock()

    def drain(self, stream: Any) -> None:
        """Read ``stream`` to its end (run in a daemon thread)."""
        try:
            while True:
                chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
                if not chunk:
                    break
                with self._lock:
                    self.total += len(chunk)
                    room = CAPTURE_BYTES - len(self.head)
                    if room > 0:
                        self.head += chunk[:room]
        except (OSError, ValueError):
            pass
        finally:
            try:
                stream.close()
            except OSError:
                pass

    def summary(self) -> dict[str, Any] | None:
        """``{"bytes": total, "first_lines": [...], "truncated": bool}``, or None when empty."""
        with self._lock:
            if not self.total:
                return None
            text = bytes(self.head).decode("utf-8", errors="replace")
            total = self.total
        lines = text.splitlines()
        shown = [line[:200] for line in lines[:REPORT_LINES]]
        truncated = (total > len(self.head) or len(lines) > REPORT_LINES
                     or any(len(line) > 200 for line in lines[:REPORT_LINES]))
        return {"bytes": total, "first_lines": shown, "truncated": truncated}


# --------------------------------------------------------------------------------------------
# The worker process, seen from the parent
# --------------------------------------------------------------------------------------------


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class WorkerLost(SpecverifyError):
    """The worker ended or stopped answering; ``fault`` says how (see the module docstring)."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.message)
        self.fault = fault


class WorkerProcess:
    """One worker process: start, load the target, exchange messages with deadlines, stop.

    ``request(message, deadline_s, what)`` returns the worker's reply or raises
    :class:`WorkerLost` (the worker is then dead: killed at the deadline, or ended by the
    function); a ``BaseException`` in the parent while waiting (Ctrl-C) kills the worker too and
    propagates.  ``stdout``/``stderr`` capture the worker's output across restarts of one session.
    """

    def __init__(self, target: WorkerTarget, *, level: str, device: str, start_timeout_s: float,
                 stdout: CapturedStream, stderr: CapturedStream, threads: int) -> None:
        self.target, self.level, self.device, self.threads = target, level, device, threads
        self.stdout, self.stderr = stdout, stderr
        self.spawned = take() or spawn()
        self.process, self.connection = self.spawned.process, self.spawned.connection
        self.drains = [threading.Thread(target=capture.drain, args=(stream,), name="specverify-capture", daemon=True)
                       for stream, capture in ((self.process.stdout, stdout), (self.process.stderr, stderr))]
        for drain in self.drains:
            drain.start()
        self.killed_by_audit = False
        self.info: dict[str, Any] = {}
        self.start_timeout_s = start_timeout_s
        self.loaded = False

    # -- lifecycle ---------------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        """Wait for the worker to start and load the target; return what it reports
        (``{"name", "parameters"}``) or raise :class:`WorkerLost` / :class:`LoadFailed`."""
        if self.loaded:
            return self.info
        path = [entry or os.getcwd() for entry in sys.path]
        if os.getcwd() not in path:  # last, as the loader's fallback for package.module targets in this directory
            path.append(os.getcwd())
        message = {"op": "load", "target": self.target, "level": self.level, "device": self.device,
                   "sys_path": path, "threads": self.threads}
        reply = self.request(message, self.start_timeout_s, "the worker process (starting, importing the target)")
        if reply[0] != "loaded":
            raise LoadFailed(reply[1] if reply[0] == "load-failed" else reply[2])
        self.info = reply[1]
        self.loaded = True
        return self.info

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.killed_by_audit = True
        self.spawned.kill(REAP_TIMEOUT_S)
        self._cleanup()

    def stop(self, grace_s: float | None = None) -> None:
        """Ask the worker to end (it ends with ``os._exit``, ignoring its threads), wait at most
        ``grace_s`` seconds (None: :data:`STOP_GRACE_S`), then kill whatever is left of its process group."""
        if self.process.poll() is None:
            try:
                self.connection.send_bytes(pickle.dumps({"op": "stop"}))
                self.process.wait(timeout=STOP_GRACE_S if grace_s is None else max(0.0, grace_s))
            except (OSError, EOFError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()

    def _cleanup(self) -> None:
        for drain in self.drains:  # the last output of a dead worker is still in its pipes
            drain.join(timeout=DRAIN_TIMEOUT_S)
        self.spawned.close()

    # -- messages ----------------------------------------------------------------------------

    def request(self, message: dict[str, Any], deadline_s: float, what: str) -> tuple:
        self.send(message, what)
        return self.receive(deadline_s, what)

    def send(self, message: dict[str, Any], what: str) -> None:
        """Send ``message`` without waiting for the reply (the worker answers requests in order;
        :meth:`receive` takes the oldest reply)."""
        try:
            self.connection.send_bytes(pickle.dumps(message))
        except OSError as error:
            raise WorkerLost(self._ended(what, error)) from None
        except BaseException:
            self.kill()
            raise

    def receive(self, deadline_s: float, what: str) -> tuple:
        """The reply to the oldest request sent, waited for at most ``deadline_s`` seconds (past
        it the worker is killed and :class:`WorkerLost` raised)."""
        try:
            if not self.connection.poll(deadline_s):
                self.kill()
                raise WorkerLost(Fault("timeout", f"{what} did not return within the per-call timeout of "
                                                  f"{deadline_s:.3g} s; the worker process was killed (and is "
                                                  "restarted for the next check)"))
            return pickle.loads(self.connection.recv_bytes())
        except WorkerLost:
            raise
        except (EOFError, OSError, pickle.UnpicklingError) as error:
            raise WorkerLost(self._ended(what, error)) from None
        except BaseException:
            self.kill()
            raise

    def _ended(self, what: str, error: BaseException) -> Fault:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return Fault("exception", f"lost the connection to the worker process running {what} "
                                      f"({type(error).__name__}: {error}); the worker was killed")
        self._cleanup()
        if code is not None and code < 0:
            name = _signal_name(-code)
            hint = {"SIGKILL": " (not sent by the audit: the kernel's out-of-memory killer sends SIGKILL when memory "
                               "runs out)",
                    "SIGSEGV": " (a segmentation fault: invalid memory access in native code)",
                    "SIGABRT": " (abort(): a failed assertion or a fatal error in native code)",
                    "SIGBUS": " (a bus error: invalid memory access)"}.get(name, "")
            return Fault("exception", f"the worker process running {what} was killed by signal {name}{hint}")
        return Fault("exception", f"the function ended the process: the worker process running {what} exited with "
                                  f"status {code} (os._exit, sys.exit in a thread, or a fatal error) instead of "
                                  "returning")


class LoadFailed(SpecverifyError):
    """The worker could not load the target (the message says why)."""
