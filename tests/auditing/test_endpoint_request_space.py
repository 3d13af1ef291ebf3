"""The endpoint level over its request space: each failure class planted in the toy server is
caught by the check built for it, the same check passes the correct toy (speculative, and the
plain sampler: correct code written differently, drawing its randomness per call), the coverage
table says what was reached and what was not, and the exact pieces (truncated laws, the
Poisson-binomial tail, the stop claims) are checked against brute force."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

pytest.importorskip("httpx", reason="the endpoint level needs httpx: pip install -e '.[endpoint]'")

from specverify.auditing.checks import COVERAGE_TABLE
from specverify.auditing.endpoint.client import Completion
from specverify.auditing.endpoint.pit import pit_value, processed_law, truncated_law
from specverify.auditing.endpoint.request_space import (
    filler_text,
    length_cases,
    load_cases,
)
from specverify.auditing.endpoint.space_checks import (
    poisson_binomial_sf,
    repeats,
    shared_claims,
    stop_violations,
)
from specverify.auditing.reports.json_file import write_json
from specverify.auditing.reports.terminal import format_report
from specverify.auditing.runner import audit
from specverify.testing.toy_server import REQUEST_SPACE_BUGS

# Budget of each planted bug's test: the smallest round number at which it failed at the first look in
# development, doubled (the correct toy is run at the same budget).
BUDGETS = {"space-sampling-fields": 800, "space-penalties": 1600, "space-prompt-lengths": 800, "space-prefixes": 400,
           "choices-joint": 800, "stop-handling": 0, "space-load": 400}
BUDGET_OVERRIDES = {"draft law before top-k in steps of >= 2 rows": 1600}
"""Bugs whose kill depends on how many requests the toy admits to one step (timing): at 800 this one
passed once in a loaded run; at 1600 it failed in each of 2 runs at load ≈ 5."""
PLANTED = [(check, bug, BUDGET_OVERRIDES.get(label, BUDGETS[check])) for label, check, bug in REQUEST_SPACE_BUGS]


def _audit(candidate, baseline, check: str, budget: int):
    return audit(candidate.url, level="endpoint", budget=budget or "quick", baseline=baseline.url, checks=[check],
                 concurrency=4, allow_underpowered=True)


@pytest.mark.parametrize(("check", "bug", "budget"), PLANTED, ids=[label for label, _, _ in REQUEST_SPACE_BUGS])
def test_each_planted_failure_class_is_caught(toy_server, check: str, bug: dict, budget: int) -> None:
    candidate = toy_server(speculative=True, batching=True, **bug)
    report = _audit(candidate, toy_server(speculative=False), check, budget)
    assert report.checks[0].verdict == "fail" and report.exit_code == 1, report.explain()
    assert report.verdict == "loss detected"


CHECK_BUDGETS = sorted({(check, budget) for check, _, budget in PLANTED})


@pytest.mark.parametrize("speculative", [True, False], ids=["speculative", "plain-sampler"])
@pytest.mark.parametrize(("check", "budget"), CHECK_BUDGETS, ids=[f"{c}-{b}" for c, b in CHECK_BUDGETS])
def test_the_correct_toy_passes_each_check(toy_server, check: str, budget: int, speculative: bool) -> None:
    candidate = toy_server(speculative=speculative, batching=True)
    report = _audit(candidate, toy_server(speculative=False), check, budget)
    assert report.checks[0].verdict == "pass", report.explain()


def test_speculation_switched_off_above_a_batch_size_passes_and_shows_in_the_counters(toy_server) -> None:
    """Above one row the toy runs the plain sampler (correct): every side passes, and the sides of
    two or more requests show fewer drafted tokens per request by the server's counters."""
    candidate = toy_server(speculative=True, batching=True, speculation_off_above=1)
    report = _audit(candidate, toy_server(speculative=False), "space-load", 400)
    assert report.checks[0].verdict == "pass", report.explain()
    assert "burst 1: context p" in report.checks[0].message and "drafted tokens per request" in report.checks[0].message


def test_a_load_loss_names_the_failing_and_the_passing_sides(toy_server) -> None:
    candidate = toy_server(speculative=True, batching=True, speculation_off_above=1, plain_path_bug=True)
    message = _audit(candidate, toy_server(speculative=False), "space-load", 400).checks[0].message
    assert "the other sides pass their own tests (burst 1, burst 1 again)" in message, message


