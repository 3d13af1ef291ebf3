"""The plan's time model (:mod:`specverify.auditing.cost`) and how the display re-times it on the
function's measured speed, on a function 100× slower per entry at a large vocabulary than at a
small one (the clock of the function is the call log's, set by hand: no sleeping)."""

from __future__ import annotations

import io
import time

import pytest

from specverify.auditing.audited import CallCounts
from specverify.auditing.checks import CheckKind, CheckResult, Verdict, resolve_budget
from specverify.auditing.cost import (
    HARNESS_S_PER_ENTRY,
    HARNESS_S_PER_ROW,
    PRIOR_S_PER_ENTRY,
    PRIOR_S_PER_ROW,
    SECONDS_PER_CHECK,
    Cost,
    Speeds,
    production_step_cost,
    step_cost,
)
from specverify.auditing.progress import LineProgress
from tests.auditing.display_checks import StepCheck, plan_of

LARGE_V = 151_936
SLOWDOWN = 100.0


def test_a_step_cost_is_its_entries_at_the_prior_speed():
    cost = step_cost(1_000, 4, 50_257)
    assert cost.work == 9 * 50_257 and cost.scale == 50_257
    per_row = HARNESS_S_PER_ROW + PRIOR_S_PER_ROW + 9 * 50_257 * (HARNESS_S_PER_ENTRY + PRIOR_S_PER_ENTRY)
    assert cost.seconds() == pytest.approx(SECONDS_PER_CHECK + 1_000 * per_row)
    assert step_cost(0, 4, 50_257).units == 0


def test_speeds_price_a_check_from_its_own_regime_at_the_nearest_measured_scale():
    """Entry-bound scales (V = 4,099 at the reference's speed, V = 151,936 100× slower) price an
    unmeasured large vocabulary at the nearest one's slowdown, within the range of both; a small
    vocabulary's per-row overheads never price a large one's entries (before any large one is
    measured they widen its range only)."""
    speeds = Speeds()
    tiny, deep, large = step_cost(1_000, 1, 4), step_cost(1_000, 16, 4_099), step_cost(1_000, 1, LARGE_V)
    gpt2 = step_cost(1_000, 1, 50_257)
    assert speeds.estimate([large]).seconds == pytest.approx(large.seconds())  # the prior before a measurement
    speeds.record(tiny, 1_000, function_s=1.0, wall_s=1.1, calls=1)  # 1 ms a row: overheads, not entries
    slowdown = 1e-3 / tiny.prior_per_row  # its range: the slowdown measured on the small vocabulary
    prior = gpt2.prior_function_s
    estimate = speeds.function_s(gpt2)
    assert (estimate.seconds, estimate.low, estimate.high) == pytest.approx((prior, prior, prior * slowdown))
    speeds.record(deep, 1_000, function_s=deep.prior_function_s, wall_s=1.0, calls=1)
    speeds.record(large, 1_000, function_s=large.prior_function_s * SLOWDOWN, wall_s=100.0, calls=1)
    assert speeds.function_s(large).seconds == pytest.approx(large.prior_function_s * SLOWDOWN)
    estimate = speeds.function_s(gpt2)  # nearer 151,936 than 4,099 in log scale
    assert estimate.seconds == pytest.approx(prior * SLOWDOWN) and estimate.high == pytest.approx(estimate.seconds)
    assert estimate.low == pytest.approx(prior)
    near_tiny = step_cost(1_000, 2, 6)  # the tiny scale's slowdown against the prior
    assert speeds.function_s(near_tiny).seconds == pytest.approx(near_tiny.prior_function_s * slowdown)


def test_the_slowdown_not_the_seconds_per_entry_carries_to_another_shape():
    """A function 40× slower than the reference on V = 8,192 in float32 with one draft is priced 40×
    slower on a production shape (bfloat16, 12 drafts), whose entries cost the reference another
    time each: not at the seconds per entry measured on the first."""
    speeds = Speeds()
    truncated = step_cost(6_000, 1, 8_192)
    production = production_step_cost(8_000, 12, 4_099, entry_bytes=2, rows_per_call=160)
    speeds.record(truncated, 6_000, function_s=40 * truncated.prior_function_s, wall_s=2.0, calls=11)
    assert speeds.function_s(production).seconds == pytest.approx(40 * production.prior_function_s)
    per_entry = 40 * truncated.prior_function_s / truncated.units
    assert speeds.function_s(production).seconds < production.units * per_entry / 2


