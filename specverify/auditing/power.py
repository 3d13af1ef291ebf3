"""No power, no pass: an audit whose checks cannot detect the deviation a pass promises ends in
"underpowered" (exit 2), not in "no loss detected".

A pass says: every statistical check would have detected a deviation of total variation ε in
the law of its cells with probability :data:`~specverify.auditing.checks.POWER` (β = 0.01), at
its share of the family-wise α.  ε is the largest *detectable TV* of the plan's statistical
checks (:meth:`Check.detectable_tv` at the check's n and final-look level).  A TV is at most 1,
so a detectable TV ≥ 1 means the check has no guaranteed power against any deviation at all
(``--budget 10`` at the sampler level: 1.98).

Which TV a run must reach:

- a named budget (``quick`` / ``standard`` / ``thorough``) asks for its own ε (sampler and tree
  level quick: 0.05; decoder quick: 0.05 (mean per position); endpoint quick: 0.1 for the PIT checks and 0.2 between
  the servers' laws), and every check is sized to detect it, so a named budget is underpowered
  only where a check could not be sized (a detectable TV above the level's ceiling);
- a fixed budget (N samples per check) asks for no TV, so it must reach the level's ceiling
  :data:`~specverify.auditing.defaults.POWER_CEILING_TV` (TV 0.25 at every level: a quarter of
  the output law's mass moved; the quick budget of every level reaches it);
- a check sized for its own TV per named budget (:attr:`Check.sized_for_own_tv`: the
  production-shape checks, whose rows cost a megabyte each) must reach that TV instead where it is larger
  (:func:`check_ceiling`), and the verdict names it with its TV.

An underpowered run still runs every check, because a gross loss can show at any n: a failure
is still exit 1 ("loss detected").  Without a failure it is exit 2 unless the caller accepted the
weaker guarantee (``allow_underpowered=True``, ``--allow-underpowered``), which turns it into a
pass that states the TV it did reach.  :func:`power_shortfall` says which check falls short and
the fixed budget that would reach the ceiling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specverify.auditing.checks import POWER, Check, Plan, SampleBudget, resolve_budget
from specverify.auditing.defaults import POWER_CEILING_TV


@dataclass(frozen=True)
class PowerShortfall:
    """A plan that cannot detect the TV a pass promises: ``check`` detects only ``detectable``
    (inf or ≥ 1: no power at all) against the ``ceiling`` of the level; ``needed`` is the
    smallest fixed budget (samples per check) at which every check reaches the ceiling (None when
    it could not be computed)."""

    level: str
    budget: str
    ceiling: float
    check: str
    detectable: float
    needed: int | None

    @property
    def no_power(self) -> bool:
        """True when the worst check's detectable TV is ≥ 1: it is guaranteed to detect nothing."""
        return not self.detectable < 1.0

    def detectable_text(self) -> str:
        if self.detectable == float("inf"):
            return "no TV at all (its test cannot reach power 0.99 at this n)"
        if self.no_power:
            return f"only TV ≥ {self.detectable:.3g}, which no deviation reaches (a TV is at most 1)"
        return f"only TV ≥ {self.detectable:.3g}"

    def fix(self) -> str:
        """The one-line fix: a budget that reaches the ceiling, or the explicit opt-out."""
        sized = f"--budget {self.needed}" if self.needed else "a larger --budget"
        return (f"{sized} (or --budget quick) reaches every check's bound (the level's ceiling TV "
                f"{ceiling_of(self.level):g}, a production-shape check its own quick TV); "
                "--allow-underpowered (allow_underpowered=True) accepts the weaker guarantee")

    def bound_text(self) -> str:
        """The TV the worst check must reach: the level's ceiling, or a production-shape check's own."""
        if self.ceiling <= ceiling_of(self.level) * (1 + 1e-9):
            return f"the {self.level} level's ceiling TV {self.ceiling:g}"
        return (f"the TV {self.ceiling:.3g} this production-shape check is held to (its own quick TV + 1 %; the "
                f"{self.level} level's ceiling TV {ceiling_of(self.level):g} holds the others)")

    def sentence(self) -> str:
        return (f"at budget {self.budget}, {self.check} detects {self.detectable_text()}, above "
                f"{self.bound_text()} that a pass requires (power {POWER:g})")


def ceiling_of(level: str) -> float:
    """The largest detectable TV a pass may state at ``level`` (:data:`POWER_CEILING_TV`; 0.25 for a level not
    listed)."""
    return POWER_CEILING_TV.get(level, 0.25)


def check_ceiling(check: Check, level: str, budget: SampleBudget) -> float:
    """The largest detectable TV a pass may state for ``check``: the level's ceiling, or, for a
    check sized for its own TV (:attr:`Check.sized_for_own_tv`: production shapes, whose rows cost
    a megabyte each), the TV it is sized for under this budget (under a fixed budget, under
    ``quick``) when that is larger.  A plan never states more than the TV its n was sized for
    (:meth:`Check.plan`); the report states every such check's TV."""
    ceiling = ceiling_of(level)
    if not check.sized_for_own_tv:
        return ceiling
    named = budget if budget.epsilon is not None else resolve_budget("quick")  # sampler and tree: BUDGETS
    promised = check.target_tv(named)
    return ceiling if promised is None else max(ceiling, promised)


def power_shortfall(checks: Sequence[Check], plans: Sequence[Plan], level: str, budget: SampleBudget,
                    share: float | None) -> PowerShortfall | None:
    """The worst statistical check of the plan when its detectable TV exceeds the level's
    ceiling (None when every check reaches it).  ``needed``: the largest n any statistical check
    needs for the ceiling at its final-look level (the fixed budget that makes the plan pass)."""
    planned = [(c, p, check_ceiling(c, level, budget)) for c, p in zip(checks, plans)
               if c.statistical and p.alpha is not None]
    if not planned:
        return None
    worst_check, worst_plan, ceiling = max(planned, key=lambda cpc: _detectable(cpc[1]) / cpc[2])
    worst = _detectable(worst_plan)
    if worst <= ceiling:
        return None
    sizes = [_needed(check, plan, check_ceiling(check, level, SampleBudget("fixed", samples=1)))
             for check, plan, _ in planned]
    known = [size for size in sizes if size is not None]
    needed = max(known) if len(known) == len(sizes) else None
    return PowerShortfall(level, budget.name, ceiling, worst_check.name, worst, needed)


def _needed(check: Check, plan: Plan, ceiling: float) -> int | None:
    """The smallest n at which ``check`` detects TV ``ceiling`` at its final-look level: its own
    ``required_samples``, or, where that cannot size the ceiling (a binomial check whose bound
    leaves less than the ceiling to exceed), the first n whose detectable TV is within it (doubling,
    then bisection: the detectable TV decreases in n); None when no n below 10^9 reaches it."""
    alpha = _final_alpha(check, plan)
    try:
        return int(check.required_samples(ceiling, alpha=alpha, power=POWER))
    except Exception:
        pass

    def reaches(n: int) -> bool:
        try:
            return check.detectable_tv(n, alpha=alpha, power=POWER) <= ceiling
        except Exception:
            return False

    high = 16
    while not reaches(high):
        high *= 2
        if high > 10**9:
            return None
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return high


def _detectable(plan: Plan) -> float:
    return float("inf") if plan.detectable_tv is None else float(plan.detectable_tv)


def _final_alpha(check: Check, plan: Plan) -> float:
    if plan.look_alphas:
        return plan.look_alphas[-1]
    assert plan.alpha is not None, "a statistical check's plan has its share of α"
    return check.sizing_level(plan.alpha)
