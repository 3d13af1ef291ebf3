"""The function under audit and the battery's session are declared types
(:mod:`specverify.auditing.audited`): every level's session is an AuditSession whose function is an
AuditedFunction, and a battery that returns anything else is refused with the fix."""

from __future__ import annotations

import pytest

import specverify
from specverify.auditing import runner
from specverify.auditing.audited import AuditedFunction, AuditSession, CallCounts
from specverify.auditing.checks import Battery
from specverify.core.rules import verify
from specverify.core.tree_rules import verify_tree


@pytest.mark.parametrize(("level", "fn"), [("sampler", verify), ("tree", verify_tree)])
def test_each_levels_session_declares_its_function(level, fn):
    battery = runner.load_battery(level)
    session = battery.open_session(fn, device="cpu", timeout_s=30, isolation="none")
    try:
        assert isinstance(session, AuditSession) and isinstance(session.function, AuditedFunction)
        assert isinstance(session.function.log, CallCounts) and session.function.raw is fn
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