def test_a_function_that_pays_per_call_is_priced_by_its_calls_and_its_rows_apart():
    """A function of 5 ms a call, at the reference's speed on rows: a check of one row a call
    measures its cost per call, and a later check of large calls at the same scale is priced at its
    calls' 5 ms each and its rows' prior, not at the one-row check's slowdown (~260×) on every row;
    a check of large calls measured later sets the slowdown on rows from what its calls leave."""
    speeds = Speeds()
    call_s = 5e-3
    one_row = step_cost(1_000, 2, 10, rows_per_call=1)
    batched = step_cost(100_000, 4, 10, rows_per_call=1_000)
    speeds.record(one_row, 1_000, function_s=1_000 * (call_s + one_row.prior_per_row), wall_s=6.0, calls=1_000)
    rows_s = batched.rows * batched.prior_per_row
    assert speeds.function_s(batched).seconds == pytest.approx(batched.calls * call_s + rows_s, rel=1e-3)
    one_row_slowdown = 1_000 * (call_s + one_row.prior_per_row) / one_row.prior_function_s
    assert speeds.function_s(batched).seconds < batched.prior_function_s * one_row_slowdown / 5
    large_calls = step_cost(50_000, 4, 10)
    speeds.record(large_calls, 50_000, function_s=5 * call_s + 3 * large_calls.prior_function_s, wall_s=1.0, calls=5)
    assert speeds.function_s(batched).seconds == pytest.approx(batched.calls * call_s + 3 * rows_s, rel=1e-3)


def _result(name: str, n: int, seconds: float) -> CheckResult:
    return CheckResult(name, "", CheckKind.GOODNESS_OF_FIT, {}, Verdict.PASS, "", n=n, pvalue=0.5, seconds=seconds)


def test_a_function_100x_slower_at_large_vocabularies_is_retimed_after_its_first_large_check():
    """Checks at V = 4 and 4,099, then two at V = 151,936 and one at V = 50,257: the plan prices all at
    the reference's speed; after the first large check ran 100× slower per entry, the large one left
    is priced at that speed and the V = 50,257 one at its nearest measured scale's, with the range of
    the measured speeds; the ETA inside a large check follows its rows so far instead of falling to 0."""
    stream = io.StringIO()
    display = LineProgress(stream, per_check=True, heartbeat_s=3600)
    log = CallCounts()
    checks = [StepCheck("small", 1, 4), StepCheck("deep", 16, 4_099), StepCheck("large-0", 1, LARGE_V),
              StepCheck("large-1", 1, LARGE_V), StepCheck("gpt2", 1, 50_257)]
    plans = [plan_of(20_000), plan_of(2_000), plan_of(2_000), plan_of(2_000), plan_of(2_000)]
    display.begin(target="t", level="sampler", budget=resolve_budget("quick"), alpha=1e-3, checks=checks,
                  plans=plans, log=log)
    planned_large = checks[2].cost(plans[2]).seconds()

    def run(index: int, seconds_per_entry: float) -> None:
        cost = display.costs[index]
        display.check_started(index, checks[index], plans[index])
        log.calls += 10
        log.rows += plans[index].n
        log.function_seconds += cost.units * seconds_per_entry
        display.check_finished(index, _result(checks[index].name, plans[index].n, 0.0))

    display.started -= 10.0  # the audit has run long enough to re-time
    run(0, PRIOR_S_PER_ENTRY)
    run(1, PRIOR_S_PER_ENTRY)
    run(2, PRIOR_S_PER_ENTRY * SLOWDOWN)
    rest = display.speeds.estimate(display.costs[3:])
    slow_large = display.costs[3].units * PRIOR_S_PER_ENTRY * SLOWDOWN
    gpt2_units = display.costs[4].units
    assert planned_large < slow_large / 20  # the plan before any measurement
    assert rest.seconds == pytest.approx(slow_large + gpt2_units * PRIOR_S_PER_ENTRY * SLOWDOWN, rel=0.05)
    assert rest.low == pytest.approx(slow_large + gpt2_units * PRIOR_S_PER_ENTRY, rel=0.05)
    assert rest.high == pytest.approx(rest.seconds)
    lines = [line for line in stream.getvalue().splitlines() if line.startswith("specverify: measured")]
    assert lines and "re-planned" in lines[-1], stream.getvalue()

    display.check_started(3, checks[3], plans[3])  # halfway through the next large check
    display.check_started_at -= slow_large / 2
    log.rows += plans[3].n // 2
    log.function_seconds += slow_large / 2
    eta = display.eta()
    assert eta == pytest.approx(slow_large / 2 + gpt2_units * PRIOR_S_PER_ENTRY * SLOWDOWN, rel=0.05)
    display.end(total_s=time.perf_counter() - display.started)


