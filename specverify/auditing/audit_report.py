"""An audit's report in three typed parts: what the user asked for (:class:`AuditSettings`), what
the audit planned for the function (:class:`AuditPlan`), and what it found (:class:`AuditReport`:
the results, the minimal failing case, the replay selection, with the report's settings and plan).

:func:`specverify.auditing.runner.audit` builds them; the formats in :mod:`specverify.auditing.reports`
read them.  The verdicts and exit statuses are those of :mod:`specverify.auditing.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specverify.auditing import replay
from specverify.auditing.checks import POWER, CheckResult, SampleBudget, Verdict
from specverify.auditing.defaults import FAIL_FAST_SKIP, LOCATING_CUT_SKIP, VERBOSE_ENV, AuditVerdict
from specverify.auditing.minimal_case import CaseSearch
from specverify.auditing.omissions import Omission
from specverify.auditing.power import PowerShortfall


@dataclass(frozen=True)
class AuditSettings:
    """What the user asked for: the target and level, the budget, the family-wise ``alpha`` split
    over the statistical checks by ``correction``, the ``power`` every statistical check is sized
    for, the seed, device and per-call timeout, the checks selected, whether to stop at the first
    failure and whether an underpowered plan may pass, the level's own options and the preset.
    The replay lines repeat them."""

    target: str
    level: str
    budget: SampleBudget
    alpha: float
    seed: int
    device: str
    timeout_s: float
    correction: str = "bonferroni"
    """How ``alpha`` is split over the statistical checks: Bonferroni, α / m each of the m."""
    power: float = POWER
    """The probability with which each statistical check detects its detectable TV."""
    selected: tuple[str, ...] | None = None
    """The check names asked for with ``checks=``, or chosen by the preset (None: the whole battery);
    the replay repeats them."""
    fail_fast: bool = False
    """Whether the audit stops at its first failing check (the later checks are then skipped)."""
    allow_underpowered: bool = False
    """Whether a plan that cannot detect the level's ceiling TV may pass (:mod:`specverify.auditing.power`)."""
    level_options: dict[str, Any] = field(default_factory=dict)
    """The level's own keyword arguments (the endpoint level's ``baseline``, ``model``, …); the
    replay lines repeat them."""
    preset: str | None = None
    """The preset that chose the budget and the checks (:mod:`specverify.auditing.presets`), None without one."""
    preset_note: str = ""
    """What the preset ran and left out at this level (:meth:`specverify.auditing.presets.Preset.note`)."""


@dataclass(frozen=True)
class AuditPlan:
    """What the audit planned for this function.  An audit that ended before its plan (the target
    did not load, its signature cannot take the level's call) has the defaults: nothing planned."""

    alpha_share: float | None = None
    """Each statistical check's share of α (None: no statistical check)."""
    shortfall: PowerShortfall | None = None
    """The plan's worst check when it cannot detect the ceiling TV (None: every check can)."""
    omitted: tuple[Omission, ...] = ()
    """Checks the battery left out for this function, with the reason and the fix."""
    notes_said: bool = False
    """Whether the progress display already wrote the plan's notes (the preset's note, checks left
    out with their fix, a power shortfall): the terminal report and :meth:`AuditReport.explain` then
    do not say them again."""


