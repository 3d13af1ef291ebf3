"""A production check claims each look's identity designs from the work made ahead (made in a
thread while it draws the look's samples when not made yet): they are the designs of the rows each
chain then holds, the judgement uses them, and it is the judgement made without them.  Its interim
looks end on whole calls, at the default design's levels, and a run gathers the laws of each call
size once."""

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


@pytest.mark.parametrize("budget", ["quick", "standard"])
def test_the_interim_looks_end_on_whole_calls_at_the_designs_levels(budget):
    """Every production check's interim looks are whole numbers of its calls, the final look is its
    n, and the looks' levels are the default design's: only the look sizes move."""
    from specverify.auditing.checks import SequentialCheck
    from specverify.auditing.sampler.production import ProductionStepCheck

    battery = load_battery("sampler")
    session = battery.open_session(reference, device="cpu", timeout_s=600, isolation="none")
    checks = [c for c in battery.checks(session) if isinstance(c, ProductionStepCheck)]
    plans = plan_checks(checks, battery.resolve_budget(budget), 1e-3, 0, "sampler")[0]
    for check, plan in zip(checks, plans):
        default_looks, default_alphas = SequentialCheck.looks(check, plan.n, plan.alpha)
        assert plan.looks[-1] == plan.n, check.name
        assert plan.look_alphas == default_alphas, check.name
        assert all(look % check.rows_per_call == 0 for look in plan.looks[:-1]), (check.name, plan.looks)
        assert all(0 <= look - default < check.rows_per_call for look, default in zip(plan.looks, default_looks))
    session.function.close()


def test_a_run_builds_the_laws_of_each_call_size_once(check_and_plan, monkeypatch):
    """The calls of every look share the laws of their size: one gather per call size in a run
    (the full calls and the last, shorter one), however many looks run."""
    from specverify.auditing.sampler import production

    check, plan, session = check_and_plan
    built = []
    original = production.chain_laws

    def counted(bank, chain, num_draft, dtype):
        built.append(len(chain))
        return original(bank, chain, num_draft, dtype)

    monkeypatch.setattr(production, "chain_laws", counted)
    production.placed_rows.cache_clear()
    result = check.run(session, plan)
    assert result.look == len(plan.looks)
    assert sorted(built) == sorted({check.rows_per_call, plan.n % check.rows_per_call} - {0})


def test_the_two_halves_of_the_build_make_every_production_law():
    """The sampler battery builds the production laws in two halves (one in a thread): together
    they make every bank, coarse view and exact case the checks are made of."""
    from specverify.auditing.sampler import production

    session = load_battery("sampler").open_session(reference, device="cpu", timeout_s=60, isolation="none")
    for cached in (production.production_bank, production.bank_views, production.exact_shapes):
        cached.cache_clear()
    production.build_production_laws(large=True)
    production.build_production_laws(large=False)
    built = [cached.cache_info().misses for cached in (production.production_bank, production.bank_views,
                                                       production.exact_shapes)]
    production.production_checks(session.function)
    production.exact_production_check()
    assert built == [cached.cache_info().misses for cached in (production.production_bank, production.bank_views,
                                                               production.exact_shapes)]
    assert built == [len(production.PRODUCTION_SHAPES), len(production.PRODUCTION_SHAPES), 1]
