"""The check framework shared by every audit level: verdicts, budgets, plans, results, checks.

A *battery* is the list of checks of one audit level.  :func:`specverify.auditing.runner.audit`
plans each check's sample size from the budget, runs the checks in order with a guarded session
of the function, and aggregates their verdicts; a level only has to provide a :class:`Battery`
(``open_session`` + ``checks``) and register it in :data:`specverify.auditing.runner.LEVELS`.

Statistical honesty.  Every statistical check is a level-α test with its own share of the
audit's family-wise α (Bonferroni: α_share = α / #statistical checks, valid under any dependence).
Its sample size is the smallest n at which it detects a deviation of total variation ε in the law
of its cells with power ≥ :data:`POWER` (:func:`specverify.core.stats.sample_size_for_tv`, a
noncentral-χ² bound using χ² ≥ 4·TV², so it holds for every alternative at distance ε), or, under
a fixed budget of N samples, it reports the ε it can detect (:func:`specverify.core.stats.detectable_tv`).
Exact and contract checks are deterministic and take no share of α.

Sequential checks (:class:`SequentialCheck`: every sampling check of the sampler, decoder and
tree levels) test their cumulative sample at the looks of their plan, n/16, n/4 and n,
each at its increment of the α-spending function α·t³ (:mod:`specverify.core.sequential`), and
stop at the first look that rejects: P(reject | H0) ≤ Σ levels = α share by the union bound,
whatever the dependence between looks.  Their n is sized at the final look's level (63/64 of the
share), so the final look alone keeps the stated power.

Every check derives from :class:`Check` (deterministic) or :class:`ChiSquareCheck` (a Pearson
test on ``num_cells`` cells) and reports through :meth:`Check.report`, the one place a
:class:`CheckResult` is built.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np

from specverify.auditing.ahead import AheadItem
from specverify.auditing.audited import AuditedFunction, AuditSession
from specverify.auditing.cost import HARNESS_S_PER_ROW, SECONDS_PER_CHECK, SECONDS_UNSAMPLED, Cost
from specverify.auditing.isolation.faults import Fault, FaultKind, call_with_deadline
from specverify.auditing.omissions import Omission
from specverify.core import rounding, stats
from specverify.core.sequential import DEFAULT_LOOKS, SequentialPlan, final_look_alpha
from specverify.core.stats import monte_carlo_draws

POWER = stats.POWER

BUDGETS: dict[str, float] = {"quick": 0.05, "standard": 0.02, "thorough": 0.01}
"""Named budgets: the TV deviation every statistical check detects with power ≥ POWER."""


class Verdict(StrEnum):
    """Outcome of one check.  ``fail``: loss or contract violation; ``error``: the function could
    not be judged on this check (it raised, hung, crashed or returned malformed output);
    ``skipped``: not applicable, or not run."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIPPED = "skipped"


class CheckKind(StrEnum):
    """What a check tests.  A failure of a loss-detecting kind is "loss detected"; a failure of a
    ``contract`` check is "contract violated".  ``request-handling``: exact claims on what a server
    returns for a request's ``max_tokens``, stop strings and end tokens (tokens the target's
    sampling would not have produced: a loss, though not of the sampling law)."""

    GOODNESS_OF_FIT = "goodness-of-fit"
    BINOMIAL = "binomial"
    EXACT = "exact"
    REQUEST_HANDLING = "request-handling"
    CONTRACT = "contract"

    @property
    def detects_loss(self) -> bool:
        return self is not CheckKind.CONTRACT


class Locus(StrEnum):
    """The piece of the rule a check isolates, as its construction guarantees; the diagnosis
    (:mod:`specverify.auditing.diagnosis`) reads where a loss is from the verdicts per locus.

    ``bonus``: q = p, so every draft is accepted and only the bonus token (drawn from p_K) can be
    wrong; ``correction``: drafts accepted up to a rejection whose correction is drawn from
    (p − q)+; ``residual-is-target``: disjoint supports, every draft rejected, where (p − q)+ = p;
    ``one-row-exact``: the exact law of one row alone (no batch); ``single-draft`` / ``multi-draft``:
    steps with K = 1 / K > 1 at toy shapes; ``context``: laws that depend on the tokens before them
    or state carried across calls; ``edge-case``: degenerate laws (zeros, near one-hot, near
    uniform, tiny masses); ``randomness-source`` / ``inputs-unchanged``: the two contracts the
    diagnosis names."""

    BONUS = "bonus"
    CORRECTION = "correction"
    RESIDUAL_IS_TARGET = "residual-is-target"
    ONE_ROW_EXACT = "one-row-exact"
    SINGLE_DRAFT = "single-draft"
    MULTI_DRAFT = "multi-draft"
    CONTEXT = "context"
    EDGE_CASE = "edge-case"
    RANDOMNESS_SOURCE = "randomness-source"
    INPUTS_UNCHANGED = "inputs-unchanged"

    @property
    def locating(self) -> bool:
        """A cheap check that says *where* a loss is (the bonus or the correction alone, the residual
        where (p − q)+ = p, one row exactly): fail-fast still runs it after the first failure."""
        return self in (Locus.BONUS, Locus.CORRECTION, Locus.RESIDUAL_IS_TARGET, Locus.ONE_ROW_EXACT)


