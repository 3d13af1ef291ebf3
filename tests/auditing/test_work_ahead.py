"""Work made ahead (:mod:`specverify.auditing.ahead`): queued items run only once started, while the
gate has been open for ``SETTLE_S``, first looks first; a claimed item runs at once, gate or not; closing drops
what was not made; and an audit whose function runs in a worker makes a production check's
designs before the check reaches them."""

from __future__ import annotations

import threading
import time

import pytest

from specverify.auditing import ahead as ahead_module
from specverify.auditing.ahead import AheadItem, Gate, WorkAhead
from specverify.auditing.defaults import EXIT_PASS
from specverify.auditing.runner import audit
from specverify.auditing.sampler.production import ProductionStepCheck


def recording(made: list[str], key: str):
    def make() -> str:
        made.append(key)
        return key.upper()
    return make


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not condition():
        assert time.perf_counter() < deadline, "timed out"
        time.sleep(0.001)


def test_queued_items_run_only_once_started_and_while_the_gate_is_open_first_looks_first():
    gate, made = Gate(), []
    ahead = WorkAhead(gate)
    ahead.add([AheadItem(key, look, recording(made, key)) for key, look in (("a1", 1), ("b0", 0), ("c2", 2))])
    try:
        assert ahead.claim("claimed", recording(made, "claimed")).result(timeout=10) == "CLAIMED"
        with gate.opened():
            time.sleep(0.05)
        assert made == ["claimed"]  # not started: only the claim ran
        ahead.start()
        time.sleep(0.05)
        assert made == ["claimed"]  # the gate did not open since
        made.clear()
        with gate.opened():
            wait_for(lambda: len(made) == 3)
        assert made == ["b0", "a1", "c2"]
        assert [ahead.claim(key, lambda: "again").result() for key in ("a1", "b0", "c2")] == ["A1", "B0", "C2"]
        assert ahead.claim("a1", lambda: "made again").result() == "made again"  # not kept after its claim
    finally:
        ahead.close()


def test_a_wait_shorter_than_the_settling_time_starts_nothing(monkeypatch):
    monkeypatch.setattr(ahead_module, "SETTLE_S", 0.2)
    gate, made = Gate(), []
    ahead = WorkAhead(gate)
    ahead.add([AheadItem("x", 0, recording(made, "x"))])
    ahead.start()
    try:
        for _ in range(5):
            with gate.opened():
                time.sleep(0.01)
            time.sleep(0.01)
        assert made == []
        with gate.opened():
            wait_for(lambda: made == ["x"])
    finally:
        ahead.close()


def test_a_claimed_item_runs_at_once_gate_or_not_and_raises_what_it_raised():
    made = []
    ahead = WorkAhead(Gate())
    ahead.add([AheadItem("queued", 3, recording(made, "queued"))])
    ahead.start()
    try:
        assert ahead.claim("queued", lambda: "unused").result(timeout=10) == "QUEUED"
        assert ahead.claim("new", recording(made, "new")).result(timeout=10) == "NEW"

        def broken() -> None:
            raise ValueError("the item's own error")

        with pytest.raises(ValueError, match="the item's own error"):
            ahead.claim("broken", broken).result(timeout=10)
    finally:
        ahead.close()
    assert made == ["queued", "new"]


def test_without_a_gate_only_claims_run_each_in_a_thread_that_ends_with_it():
    made = []
    ahead = WorkAhead()
    ahead.add([AheadItem("queued", 0, recording(made, "queued"))])
    ahead.start()
    time.sleep(0.05)
    assert made == [] and not any(t.name == "specverify-ahead" for t in threading.enumerate())
    assert ahead.claim("queued", lambda: None).result(timeout=10) == "QUEUED"
    wait_for(lambda: not any(t.name == "specverify-ahead" for t in threading.enumerate()))
    ahead.close()


def test_closing_cancels_what_was_not_made_and_stops_the_thread():
    gate = Gate()
    ahead = WorkAhead(gate)
    item = AheadItem("never", 0, lambda: "never")
    ahead.add([item])
    ahead.start()
    ahead.close()
    assert item.future.cancelled()
    assert not any(t.name == "specverify-ahead" for t in threading.enumerate())


def test_an_audit_in_a_worker_makes_the_designs_before_the_check_claims_them(monkeypatch):
    """``production-K32`` at quick: three looks, the later ones made while the audit waited for the
    function's earlier calls.  Without the runner's queue every look's designs are made when
    claimed."""
    made_before_claim: list[bool] = []
    claimed: set[object] = set()
    original_claim, original_designs = WorkAhead.claim, ProductionStepCheck.look_designs

    def claim(self, key, make):
        claimed.add(key)
        return original_claim(self, key, make)

    def look_designs(self, plan, look):
        made_before_claim.append(self._designs(plan, look).key not in claimed)
        return original_designs(self, plan, look)

    monkeypatch.setattr(WorkAhead, "claim", claim)
    monkeypatch.setattr(ProductionStepCheck, "look_designs", look_designs)
    report = audit("reference", budget="quick", checks=["batch-size-1", "production-K32"], isolation="process")
    assert report.exit_code == EXIT_PASS
    assert len(made_before_claim) == 3 and any(made_before_claim)
