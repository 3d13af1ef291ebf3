"""While the function's calls run in a worker process, the audit's own process does its torch work
on :data:`~specverify.auditing.isolation.process.AUDIT_THREADS` intra-op threads; the worker keeps
the threads the audit's process had when the session opened."""

from __future__ import annotations

import torch

from specverify.auditing.defaults import EXIT_PASS
from specverify.auditing.isolation.guarded import GuardedFunction
from specverify.auditing.isolation.process import AUDIT_THREADS, use_audit_threads
from specverify.auditing.runner import audit
from specverify.core.rules import verify as reference


def worker_threads(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    """A direct call's answer: the intra-op threads of the process it runs in."""
    return torch.get_num_threads()


def verify_noting_threads(target_probs, draft_probs, draft_tokens, generator=None):
    """The reference rule, which also records the audit's threads during its calls (in-process)."""
    SEEN.add(torch.get_num_threads())
    return reference(target_probs, draft_probs, draft_tokens, generator)


SEEN: set[int] = set()


def test_the_worker_keeps_the_threads_of_the_sessions_start():
    """Also a worker started after the audit lowered its own threads (a restart)."""
    before = torch.get_num_threads()
    function = GuardedFunction(f"{__file__}:worker_threads", timeout_s=60, isolation="process")
    inputs = (torch.ones(1, 2, 3) / 3, torch.ones(1, 1, 3) / 3, torch.zeros(1, 1, dtype=torch.int64))
    try:
        use_audit_threads()
        assert function.raw(*inputs, None) == before
        function.close()
        assert function.raw(*inputs, None) == before and torch.get_num_threads() == AUDIT_THREADS
    finally:
        function.close()
        torch.set_num_threads(before)


def test_an_audit_lowers_its_own_threads_only_when_the_function_runs_in_a_worker(monkeypatch):
    import specverify.auditing.runner as runner

    lowered = []
    monkeypatch.setattr(runner, "use_audit_threads", lambda: lowered.append(torch.get_num_threads()) or
                        use_audit_threads())
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        SEEN.clear()
        report = audit(verify_noting_threads, budget=500, checks=["step-K1"], isolation="none")
        assert report.exit_code == EXIT_PASS and SEEN == {2} and not lowered
        report = audit(f"{__file__}:verify_noting_threads", budget=500, checks=["step-K1"], isolation="process")
        assert report.exit_code == EXIT_PASS and lowered == [2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
