"""The audit: run a level's battery of checks against an implementation and give a verdict.

``audit(fn)`` returns an :class:`AuditReport`; ``assert_lossless(fn)`` raises ``AssertionError``
with a readable explanation unless the audit found no loss.

Verdicts and exit statuses (``specverify audit``):

- 0 ``no loss detected``: every check passed.  The report states the family-wise α, the power
  and the smallest TV deviation every statistical check was sized to detect.
- 1 ``loss detected`` (a statistical or exact check failed) or ``contract violated`` (the function
  modified its inputs, or drew randomness from somewhere other than its generator).  A failure
  takes precedence over errors in other checks: a loss found anywhere is a loss.
- 2 ``could not audit``: the target could not be loaded, or a check could not judge the function
  (it raised, hung past the per-call timeout, or returned output that breaks SPEC §1), and no
  check failed.

Family-wise α: split evenly over the statistical checks (Bonferroni), so a correct implementation
fails the whole audit with probability at most α whatever the dependence between checks.

Levels are pluggable: :data:`LEVELS` maps a level name to the ``module:class`` of its battery
(see :class:`specverify.auditing.sampler.Battery`).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specverify.core import stats
from specverify.auditing.sampler import POWER, CheckResult, Plan, SampleBudget, resolve_budget, result_from_fault, skipped_result
from specverify.auditing.faults import Fault, preserved_global_rng, seed_global_rng
from specverify.auditing.loading import LoadError, load_target
from specverify.core.seeding import derive_seed

LEVELS: dict[str, str] = {
    "sampler": "specverify.auditing.sampler:SamplerBattery",
    "decoder": "specverify.auditing.decoder:DecoderBattery",
    "endpoint": "specverify.auditing.endpoint.battery:EndpointBattery",
}
"""Audit level -> ``module:class`` of its battery (instantiated without arguments)."""

DEFAULT_ALPHA = 1e-3
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_BUDGET = "standard"

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
_FILE_MODULE_PREFIX = "_specverify_target_"  # the private module names specverify.auditing.loading gives .py files
_LOSS_KINDS = ("goodness-of-fit", "binomial", "exact")

Progress = Callable[[int, int, str], None]
"""``progress(done, total, name)``: called before each check (``name`` is the check about to
run) and once at the end with ``done == total``."""


@dataclass(frozen=True)
class AuditReport:
    """Everything an audit found (see the module docstring for ``verdict`` and ``exit_code``).

    ``detectable_tv`` is the largest TV any statistical check was sized to detect with power
    ``power`` (the audit's guarantee); ``timings`` holds wall-clock figures, the only
    non-deterministic content.
    """

    target: str
    level: str
    budget: SampleBudget
    alpha: float
    alpha_share: float | None
    correction: str
    power: float
    seed: int
    device: str
    timeout_s: float
    checks: tuple[CheckResult, ...]
    verdict: str
    exit_code: int
    summary: str
    detectable_tv: float | None
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.verdict == "fail")

    @property
    def errors(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.verdict == "error")

    def explain(self) -> str:
        """A readable account of the verdict: the headline, then each failing or erroring check
        with its inputs, what was observed against what was expected, p-value and estimated TV."""
        lines = [f"{self.target}: {self.verdict.upper()} — {self.summary}"]
        for check in self.failed + self.errors:
            lines.append(f"- {check.name} [{check.verdict}]: {check.message}")
            lines.append(f"    what it checks: {check.description}")
            if check.parameters:
                lines.append("    inputs: " + ", ".join(f"{k}={v}" for k, v in check.parameters.items()))
            if check.n:
                lines.append(f"    n={check.n}, p-value={_fmt(check.pvalue)}, α share={_fmt(check.alpha)}, "
                             f"estimated TV={_fmt(check.empirical_tv)}")
        lines.append(f"(seed {self.seed}, budget {self.budget.name}, α = {self.alpha:g}; replay with "
                     f"`specverify audit {self.target} --seed {self.seed} --budget {self.budget.name}`)")
        return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def target_name(fn: Callable[..., Any] | str) -> str:
    """``module:qualname`` of a callable (``path/to/file.py:qualname`` for one loaded from a file)."""
    if isinstance(fn, str):
        return fn
    module_name = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", type(fn).__name__)
    module = sys.modules.get(module_name)
    if module_name.startswith(_FILE_MODULE_PREFIX) and getattr(module, "__file__", None):
        return f"{module.__file__}:{qualname}"
    return f"{module_name}:{qualname}"


def load_battery(level: str, **options: Any) -> Any:
    """Instantiate the battery of ``level`` from :data:`LEVELS` (``options``: the level's own
    keyword arguments, e.g. the endpoint level's ``baseline``)."""
    if level not in LEVELS:
        raise ValueError(f"level: expected one of {', '.join(sorted(LEVELS))}, got {level!r}")
    module_name, class_name = LEVELS[level].split(":")
    return getattr(importlib.import_module(module_name), class_name)(**options)


def _check_arguments(alpha: float, timeout_s: float, device: str) -> None:
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha: expected a family-wise false-positive rate in (0, 1), e.g. 1e-3; got {alpha!r}")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device: expected 'cpu' or 'cuda' (or 'cuda:N'), got {device!r}")
    if device != "cpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} requested but CUDA is not available here; use --device cpu")


