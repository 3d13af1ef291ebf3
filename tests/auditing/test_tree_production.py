"""The tree level at production shapes: the six production-shape catalog entries
are exact on small trees and lossy beyond them, the production checks plan the TV they state,
and the standard tree audit kills the entries and other bugs of their classes.

``pytest -s -m slow`` prints the kill tables (entry | exact TV | check that failed | look | n |
seconds to verdict)."""

from __future__ import annotations

import time

import pytest

from specverify.auditing.checks import resolve_budget
from specverify.auditing.runner import audit, load_battery, plan_checks
from specverify.auditing.tree.catalog import (
    TREE_CATALOG,
    parent_offset_saturating_at,
    positions_capped_at,
    residual_in_slots,
    rows_at_a_time,
    small_batch_path_up_to,
    target_law_cached_as_top,
    witness_chain,
    witness_rule,
)
from specverify.core import tree_exact
from specverify.core.chains import random_markov_chain

PRODUCTION_ENTRIES = ("positions_capped_at_depth_three", "residual_in_three_slots", "siblings_assumed_contiguous",
                      "target_law_cached_as_top_entries", "small_batch_path", "parent_offset_saturates_at_32")


@pytest.mark.parametrize("name", PRODUCTION_ENTRIES)
def test_entry_is_lossy_on_its_witness(name):
    entry = TREE_CATALOG[name]
    *_, shape, scheme = entry.witness
    assert tree_exact.exact_tree_step_tv(witness_rule(entry), witness_chain(entry), shape, scheme) > 0.05


SMALL = random_markov_chain(3, 1, 1, closeness=0.5)
FOUR = random_markov_chain(4, 1, 1, closeness=0.0)


@pytest.mark.parametrize(("name", "chain", "shape", "scheme", "rows"), [
    ("positions_capped_at_depth_three", SMALL, (-1, 0, 1), "independent", None),  # depth 3
    ("positions_capped_at_depth_three", SMALL, (-1, -1, 0, 2), "without_replacement", None),
    ("residual_in_three_slots", FOUR, (-1, -1, -1), "deterministic", None),  # three children
    ("residual_in_three_slots", FOUR, (-1, -1, -1, 0), "without_replacement", None),
    ("siblings_assumed_contiguous", SMALL, (-1, -1, 0, 1), "independent", None),  # breadth-first
    ("siblings_assumed_contiguous", SMALL, (-1, -1, 0), "deterministic", None),
    ("target_law_cached_as_top_entries", FOUR, (-1, -1, 0), "independent", None),  # V = 4
    ("small_batch_path", FOUR, (-1, -1), "independent", None),  # one call of many rows
    ("parent_offset_saturates_at_32", SMALL, (-1, -1, 0, 1), "independent", None),  # parents at most 3 back
    ("parent_offset_saturates_at_32", FOUR, tree_exact.star_shape(4), "deterministic", None),
])
def test_entry_is_exact_on_the_shapes_the_toy_checks_draw(name, chain, shape, scheme, rows):
    rule = TREE_CATALOG[name].fn if rows is None else rows_at_a_time(TREE_CATALOG[name].fn, rows)
    assert tree_exact.exact_tree_step_tv(rule, chain, shape, scheme) < 1e-9


def test_production_checks_state_their_shapes_and_detectable_tv():
    battery = load_battery("tree")
    checks = battery.checks(battery.open_session("reference", device="cpu", timeout_s=60))
    plans, _ = plan_checks(checks, resolve_budget("standard"), 0.001, 0, "tree")
    planned = {c.name: (c, p) for c, p in zip(checks, plans)}
    deep, plan = planned["tree-dynamic-deep-deterministic"]
    assert deep.parameters["depth"] == 60 and deep.parameters["N"] == [60] and deep.parameters["B"][:4] == [1, 2, 3, 4]
    assert deep.parameters["distance"] == 59 and deep.parameters["children"] == 4
    assert deep.parameters["orders"] == ["breadth_first", "depth_first", "interleaved"]
    assert plan.detectable_tv == pytest.approx(0.05, abs=1e-4)
    fan_out, plan = planned["tree-fan-out-independent"]
    assert fan_out.parameters["children"] == 59 and fan_out.parameters["distance"] == 59
    assert fan_out.parameters["L"] == 3
    assert plan.detectable_tv == pytest.approx(0.05, abs=1e-4)
    wide, plan = planned["tree-dynamic-wide-independent"]
    assert wide.parameters["children"] == 10 and wide.parameters["V"] == 12 and plan.detectable_tv <= 0.05 + 1e-9
    small, plan = planned["tree-small-batches"]
    assert set(small.parameters["B"]) == {1, 2, 3, 4} and len(small.parameters["scheme"]) == 3
    large, plan = planned["tree-large-vocabulary"]
    assert large.parameters["V"] >= 32_768 and plan.detectable_tv <= 0.2 + 1e-9
    assert planned["tree-siblings-independent"][1].detectable_tv <= 0.02 + 1e-9


