"""Starting a worker process, apart from loading the function into it; importable without torch.

:func:`spawn` starts ``python -m specverify.auditing.isolation.worker FD`` (its own session, a
scratch working directory, stdout and stderr on pipes, :data:`WORKER_ENVIRONMENT`); the worker
imports torch and its own modules at once and then waits for its ``load`` request.
:class:`~specverify.auditing.isolation.process.WorkerProcess` spawns one at each (re)start, or
takes the one :func:`prestarted` holds: ``specverify audit`` starts it before importing the audit
itself, so that on two cores the worker's imports run while the audit's process does its own
(about a second of torch each) instead of after them.  A prestarted worker is one of the same
command and environment, so taking it changes nothing but when it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from specverify.auditing.isolation import allocator

DISCARD_REAP_S = 5.0
"""The longest :meth:`Spawned.discard` waits for a killed worker to be reaped."""

WORKER_ENVIRONMENT: dict[str, str] = {**allocator.environment(), "OMP_WAIT_POLICY": "PASSIVE"}
"""The worker's environment defaults (a variable the caller set is kept).

- glibc's allocator keeps large freed blocks (:mod:`~specverify.auditing.isolation.allocator`):
  inputs of 1–2 MB a row at V = 151,936 would otherwise be mapped and unmapped on every call, and
  the page faults cost as much CPU as the function (production-gpt2-K4 on lmdeploy: 43 s of
  system time, 1.1 s with these).
- OpenMP's idle threads sleep instead of spinning: the worker and the audit take turns (one waits
  while the other works), and a worker's threads spinning after each call hold cores the audit's
  own threads need (standard audit of ``reference`` on 2 cores: 29.5 CPU-s with spinning threads,
  20.3 without)."""


@dataclass
class Spawned:
    """A started worker process: the process (pipes on stdout and stderr), the parent's end of
    its control socket and its scratch directory."""

    process: subprocess.Popen[bytes]
    connection: Connection
    scratch: str

    def kill(self, reap_timeout_s: float) -> None:
        """SIGKILL the worker's process group (the process alone where the group cannot be
        signalled) if it still runs, and reap it, waiting at most ``reap_timeout_s`` seconds."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    self.process.kill()
                except ProcessLookupError:
                    pass
        try:
            self.process.wait(timeout=reap_timeout_s)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Close the control socket and remove the scratch directory (the process has ended)."""
        try:
            self.connection.close()
        except OSError:
            pass
        shutil.rmtree(self.scratch, ignore_errors=True)

    def discard(self) -> None:
        """End a worker no session took: kill it, close its pipes, :meth:`close`."""
        self.kill(DISCARD_REAP_S)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        self.close()


def spawn() -> Spawned:
    """Start a worker process (see the module docstring)."""
    import specverify

    scratch = tempfile.mkdtemp(prefix="specverify-worker-")
    parent_end, child_end = socket.socketpair()
    environment = dict(os.environ)
    package_root = str(Path(specverify.__file__).resolve().parents[1])
    inherited = [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    environment["PYTHONPATH"] = os.pathsep.join([package_root] + inherited)
    environment["PYTHONUNBUFFERED"] = "1"
    environment.update({name: value for name, value in WORKER_ENVIRONMENT.items() if name not in environment})
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "specverify.auditing.isolation.worker", str(child_end.fileno())],
        pass_fds=(child_end.fileno(),), cwd=scratch, env=environment, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    child_end.close()
    connection = Connection(os.dup(parent_end.fileno()))
    parent_end.close()
    return Spawned(process, connection, scratch)


_HELD: list[Spawned] = []
"""The workers :func:`prestarted` holds until a session takes one."""


@contextlib.contextmanager
def prestarted(enabled: bool = True) -> Iterator[None]:
    """Within it, the first worker a session starts (:func:`take`) is one started on entry; one
    left untaken is discarded on exit.  ``enabled=False``: nothing is started."""
    if not enabled:
        yield
        return
    held = spawn()
    _HELD.append(held)
    try:
        yield
    finally:
        if held in _HELD:
            _HELD.remove(held)
            held.discard()


def take() -> Spawned | None:
    """The prestarted worker, if one is held and still running (then no longer held); else None."""
    while _HELD:
        spawned = _HELD.pop()
        if spawned.process.poll() is None:
            return spawned
        spawned.discard()
    return None
