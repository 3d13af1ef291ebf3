"""A check's plan (:meth:`specverify.auditing.checks.Check.plan`): under a named budget the n and the
detectable TV are the check's own :meth:`~specverify.auditing.checks.Check.sized_for`, under a fixed budget
the detectable TV is ``detectable_tv`` at N; the planner reads nothing else about the check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from specverify.auditing.checks import Check, CheckKind, SampleBudget, resolve_budget


@dataclass
class BumpyBoundCheck(Check):
    """A statistical check whose power bound at its required n states a TV above the target (a bound
    not monotone in n), and whose ``required_samples`` does not verify the target at that n."""

    name: str = "bumpy"
    description: str = "a check for the planner's contract"
    parameters: dict[str, Any] = field(default_factory=dict)
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    statistical: ClassVar[bool] = True

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return 1_000

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return 0.3 if n == 1_000 else 0.5


@dataclass
class VerifiedBumpyBoundCheck(BumpyBoundCheck):
    """The same bound, with a ``required_samples`` that verifies the target at the n it returns
    (:attr:`~specverify.auditing.checks.Check.sizing_verifies_target`)."""

    sizing_verifies_target: ClassVar[bool] = True


def test_a_named_budget_plans_the_checks_own_sizing():
    standard = resolve_budget("standard")
    assert VerifiedBumpyBoundCheck().plan(standard, 1e-3, 0).detectable_tv == standard.epsilon
    unverified = BumpyBoundCheck().plan(standard, 1e-3, 0)
    assert (unverified.n, unverified.detectable_tv) == (1_000, 0.3)  # what its bound says, never the target


def test_a_fixed_budget_plans_the_bound_at_n():
    plan = VerifiedBumpyBoundCheck().plan(SampleBudget("fixed", samples=2_000), 1e-3, 0)
    assert (plan.n, plan.detectable_tv, plan.fixed_budget) == (2_000, 0.5, True)