def test_request_space_only_runs_the_space_checks_and_the_coverage_table(toy_server) -> None:
    candidate = toy_server(speculative=True)
    report = audit(candidate.url, level="endpoint", budget=40, request_space_only=True, concurrency=2,
                   allow_underpowered=True)
    names = [c.name for c in report.checks]
    assert names[-1] == "request-space-coverage" and "greedy-identity" not in names and "space-load" in names
    with pytest.raises(ValueError, match="request_space_only"):
        audit(candidate.url, level="endpoint", budget=40, request_space=False, request_space_only=True)


def test_a_stop_bug_the_baseline_shares_is_a_serving_bug_not_a_loss(toy_server) -> None:
    """Both servers return the stop string that ends a choice (a serving-layer bug, as
    llama-cpp-python's stop-order bug is): the candidate's violations are the baseline's too, so
    the check passes and says whose they are; without the baseline the same candidate fails, and
    the diagnosis names the claim broken, not the target's law."""
    candidate = toy_server(speculative=True, batching=True, stop_kept_bug=True)
    shared = _audit(candidate, toy_server(speculative=False, stop_kept_bug=True), "stop-handling", 0)
    assert shared.checks[0].verdict == "pass", shared.explain()
    assert "the baseline server breaks the same claim(s) as often" in shared.checks[0].message
    assert "(stop string returned in " in shared.checks[0].message
    alone = audit(candidate.url, level="endpoint", budget="quick", checks=["stop-handling"], allow_underpowered=True)
    assert alone.checks[0].verdict == "fail" and "stop string" in alone.checks[0].message
    assert "stop / length handling" in alone.diagnosis and "target's law" not in alone.diagnosis


def test_a_speculation_stop_bug_does_not_hide_behind_a_shared_one(toy_server) -> None:
    """The baseline returns the stop string that ends a choice; the candidate also keeps the
    tokens its verification step accepted after it: a claim the baseline never breaks, so the
    check fails."""
    candidate = toy_server(speculative=True, batching=True, stop_bug=True, stop_kept_bug=True)
    report = _audit(candidate, toy_server(speculative=False, stop_kept_bug=True), "stop-handling", 0)
    assert report.checks[0].verdict == "fail", report.explain()
    assert "that the baseline does not share" in report.checks[0].message


def test_a_shared_claim_broken_far_more_often_by_the_candidate_is_not_shared() -> None:
    """Out of 33 requests: 3 vs 2 is shared (p 0.5), 18 vs 1 is not (Fisher, one-sided p 2e-6), and a
    claim the baseline never breaks is never shared."""
    assert shared_claims({"stop string returned": (3, 2)}, 33) == {"stop string returned"}
    assert shared_claims({"stop string returned": (18, 1)}, 33) == set()
    assert shared_claims({"end token": (1, 0)}, 33) == set()


def test_a_loss_confined_to_one_value_is_named_by_that_value(toy_server) -> None:
    """Long prompts only: the short lengths pass their own tests, the failure names a long one."""
    candidate = toy_server(speculative=True, long_prompt_bug=1000)
    report = _audit(candidate, toy_server(speculative=False), "space-prompt-lengths", 800)
    message = report.checks[0].message
    assert "prompt length=1024 chars do not follow" in message or "prompt length=4087 chars do not follow" in message


def test_coverage_table_reports_refused_fields_and_missing_flags(toy_server, tmp_path) -> None:
    """The toy refuses repetition_penalty (HTTP 400): not covered, never silently skipped; without a
    baseline the penalties are not covered and --baseline is named; the table is in the terminal
    report and its rows in the result's parameters (the JSON)."""
    candidate = toy_server(speculative=True, context_length=2048)
    report = audit(candidate.url, level="endpoint", budget=200, checks=["stop-handling", "request-space-coverage"],
                   allow_underpowered=True)
    coverage = report.checks[-1]
    rows = {row["dimension"]: row for row in coverage.parameters[COVERAGE_TABLE]}
    assert "HTTP 400" in rows["penalties"]["not covered"]["repetition_penalty=1.2"]
    assert "--baseline" in rows["penalties"]["not covered"]["presence_penalty=1.0"]
    assert set(rows["stop"]["reached"]) == {"max_tokens exact", "stop strings"}
    assert "NOT COVERED repetition_penalty=1.2" in format_report(report)
    written = json.loads(write_json(report, tmp_path / "report.json").read_text())
    assert written["checks"][-1]["parameters"][COVERAGE_TABLE] == coverage.parameters[COVERAGE_TABLE]
    assert [c.value for c in length_cases(2048)][-1] == "2039 chars"  # the context read from GET /models