# --------------------------------------------------------------------------------------------
# Budgets, plans and results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleBudget:
    """How many samples each statistical check draws.

    Named budgets fix the deviation ``epsilon`` (TV) every check must detect with power ≥ POWER
    and derive each check's n from it; a fixed budget gives every check ``samples`` draws and
    reports the deviation each can then detect.
    """

    name: str
    epsilon: float | None = None
    samples: int | None = None

    def describe(self) -> str:
        if self.epsilon is not None:
            return f"{self.name} (each check sized to detect TV ≥ {self.epsilon:g} with power {POWER:g})"
        return f"{self.samples} samples per check"


def resolve_budget(budget: str | int | SampleBudget) -> SampleBudget:
    """``quick`` (TV 0.05), ``standard`` (0.02), ``thorough`` (0.01), or N samples per check."""
    if isinstance(budget, SampleBudget):
        return budget
    if isinstance(budget, bool):
        raise ValueError(f"budget: expected quick, standard, thorough or a positive integer, got {budget!r}")
    if isinstance(budget, int) or (isinstance(budget, str) and budget.strip().isdigit()):
        samples = int(budget)
        if samples < 10:
            raise ValueError(f"budget: a fixed budget needs at least 10 samples per check, got {samples}")
        return SampleBudget(str(samples), samples=samples)
    if isinstance(budget, str) and budget.strip().lower() in BUDGETS:
        name = budget.strip().lower()
        return SampleBudget(name, epsilon=BUDGETS[name])
    raise ValueError(f"budget: expected quick, standard, thorough or a positive integer N, got {budget!r}")


@dataclass(frozen=True)
class Sizing:
    """A check's sample size for a target TV and the TV verified detectable at it (:meth:`Check.sized_for`)."""

    n: int
    detectable_tv: float


@dataclass(frozen=True)
class Plan:
    """What the audit gives one check: its sample size, level and seed.

    n: samples to draw (0 for deterministic checks); n_required: the theoretical minimum for the
    budget's ε (equal to n for named budgets); alpha: the check's share of the family-wise α
    (None for deterministic checks); detectable_tv: the TV it detects with power ≥ POWER at n;
    seed: the check's own seed, derived from its name and parameters and the audit's base seed.
    """

    n: int
    n_required: int
    alpha: float | None
    detectable_tv: float | None
    seed: int
    looks: tuple[int, ...] = ()
    """Cumulative sample sizes at which a sequential check tests (the last is ``n``); empty for
    deterministic checks and for checks tested once at ``alpha``."""
    look_alphas: tuple[float, ...] = ()
    """The level of each look (α-spending increments, summing to ``alpha``: :mod:`specverify.core.sequential`)."""
    fixed_budget: bool = False
    """True under a fixed budget of N samples per check (``--budget N``), False under a named one."""
    coarse_tv: float | None = None
    """For a check that also tests coarse views of its laws (:mod:`specverify.core.coarse`): the TV
    between coarse laws it detects with power ≥ POWER at n (None for the others)."""


COVERAGE_TABLE = "coverage"
"""A check result whose ``parameters`` hold this key reports coverage (rows of what the audit
reached): the terminal report prints its message whatever its verdict, and the JSON keeps the rows."""


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check (the rows of the report).

    verdict: ``pass`` | ``fail`` (loss or contract violation) | ``error`` (the function could not be
    audited on this check: it raised, hung or returned malformed output) | ``skipped`` (not
    applicable, or not run after a timeout).  ``statistic``/``pvalue`` come from the check's test;
    ``empirical_tv`` is the plug-in TV of the observed cell frequencies (for the exact check: the
    exact TV of one step); ``observed``/``expected`` are per-cell counts and probabilities with
    ``cell_labels``; ``acceptance`` holds ``{"observed": counts of 0..K accepted, "expected":
    probabilities}`` where the theory is known; ``fault`` the fault kind that stopped or failed the
    check; ``calls``/``rows`` the function calls and rows it evaluated; ``seconds`` is wall time
    (the only non-deterministic field).
    """

    name: str
    description: str
    kind: CheckKind
    parameters: Mapping[str, Any]
    verdict: Verdict
    message: str
    n: int = 0
    n_required: int = 0
    num_cells: int = 0
    statistic: float | None = None
    pvalue: float | None = None
    alpha: float | None = None
    empirical_tv: float | None = None
    detectable_tv: float | None = None
    observed: tuple[int, ...] | None = None
    expected: tuple[float, ...] | None = None
    cell_labels: tuple[str, ...] | None = None
    acceptance: Mapping[str, tuple[float, ...]] | None = None
    fault: FaultKind | None = None
    calls: int = 0
    rows: int = 0
    seconds: float = 0.0
    look: int | None = None
    """For a sequential check: the look (1-based) whose test gave this verdict (the first that
    rejected, or the last); ``level`` is that look's share of ``alpha``."""
    num_looks: int = 0
    level: float | None = None
    production_shape: bool = False
    """The check ran at production shapes (:attr:`Check.production_shape`)."""
    sized_for_own_tv: bool = False
    """The check was sized for its own TV, not the budget's ε (:attr:`Check.sized_for_own_tv`)."""
    locus: Locus | None = None
    """The piece of the rule the check isolates (:attr:`Check.locus`)."""
    coarse_tv: float | None = None
    """The TV between coarse laws the check detects (:attr:`Plan.coarse_tv`)."""
    coarse_views: str = ""
    """What those coarse laws are (:attr:`Check.coarse_views`)."""

    def __post_init__(self) -> None:
        # Results built from plain strings ("fail", "goodness-of-fit") get the enums, so that every
        # consumer compares enums and an unknown kind or verdict is an error here, not a silent miss.
        object.__setattr__(self, "kind", CheckKind(self.kind))
        object.__setattr__(self, "verdict", Verdict(self.verdict))
        if self.fault is not None:
            object.__setattr__(self, "fault", FaultKind(self.fault))
        if self.locus is not None:
            object.__setattr__(self, "locus", Locus(self.locus))


