"""A worker started ahead of the audit (specverify/auditing/isolation/spawn.py): the first session
takes it, nothing else can, and one never taken is stopped."""

from __future__ import annotations

from specverify.auditing.defaults import EXIT_PASS
from specverify.auditing.isolation import spawn
from specverify.auditing.runner import audit


def test_a_prestarted_worker_is_taken_once_and_is_running():
    with spawn.prestarted():
        first = spawn.take()
        assert first is not None and first.process.poll() is None
        assert spawn.take() is None
        first.discard()
        assert first.process.poll() is not None
    assert spawn.take() is None


def test_an_untaken_worker_is_stopped_when_the_block_ends(monkeypatch):
    started = []
    original = spawn.spawn
    monkeypatch.setattr(spawn, "spawn", lambda: started.append(original()) or started[-1])
    with spawn.prestarted():
        pass
    with spawn.prestarted(enabled=False):
        pass
    assert len(started) == 1 and started[0].process.poll() is not None


def test_the_audit_runs_on_the_prestarted_worker(monkeypatch):
    with spawn.prestarted():
        held = spawn._HELD[-1]
        report = audit("reference", budget=600, checks=["step-K2"])
        assert report.exit_code == EXIT_PASS, report.summary
        assert held not in spawn._HELD  # taken by the session
        assert held.process.poll() is not None  # and stopped with it
