"""Server processes on 127.0.0.1 for tests and benchmarks: a free port, start, wait, stop.

A server is started as a child process with its stderr in a temporary file (not a pipe: a full
pipe would block a long-running server), polled on ``GET {url}/models`` until it answers 200, and
stopped with SIGTERM, then SIGKILL after 10 s.  The llama.cpp and vLLM fixtures
(:mod:`specverify.testing.llama_servers`, :mod:`specverify.testing.vllm_servers`) build on these.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_logged(command: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    """Start ``command`` with stdout discarded and stderr kept in a temporary file (:func:`stderr_tail`)."""
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(list(command), stdout=subprocess.DEVNULL, stderr=log, env=dict(env))
    process.stderr_log = log  # type: ignore[attr-defined]
    return process


def stderr_tail(process: subprocess.Popen, limit: int = 2000) -> str:
    """The last ``limit`` characters the server wrote to stderr."""
    log = getattr(process, "stderr_log", None)
    if log is None:
        return ""
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:]


def wait_healthy(process: subprocess.Popen, url: str, startup_s: float, name: str = "server") -> None:
    """Return once ``GET {url}/models`` answers 200; raise ``RuntimeError`` (with the server's
    stderr tail) if the process exits first or ``startup_s`` passes."""
    import httpx

    deadline = time.monotonic() + startup_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}: {stderr_tail(process)}")
        try:
            if httpx.get(url + "/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} at {url} not healthy within {startup_s:g} s: {stderr_tail(process)}")


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; closes the stderr log."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    log = getattr(process, "stderr_log", None)
    if log is not None:
        log.close()
