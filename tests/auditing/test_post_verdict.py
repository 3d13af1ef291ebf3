"""An audit ends promptly after its verdict, whatever the function's speed: the locating checks,
the minimal case and the worker's shutdown share one bounded budget
(:mod:`specverify.auditing.post_verdict`), and the report states each step's time."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

import specverify
from specverify.auditing import post_verdict
from specverify.auditing.defaults import LOCATING_CUT_SKIP
from specverify.auditing.isolation.faults import CutOff
from specverify.auditing.isolation.guarded import GuardedFunction
from specverify.auditing.isolation.process import SHUTDOWN_BOUND_S
from specverify.auditing.minimal_case import MIN_ROWS, MINIMAL_ROWS, case_rows
from specverify.auditing.progress import AuditProgress
from specverify.auditing.reports.json_file import report_to_dict
from specverify.auditing.reports.terminal import format_report
from specverify.testing.harness import Proposal

HOSTILE = Path(__file__).with_name("hostile")
LOSSY_SLOW = f"{HOSTILE / 'lossy_slow_per_row.py'}:verify"
TURNS_SLOW = f"{HOSTILE / 'lossy_turns_slow.py'}:verify"
LOCATING = ["bonus-position", "correction-position", "disjoint-supports"]

MARGIN_S = 1.0
"""What an audit may run past its post-verdict budget: stopping a call at the deadline (killing and
reaping a worker, or the in-process alarm), one catalog entry's run on a case, recording the steps;
a few hundred milliseconds on 2 loaded cores."""


def _proposal(rows: int) -> Proposal:
    """``rows`` copies of one K = 1, V = 4 step."""
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    return Proposal(p.repeat(rows, 1, 1), q.repeat(rows, 1, 1), torch.zeros(rows, 1, dtype=torch.int64))


def test_a_lossy_slow_sampler_gets_its_verdict_and_the_audit_ends_within_its_budget(monkeypatch):
    """buggy_bonus at 2 ms a row (~500 rows/s): bonus-position fails at its first look; after it,
    the two locating checks take ~33 s and each minimal-case call of 20,000 rows 40 s.  Without the
    budget this audit took 173.6 s (in-process, load 13 on 2 cores), its progress saying "audit
    finished in 34 s" when the checks ended, two minutes before the end; with it, 23.6 s (the
    verdict at 14.3 s, the default floor of 10 s): it ends by the verdict + the budget + MARGIN_S.
    The floor is lowered to 2 s to keep the test short (the same formula)."""
    monkeypatch.setattr(post_verdict, "FLOOR_S", 2.0)
    began = time.perf_counter()
    report = specverify.audit(LOSSY_SLOW, budget="quick", checks=LOCATING, isolation="none")
    wall_s = time.perf_counter() - began
    post = report.timings["post_verdict"]
    assert report.verdict == "loss detected" and report.exit_code == 1, report.summary
    assert post["budget_s"] == pytest.approx(max(2.0, 0.5 * post["verdict_s"]))
    assert report.timings["total_s"] <= post["verdict_s"] + post["budget_s"] + MARGIN_S, post
    assert wall_s <= report.timings["total_s"] + 2.0  # the figure "audit finished in" says is the end
    steps = {step["step"]: step for step in post["steps"]}
    assert set(steps) == {"locating checks", "minimal case"}, steps  # in-process: no worker to shut down
    cut = [c for c in report.checks if c.message.startswith(LOCATING_CUT_SKIP)]
    assert cut and all("--no-fail-fast" in c.message for c in cut), [c.message for c in report.checks]
    assert "not run" in steps["locating checks"]["outcome"]
    bounded = steps["minimal case"]["outcome"]
    assert bounded.startswith(("skipped:", "reproduced with", "the post-verdict deadline")), bounded
    assert report.case_search.case is None or report.case_search.case.rows < MINIMAL_ROWS
    text = format_report(report)
    assert "(after the verdict at" in text and "locating checks" in text and "minimal case" in text
    assert report_to_dict(report)["timings"]["post_verdict"] == post


class _SlowAfterVerdict(AuditProgress):
    """Creates the file that makes ``lossy_turns_slow.py`` sleep 30 s a call as soon as the audit
    announces its first post-verdict step."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def after_verdict(self, text: str) -> None:
        self.marker.write_text(text)


