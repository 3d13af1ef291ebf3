"""Self-test of the tree bug catalog: every entry is lossy (exact TV > 0 on its witness) and the
tree audit kills it.  Prints the kill table (``pytest -s``): entry, class, witness, exact TV, and
the checks that failed.

The exact part cannot flake.  The audit part runs the tree battery at a fixed budget of
``KILL_BUDGET`` samples per statistical check without the exact check (so the kill is
statistical); the exact check is run separately and must kill every entry too.
"""

from __future__ import annotations

import pytest

from specverify.auditing.runner import audit, load_battery
from specverify.auditing.tree.catalog import TREE_CATALOG, witness_chain, witness_rule
from specverify.core import tree_exact

KILL_BUDGET = "quick"
"""Budget of the statistical kill: every statistical check sized for TV 0.05 with power 0.99."""

ROWS: dict[str, tuple[float, str, str]] = {}


@pytest.fixture(scope="module", autouse=True)
def _kill_table():
    yield
    if ROWS:
        print("\n[tree catalog] entry | class | witness (V, order, seed, closeness, shape, "
              "scheme) | exact TV | killed by")
        for name, (tv, killers, witness) in ROWS.items():
            print(f"[tree catalog] {name} | {TREE_CATALOG[name].bug_class} | {witness} | {tv:.4f} | {killers}")


@pytest.mark.parametrize("name", sorted(TREE_CATALOG))
def test_entry_is_lossy_exactly(name):
    entry = TREE_CATALOG[name]
    *_, shape, scheme = entry.witness
    tv = tree_exact.exact_tree_step_tv(witness_rule(entry), witness_chain(entry), shape, scheme)
    assert tv > 1e-3, f"{name}: exact TV {tv:.3g} on its witness"
    ROWS[name] = (tv, ROWS.get(name, (0, "", ""))[1], str(entry.witness))


def _statistical_checks(fn) -> list[str]:
    battery = load_battery("tree")
    return [c.name for c in battery.checks(battery.open_session(fn, device="cpu", timeout_s=60))
            if c.name != "exact-tree-step"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TREE_CATALOG))
def test_tree_audit_kills_entry_statistically(name):
    entry = TREE_CATALOG[name]
    report = audit(entry.fn, level="tree", budget=KILL_BUDGET, checks=_statistical_checks(entry.fn))
    killers = [c.name for c in report.checks if c.verdict == "fail"]
    tv = ROWS.get(name, (float("nan"), "", ""))[0]
    ROWS[name] = (tv, ", ".join(killers), str(entry.witness))
    assert report.exit_code == 1, f"{name}: {report.explain()}"
