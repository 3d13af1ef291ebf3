"""Fixtures of the property suite (``specverify properties [TARGET]``, ``pytest --pyargs
specverify.properties [--specverify-impl TARGET]``, or ``pytest properties`` in a checkout).

The implementation under test comes from the specverify plugin's ``specverify_impl`` fixture
(``--specverify-impl``, default the built-in ``reference``); the sampled checks call it with the SPEC §1
signature only.  The exact checks integrate a rule over injected uniforms, so they run on the
built-in rules and, through the ``uniform_rule`` fixture, on an ``--specverify-impl`` whose signature takes a
``uniforms`` keyword (docs/ARCHITECTURE.md convention).

The header of the run states the statistical budget (``budget.py``), and collection refuses a
``statistical`` test that the budget does not count.  The suite loads its Hypothesis profile
itself (:mod:`specverify.testing.profiles`: derandomized, which the budget's count of executions
relies on), so it runs the same from a pip install, where the repository's root conftest is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from specverify.core import rules
from specverify.core.rules import accepts_uniforms
from specverify.properties import budget
from specverify.testing.profiles import load_profile

load_profile()

HERE = Path(__file__).resolve().parent


class UniformRule(NamedTuple):
    """A rule with the SPEC §1 signature plus ``uniforms=``, and a name for messages."""

    name: str
    fn: Callable[..., Any]


@pytest.fixture(scope="session", params=["reference", "impl"])
def uniform_rule(request: pytest.FixtureRequest, specverify_impl: Callable[..., Any]) -> UniformRule:
    """The rules the exact checks integrate: the built-in reference, and ``--specverify-impl`` when it takes
    ``uniforms=`` (skipped when it is the reference itself or takes no uniforms)."""
    if request.param == "reference":
        return UniformRule("reference (specverify.core.rules.verify)", rules.verify)
    spec = request.config.getoption("specverify_impl")
    if specverify_impl is rules.verify:
        pytest.skip(f"--specverify-impl {spec} is the built-in reference, checked as [reference]")
    if not accepts_uniforms(specverify_impl):
        pytest.skip(f"--specverify-impl {spec} takes no `uniforms=` keyword: exact checks do not apply "
                    "(sampled checks still run)")
    return UniformRule(f"--specverify-impl {spec}", specverify_impl)


def pytest_report_header(config: pytest.Config) -> str:
    return f"properties: {budget.describe(config.getoption('--specverify-alpha'))}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers",
                            "uses_impl: the test exercises the --specverify-impl implementation (added at collection)")


def _uses_impl(item: pytest.Item) -> bool:
    """Whether ``item`` calls ``--specverify-impl``: through ``specverify_impl``, or as ``uniform_rule[impl]``."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "uniform_rule" in getattr(item, "fixturenames", ()):
        return params.get("uniform_rule") == "impl"
    return "specverify_impl" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that exercise ``--specverify-impl`` (``-m uses_impl`` runs only those), and refuse a
    statistical test the budget does not count."""
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue
        if _uses_impl(item):
            item.add_marker(pytest.mark.uses_impl)
        if item.get_closest_marker("statistical") is None:
            continue
        name = getattr(item, "originalname", item.name)
        if not budget.is_budgeted(name):
            raise pytest.UsageError(
                f"{item.nodeid} is marked statistical but budget.STATISTICAL_TESTS does not count it; "
                "add it there with its max_examples so that the suite's alpha stays split over every execution"
            )