def select_checks(available: Sequence[Any], names: Sequence[str] | None) -> list[Any]:
    """The checks named in ``names`` (all of them for None), in the battery's order."""
    if names is None:
        return list(available)
    known = [c.name for c in available]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"checks: unknown check name(s) {unknown}; this battery has: {', '.join(known)}")
    return [c for c in available if c.name in names]


def plan_checks(checks: Sequence[Any], budget: SampleBudget, alpha: float, seed: int, level: str) -> tuple[list[Plan], float | None]:
    """Each check's :class:`Plan` and the Bonferroni share α / m of the m statistical checks.

    Named budgets: n = the smallest sample size at which the check detects TV ε with power POWER
    at its share of α (``check.required_samples``).  Fixed budgets: n = N and the check reports
    the TV it can then detect.  Seeds: ``derive_seed(level, name, parameters, base=seed)``.
    """
    statistical = [c for c in checks if c.statistical]
    share = stats.bonferroni(alpha, len(statistical)) if statistical else None
    plans = []
    for check in checks:
        seed_of_check = derive_seed(level, check.name, sorted((str(k), str(v)) for k, v in check.parameters.items()),
                                    base=seed)
        if not check.statistical:
            plans.append(Plan(0, 0, None, None, seed_of_check))
            continue
        if budget.epsilon is not None:
            n = check.required_samples(budget.epsilon, alpha=share, power=POWER)
        else:
            n = int(budget.samples)
        detectable = check.detectable_tv(n, alpha=share, power=POWER)
        plans.append(Plan(n, n, share, detectable, seed_of_check))
    return plans, share


def audit(
    fn: Callable[..., Any] | str,
    *,
    level: str = "sampler",
    budget: str | int | SampleBudget = DEFAULT_BUDGET,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    device: str = "cpu",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    checks: Sequence[str] | None = None,
    **level_options: Any,
) -> AuditReport:
    """Audit ``fn`` (a callable, or a target string for :func:`specverify.auditing.loading.load_target`)
    at ``level`` and return the :class:`AuditReport`.  Deterministic for a given ``seed``.

    ``budget``: ``quick`` / ``standard`` / ``thorough`` (at the sampler level every statistical
    check is sized to detect TV 0.05 / 0.02 / 0.01 with power 0.99; a level's battery may define
    its own ``resolve_budget``) or N samples per check.  ``alpha``: the family-wise
    false-positive rate of the whole audit.  ``timeout_s``: the deadline of each call.
    ``checks``: run only the checks with these names (α is then split over the statistical ones
    among them); default all.  ``level_options``: passed to the level's battery (the endpoint
    level's ``baseline``, ``model``, ``concurrency``, ``deadline_s``).
    """
    battery = load_battery(level, **level_options)
    sample_budget = getattr(battery, "resolve_budget", resolve_budget)(budget)  # a level may size its own named budgets
    _check_arguments(alpha, timeout_s, device)
    name = target_name(fn)
    started = time.perf_counter()
    settings = dict(target=name, level=level, budget=sample_budget, alpha=float(alpha), correction="bonferroni",
                    power=POWER, seed=int(seed), device=device, timeout_s=float(timeout_s))
    try:
        if isinstance(fn, str):  # a level whose targets are not Python (the endpoint's URL) loads its own
            fn = battery.load_target(fn) if hasattr(battery, "load_target") else load_target(fn, level)
        session = battery.open_session(fn, device=device, timeout_s=timeout_s)
    except LoadError as error:
        return AuditReport(**settings, alpha_share=None, checks=(), verdict="could not audit",
                           exit_code=EXIT_ERROR, summary=str(error), detectable_tv=None,
                           timings={"total_s": time.perf_counter() - started})
    selected = select_checks(battery.checks(session), checks)
    plans, share = plan_checks(selected, sample_budget, alpha, seed, level)
    results = _run_checks(selected, plans, session, seed, progress)
    total_s = time.perf_counter() - started
    log = getattr(getattr(session, "function", None), "log", None)
    timings: dict[str, Any] = {"total_s": total_s, "checks_s": {r.name: r.seconds for r in results}}
    if log is not None:
        timings.update(function_s=log.function_seconds, calls=log.calls, rows=log.rows,
                       rows_per_s=log.rows / total_s if total_s > 0 else None)
    verdict, exit_code, summary, detectable = _verdict(results, alpha, share)
    return AuditReport(**settings, alpha_share=share, checks=tuple(results), verdict=verdict, exit_code=exit_code,
                       summary=summary, detectable_tv=detectable, timings=timings)


