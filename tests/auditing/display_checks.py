"""Checks and plans for the tests of what an audit prints (progress, ETA, cost model): a statistical
check that hands the function steps of ``num_draft`` drafts at ``vocab_size``, and its plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from specverify.auditing.checks import Check, CheckKind, Plan
from specverify.auditing.cost import Cost, step_cost


@dataclass
class StepCheck(Check):
    name: str
    num_draft: int = 1
    vocab_size: int = 4
    description: str = "a step check for the displays"
    parameters: dict[str, Any] = field(default_factory=dict)
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    statistical: ClassVar[bool] = True

    def cost(self, plan: Plan) -> Cost:
        return step_cost(plan.n, self.num_draft, self.vocab_size)


def plan_of(n: int) -> Plan:
    """A plan of ``n`` samples (the displays read only its size)."""
    return Plan(n, n, None, None, 0)