def test_a_tree_check_of_small_calls_is_priced_by_its_calls():
    """A tree call costs the audit and the reference rule far more than its rows (the four inputs,
    the emitted paths validated, the rule's walk over the nodes): the battery's check of 1 to 4 rows
    a call is planned at least at its calls' seconds, a large-batch check of the same trees not."""
    from specverify.auditing.cost import TREE_HARNESS_S_PER_CALL, TREE_PRIOR_S_PER_CALL
    from specverify.auditing.runner import load_battery, plan_checks

    battery = load_battery("tree")
    session = battery.open_session("reference", device="cpu", timeout_s=60, isolation="none")
    checks = battery.checks(session)
    plans = dict(zip((check.name for check in checks),
                     plan_checks(checks, resolve_budget("quick"), 1e-3, 0, "tree")[0]))
    small = next(check for check in checks if check.name == "tree-small-batches")
    cost = small.cost(plans[small.name])
    calls = cost.rows / (sum(small.call_rows) / len(small.call_rows))
    assert cost.seconds() >= calls * (TREE_HARNESS_S_PER_CALL + TREE_PRIOR_S_PER_CALL)
    siblings = next(check for check in checks if check.name.startswith("tree-siblings"))
    large_batches = siblings.cost(plans[siblings.name])
    assert large_batches.seconds() < large_batches.rows * (TREE_HARNESS_S_PER_CALL + TREE_PRIOR_S_PER_CALL) / 100


def test_a_check_priced_without_work_counts_its_direct_calls_as_its_own_time():
    """An exact check's plan prices its direct calls of the function in its fixed seconds; the
    measured function seconds of those calls are not subtracted from its own."""
    speeds = Speeds()
    speeds.record(Cost(0, 2.0), 0, 0.6, 1.0)
    assert speeds.own_ratio(Cost(0, 1.0)) == pytest.approx(0.5)
    speeds = Speeds()
    speeds.record(Cost(1000, 2.0, work=1.0, prior_s=1e-6), 1000, 0.6, 1.0)
    assert speeds.own_ratio(Cost(0, 1.0)) == pytest.approx(0.2)


def test_the_expected_time_counts_from_the_audits_start():
    """The header's expected time includes the seconds the audit spent before its plan (starting
    the worker, building the checks), as the report's ``audit finished in`` does; the ETA's clock
    starts there too."""
    from specverify.auditing.progress import duration

    checks, plans = [StepCheck("small", 1, 4)], [plan_of(20_000)]
    planned = checks[0].cost(plans[0]).seconds()
    said = {}
    for before_s in (None, 30.0):
        stream = io.StringIO()
        display = LineProgress(stream, per_check=True, heartbeat_s=3600)
        if before_s is not None:
            display.audit_started(time.perf_counter() - before_s)
        display.begin(target="t", level="sampler", budget=resolve_budget("quick"), alpha=1e-3, checks=checks,
                      plans=plans, log=CallCounts())
        said[before_s] = stream.getvalue()
        display.end(total_s=0.0)
    assert f"expected ~{duration(planned)} " in said[None]
    assert f"expected ~{duration(30.0 + planned)} " in said[30.0]
