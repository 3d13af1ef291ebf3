"""Rounding is not loss: the exact check's tolerance follows the arithmetic a function declares
(specverify.core.rounding), so a float32 or bfloat16 rule passes "exact up to rounding" with its TV
stated, while the same code claiming float64, and a real bug in float32, fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from specverify.auditing.defaults import EXIT_FAIL
from specverify.auditing.runner import audit
from specverify.core import rounding

RULES = Path(__file__).with_name("precision_rules.py")


def exact_step(name: str):
    report = audit(f"{RULES}:{name}", checks=["exact-step"], budget="quick")
    (check,) = report.checks
    return report, check


@pytest.mark.parametrize("name, arithmetic", [("float32_rule", "float32"), ("float32_rule_declared", "float32"),
                                              ("bfloat16_rule", "bfloat16")])
def test_a_lower_precision_rule_is_exact_up_to_its_rounding(name, arithmetic):
    report, check = exact_step(name)
    assert check.verdict == "pass", check.message
    assert check.empirical_tv > rounding.INTEGRATION_FLOOR, "the rule should show some rounding"
    assert check.empirical_tv <= rounding.rounding_tolerance(arithmetic, 2, 3)
    assert f"exact up to {arithmetic} rounding" in check.message
    print(f"{name}: exact TV {check.empirical_tv:.3g}; {check.message}")


def test_an_undeclared_rule_is_told_how_to_tighten_the_bound():
    _, check = exact_step("float32_rule")
    assert "declares no `arithmetic`" in check.message


def test_float32_rounding_claimed_as_float64_is_a_loss():
    # The check can fail: the same rounding is above the float64 bound the function claims.
    report, check = exact_step("float32_rule_claiming_float64")
    assert report.exit_code == EXIT_FAIL and check.verdict == "fail", check.message
    assert "above the float64 rounding bound" in check.message


def test_a_bug_in_float32_is_still_a_loss():
    from specverify.auditing.sampler.catalog import CATALOG  # noqa: F401 - the catalog's bugs compute in float64

    def bonus_from_draft_float32(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        from tests.auditing.precision_rules import float32_rule

        shifted = target_probs.clone()
        shifted[:, -1] = draft_probs[:, -1]  # the bonus drawn from the last draft law
        return float32_rule(shifted, draft_probs, draft_tokens, generator, uniforms=uniforms)

    report = audit(bonus_from_draft_float32, checks=["exact-step"], budget="quick", isolation="none")
    assert report.exit_code == EXIT_FAIL, report.checks[0].message


@pytest.mark.parametrize("arithmetic, bound", [("float64", 1.1e-9), ("float32", 2e-6), ("bfloat16", 0.13)])
def test_the_bound_at_the_exact_check_shapes(arithmetic, bound):
    assert rounding.rounding_tolerance(arithmetic, 2, 3) <= bound
