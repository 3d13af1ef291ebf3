"""Faulty adapters are reported, never crash the audit and never pass: exit 2 for exceptions, hangs and
malformed output; exit 1 for impossible output (well formed, impossible under the law), input mutation
and randomness not taken from the generator."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from specverify.auditing.defaults import EXIT_ERROR, EXIT_FAIL, MALFORMED_SKIP
from specverify.auditing.loading import load_target
from specverify.auditing.runner import audit

FAULTY = Path(__file__).resolve().parents[2] / "examples" / "faulty.py"
SMALL = dict(budget=500, checks=["randomness-source", "step-K2", "decoding-loop-order1", "inputs-unchanged"])


def faulty(name):
    return load_target(f"{FAULTY}:{name}")


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("raises", "raised RuntimeError: CUDA kernel not compiled"),
        ("nan_ids", "NaN token ids"),
        ("wrong_shape", "returned shape"),
        ("wrong_dtype", "dtype torch.int32"),
        ("out_of_range", "outside [0,"),
        ("token_after_padding", "after -1 padding"),
    ],
)
def test_malformed_or_raising_adapters_could_not_be_audited(name, fragment):
    report = audit(faulty(name), **SMALL)
    assert report.exit_code == EXIT_ERROR and report.verdict == "could not audit"
    assert fragment in report.summary, report.summary
    errored = [c for c in report.checks if c.verdict == "error"]
    assert all(fragment in c.message for c in errored)
    if name == "raises":  # an exception: every check tries the function
        assert len(errored) == 3
        assert next(c for c in report.checks if c.name == "inputs-unchanged").verdict == "skipped"
    else:  # the first malformed output ends the audit
        first, *rest = report.checks
        assert errored == [first] and first.fault == "malformed"
        assert all(c.verdict == "skipped" and c.message.startswith(MALFORMED_SKIP) for c in rest)
        assert report.replay_checks == (first.name,)


@pytest.mark.parametrize(
    "name, fragment, checks",
    [
        ("non_draft_accepted", "accepted slot 0", SMALL["checks"]),
        ("reads_other_rows_drafts", "non-draft token in an accepted slot", SMALL["checks"]),
        ("emits_forbidden_token", "probability 0", ["zeros-both-sides", "disjoint-supports"]),
    ],
)
def test_impossible_outputs_are_losses_not_adapter_errors(name, fragment, checks):
    # Right shape and dtype, tokens no lossless rule emits: a kernel that mixes requests or ignores
    # the target's zeros, proved by one output (exit 1), not "my adapter is broken" (exit 2).
    report = audit(faulty(name), budget=500, checks=checks, fail_fast=False)
    assert report.exit_code == EXIT_FAIL and report.verdict == "loss detected", report.summary
    assert "impossible output" in report.summary
    failed = [c for c in report.checks if c.verdict == "fail"]
    assert failed and all(c.fault == "impossible" and fragment in c.message for c in failed), \
        [c.message for c in failed]


def test_a_hanging_adapter_times_out_and_the_rest_is_skipped():
    # The worker is killed at the deadline and restarted, so the next check still runs; after the
    # second hang the function is not called again.
    report = audit(faulty("hangs"), timeout_s=0.5, **SMALL)
    assert report.exit_code == EXIT_ERROR
    first, second, *rest = report.checks
    assert all(c.verdict == "error" and c.fault == "timeout" and "0.5 s" in c.message for c in (first, second))
    assert all(c.verdict == "skipped" and "hung" in c.message for c in rest)
    assert report.timings["total_s"] < 60


def test_a_hanging_adapter_in_process_stops_the_audit_at_the_first_hang():
    report = audit(faulty("hangs"), timeout_s=0.5, isolation="none", **SMALL)
    first, *rest = report.checks
    assert first.verdict == "error" and first.fault == "timeout" and "0.5 s" in first.message
    assert all(c.verdict == "skipped" and "hung" in c.message for c in rest)
    assert report.timings["total_s"] < 10


def test_a_hang_is_caught_outside_the_main_thread_too():
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(report=audit(faulty("hangs"), timeout_s=0.5, **SMALL)))
    thread.start()
    thread.join(30)
    assert outcome["report"].exit_code == EXIT_ERROR and outcome["report"].checks[0].fault == "timeout"


@pytest.mark.statistical
def test_input_mutation_is_a_failure():
    report = audit(faulty("mutates_inputs"), **SMALL)
    verdicts = {c.name: c.verdict for c in report.checks}
    assert report.exit_code == EXIT_FAIL and report.verdict == "contract violated"
    assert verdicts == {"randomness-source": "pass", "step-K2": "pass", "decoding-loop-order1": "pass",
                        "inputs-unchanged": "fail"}
    assert "draft_tokens" in report.checks[-1].message


@pytest.mark.statistical
def test_global_rng_use_is_a_failure():
    report = audit(faulty("global_rng"), **SMALL)
    check = report.checks[0]
    assert report.exit_code == EXIT_FAIL and check.verdict == "fail" and check.fault == "global-rng"
    assert "global" in check.message


def test_the_audit_leaves_the_global_rng_as_it_found_it():
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    audit(faulty("global_rng"), **SMALL)
    assert torch.equal(torch.rand(3), expected)


def test_faulty_adapters_never_pass_at_the_full_battery():
    report = audit(faulty("raises"), budget="quick")
    assert report.exit_code == EXIT_ERROR and all(c.verdict in ("error", "skipped") for c in report.checks)