@dataclass(frozen=True)
class AuditReport:
    """Everything an audit found, with the settings it ran under and its plan (see
    :mod:`specverify.auditing.runner` for ``verdict`` and ``exit_code``).

    ``detectable_tv`` is the largest TV any statistical check was sized to detect with power
    ``settings.power`` (the audit's guarantee); ``timings`` holds wall-clock figures, all from the
    audit's start on one clock (``total_s``, ``checks_s``, the call log's, ``post_verdict``: the
    steps after the verdict, :meth:`specverify.auditing.post_verdict.PostVerdict.timings`), the
    only non-deterministic content besides a minimal case sized to a slow function's speed.
    """

    settings: AuditSettings
    checks: tuple[CheckResult, ...]
    verdict: AuditVerdict
    summary: str
    detectable_tv: float | None
    plan: AuditPlan = AuditPlan()
    timings: dict[str, Any] = field(default_factory=dict)
    isolation: dict[str, Any] = field(default_factory=dict)
    """How the function was called: ``mode`` (``process`` | ``none``) and what
    :meth:`specverify.auditing.audited.AuditedFunction.describe` adds."""
    warnings: tuple[str, ...] = ()
    """Warnings raised while the checks ran (third-party deprecation notices and the like), kept
    in the report instead of the terminal; each once, with its count."""
    case_search: CaseSearch = CaseSearch()
    """The minimal failing case looked for after a sampler-level loss: the step on which the function
    is visibly wrong, as a unit test, or why none is shown."""
    replay_checks: tuple[str, ...] | None = None
    """The checks the replay line runs (the failing ones; None: the same selection as this audit)."""
    replay_alpha: float | None = None
    """The α of the replay line: the one that gives each replayed check the α share it had here
    (so that it draws the same samples); None: this audit's α."""
    interrupted: bool = False
    """Whether a Ctrl-C stopped the audit."""

    @property
    def stopped_early(self) -> bool:
        """True when fail-fast skipped checks after a failure (the pattern of verdicts is incomplete)."""
        return any(c.verdict is Verdict.SKIPPED and c.message.startswith((FAIL_FAST_SKIP, LOCATING_CUT_SKIP))
                   for c in self.checks)

    @property
    def exit_code(self) -> int:
        """The exit status of ``specverify audit`` for this verdict (:class:`AuditVerdict`)."""
        return self.verdict.exit_code

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.verdict is Verdict.FAIL)

    @property
    def errors(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.verdict is Verdict.ERROR)

    def explain(self, verbose: bool = True) -> str:
        """A readable account of the verdict, the message first: the headline, the diagnosis (with
        the law the minimal case's wrong tokens follow and the closest known bug) and the minimal
        failing case, then (``verbose``) each failing or erroring check with its inputs, what was
        observed against what was expected, p-value and estimated TV; then the replay line.
        Without ``verbose`` the last line says how to get the checks' details."""
        from specverify.auditing.findings import grouped_findings, said_in_summary

        settings, plan, case = self.settings, self.plan, self.case_search.case
        lines = [f"{settings.target}: {self.verdict.upper()} — {self.summary}"]
        if self.diagnosis:
            lines.append(f"diagnosis: {self.diagnosis}" + "".join(f" {s}" for s in self.case_reading()))
        if case is not None:
            lines.append(case.sentence() + "; as a unit test:")
            lines += ["    " + line if line else "" for line in self.minimal_case_code().splitlines()]
        elif self.case_search.note:
            lines.append(f"minimal case: none: {self.case_search.note}")
        by_name = {c.name: c for c in self.checks}
        details = [finding for finding in grouped_findings(self.checks) if not said_in_summary(finding, self)]
        for finding in details if verbose else ():
            check = by_name[finding.names[0]]
            lines.append(f"- {finding.line()}")
            lines.append(f"    what it checks: {check.description}")
            if check.parameters:
                lines.append("    inputs: " + ", ".join(f"{k}={v}" for k, v in check.parameters.items()))
            if check.n:
                lines.append(f"    n={check.n}, p-value={_fmt(check.pvalue)}, α share={_fmt(check.alpha)}, "
                             f"estimated TV={_fmt(check.empirical_tv)}")
        if not plan.notes_said:
            lines += ([settings.preset_note] if settings.preset_note else []) + [o.line() for o in plan.omitted]
        preset = f"preset {settings.preset}, " if settings.preset else ""
        lines.append(f"({preset}seed {settings.seed}, budget {settings.budget.name}, α = {settings.alpha:g}; "
                     f"replay with `{self.replay_command}`"
                     + (f"; every check: `{self.full_command}`" if self.stopped_early else "") + ")")
        if details and not verbose:
            lines.append(f"(the {len(details)} finding(s) in detail — inputs, n, p-value, estimated TV — with "
                         f"{VERBOSE_ENV}=1 or `pytest -vv`; in Python: report.explain(verbose=True))")
        return "\n".join(lines)

    def case_reading(self) -> list[str]:
        """What the minimal case shows beyond its one token: the wrong law its tokens follow and
        the closest known bug, each a sentence (none without a minimal case)."""
        case = self.case_search.case
        if case is None:
            return []
        found = [f"On the minimal case {case.follows}." if case.follows else "",
                 f"The {case.closest[0].lower()}{case.closest[1:]}." if case.closest else ""]
        return [sentence for sentence in found if sentence]

    def minimal_case_code(self) -> str:
        """The minimal case as a unit test, with the command that finds it again from the seed."""
        case = self.case_search.case
        return case.code(replay=self.replay_command) if case is not None else ""

    @property
    def diagnosis(self) -> str:
        """Where the loss is, read from the pattern of verdicts (:func:`specverify.auditing.diagnosis.diagnose`)."""
        from specverify.auditing.diagnosis import diagnose

        return diagnose(self.checks, self.settings.level, stopped_early=self.stopped_early)

    @property
    def replay_command(self) -> str:
        """The shell command that repeats what went wrong, from the directory it ran in: the
        failing checks (else the erroring ones) with ``--checks``, at the α that keeps their α
        shares (:attr:`replay_alpha`), so they draw the same samples; the whole audit otherwise."""
        settings = self.settings
        checks = self.replay_checks if self.replay_checks is not None else settings.selected
        alpha = self.replay_alpha if self.replay_alpha is not None else settings.alpha
        fail_fast = settings.fail_fast if checks is None or len(checks) > 1 else None
        return replay.replay_command(settings.target, alpha=alpha, checks=checks, fail_fast=fail_fast,
                                     **self._replayed_settings())

    @property
    def full_command(self) -> str:
        """The command that runs the whole battery of this audit without stopping at a failure
        (the whole pattern of verdicts)."""
        return replay.replay_command(self.settings.target, alpha=self.settings.alpha, checks=self.settings.selected,
                                     fail_fast=False, **self._replayed_settings())

    def _replayed_settings(self) -> dict[str, Any]:
        """The settings every replay line repeats (:func:`specverify.auditing.replay.replay_command`)."""
        settings = self.settings
        return dict(level=settings.level, seed=settings.seed, budget=settings.budget.name, device=settings.device,
                    timeout_s=settings.timeout_s, isolation=(self.isolation or {}).get("mode", "process"),
                    allow_underpowered=settings.allow_underpowered, level_options=settings.level_options)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"