@pytest.mark.parametrize("isolation", ["process", "none"])
def test_a_function_that_turns_very_slow_after_the_verdict_is_cut_off_at_the_budget(isolation, tmp_path,
                                                                                    monkeypatch):
    """Every call after the verdict sleeps 30 s.  The minimal-case search's one call is stopped at
    the post-verdict deadline (in a worker by killing it, in-process by the alarm), its step is
    recorded as cut off with the reason, and the audit ends within the budget + MARGIN_S, not 30 s
    later.  The budget is made 2 s (a floor of 2 s, a share of 0.1 of the time to the verdict)."""
    monkeypatch.setattr(post_verdict, "FLOOR_S", 2.0)
    monkeypatch.setattr(post_verdict, "SHARE", 0.1)
    marker = tmp_path / "slow"
    monkeypatch.setenv("SPECVERIFY_TEST_SLOW_MARKER", str(marker))
    report = specverify.audit(TURNS_SLOW, budget="quick", checks=["bonus-position"], isolation=isolation,
                              progress=_SlowAfterVerdict(marker))
    post = report.timings["post_verdict"]
    assert report.verdict == "loss detected" and marker.exists(), report.summary
    assert post["budget_s"] == pytest.approx(max(2.0, 0.1 * post["verdict_s"]))
    assert report.timings["total_s"] - post["verdict_s"] <= post["budget_s"] + MARGIN_S, post
    steps = {step["step"]: step for step in post["steps"]}
    assert steps["minimal case"]["cut_off"], steps
    assert steps["minimal case"]["outcome"].startswith("the post-verdict deadline came before a call"), steps
    assert "shutdown" not in steps  # the cutoff's kill left no worker to stop
    assert report.case_search.case is None and report.case_search.note == steps["minimal case"]["outcome"]
    assert "minimal case" in format_report(report) and report_to_dict(report)["timings"]["post_verdict"] == post


def test_the_minimal_case_is_sized_to_the_functions_speed():
    assert case_rows(None, 0.5) == MINIMAL_ROWS  # not measured yet: the full size, under the cutoff
    assert case_rows(1e6, 10.0) == MINIMAL_ROWS
    assert case_rows(500.0, 10.0) == 2_000  # half of 10 s at 500 rows/s, in thousands
    assert case_rows(500.0, 4.0) == MIN_ROWS
    assert case_rows(300.0, 5.0) == 0  # 750 rows: below the floor, not attempted
    assert case_rows(None, 0.0) == 0  # no time left


def test_the_budget_is_a_share_of_the_time_to_the_verdict_with_a_floor():
    budget = post_verdict.PostVerdict(time.perf_counter() - 40.0)
    budget.open()
    assert budget.budget_s == pytest.approx(20.0, abs=0.1)
    assert budget.locating_deadline() - budget.verdict_at == pytest.approx(10.0, abs=0.1)
    assert budget.deadline() - budget.verdict_at == pytest.approx(20.0, abs=0.1)
    quick = post_verdict.PostVerdict(time.perf_counter() - 1.0)
    quick.open()
    assert quick.budget_s == post_verdict.FLOOR_S and "floor" in quick.announcement("x follow")


def test_a_call_past_the_cutoff_is_refused_and_a_running_one_is_stopped():
    function = GuardedFunction(LOSSY_SLOW, timeout_s=60, isolation="none")
    function(_proposal(2), function.generator(0), where="warm-up")
    function.cut_off_at(time.perf_counter() - 1.0)
    with pytest.raises(CutOff):
        function(_proposal(2), function.generator(1), where="after the cutoff")
    function.cut_off_at(time.perf_counter() + 0.3)
    began = time.perf_counter()
    with pytest.raises(CutOff):
        function(_proposal(5_000), function.generator(2), where="10 s of rows")  # 2 ms a row
    assert time.perf_counter() - began < 2.0
    assert function.log.losses == [] and function.stop_reason() is None  # the caller's deadline, not a hang
    function.cut_off_at(None)
    function(_proposal(2), function.generator(3), where="no cutoff")