def _run_checks(checks: Sequence[Any], plans: Sequence[Plan], session: Any, seed: int,
                progress: Progress | None) -> list[CheckResult]:
    """Run every check in order; a fault stops only its own check, a timeout also the ones after it
    (the function is not called again once it has hung).  The global RNGs are reseeded per check,
    so even a function that misuses them gives a deterministic report, and restored afterwards."""
    results: list[CheckResult] = []
    hung: str | None = None
    log = getattr(getattr(session, "function", None), "log", None)
    with preserved_global_rng():
        for index, (check, plan) in enumerate(zip(checks, plans)):
            if progress is not None:
                progress(index, len(checks), check.name)
            started = time.perf_counter()
            calls_before, rows_before = (log.calls, log.rows) if log is not None else (0, 0)
            if hung is not None:
                result = skipped_result(check, plan, f"not run: the function hung in {hung}")
            else:
                seed_global_rng(derive_seed("global-rng-state", check.name, base=seed))
                try:
                    result = check.run(session, plan)
                except Fault as fault:
                    result = result_from_fault(check, plan, fault)
                    if fault.kind == "timeout":
                        hung = check.name
            extra = {"seconds": time.perf_counter() - started}
            if log is not None:
                extra.update(calls=log.calls - calls_before, rows=log.rows - rows_before)
            results.append(dataclasses.replace(result, **extra))
    if progress is not None:
        progress(len(checks), len(checks), "done")
    return results


def _verdict(results: Sequence[CheckResult], alpha: float, share: float | None) -> tuple[str, int, str, float | None]:
    statistical = [r for r in results if r.alpha is not None]
    detectable = max((r.detectable_tv for r in statistical if r.detectable_tv is not None), default=None)
    failed = [r for r in results if r.verdict == "fail"]
    errors = [r for r in results if r.verdict == "error"]
    if failed:
        names = ", ".join(r.name for r in failed)
        if any(r.kind in _LOSS_KINDS for r in failed):
            return "loss detected", EXIT_FAIL, f"{len(failed)} check(s) failed: {names}", detectable
        return "contract violated", EXIT_FAIL, f"{len(failed)} check(s) failed: {names}", detectable
    if errors:
        reasons = "; ".join(f"{r.name}: {r.message}" for r in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        return "could not audit", EXIT_ERROR, reasons + more, detectable
    if not statistical or any(r.verdict != "pass" for r in statistical):
        return "could not audit", EXIT_ERROR, "not every statistical check ran", detectable
    summary = (f"no loss detected at α = {alpha:g} (family-wise; Bonferroni over {len(statistical)} checks, "
               f"{share:.3g} each) with power {POWER:g} against TV ≥ {detectable:.3g} in any check's cells")
    return "no loss detected", EXIT_PASS, summary, detectable


def assert_lossless(fn: Callable[..., Any] | str, **options: Any) -> AuditReport:
    """Audit ``fn`` (same options as :func:`audit`) and raise ``AssertionError`` with
    :meth:`AuditReport.explain` unless no loss was detected; return the report otherwise."""
    report = audit(fn, **options)
    if report.exit_code != EXIT_PASS:
        raise AssertionError(report.explain())
    return report