def test_the_coverage_table_is_reported_when_fail_fast_stops_the_audit(toy_server) -> None:
    """The coverage table calls nothing: it runs after the first failure (and after a fault or a
    dead server) and shows what was reached up to there."""
    candidate = toy_server(speculative=True, stop_bug=True)
    report = audit(candidate.url, level="endpoint", budget="quick", checks=["stop-handling", "request-space-coverage"],
                   allow_underpowered=True)
    assert report.settings.fail_fast and [c.verdict for c in report.checks] == ["fail", "pass"]
    rows = {row["dimension"]: row for row in report.checks[-1].parameters[COVERAGE_TABLE]}
    assert "max_tokens exact" in rows["stop"]["reached"] and not rows["prompt length"]["reached"]


def test_prompt_lengths_and_bursts_follow_the_context_and_the_concurrency() -> None:
    assert [c.value for c in length_cases(None)] == ["40 chars", "256 chars", "1024 chars"]
    assert [c.value for c in length_cases(100_000)][-1] == "16384 chars"
    assert [c.value for c in load_cases((), 6)] == ["burst 1", "burst 2", "burst 4", "burst 6", "burst 1 again"]
    assert {(c.burst, c.top_k, c.max_tokens) for c in load_cases((), 2)} == {(1, 4, 8), (2, 4, 8)}
    text = filler_text(300, "x")
    assert len(text) == 300 and text.isascii() and not text.endswith(" ") and filler_text(300, "x") == text


def _law(probs: dict[str, float]):
    return processed_law({t: math.log(p) for t, p in probs.items()}, temperature=1.0, top_k=len(probs))


def test_truncated_laws_are_the_nucleus_and_min_p_sets() -> None:
    law = _law({"a": 0.5, "b": 0.25, "c": 0.15, "d": 0.1})
    nucleus = truncated_law(law, top_p=0.8)
    assert nucleus.tokens == ("a", "b", "c") and np.allclose(nucleus.probs, np.array([0.5, 0.25, 0.15]) / 0.9)
    assert pit_value(nucleus, "d", 0.5, tie_tolerance=0.0) is None  # cut: probability 0
    assert truncated_law(law, min_p=0.4).tokens == ("a", "b")  # 0.15 < 0.4 · 0.5 ≤ 0.25
    assert truncated_law(law, top_p=0.75) is None  # 0.5 + 0.25 sits on the threshold: ambiguous
    assert truncated_law(law, min_p=0.3) is None  # 0.15 = 0.3 · 0.5: ambiguous
    assert truncated_law(law, min_p=0.32).tokens == ("a", "b")
    assert truncated_law(law, min_p=0.32, tie_tolerance=0.5) is None  # 0.15 within e^0.5 of 0.16
    assert truncated_law(law) is law


def test_poisson_binomial_tail_is_exact() -> None:
    probabilities = [0.1, 0.3, 0.25, 0.6]
    for count in range(6):
        brute = sum(math.prod(p if o else 1 - p for p, o in zip(probabilities, outcome))
                    for outcome in itertools.product([0, 1], repeat=4) if sum(outcome) >= count)
        assert poisson_binomial_sf(count, probabilities) == pytest.approx(brute, abs=1e-12)


def _choice(text: str, finish: str | None) -> Completion:
    return Completion(text, tuple(text), (None,) * len(text), (None,) * len(text), finish)


def test_stop_claims() -> None:
    assert stop_violations(_choice("abc", "length"), 3, ()) == []
    assert stop_violations(_choice("ab", "stop"), 3, (" ",)) == []
    assert "finish_reason 'length' after 2" in str(stop_violations(_choice("ab", "length"), 3, ())[0])
    assert "stop string ' ' returned" in " ".join(map(str, stop_violations(_choice("a b", "stop"), 5, (" ",))))
    assert stop_violations(_choice("abcd", "length"), 3, ())[0].claim == "max_tokens"
    ended = Completion("a", ("a", "</s>", "b"), (None,) * 3, (None,) * 3, "stop")
    assert "1 token(s) after the end token '</s>'" in " ".join(map(str, stop_violations(ended, 5, ())))
    assert repeats("abab", 4) == 2 and repeats("abcd", 4) == 0


@pytest.mark.slow
def test_twenty_seeds_of_the_correct_toy_raise_no_false_alarm() -> None:
    """Seeds 0–19 (toy LM and audit seed), every request-space check at ``quick``
    (benchmarks/endpoint_space_false_alarms.py); α = 1e-3 family-wise per audit, so 20 audits
    accuse correct code with probability ≤ 0.02."""
    from benchmarks.endpoint_space_false_alarms import alarms_of_seed

    alarms = [(seed, alarm) for seed in range(20) for alarm in alarms_of_seed(seed, "quick")]
    assert alarms == []