def test_in_a_worker_the_cutoff_kills_the_call_and_a_hung_worker_is_killed_at_shutdown():
    """A call running at the cutoff is stopped by killing the worker, with no loss counted against
    the function, and the next call starts another.  At shutdown, a worker that cannot answer the
    request to stop (frozen here with SIGSTOP, as a function holding its main thread would leave
    it) is killed after the grace: about 1 s (2.0 s before the bound), never over SHUTDOWN_BOUND_S."""
    function = GuardedFunction(LOSSY_SLOW, timeout_s=60, isolation="process")
    function(_proposal(2), function.generator(0), where="warm-up")
    function.cut_off_at(time.perf_counter() + 0.3)
    began = time.perf_counter()
    with pytest.raises(CutOff):
        function(_proposal(5_000), function.generator(1), where="10 s of rows")
    assert time.perf_counter() - began < 0.3 + 3.0  # the cutoff, then the kill and the reap
    assert function.log.losses == [] and not function.worker.alive() and function.startup_s() > 0
    function.cut_off_at(None)
    function(_proposal(2), function.generator(2), where="after the cutoff")
    assert function.log.restarts == 1
    worker = function.worker
    os.kill(worker.process.pid, signal.SIGSTOP)
    began = time.perf_counter()
    function.close()
    assert time.perf_counter() - began <= SHUTDOWN_BOUND_S
    assert not worker.alive() and worker.killed_by_audit


def test_a_spent_budget_leaves_the_worker_no_grace_and_the_shutdown_step_says_so(monkeypatch):
    """With the budget spent, a worker that cannot answer the request to stop (frozen with SIGSTOP)
    is killed at once instead of after STOP_GRACE_S, and the step is recorded as cut off."""
    from specverify.auditing.isolation.process import STOP_GRACE_S
    from specverify.auditing.runner import _shut_down
    from specverify.auditing.sampler.battery import SamplerBattery

    monkeypatch.setattr(post_verdict, "FLOOR_S", 0.01)
    session = SamplerBattery().open_session(LOSSY_SLOW, device="cpu", timeout_s=60, isolation="process")
    worker = session.function.worker
    budget = post_verdict.PostVerdict(time.perf_counter() - 0.02)
    budget.open()
    time.sleep(0.05)
    assert budget.seconds_left() == 0.0 and session.function.worker_running()
    os.kill(worker.process.pid, signal.SIGSTOP)
    began = time.perf_counter()
    _shut_down(session, budget)
    assert time.perf_counter() - began < STOP_GRACE_S and not worker.alive() and worker.killed_by_audit
    (step,) = budget.timings()["steps"]
    assert step["step"] == "shutdown" and step["cut_off"] and "0.0 s of its 1 s grace" in step["outcome"], step


def test_the_closest_catalog_entry_is_not_read_past_the_deadline():
    """A case found at the deadline is shown without its closest catalog entry (a second of the
    audit's own work: every entry run on 5,000 rows), and the search counts as cut off."""
    from specverify.auditing.diagnosis import closest_catalog_entry
    from specverify.auditing.minimal_case import MinimalCase, _read

    p = [[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]
    q = [[0.4, 0.3, 0.2, 0.1]]
    tokens = torch.zeros(2_000, 2, dtype=torch.int64).numpy()
    past = time.perf_counter() - 1.0
    with pytest.raises(CutOff):
        closest_catalog_entry(torch.tensor(p).double().numpy(), torch.tensor(q).double().numpy(), [0], tokens, 5,
                              deadline=past)
    case = MinimalCase("t.py:verify", "bonus-position", 0, tuple(map(tuple, p)), tuple(map(tuple, q)), (0,), 2_000, 5,
                       1, 0, 0.25, 1.0, 77.0)
    search = _read(case, tokens, past)
    assert search.case is not None and search.case.closest == "" and search.cut_off
    assert search.outcome() == ("reproduced with 2,000 rows a call; the closest catalog entry not read: the "
                                "post-verdict deadline came first")
