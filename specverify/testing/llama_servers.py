"""A llama.cpp baseline/candidate pair on 127.0.0.1, for endpoint audits in tests and benchmarks.

:func:`llama_pair` starts two ``python -m llama_cpp.server`` processes (llama-cpp-python, the
``[server]`` extra) over one GGUF, each on a free port of 127.0.0.1 with one thread: the baseline
serves the model plainly, the candidate with prompt-lookup drafting
(``--draft_model prompt-lookup-decoding``).  It waits until both answer ``GET /v1/models``, yields
their ``/v1`` base URLs, and stops both on the way out, whatever happened.  The packaged
SmolLM2-135M-Instruct Q4_1 GGUF (:func:`smollm2_gguf`) is the default model of the suite's tests.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from specverify.testing.local_servers import free_port, start_logged, stop_server, wait_healthy

STARTUP_S = 120.0
DRAFT_TOKENS = 4


class LlamaPair(NamedTuple):
    """The ``/v1`` base URLs of a running pair."""

    candidate: str
    baseline: str


def smollm2_gguf() -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF (raises ``ModelNotInstalledError`` with the pip line)."""
    from specverify.hf.packaged import locate_gguf_parts, packaged_model

    (gguf,) = locate_gguf_parts(packaged_model("smollm2-135m-instruct"))
    return gguf


def start_server(gguf: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """Start one ``llama_cpp.server`` over ``gguf`` with the extra flags; (process, ``/v1`` URL)."""
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "2048", "--verbose", "False", *extra]
    return start_logged(command, dict(os.environ, OMP_NUM_THREADS="1")), f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def llama_pair(gguf: Path | None = None, draft_tokens: int = DRAFT_TOKENS) -> Iterator[LlamaPair]:
    """A healthy baseline and prompt-lookup candidate over ``gguf`` (default :func:`smollm2_gguf`),
    stopped on exit."""
    gguf = smollm2_gguf() if gguf is None else gguf
    started: list[tuple[subprocess.Popen, str]] = []
    try:
        started.append(start_server(gguf))
        started.append(start_server(gguf, "--draft_model", "prompt-lookup-decoding",
                                    "--draft_model_num_pred_tokens", str(draft_tokens)))
        for process, url in started:
            wait_healthy(process, url, STARTUP_S, "llama_cpp.server")
        yield LlamaPair(candidate=started[1][1], baseline=started[0][1])
    finally:
        for process, _ in started:
            stop_server(process)
