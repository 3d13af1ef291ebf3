"""The function under audit and the battery's session are declared types
(:mod:`specverify.auditing.audited`): every level's session is an AuditSession whose function is an
AuditedFunction, and a battery that returns anything else is refused with the fix."""

from __future__ import annotations

import time

import pytest
import torch

import specverify
from specverify.auditing import runner
from specverify.auditing.audited import AuditedFunction, AuditSession, CallCounts
from specverify.auditing.checks import Battery
from specverify.auditing.isolation.guarded import GuardedFunction
from specverify.core.rules import verify
from specverify.core.tree_rules import verify_tree


@pytest.mark.parametrize(("level", "fn"), [("sampler", verify), ("tree", verify_tree)])
def test_each_levels_session_declares_its_function(level, fn):
    battery = runner.load_battery(level)
    session = battery.open_session(fn, device="cpu", timeout_s=30, isolation="none")
    try:
        assert isinstance(session, AuditSession) and isinstance(session.function, AuditedFunction)
        assert isinstance(session.function.log, CallCounts) and session.function.raw.__wrapped__ is fn
        assert not session.function.worker_running() and session.function.stop_reason() is None
    finally:
        session.close()


def test_a_battery_whose_session_is_not_an_audit_session_is_refused_with_the_fix(monkeypatch):
    class BareBattery(Battery):
        level = "sampler"

        def open_session(self, fn, *, device, timeout_s, isolation="none"):
            return object()

    monkeypatch.setattr(runner, "load_battery", lambda level, **options: BareBattery())
    with pytest.raises(TypeError, match="return a subclass of specverify.auditing.audited.AuditSession"):
        specverify.audit(verify, isolation="none")


def sleeping_verify(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    """Takes 50 ms a call, then returns every row's first draft token and a bonus of 0."""
    time.sleep(0.05)
    return torch.cat([draft_tokens[:, :1], torch.zeros_like(draft_tokens[:, :1])], dim=1)


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_direct_calls_count_as_the_functions_calls_and_seconds(isolation):
    """The exact checks call ``raw``: that is the function's time too, as the report and the re-timed
    plan count it."""
    function = GuardedFunction(f"{__file__}:sleeping_verify", timeout_s=60, isolation=isolation)
    inputs = (torch.ones(1, 2, 3) / 3, torch.ones(1, 1, 3) / 3, torch.zeros(1, 1, dtype=torch.int64))
    try:
        assert function.raw(*inputs, None, uniforms=torch.rand(1, 2)).shape == (1, 2)
        assert function.log.calls == 1 and 0.05 <= function.log.function_seconds < 5
    finally:
        function.close()