FAST_KILLS = (
    ("positions_capped_at_depth_three", "tree-dynamic-deep-without_replacement", "quick"),
    ("residual_in_three_slots", "tree-dynamic-wide-deterministic", "quick"),
    ("siblings_assumed_contiguous", "tree-dynamic-wide-independent", "quick"),
    ("target_law_cached_as_top_entries", "tree-dynamic-wide-without_replacement", "quick"),
    ("small_batch_path", "tree-small-batches", "standard"),  # TV 0.08 in its cells: above standard's 0.05
    ("parent_offset_saturates_at_32", "tree-fan-out-independent", "quick"),
)


@pytest.mark.parametrize(("name", "check", "budget"), FAST_KILLS)
def test_production_check_kills_entry(name, check, budget):
    report = audit(TREE_CATALOG[name].fn, level="tree", budget=budget, checks=[check], isolation="none")
    assert report.exit_code == 1, report.explain()


def test_large_vocabulary_check_kills_a_top_k_cache_and_passes_the_reference():
    cached = target_law_cached_as_top(1024)
    report = audit(cached, level="tree", budget="quick", checks=["tree-large-vocabulary"], isolation="none")
    assert report.exit_code == 1, report.explain()
    report = audit("reference", level="tree", budget="quick", checks=["tree-large-vocabulary"], isolation="none")
    assert report.exit_code == 0, report.explain()


# ------------------------------------------------------------------------------------------------
# Kill tables (slow): the standard audit without its exact check, stopping at the first failure
# ------------------------------------------------------------------------------------------------

ROWS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _kill_table():
    yield
    if ROWS:
        print("\n[tree production] bug | exact TV | first failing check | look | n | seconds to verdict")
        print("\n".join(ROWS))


def _statistical(fn) -> list[str]:
    battery = load_battery("tree")
    return [c.name for c in battery.checks(battery.open_session(fn, device="cpu", timeout_s=60))
            if c.name != "exact-tree-step"]


def _kill(label: str, fn, tv: float | None) -> None:
    started = time.perf_counter()
    report = audit(fn, level="tree", budget="standard", checks=_statistical(fn), fail_fast=True,
                   isolation="none" if getattr(fn, "__qualname__", "").count("<locals>") else "process")
    seconds = time.perf_counter() - started
    failed = report.failed
    first = failed[0] if failed else None
    ROWS.append(f"[tree production] {label} | {'—' if tv is None else f'{tv:.4f}'} | "
                f"{first.name if first else 'none'} | "
                f"{first.look if first else '—'}/{first.num_looks if first else '—'} | "
                f"{first.n if first else '—'} | {seconds:.1f}")
    assert report.exit_code == 1, report.explain()


@pytest.mark.slow
@pytest.mark.parametrize("name", PRODUCTION_ENTRIES)
def test_standard_audit_kills_entry_statistically(name):
    entry = TREE_CATALOG[name]
    *_, shape, scheme = entry.witness
    _kill(name, entry.fn, tree_exact.exact_tree_step_tv(witness_rule(entry), witness_chain(entry), shape, scheme))


VARIANTS = {  # other bugs of the five classes, wrong only further out
    "positions capped at depth 5": positions_capped_at(5),
    "positions capped at depth 7": positions_capped_at(7),
    "residual in 5 slots (wrong from the 6th child)": residual_in_slots(5),
    "residual in 8 slots (wrong from the 9th child)": residual_in_slots(8),
    "target law cached as top 8": target_law_cached_as_top(8),
    "target law cached as top 1024": target_law_cached_as_top(1024),
    "separate path for B = 1": small_batch_path_up_to(1),
    "separate path for B <= 2": small_batch_path_up_to(2),
    "parent offset saturating at 16": parent_offset_saturating_at(16),
    "parent offset saturating at 57": parent_offset_saturating_at(57),
}


@pytest.mark.slow
@pytest.mark.parametrize("label", sorted(VARIANTS))
def test_standard_audit_kills_other_bugs_of_the_classes(label):
    _kill(label, VARIANTS[label], None)
