"""A production check claims each look's identity designs from the work made ahead (made in a
thread while it draws the look's samples when not made yet): they are the designs of the rows each
chain then holds, the judgement uses them, and it is the judgement made without them."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from specverify.auditing.checks import LooksReached
from specverify.auditing.runner import load_battery, plan_checks
from specverify.core import identity
from specverify.core.rules import verify as reference


@pytest.fixture(scope="module")
def check_and_plan():
    """``production-batch-1024`` (seven chains, calls of 1,024 rows: uneven splits) at quick."""
    battery = load_battery("sampler")
    session = battery.open_session(reference, device="cpu", timeout_s=600, isolation="none")
    checks = battery.checks(session)
    plans = dict(zip((c.name for c in checks), plan_checks(checks, battery.resolve_budget("quick"), 1e-3, 0,
                                                           "sampler")[0]))
    check = next(c for c in checks if c.name == "production-batch-1024")
    yield check, plans[check.name], session
    session.function.close()


def test_the_designs_are_those_of_the_rows_each_chain_holds_at_each_look(check_and_plan, monkeypatch):
    check, plan, session = check_and_plan
    made_here = []
    original = identity.identity_design

    def counted(*args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            made_here.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(identity, "identity_design", counted)
    reached = LooksReached()
    for look in range(len(plan.looks)):
        reached = check.run_looks(session, plan, reached, look + 1)
        counts = reached.tally.counts["counts"].reshape(check.bank.num_chains, check.num_draft + 1, -1)
        assert np.array_equal(counts[:, 0].sum(axis=-1), check.chain_rows(plan, look))
        if reached.finished(plan):
            break
    assert made_here == []  # every judgement found its designs made


def test_the_judgement_is_the_one_made_without_designs_ahead(check_and_plan, monkeypatch):
    check, plan, session = check_and_plan
    with_designs = check.run(session, plan)
    monkeypatch.setattr(check, "draw", check._draw)
    without = check.run(session, plan)
    assert (with_designs.verdict, with_designs.pvalue, with_designs.statistic, with_designs.n) == \
        (without.verdict, without.pvalue, without.statistic, without.n)


def test_a_design_of_another_n_is_refused():
    probs = np.full(8, 1 / 8)
    counts = np.array([3, 1, 0, 2, 1, 1, 0, 2])
    with pytest.raises(ValueError, match="design: made for n = 9"):
        identity.identity_test(counts, probs, design=identity.identity_design(probs, 9))
    assert identity.identity_test(counts, probs, design=identity.identity_design(probs, 10)).pvalue == \
        identity.identity_test(counts, probs).pvalue