class Check:
    """Base of every check: identity, its own plan, and the one way to report.

    Subclasses (dataclasses) set ``name``, ``description``, ``parameters`` (JSON-able; part of the
    check's seed) and the class attribute ``kind``, and implement ``run(session, plan)``, which
    returns :meth:`report` (or raises a :class:`~specverify.auditing.isolation.faults.Fault` that the audit
    turns into a result with :meth:`from_fault`).  A check plans itself (:meth:`plan`):
    ``statistical`` checks take a share of α and a sample size from their ``required_samples``
    (named budgets) and ``detectable_tv`` (every budget); the others get ``Plan(n=0, alpha=None)``.
    """

    name: str
    description: str  # one sentence for readers of the report
    parameters: Mapping[str, Any]
    kind: ClassVar[CheckKind]
    statistical: ClassVar[bool] = False
    sequential: ClassVar[bool] = False
    """Sequential checks are tested at the looks of their plan (:class:`SequentialCheck`); the
    other statistical checks once, at their whole α share."""
    production_shape: ClassVar[bool] = False
    """The check runs at the shapes engines serve (:mod:`specverify.auditing.sampler.production`):
    the diagnosis tells a loss there alone from one at the toy shapes."""
    locus: Locus | None = None
    """The piece of the rule the check isolates (:class:`Locus`), None for a check that isolates none."""
    sizing_verifies_target: ClassVar[bool] = False
    """``required_samples`` returns an n at which the power bound at the target TV was verified
    (a bound not monotone in n: the token-level identity test), so :meth:`sized_for` states the
    target itself."""
    calls_nothing: ClassVar[bool] = False
    """The check only reports what earlier checks recorded (the endpoint's coverage table): it
    runs whatever skipped the others (fail-fast, a fault, a dead server), unless the user
    interrupted the audit."""
    num_cells: int = 0

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        raise NotImplementedError(f"{type(self).__name__} is not a statistical check")

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        raise NotImplementedError(f"{type(self).__name__} is not a statistical check")

    def sized_for(self, epsilon: float, *, alpha: float, power: float) -> Sizing:
        """The samples that detect TV ``epsilon`` with ``power`` at level ``alpha``, and the TV
        verified at them (:class:`Sizing`): ε itself for a check whose ``required_samples``
        verifies it at the n it returns (:attr:`sizing_verifies_target`), else ``detectable_tv``
        at that n (≤ ε wherever the power bound grows with n)."""
        n = self.required_samples(epsilon, alpha=alpha, power=power)
        return Sizing(n, epsilon if self.sizing_verifies_target else self.detectable_tv(n, alpha=alpha, power=power))

    coarse_views: ClassVar[str] = ""
    """What the coarse laws of :meth:`coarse_detectable_tv` are, for the report ("" for a check
    without them)."""

    def coarse_detectable_tv(self, n: int, *, alpha: float, power: float) -> float | None:
        """The TV between coarse laws (:mod:`specverify.core.coarse`) this check's tests detect
        with ``power`` at ``n`` samples and final level ``alpha``, beside :meth:`detectable_tv`;
        None for a check that tests no coarse view."""
        return None

    def target_tv(self, budget: SampleBudget) -> float | None:
        """The TV this check is sized to detect under ``budget``: a named budget's ε; None under a
        fixed budget (N samples per check), where the check states the TV it then detects.  Checks
        whose rows cost megabytes (production shapes) state a larger TV of their own
        (:attr:`sized_for_own_tv`), which the report names."""
        return budget.epsilon

    @property
    def sized_for_own_tv(self) -> bool:
        """Whether :meth:`target_tv` is this check's own TV rather than the budget's ε."""
        return False

    def sizing_level(self, share: float) -> float:
        """The level the final test runs at, for sizing: the whole α share for a check tested once."""
        return share

    def looks(self, n: int, share: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The looks at which the check is tested and their levels: none (one test at ``share``)."""
        return (), ()

    def plan(self, budget: SampleBudget, share: float | None, seed: int) -> Plan:
        """This check's :class:`Plan` under ``budget`` at α share ``share`` (None: no statistical check).

        Named budgets: n and the detectable TV are :meth:`sized_for` at the target TV ε (:meth:`target_tv`),
        the :meth:`sizing_level` (the final look's level) and POWER; fixed budgets: n = N and the
        detectable TV is ``detectable_tv`` at n and the final look's level.
        """
        if not self.statistical or share is None:
            return Plan(0, 0, None, None, seed)
        target = self.target_tv(budget)
        if target is None:
            assert budget.samples is not None, "a budget without a TV to detect fixes the samples per check"
            n = int(budget.samples)
            looks, look_alphas = self.looks(n, share)
            detectable = self.detectable_tv(n, alpha=look_alphas[-1] if looks else share, power=POWER)
        else:
            sizing = self.sized_for(target, alpha=self.sizing_level(share), power=POWER)
            n, detectable = sizing.n, sizing.detectable_tv
            looks, look_alphas = self.looks(n, share)
        coarse = self.coarse_detectable_tv(n, alpha=look_alphas[-1] if looks else share, power=POWER)
        return Plan(n, n, share, detectable, seed, looks, look_alphas, fixed_budget=target is None, coarse_tv=coarse)

    def cost(self, plan: Plan) -> Cost:
        """The time model of ``plan`` (:mod:`specverify.auditing.cost`): by default the audit's own
        work only, a fixed part and ``HARNESS_S_PER_ROW`` a sample; a check that hands the function
        rows states their work (:func:`~specverify.auditing.cost.step_cost`, ``tree_cost``, ``call_cost``)."""
        if not plan.n:
            return Cost(0, SECONDS_UNSAMPLED)
        return Cost(plan.n, SECONDS_PER_CHECK, HARNESS_S_PER_ROW)

    def work_ahead(self, plan: Plan) -> Sequence[AheadItem]:
        """What the check computes from ``plan`` alone, which the audit may make before the check
        needs it (:mod:`specverify.auditing.ahead`); the check claims each item by its key from
        ``session.ahead``.  Nothing by default."""
        return ()

    def run(self, session: Any, plan: Plan) -> CheckResult:
        raise NotImplementedError

    def report(self, plan: Plan, verdict: Verdict, message: str, **measured: Any) -> CheckResult:
        """:func:`check_report` of this check."""
        return check_report(self, plan, verdict, message, **measured)

    def skipped(self, plan: Plan, reason: str) -> CheckResult:
        return check_report(self, plan, Verdict.SKIPPED, reason)

    def from_fault(self, plan: Plan, fault: Fault) -> CheckResult:
        return result_from_fault(self, plan, fault)


class Battery:
    """The checks of one audit level: :meth:`open_session` wraps the function under audit (guards,
    call log), :meth:`checks` lists the checks to run, in order, against that session.  A level
    may override the three hooks: :meth:`omitted` (the checks it leaves out for a function, with the
    fix), :meth:`resolve_budget` (its named budgets mean other TVs) and :meth:`load_target` (targets
    that are not Python, such as the endpoint level's base URL)."""

    level: ClassVar[str]
    first_looks_first: ClassVar[bool] = False
    """Under fail-fast, run every sequential check's first look before any check runs its later
    looks (:func:`specverify.auditing.runner.first_looks`): a gross loss is found within the first
    sixteenth of the audit's work, whichever check sees it."""

    def open_session(self, fn: Any, *, device: str, timeout_s: float, isolation: str = "worker") -> AuditSession:
        raise NotImplementedError

    def checks(self, session: Any) -> list[Check]:
        raise NotImplementedError

    def omitted(self, session: Any) -> list[Omission]:
        """The checks this battery leaves out for the function of ``session``, with the reason and
        the fix (:mod:`specverify.auditing.omissions`); none by default."""
        return []

    def resolve_budget(self, budget: str | int | SampleBudget) -> SampleBudget:
        """The :class:`SampleBudget` of ``budget`` at this level (:func:`resolve_budget`)."""
        return resolve_budget(budget)

    def load_target(self, spec: str) -> Any | None:
        """What a target string means at this level when it is not Python (the endpoint's URL), or
        None: a Python target, which the session loads (in its worker)."""
        return None


def check_report(check: Check, plan: Plan, verdict: Verdict, message: str, **measured: Any) -> CheckResult:
    """The one place a :class:`CheckResult` is built: the identity of ``check`` (its ``name``,
    ``description``, ``kind``, ``parameters``, ``num_cells``), its ``plan`` (``n_required``, α share,
    detectable TV), the verdict and message, and whatever the check measured (``n``, ``pvalue``,
    ``observed``, ...; a measured ``parameters`` or ``num_cells`` replaces the check's own)."""
    fields: dict[str, Any] = {"n_required": plan.n_required, "num_cells": check.num_cells,
                              "alpha": plan.alpha, "detectable_tv": plan.detectable_tv,
                              "production_shape": check.production_shape,
                              "sized_for_own_tv": check.sized_for_own_tv, "locus": check.locus,
                              "coarse_tv": plan.coarse_tv, "coarse_views": check.coarse_views}
    fields.update(measured)
    parameters = fields.pop("parameters", check.parameters)
    return CheckResult(check.name, check.description, check.kind, dict(parameters), verdict, message, **fields)


def result_from_fault(check: Any, plan: Plan, fault: Fault) -> CheckResult:
    """The result of a run stopped by ``fault``: ``fail`` for an impossible output (a loss) and for
    contract violations (the function produced output that breaks the contract), ``error`` for
    faults that leave nothing to judge."""
    verdict = Verdict.FAIL if fault.kind.fails_check else Verdict.ERROR
    return check_report(check, plan, verdict, fault.message, fault=fault.kind)


def skipped_result(check: Any, plan: Plan, reason: str) -> CheckResult:
    return check_report(check, plan, Verdict.SKIPPED, reason)


# --------------------------------------------------------------------------------------------
# Pearson, binomial and contract checks
# --------------------------------------------------------------------------------------------


def _top_deviations(counts: np.ndarray, expected: np.ndarray, labels: tuple[str, ...], limit: int = 3) -> str:
    frequency = counts / max(1, counts.sum())
    order = np.argsort(-np.abs(frequency - expected), kind="stable")[:limit]
    return "; ".join(f"{labels[i]}: observed {frequency[i]:.4f} vs expected {expected[i]:.4f}" for i in order)


def level_of(plan: Plan, level: float | None) -> float:
    """The level a test is run at: ``level`` (a look's), else the check's whole share ``plan.alpha``."""
    level = plan.alpha if level is None else level
    if level is None:
        raise ValueError("plan: a statistical check needs a plan with an α share (plan.alpha is None)")
    return level


def level_phrase(plan: Plan, level: float | None, look: int | None) -> str:
    """How the level of a test is named in messages: "α share 3.3e-05", or, at a look of a
    sequential check, "level 2.9e-05 of look 5/5 (α share 3.3e-05)"."""
    if look is None or not plan.looks:
        return f"α share {level_of(plan, level):.3g}"
    return f"level {level_of(plan, level):.3g} of look {look}/{len(plan.looks)} (α share {plan.alpha:.3g})"


INTERIM_MONTE_CARLO_ENTRIES = 8_000_000
"""Draws × pooled groups (about a second) beyond which an interim look of a sequential check does
not confirm an asymptotic rejection by simulation: its small level needs hundreds of thousands of
draws, and the next look, at a larger level, decides with fewer.  The tail bound still confirms
there, at the look's whole level; the last look always simulates, so the planned power stands."""


def goodness_of_fit_result(check: Check, plan: Plan, counts: np.ndarray, expected: np.ndarray,
                           labels: tuple[str, ...], acceptance: Mapping[str, tuple[float, ...]] | None,
                           *, level: float | None = None, look: int | None = None) -> CheckResult:
    """Pearson goodness of fit of the observed cell counts against the target law (stats module:
    cells pooled by expected count, exact or Monte-Carlo p-value when few cells remain, p = 0 when
    a sample fell in a cell of probability 0), at ``level`` (default: the check's α share); at an
    interim ``look``, no confirmation by simulation beyond :data:`INTERIM_MONTE_CARLO_ENTRIES`."""
    level = level_of(plan, level)
    interim = look is not None and look < len(plan.looks)
    fit = stats.goodness_of_fit(counts, expected, seed=plan.seed % (2**32), monte_carlo_draws=monte_carlo_draws(level),
                               confirm_below=level,
                               monte_carlo_max_entries=INTERIM_MONTE_CARLO_ENTRIES if interim else None)
    failed = fit.pvalue <= level
    where = level_phrase(plan, level, look)
    if fit.impossible_count:
        impossible = [labels[i] for i in np.flatnonzero((expected == 0) & (counts > 0))[:3]]
        message = (f"emitted {fit.impossible_count} sample(s) of target probability 0 "
                   f"({', '.join(impossible)}): certain loss")
    elif failed:
        message = (f"the emitted tokens do not follow the target's law: p-value {fit.pvalue:.3g} ≤ {where}; "
                   f"estimated TV {fit.empirical_tv:.4f}; largest deviations: "
                   f"{_top_deviations(counts, expected, labels)}")
    else:
        message = f"consistent with the target's law (p-value {fit.pvalue:.3g} > {where})"
    return check_report(
        check, plan, Verdict.FAIL if failed else Verdict.PASS, message, n=int(counts.sum()), num_cells=len(expected),
        statistic=float(fit.statistic), pvalue=float(fit.pvalue), empirical_tv=float(fit.empirical_tv),
        observed=tuple(int(c) for c in counts), expected=tuple(float(e) for e in expected), cell_labels=labels,
        acceptance=acceptance, **look_fields(plan, level, look),
    )


def binomial_result(check: Check, plan: Plan, successes: int, n: int, bound: float, labels: tuple[str, str],
                    *, failing: str, passing: str, level: float | None = None, look: int | None = None,
                    note: str = "") -> CheckResult:
    """One-sided exact binomial test of H0: P(success) ≤ ``bound`` on ``successes`` of ``n`` at
    ``level``.  ``failing`` / ``passing`` describe the outcome; they may use ``{rate}``,
    ``{bound}``, ``{pvalue}``, ``{where}`` and ``{excess}``; ``note`` is appended to the message."""
    level = level_of(plan, level)
    test = stats.binomial_test(successes, n, bound, "greater")
    failed = test.pvalue <= level
    text = (failing if failed else passing).format(
        rate=test.estimate, bound=bound, pvalue=test.pvalue, where=level_phrase(plan, level, look),
        excess=test.estimate - bound)
    return check_report(check, plan, Verdict.FAIL if failed else Verdict.PASS, text + (f"; {note}" if note else ""),
                        n=n, num_cells=2, statistic=float(successes), pvalue=float(test.pvalue),
                        empirical_tv=max(0.0, test.estimate - bound), observed=(successes, n - successes),
                        expected=(bound, 1.0 - bound), cell_labels=labels, **look_fields(plan, level, look))


def look_fields(plan: Plan, level: float, look: int | None) -> dict[str, Any]:
    """The :class:`CheckResult` fields that say which look of a sequential check gave the verdict."""
    if look is None or not plan.looks:
        return {}
    return {"look": look, "num_looks": len(plan.looks), "level": level}


# --------------------------------------------------------------------------------------------
# Sequential checks: test at a few looks, stop at the first that rejects
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    """What a sequential check has drawn so far: ``n`` samples and named count arrays (cell
    counts, acceptance lengths, calls ...).  ``a + b`` is the tally of both draws.  ``prepared``:
    what the last draw made ahead for the judgement of the look it completes (e.g. the token-level
    tests' designs, made while its samples were drawn), None when nothing; ``a + b`` keeps ``b``'s."""

    n: int
    counts: Mapping[str, np.ndarray]
    prepared: Any = field(default=None, compare=False, repr=False)

    def __add__(self, other: Tally) -> Tally:
        if set(self.counts) != set(other.counts):
            raise ValueError(f"other: a tally of {sorted(other.counts)} cannot be added to one of "
                             f"{sorted(self.counts)}")
        return Tally(self.n + other.n, {key: self.counts[key] + other.counts[key] for key in self.counts},
                     other.prepared)


class SequentialCheck(Check):
    """A statistical check tested at the looks of its plan (group-sequential design,
    :mod:`specverify.core.sequential`: Lan & DeMets 1983 α-spending, union bound over looks).

    Subclasses implement ``draw(session, plan, n, look) -> Tally`` (``n`` new samples, seeded by
    the plan's seed and ``look``, so every look's samples are fresh and the run is reproducible)
    and ``judge(plan, tally, level, look) -> CheckResult`` (the test of the cumulative tally at
    ``level``).  :meth:`run` draws up to each look, judges, and stops at the first look that
    fails; under H0 that happens with probability ≤ Σ_j level_j = α share whatever the dependence
    between looks, and the final look alone keeps the planned power (its size is drawn from its
    own level, :meth:`SequentialPlan.for_tv <specverify.core.sequential.SequentialPlan.for_tv>`).
    """

    statistical: ClassVar[bool] = True
    sequential: ClassVar[bool] = True
    runs_in_parts: ClassVar[bool] = True
    """Its looks may run apart (:meth:`run_looks` from where the run stands): its :meth:`run` is
    the looks and nothing around them."""

    def sizing_level(self, share: float) -> float:
        """The final look's level (the share less what the earlier looks spend)."""
        return final_look_alpha(share)

    def looks(self, n: int, share: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The default group-sequential design of :mod:`specverify.core.sequential` (looks at n/16,
        n/4, n; spending α t³), or none (one test at the whole share) below one sample a look."""
        if n < len(DEFAULT_LOOKS):
            return (), ()
        design = SequentialPlan(n, share)
        return design.looks, design.alphas

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        raise NotImplementedError

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        raise NotImplementedError

    def run(self, session: Any, plan: Plan) -> CheckResult:
        """Draw to each look of ``plan`` and judge the cumulative tally at that look's level;
        return the first failing judgement, else the last one.  A plan without looks is tested
        once, on ``plan.n`` samples at the whole share ``plan.alpha``."""
        if not plan.looks:
            return self.judge(plan, self.draw(session, plan, plan.n, 0), level_of(plan, None), None)
        return self.run_from(session, plan, LooksReached())

    def run_from(self, session: Any, plan: Plan, reached: LooksReached) -> CheckResult:
        """The result of the run gone on from ``reached`` to its end (:meth:`run_looks`)."""
        result = self.run_looks(session, plan, reached, len(plan.looks)).result
        assert result is not None, "a plan with looks judges at least one"
        return result

    def judged_while_drawing(self) -> bool:
        """Whether each look's judgement but the last runs in the session's work-ahead thread
        (:meth:`~specverify.auditing.ahead.WorkAhead.claim`) while the next look draws: for checks
        whose judgement is long against their draws (many tests at each look on cheap rows), as a
        look that fails has drawn the next one for nothing.  The results are those of the run in
        turn; a look that fails still ends the run, and the next look's draw made meanwhile is
        dropped, whatever it raised (an interrupt excepted).  False by default."""
        return False

    def run_looks(self, session: Any, plan: Plan, reached: LooksReached, stop: int) -> LooksReached:
        """Go on from ``reached`` to look ``stop`` (a count of looks, at most ``len(plan.looks)``):
        the same draws and judgements as :meth:`run` makes, wherever it is paused, so a run in
        parts is the run in one."""
        tally = reached.tally
        judging: tuple[Future[CheckResult], Tally, int] | None = None  # a look's judgement, running
        for index in range(reached.looks, stop):
            if judging is None and reached.finished(plan):
                break
            try:
                part = self.draw(session, plan, plan.looks[index] - (tally.n if tally else 0), index)
            except Exception:
                if judging is not None and (judged := _judged(judging)).finished(plan):
                    return judged
                raise
            if judging is not None:
                reached, judging = _judged(judging), None
                if reached.finished(plan):
                    return reached
            tally = part if tally is None else tally + part
            judge = functools.partial(self.judge, plan, tally, plan.look_alphas[index], index + 1)
            if index + 1 < min(stop, len(plan.looks)) and self.judged_while_drawing():
                key = (self.name, "judgement", plan.seed, tuple(plan.looks), index)
                judging = session.ahead.claim(key, judge), tally, index + 1
            else:
                reached = LooksReached(tally, judge(), index + 1)
        return reached


def _judged(judging: tuple[Future[CheckResult], Tally, int]) -> LooksReached:
    """Where the run stands once the judgement ``judging`` (its future, tally and look count) is in."""
    future, tally, looks = judging
    return LooksReached(tally, future.result(), looks)


@dataclass(frozen=True)
class LooksReached:
    """Where a :class:`SequentialCheck`'s run stands: the tally drawn so far, the judgement of the
    last look and how many looks were judged (none yet: ``LooksReached()``)."""

    tally: Tally | None = None
    result: CheckResult | None = None
    looks: int = 0

    def finished(self, plan: Plan) -> bool:
        """The run is over: a look failed, or the last one was judged."""
        return self.result is not None and (self.result.verdict is Verdict.FAIL or self.looks >= len(plan.looks))


@functools.lru_cache(maxsize=1024)
def binomial_sample_size(delta: float, p0: float, alpha: float, power: float) -> int:
    return stats.binomial_sample_size(delta, p0=p0, alpha=alpha, power=power)


@functools.lru_cache(maxsize=1024)
def binomial_detectable_rate(n: int, p0: float, alpha: float, power: float) -> float:
    """Smallest rate excess δ that the one-sided exact binomial test with n trials detects with
    ``power`` (bisection on :func:`specverify.core.stats.binomial_power`, increasing in δ)."""
    low, high = 0.0, 1.0 - p0
    if stats.binomial_power(n, high, p0=p0, alpha=alpha) < power:
        return math.inf
    for _ in range(50):
        middle = (low + high) / 2
        if stats.binomial_power(n, middle, p0=p0, alpha=alpha) >= power:
            high = middle
        else:
            low = middle
    return high


# Power calculations are pure functions of their arguments and cost ~0.1 s each; audits in one
# process (test suites) repeat them with the same arguments.
_sample_size_for_tv = functools.lru_cache(maxsize=4096)(stats.sample_size_for_tv)
_detectable_tv = functools.lru_cache(maxsize=4096)(stats.detectable_tv)


class ChiSquareCheck(SequentialCheck):
    """A sequential Pearson goodness-of-fit check; its planning on ``num_cells`` cells: the n that detects TV ε with
    the given power at level α, and the TV detectable at a given n (noncentral χ², :mod:`specverify.core.stats`)."""

    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return _sample_size_for_tv(epsilon, alpha=alpha, power=power, num_cells=self.num_cells)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return _detectable_tv(n, alpha=alpha, power=power, num_cells=self.num_cells)


EXACT_TOLERANCE = rounding.INTEGRATION_FLOOR
"""The tolerance of an exact check of a float64 rule (float64 integration error is ~1e-13); a
function computing in another precision gets :func:`specverify.core.rounding.rounding_tolerance`."""


@dataclass(frozen=True)
class ExactCase:
    """One case of an exact check: its label, its ``integral()`` (the exact TV of one step) and the
    K (draft positions or tree nodes) and V that size its rounding tolerance."""

    label: str
    integral: Callable[[], float]
    num_draft: int
    vocab_size: int


def declared_arithmetic_of(function: AuditedFunction) -> tuple[str, bool]:
    """The arithmetic the guarded ``function`` declares and whether it declared one
    (:func:`specverify.core.rounding.declared_arithmetic`); a declaration that names no known
    precision is a ``malformed`` fault (the check cannot be judged)."""
    declared = function.declared("arithmetic")
    if declared is None:
        return rounding.DEFAULT_ARITHMETIC, False
    try:
        return rounding.check_arithmetic(declared), True
    except ValueError as error:
        raise Fault("malformed", str(error)) from None


def exact_cases_result(check: Check, plan: Plan, cases: Sequence[ExactCase], deadline_s: float,
                       arithmetic: str = "float64", declared: bool = True) -> CheckResult:
    """The verdict of an exact check: integrate each case's TV in order, all of them under one
    deadline, stopping at the first lossy case, which decides.

    A case is lossy when its TV exceeds the TV rounding in ``arithmetic`` explains for its K and V
    (:func:`specverify.core.rounding.rounding_tolerance`); a TV within that bound but above the
    float64 floor passes as "exact up to <arithmetic> rounding", with the figure.  ``declared``:
    whether the function declared its arithmetic (the message says how to tighten the bound).
    A :class:`Fault` of the function propagates; any other error means the integrator cannot
    handle this function: the check is skipped."""
    tolerances = [rounding.rounding_tolerance(arithmetic, case.num_draft, case.vocab_size) for case in cases]

    def integrate() -> list[float] | str:
        distances: list[float] = []
        for case, tolerance in zip(cases, tolerances):
            try:
                distances.append(float(case.integral()))
            except Fault:
                raise
            except Exception as error:  # the integrator could not handle this function
                return f"{type(error).__name__}: {error}"
            if distances[-1] > tolerance:
                break  # one lossy case decides; the later cases are not integrated
        return distances

    outcome = call_with_deadline(integrate, (), deadline_s, what=f"exact integration ({check.name})")
    if isinstance(outcome, str):
        return check.skipped(plan, f"exact integration not possible: {outcome}")
    labels = [case.label for case in cases]
    excess = [tv / tolerance for tv, tolerance in zip(outcome, tolerances)]
    worst = max(range(len(outcome)), key=lambda i: excess[i])
    failed = outcome[worst] > tolerances[worst]
    summary = ", ".join(f"{label}: {tv:.3g}" for label, tv in zip(labels, outcome))
    if len(outcome) < len(labels):
        summary += f"; {len(labels) - len(outcome)} later case(s) not integrated"
    assumed = "" if declared else (f" (the function declares no `arithmetic`, so {arithmetic} is assumed; declare "
                                   "`arithmetic = 'float64'` for the tight bound)")
    bound = (f"the {arithmetic} rounding bound {tolerances[worst]:.3g} for K={cases[worst].num_draft}, "
             f"V={cases[worst].vocab_size}")
    if failed:
        message = (f"exact TV of one step = {outcome[worst]:.6g} on {labels[worst]}, above {bound}: lossy{assumed}; "
                   f"per case {summary}")
    elif max(outcome) > rounding.INTEGRATION_FLOOR:
        message = (f"exact up to {arithmetic} rounding: largest exact TV "
                   f"{outcome[worst]:.3g} on {labels[worst]}, within "
                   f"{bound}{assumed} ({summary})")
    else:
        message = f"exact TV ≤ {rounding.INTEGRATION_FLOOR:g} on every case ({summary})"
    return check.report(plan, Verdict.FAIL if failed else Verdict.PASS, message,
                        empirical_tv=outcome[worst], statistic=outcome[worst])


@dataclass
class CallLogCheck(Check):
    """A contract check run after all other checks on the session's ``function.log`` (what every
    call of the function did); skipped when no call completed.  Subclasses implement
    ``judge_log(plan, log)``."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    kind: ClassVar[CheckKind] = CheckKind.CONTRACT

    def run(self, session: Any, plan: Plan) -> CheckResult:
        log = session.function.log
        if log.calls == 0:
            return self.skipped(plan, "no call of the function completed")
        return self.judge_log(plan, log)

    def judge_log(self, plan: Plan, log: Any) -> CheckResult:
        raise NotImplementedError


@dataclass
class InputsUnchangedCheck(CallLogCheck):
    """No call may have modified its input tensors (every call received fresh copies, compared
    with the harness's own afterwards).  Any level whose log records ``calls`` and ``mutations``."""

    locus = Locus.INPUTS_UNCHANGED

    def judge_log(self, plan: Plan, log: Any) -> CheckResult:
        if log.mutations:
            more = f"; … {len(log.mutations) - 3} more" if len(log.mutations) > 3 else ""
            shown = "; ".join(log.mutations[:3]) + more
            return self.report(plan, Verdict.FAIL,
                               f"the function modified its inputs in {len(log.mutations)} "
                               f"of {log.calls} calls ({shown}); "
                               "engines reuse these buffers, so work on copies", parameters={"calls": log.calls},
                               fault=FaultKind.MUTATION)
        return self.report(plan, Verdict.PASS, f"no input tensor changed in {log.calls} calls",
                           parameters={"calls": log.calls})
