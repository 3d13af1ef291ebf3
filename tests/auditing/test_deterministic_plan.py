"""The audit's plan is a function of the seed, the budget and the level only: a slow, correct
function that draws its randomness per call must not be accused because rows were grouped into
calls by its measured speed.  Speed may set deadlines and the ETA, never which rows go into which call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specverify.auditing.isolation.guarded import GuardedFunction
from specverify.auditing.sampler.battery import positional_family_bank
from specverify.core.rules import verify as reference
from specverify.testing.harness import propose

SLOW_WRAPPER = Path(__file__).with_name("slow_wrapper.py")


def test_measured_speed_never_changes_the_partition():
    seen: list[int] = []

    def recording(target_probs, draft_probs, draft_tokens, generator):
        seen.append(target_probs.shape[0])
        return reference(target_probs, draft_probs, draft_tokens, generator)

    bank = positional_family_bank("partition", "random", 4, 2, 3)
    proposal = propose(bank, bank.initial_state(torch.arange(4096) % 3), 2, torch.Generator().manual_seed(1))
    function = GuardedFunction(recording, timeout_s=600)
    function(proposal, function.generator(0), where="first")
    function.speed.per_element = function.speed.per_call = 1.0  # as if each entry took a second
    function(proposal, function.generator(0), where="second")
    function.call_groups(proposal, function.generator(0), [1000, 3096], where="third")
    assert seen == [4096, 4096, 1000, 3096]


# The checks whose calls are grouped by the transport (many small calls: B = 1, small batches, late
# calls) and two that take whole batches; the production shapes group nothing and cost most.
SPEED_GROUPED_CHECKS = "randomness-source,batch-size-1,small-batches,late-calls,step-K2,decoding-loop-order1"


def _audit_json(path: Path, budget: str, checks: str | None = None) -> dict:
    selection = [] if checks is None else ["--checks", checks]
    subprocess.run([sys.executable, "-m", "specverify", "audit", f"{SLOW_WRAPPER}:verify", "--budget", budget,
                    "--seed", "3", "--no-fail-fast", "--quiet", "--json", str(path), *selection],
                   check=False, timeout=900)
    return json.loads(path.read_text())


def _without_timings(document: dict) -> str:
    return json.dumps({key: value for key, value in document.items() if key != "timings"}, sort_keys=True, indent=1)


def test_two_runs_of_a_slow_variable_speed_function_give_the_same_report(tmp_path):
    first = _audit_json(tmp_path / "first.json", "300", SPEED_GROUPED_CHECKS)
    second = _audit_json(tmp_path / "second.json", "300", SPEED_GROUPED_CHECKS)
    assert _without_timings(first) == _without_timings(second)
    assert first["timings"] != second["timings"]  # the speed did vary
    verdicts = {check["name"]: check["verdict"] for check in first["checks"]}
    assert verdicts["randomness-source"] == "pass"
    assert all(verdict in ("pass", "skipped") for verdict in verdicts.values()), verdicts


@pytest.mark.slow
def test_a_slow_variable_speed_function_passes_the_quick_audit(tmp_path):
    # ~4 min on 2 cores: the sleep makes the B = 1 check's 7,500 calls slow.
    document = _audit_json(tmp_path / "quick.json", "quick")
    assert document["exit_code"] == 0, document["summary"]
