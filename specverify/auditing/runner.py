"""The audit: run a level's battery of checks against an implementation and give a verdict.

``audit(fn)`` returns an :class:`~specverify.auditing.audit_report.AuditReport` (its settings, plan and
results); ``assert_lossless(fn)`` raises ``AssertionError`` with a readable explanation unless the
audit found no loss.

Verdicts and exit statuses (``specverify audit``):

- 0 ``no loss detected``: every check passed.  The report states the family-wise α, the power
  and the smallest TV deviation every statistical check was sized to detect.
- 1 ``loss detected`` (a statistical or exact check failed) or ``contract violated`` (the function
  modified its inputs, or drew randomness from somewhere other than its generator).  A failure
  takes precedence over errors in other checks: a loss found anywhere is a loss.
- 2 ``could not audit``: the target could not be loaded, its signature cannot take the level's
  call (:mod:`specverify.auditing.signatures`), or a check could not judge the function (it
  raised, hung past the per-call timeout, or returned output that breaks SPEC §1), and no check
  failed.  At the sampler, tree and decoder levels the first malformed output (a wrong shape,
  dtype, padding) ends the audit: the checks after it are not run, the verdict states that one
  message and the replay runs that one check.
- 2 ``underpowered``: no check failed, but some statistical check cannot detect the TV a pass
  promises (:mod:`specverify.auditing.power`: detectable TV above the level's ceiling, e.g.
  ``--budget 10``); ``allow_underpowered=True`` turns it into a pass that states the TV reached.

Fail-fast (the default of ``quick`` and ``standard``) stops at the first failing check, but first
runs the battery's *locating* checks that have not run yet (those whose
:attr:`~specverify.auditing.checks.Check.locus` is locating: the bonus and correction positions,
disjoint supports, one row exactly), so the first report already says where the loss is; at the
sampler level it then looks for a minimal failing case (:mod:`specverify.auditing.minimal_case`).
The locating checks are checks of the planned battery, with their Bonferroni shares of α: they
only run out of order.  Everything after the
verdict (these and the worker's shutdown) runs within one time budget, a share of the time the
verdict took (:mod:`specverify.auditing.post_verdict`); a locating check its share leaves no time
for is skipped with the reason, and the report states each step's time.

Family-wise α: split evenly over the statistical checks (Bonferroni), so a correct implementation
fails the whole audit with probability at most α whatever the dependence between checks.

Levels are pluggable: :data:`LEVELS` maps a level name to the ``module:class`` of its battery
(see :class:`specverify.auditing.sampler.battery.Battery`).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from specverify.auditing import replay
from specverify.auditing.ahead import WorkAhead
from specverify.auditing.audit_report import AuditPlan, AuditReport, AuditSettings  # AuditReport re-exported here
from specverify.auditing.audited import AuditedFunction, AuditSession
from specverify.auditing.checks import (
    POWER,
    Battery,
    Check,
    CheckResult,
    LooksReached,
    Plan,
    SampleBudget,
    SequentialCheck,
    Verdict,
    result_from_fault,
    skipped_result,
)
from specverify.auditing.defaults import (  # LEVELS is the registry of levels; all re-exported here
    BUDGET_ENV,
    DEFAULT_ALPHA,
    DEFAULT_BUDGET,
    DEFAULT_TIMEOUT_S,
    EXIT_FAIL,
    EXIT_PASS,
    FAIL_FAST_SKIP,
    LEVELS,
    LOCATING_CUT_SKIP,
    MALFORMED_SKIP,
    VERBOSE_ENV,
    AuditVerdict,
    default_fail_fast,
)
from specverify.auditing.isolation.captured import captured_warnings
from specverify.auditing.isolation.faults import CutOff, Fault, FaultKind, preserved_global_rng, seed_global_rng
from specverify.auditing.isolation.process import check_isolation, preserved_process_state, use_audit_threads
from specverify.auditing.loading import LoadError, load_target
from specverify.auditing.minimal_case import MIN_ROWS, CaseSearch, case_rows
from specverify.auditing.omissions import Omission, omitted_checks, omitted_names
from specverify.auditing.post_verdict import PostVerdict
from specverify.auditing.power import PowerShortfall, power_shortfall
from specverify.auditing.presets import resolve_preset
from specverify.auditing.progress import AuditProgress, as_progress
from specverify.auditing.signatures import expected_signature, is_call_type_error, signature_problem
from specverify.core import stats
from specverify.core.seeding import derive_seed

Progress = AuditProgress | Callable[[int, int, str], None]
"""``progress=`` of :func:`audit`: an :class:`specverify.auditing.progress.AuditProgress`, told the
plan and every result and ``end(total_s=…)`` at the audit's true end, or a plain callable
``progress(done, total, name)``, called before each check and once at the end with ``done ==
total`` (:func:`specverify.auditing.progress.as_progress`)."""


def target_name(fn: Callable[..., Any] | str) -> str:
    """A target string for ``fn`` that loads from the current directory
    (:func:`specverify.auditing.replay.target_name`)."""
    return replay.target_name(fn)


def load_battery(level: str, **options: Any) -> Battery:
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


def select_checks(available: Sequence[Any], names: Sequence[str] | None, omitted: Sequence[str] = ()) -> list[Any]:
    """The checks named in ``names`` (all of them for None), in the battery's order.  A name the
    battery left out for this function (``omitted``) is not an error: the report says why it did not run."""
    if names is None:
        return list(available)
    known = [c.name for c in available]
    unknown = [n for n in names if n not in known and n not in omitted]
    if unknown or not names:
        raise ValueError(f"checks: unknown check name(s) {unknown}; this battery has: {', '.join(known)}"
                         + (f" (not run for this function: {', '.join(omitted)})" if omitted else ""))
    return [c for c in available if c.name in names]


def plan_checks(checks: Sequence[Check], budget: SampleBudget, alpha: float, seed: int,
                level: str) -> tuple[list[Plan], float | None]:
    """Each check's own :meth:`Check.plan` at the Bonferroni share α / m of the m statistical checks.

    Seeds: ``derive_seed(level, name, parameters, base=seed)``."""
    statistical = [c for c in checks if c.statistical]
    share = stats.bonferroni(alpha, len(statistical)) if statistical else None
    return [check.plan(budget, share, derive_seed(level, check.name,
                                                  sorted((str(k), str(v)) for k, v in check.parameters.items()),
                                                  base=seed))
            for check in checks], share


def audit(
    fn: Callable[..., Any] | str,
    *,
    level: str = "sampler",
    budget: str | int | SampleBudget | None = None,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    device: str = "cpu",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    checks: Sequence[str] | None = None,
    isolation: str = "process",
    fail_fast: bool | None = None,
    allow_underpowered: bool = False,
    preset: str | None = None,
    **level_options: Any,
) -> AuditReport:
    """Audit ``fn`` (a callable, or a target string for :func:`specverify.auditing.loading.load_target`)
    at ``level`` and return the :class:`AuditReport`.  Deterministic for a given ``seed``.

    ``budget``: default ``$SPECVERIFY_BUDGET`` or ``standard``; ``quick`` / ``standard`` / ``thorough`` (at the
    sampler level every statistical
    check is sized to detect TV 0.05 / 0.02 / 0.01 with power 0.99; a level's battery may define
    its own ``resolve_budget``) or N samples per check.  ``alpha``: the family-wise
    false-positive rate of the whole audit.  ``timeout_s``: the deadline of each call.
    ``checks``: run only the checks with these names (α is then split over the statistical ones
    among them); default all.  ``isolation``: ``"process"`` runs the function in a worker
    process that is killed at a deadline and restarted after it ends abnormally
    (:mod:`specverify.auditing.isolation.process`); ``"none"`` calls it in this process, restoring the
    torch default dtype, thread count and numpy error state afterwards.  A callable that cannot
    be sent to a worker (a lambda, a closure) runs in-process, with a note in the report.
    A Ctrl-C stops the audit at once with a partial report (exit 2 unless a check had failed).
    ``fail_fast``: stop at the first failing check, after running the locating checks not run
    yet, and skip the rest (default: yes for the ``quick`` and ``standard`` budgets, no for
    ``thorough`` and fixed budgets).  Statistical checks stop at their own first rejecting
    look in any case (:class:`specverify.auditing.checks.SequentialCheck`).
    ``allow_underpowered``: let a plan whose checks cannot detect the level's ceiling TV pass
    (default: such a run ends in exit 2 "underpowered", :mod:`specverify.auditing.power`).
    ``preset``: a named budget for a gate (:data:`specverify.auditing.presets.PRESETS`: ``pre-commit``,
    ``nightly``) that sets the budget, the checks and the fail-fast default; it excludes ``budget`` and ``checks``.
    ``level_options``: passed to the level's battery (the endpoint level's ``baseline``, ``model``,
    ``concurrency``, ``deadline_s``).
    """
    chosen = resolve_preset(preset) if preset is not None else None
    if chosen is not None:
        for argument, value in (("budget", budget), ("checks", checks)):
            if value is not None:
                raise ValueError(f"{argument}: preset {chosen.name!r} sets the {argument}; pass {argument} or "
                                 "preset, not both")
        budget = chosen.budget
        fail_fast = chosen.fail_fast if fail_fast is None else fail_fast
    if budget is None:
        budget = os.environ.get(BUDGET_ENV, "").strip() or DEFAULT_BUDGET
    battery = load_battery(level, **level_options)
    sample_budget = battery.resolve_budget(budget)
    _check_arguments(alpha, timeout_s, device)
    check_isolation(isolation)
    if fail_fast is None:
        fail_fast = default_fail_fast(sample_budget.name)
    if not isinstance(fail_fast, bool):
        raise ValueError(f"fail_fast: expected True, False or None (the budget's default), got {fail_fast!r}")
    if not isinstance(allow_underpowered, bool):
        raise ValueError(f"allow_underpowered: expected True or False, got {allow_underpowered!r}")
    name = target_name(fn)
    started = time.perf_counter()
    settings = AuditSettings(target=name, level=level, budget=sample_budget, alpha=float(alpha), seed=int(seed),
                             device=device, timeout_s=float(timeout_s),
                             selected=None if checks is None else tuple(checks), fail_fast=fail_fast,
                             allow_underpowered=allow_underpowered, level_options=dict(level_options),
                             preset=None if chosen is None else chosen.name)
    case_search = CaseSearch()
    post = PostVerdict(started)
    display = as_progress(progress)
    display.audit_started(started)
    displayed = False
    with preserved_process_state():
        try:
            resolved = battery.load_target(fn) if isinstance(fn, str) else None
            if resolved is not None:  # not Python (the endpoint's URL)
                fn = resolved
            elif isinstance(fn, str) and isolation == "none":
                fn = load_target(fn, level)
            session = battery.open_session(fn, device=device, timeout_s=timeout_s, isolation=isolation)
        except LoadError as error:
            return AuditReport(settings, checks=(), verdict=AuditVerdict.COULD_NOT_AUDIT, summary=str(error),
                               detectable_tv=None, timings={"total_s": time.perf_counter() - started})
        if not isinstance(session, AuditSession):
            raise TypeError(f"level {level!r}: its battery's open_session returned a {type(session).__name__}; "
                            "return a subclass of specverify.auditing.audited.AuditSession whose function is an "
                            "AuditedFunction")
        function = session.function
        if function.runs_in_worker():
            use_audit_threads()  # restored on exit (preserved_process_state)
        try:
            problem = signature_problem(level, function.raw, name.rsplit(":", 1)[-1] if ":" in name else None)
            if problem is not None:  # every check would raise the same TypeError: say it once, run nothing
                return AuditReport(settings, checks=(), verdict=AuditVerdict.COULD_NOT_AUDIT, summary=problem,
                                   detectable_tv=None,
                                   timings={"total_s": time.perf_counter() - started},
                                   isolation={"mode": isolation} | function.describe())
            omitted = tuple(omitted_checks(battery, session))
            available = battery.checks(session)
            if chosen is not None:
                every = [c.name for c in available] + sorted(omitted_names(omitted))
                checks = chosen.select(level, every)
                runs = [c.name for c in available if checks is None or c.name in checks]
                settings = dataclasses.replace(
                    settings, selected=None if checks is None else tuple(checks),
                    preset_note=chosen.note(level, runs, [n for n in every if checks is not None and n not in checks]))
            selected = select_checks(available, checks, sorted(omitted_names(omitted)))
            if checks is not None:
                omitted = tuple(o for o in omitted if any(n in checks for n in o.names))
            plans, share = plan_checks(selected, sample_budget, alpha, seed, level)
            shortfall = power_shortfall(selected, plans, level, sample_budget, share)
            display.begin(target=name, level=level, budget=sample_budget, alpha=float(alpha), checks=selected,
                          plans=plans, log=function.log)
            displayed = True
            for line in ([settings.preset_note] if settings.preset_note else []) + plan_notes(
                    shortfall, omitted, allow_underpowered):
                display.note(line)
            plan = AuditPlan(alpha_share=share, shortfall=shortfall, omitted=omitted, notes_said=display.says_notes)
            ahead = WorkAhead(function.gate)
            for check, check_plan in zip(selected, plans):
                ahead.add(check.work_ahead(check_plan))
            session.use_ahead(ahead)  # started by _run_checks once the first looks are done
            locating = tuple(c.name for c in selected if c.locus is not None and c.locus.locating) if fail_fast else ()
            with captured_warnings() as caught:
                results, interrupted = _run_checks(selected, plans, session, seed, display, fail_fast, locating,
                                                   post, stop_at_malformed=level != "endpoint",
                                                   first_looks_first=battery.first_looks_first)
                post.open()
                if level == "sampler" and not interrupted and any(r.verdict is Verdict.FAIL and r.kind.detects_loss
                                                                  for r in results):
                    case_search = _minimal_case(name, selected, results, function, seed, post, display)
        finally:
            session.ahead.close()
            _shut_down(session, post)
            total_s = time.perf_counter() - started
            if displayed:
                display.end(total_s=total_s)
    log = function.log
    described = {"mode": isolation} | function.describe()
    timings: dict[str, Any] = {"total_s": total_s, "checks_s": {r.name: r.seconds for r in results},
                               "function_s": log.function_seconds, "calls": log.calls, "rows": log.rows,
                               "rows_per_s": log.rows / total_s if total_s > 0 else None}
    timings["post_verdict"] = post.timings()
    verdict, summary, detectable = _verdict(results, alpha, share, level=level, shortfall=shortfall,
                                            allow_underpowered=allow_underpowered, omitted=omitted,
                                            epsilon=sample_budget.epsilon)
    if interrupted:
        done = sum(r.verdict != "skipped" for r in results)
        stopped = (f"interrupted by the user (Ctrl-C) after {done} of {len(results)} checks; the partial results "
                   "above are all that was established")
        if verdict.exit_code == EXIT_FAIL:
            summary = f"{summary}; {stopped}"
        else:
            verdict, summary = AuditVerdict.COULD_NOT_AUDIT, stopped
    replay_checks, replay_alpha = _replay_selection(selected, results, plans, share, sample_budget, alpha, seed,
                                                    level)
    return AuditReport(settings, checks=tuple(results), verdict=verdict, summary=summary, detectable_tv=detectable,
                       plan=plan, timings=timings, isolation=described, warnings=tuple(caught),
                       case_search=case_search, replay_checks=replay_checks, replay_alpha=replay_alpha,
                       interrupted=interrupted)


def plan_notes(shortfall: PowerShortfall | None, omitted: Sequence[Omission], allow_underpowered: bool) -> list[str]:
    """What the plan header adds: a power shortfall (and what it means for the exit status) and
    the checks left out for this function."""
    notes = []
    if shortfall is not None:
        outcome = ("it passes only as underpowered (--allow-underpowered)" if allow_underpowered else
                   "without a failure it ends in exit 2 (underpowered)")
        notes.append(f"underpowered: {shortfall.sentence()}; it can still find a gross loss, but {outcome}; "
                     f"{shortfall.fix()}")
    notes += [omission.line() for omission in omitted]
    return notes


def _minimal_case(target: str, checks: Sequence[Any], results: Sequence[CheckResult], function: AuditedFunction,
                  seed: int, post: PostVerdict, display: AuditProgress) -> CaseSearch:
    """:func:`specverify.auditing.minimal_case.find_minimal_case` over the failing loss checks,
    sized to the function's measured rows/s and cut off at the post-verdict deadline (never an
    error of the audit: a fault of the function here only means no case is shown); the step's
    time and outcome go into ``post``."""
    from specverify.auditing.minimal_case import find_minimal_case

    begun = time.perf_counter()
    log = function.log
    rows_per_s = log.rows / log.function_seconds if log.rows and log.function_seconds > 0 else None
    startup_s = function.startup_s()
    left = post.seconds_left() - startup_s
    rows = case_rows(rows_per_s, left)
    if function.stop_reason() is not None:
        search = CaseSearch(None, "the function can no longer be called", False)
    elif rows == 0 and rows_per_s is not None and left > 0:
        search = CaseSearch(None, f"skipped: the function evaluates {rows_per_s:,.0f} rows per second of its own time; "
                                  f"a case needs {MIN_ROWS:,} rows ≈ {MIN_ROWS / rows_per_s:.1f} s a call, more than "
                                  f"half the {left:.1f} s left of the post-verdict budget ({post.basis()})", True)
    elif rows == 0:
        restart = f" once the worker process is started again ({startup_s:.1f} s the last time)" if startup_s else ""
        search = CaseSearch(None, f"skipped: no time is left of the post-verdict budget ({post.basis()}){restart}",
                            True)
    else:
        display.after_verdict(f"looking for a minimal failing case ({rows:,} rows a call), until the post-verdict "
                              f"deadline in {post.seconds_left():.0f} s")
        failing = [(c, r) for c, r in zip(checks, results) if r.verdict is Verdict.FAIL and r.kind.detects_loss]
        function.cut_off_at(post.deadline())
        try:
            search = find_minimal_case(target, failing, function, seed, rows=rows, rows_per_s=rows_per_s,
                                       deadline=post.deadline())
        except Fault as fault:
            search = CaseSearch(None, f"looking for one, the function failed: {fault.message}", False)
        except KeyboardInterrupt:
            search = CaseSearch(None, "interrupted by the user", False)
        finally:
            function.cut_off_at(None)
    post.record("minimal case", time.perf_counter() - begun, search.outcome(), cut_off=search.cut_off)
    return search


def _shut_down(session: AuditSession, post: PostVerdict) -> None:
    """Close the session and record the step of a worker's shutdown: asked to stop, killed after a
    grace of what is left of the post-verdict budget (at most
    :data:`specverify.auditing.isolation.process.STOP_GRACE_S`; cut off below it)."""
    from specverify.auditing.isolation.process import SHUTDOWN_BOUND_S, STOP_GRACE_S

    if post.verdict_at is None:
        session.close()
        return
    running = session.function.worker_running()
    grace_s = min(STOP_GRACE_S, post.seconds_left())
    begun = time.perf_counter()
    session.close(grace_s)
    if not running:
        return
    if grace_s < STOP_GRACE_S:
        post.record("shutdown", time.perf_counter() - begun,
                    f"the worker process was asked to stop with {grace_s:.1f} s of its {STOP_GRACE_S:g} s grace left "
                    "in the post-verdict budget, then killed if still running", cut_off=True)
    else:
        post.record("shutdown", time.perf_counter() - begun,
                    f"worker process stopped, bounded by {SHUTDOWN_BOUND_S:g} s")


def _replay_selection(checks: Sequence[Any], results: Sequence[CheckResult], plans: Sequence[Plan],
                      share: float | None, budget: SampleBudget, alpha: float, seed: int,
                      level: str) -> tuple[tuple[str, ...] | None, float | None]:
    """The checks the replay line runs (the failing ones, else the erroring ones; None: the
    audit's own selection) and the α at which each keeps its α share here, so that it draws the
    same samples (the shortest decimal that gives every replayed check the same plan)."""
    failed = [r.name for r in results if r.verdict is Verdict.FAIL]
    chosen = failed or [r.name for r in results if r.verdict is Verdict.ERROR]
    if not chosen or len(chosen) == len(results):
        return None, None
    replayed = [c for c in checks if c.name in chosen]
    statistical = [c for c in replayed if c.statistical]
    if not statistical or share is None:
        return tuple(chosen), None
    exact = share * len(statistical)
    original = {c.name: p for c, p in zip(checks, plans)}
    for text in (f"{exact:.4g}", f"{exact:.7g}", repr(exact)):
        candidate = float(text)
        if not 0 < candidate < 1:
            continue
        again, _ = plan_checks(replayed, budget, candidate, seed, level)
        if all(p.n == original[c.name].n and p.looks == original[c.name].looks and
               all(abs(a - b) <= 1e-6 * b for a, b in zip(p.look_alphas, original[c.name].look_alphas))
               for c, p in zip(replayed, again)):
            return tuple(chosen), candidate
    return tuple(chosen), None


INTERRUPTED_WHILE_RUNNING = "interrupted by the user (Ctrl-C) while running"
"""The message of the check a Ctrl-C stopped."""


@dataclasses.dataclass(frozen=True)
class _FirstLook:
    """A check's first look, run before any check runs in full (:func:`first_looks`): where its
    run stands, or its final result (a failure, a fault, an interrupt), and what the look spent."""

    reached: LooksReached | None
    result: CheckResult | None
    seconds: float
    calls: int
    rows: int
    interrupted: bool = False


def first_looks(checks: Sequence[Any], plans: Sequence[Plan], session: AuditSession, seed: int,
                display: AuditProgress, candidates: Sequence[int]) -> dict[int, _FirstLook]:
    """The first look of each check of ``candidates`` (indices of sequential checks with several
    looks that may run apart), in the battery's order, up to the first one that ends its check (a
    failure, a fault) or an interrupt.

    A check's looks spend its α share whatever the order they run in, and each look's samples are
    seeded by the plan's seed and the look, so running every first look (1/16 of each check's
    samples) before any check's later looks changes no test: a loss that any check sees at its
    first look is found within the first sixteenth of the audit's work, wherever the check
    stands in the battery."""
    function = session.function
    log = function.log
    done: dict[int, _FirstLook] = {}
    began = time.perf_counter()
    display.note(f"first looks: {len(candidates)} statistical checks, each on the first sixteenth of its samples, "
                 "before any runs in full")
    for index in candidates:
        check, plan = checks[index], plans[index]
        if function.stop_reason() is not None:
            break
        started = time.perf_counter()
        calls_before, rows_before = log.calls, log.rows
        reached: LooksReached | None = None
        result: CheckResult | None = None
        interrupted = False
        seed_global_rng(derive_seed("global-rng-state", check.name, "first look", base=seed))
        try:
            reached = check.run_looks(session, plan, LooksReached(), 1)
            if reached.result is not None and reached.result.verdict is Verdict.FAIL:
                result, reached = reached.result, None
        except Fault as fault:
            result = result_from_fault(check, plan, fault)
        except KeyboardInterrupt:
            interrupted = True
            result = skipped_result(check, plan, INTERRUPTED_WHILE_RUNNING)
        done[index] = _FirstLook(reached, result, time.perf_counter() - started, log.calls - calls_before,
                                 log.rows - rows_before, interrupted)
        if result is not None:
            break
    if all(look.result is None for look in done.values()):
        display.note(f"first looks: no loss seen in {len(done)} checks ({time.perf_counter() - began:.1f} s); "
                     "each check now runs its other looks")
    return done


def _first_look_candidates(checks: Sequence[Any], plans: Sequence[Plan]) -> list[int]:
    """The checks whose first look runs before the others' later looks (:func:`first_looks`)."""
    return [index for index, (check, plan) in enumerate(zip(checks, plans))
            if isinstance(check, SequentialCheck) and check.runs_in_parts and len(plan.looks) > 1]


def _run_checks(checks: Sequence[Any], plans: Sequence[Plan], session: AuditSession, seed: int,
                display: AuditProgress, fail_fast: bool = False, locating: Sequence[str] = (),
                post: PostVerdict | None = None, *, stop_at_malformed: bool = True,
                first_looks_first: bool = False) -> tuple[list[CheckResult], bool]:
    """Run every check in order and return the results and whether the user interrupted.

    With ``fail_fast`` and ``first_looks_first``, on reaching the first sequential check the
    checks from there on run their first looks (:func:`first_looks`), then every check runs in
    order from where it stands.  With ``fail_fast`` the checks after the first failing one
    are skipped (their message begins with :data:`FAIL_FAST_SKIP`), except the ``locating`` ones,
    which still run (in the battery's order) so that the report can say where the loss is: the
    first failure opens the post-verdict budget ``post``, and the locating checks run until its
    locating share ends (the function is cut off then; a check it stops or leaves no time for is
    skipped with :data:`LOCATING_CUT_SKIP`); their time goes into ``post``.

    A fault stops only its own check: after a deadline or an abnormal end the worker is restarted
    and the next checks still run, until the function has hung or ended its process
    MAX_WORKER_LOSSES times (in-process: once it has hung), after which the rest is skipped.  A
    Ctrl-C (KeyboardInterrupt in this process) skips the check it interrupted and all later ones.
    With ``stop_at_malformed`` (the levels that call a function: an endpoint's malformed replies
    are the server's, check by check) a malformed output skips all later checks, the locating
    ones too (:data:`MALFORMED_SKIP`).
    A check that :attr:`~Check.calls_nothing` runs whatever skipped the others, unless the user
    interrupted.  The checks' work made ahead (``session.ahead``) starts once the first looks are
    done (at once without them): an audit that a first look ends needs none of it.  The global RNGs
    are reseeded per check, so even a function that misuses them gives a deterministic report, and
    restored afterwards."""
    results: list[CheckResult] = []
    function = session.function
    log = function.log
    interrupted = False
    first_failure: str | None = None
    locating_left = [c.name for c in checks if c.name in locating]
    after_verdict: list[CheckResult] = []
    malformed_in: str | None = None

    def settled(check: Any, result: CheckResult) -> None:
        """What a check's final result sets: a malformed output, the first failure."""
        nonlocal malformed_in, first_failure
        if stop_at_malformed and result.fault is FaultKind.MALFORMED and malformed_in is None:
            malformed_in = check.name
        if fail_fast and first_failure is None and result.verdict is Verdict.FAIL:
            first_failure = check.name
            done = {r.name for r in results} | {check.name}
            following = [name for name in locating_left if name not in done]
            if post is not None and following:
                _open_locating(post, function, display, following)

    candidates = _first_look_candidates(checks, plans) if fail_fast and first_looks_first else []
    looked: dict[int, _FirstLook] = {}
    if not candidates:
        session.ahead.start()
    try:
        with preserved_global_rng():
            for index, (check, plan) in enumerate(zip(checks, plans)):
                if candidates and index == candidates[0] and first_failure is None and malformed_in is None \
                        and not interrupted:
                    looked = first_looks(checks, plans, session, seed, display, candidates)
                    session.ahead.start()  # a loss the first looks find ends the audit before any of it is needed
                    for looked_index, look in looked.items():
                        interrupted = interrupted or look.interrupted
                        if look.result is not None:
                            settled(checks[looked_index], look.result)
                display.check_started(index, check, plan)
                started = time.perf_counter()
                calls_before, rows_before = log.calls, log.rows
                first = looked.get(index)
                stop = function.stop_reason()
                ran_after_verdict = first_failure is not None
                if first is not None and first.result is not None:
                    result, ran_after_verdict = first.result, False
                elif interrupted:
                    result = skipped_result(check, plan, "not run: the audit was interrupted by the user")
                elif check.calls_nothing:
                    result = check.run(session, plan)
                elif malformed_in is not None:
                    result = skipped_result(check, plan, f"{MALFORMED_SKIP} (in {malformed_in})")
                elif first_failure is not None and check.name not in locating:
                    passed = "" if first is None else "; its first look passed"
                    result = skipped_result(check, plan, f"{FAIL_FAST_SKIP} ({first_failure}){passed}; run with "
                                                         "--no-fail-fast (fail_fast=False) for every check")
                elif first_failure is not None and post is not None and started >= post.locating_deadline():
                    result = skipped_result(check, plan, _locating_cut(first_failure, post))
                elif stop is not None:
                    result = skipped_result(check, plan, f"not run: {stop}")
                else:
                    seed_global_rng(derive_seed("global-rng-state", check.name, base=seed))
                    try:
                        if first is not None and first.reached is not None:
                            result = check.run_from(session, plan, first.reached)
                        else:
                            result = check.run(session, plan)
                    except Fault as fault:
                        result = result_from_fault(check, plan, fault)
                    except KeyboardInterrupt:
                        interrupted = True
                        result = skipped_result(check, plan, INTERRUPTED_WHILE_RUNNING)
                    except CutOff:
                        result = skipped_result(check, plan, _locating_cut(first_failure, post))
                spent = (first.seconds, first.calls, first.rows) if first is not None else (0.0, 0, 0)
                results.append(dataclasses.replace(result, seconds=time.perf_counter() - started + spent[0],
                                                   calls=log.calls - calls_before + spent[1],
                                                   rows=log.rows - rows_before + spent[2]))
                if ran_after_verdict and check.name in locating:
                    after_verdict.append(results[-1])
                if first is None or first.result is None:
                    settled(check, results[-1])
                display.check_finished(index, results[-1])
    finally:
        if post is not None and post.verdict_at is not None and first_failure is not None:
            _close_locating(post, function, after_verdict)
    return results, interrupted


def _open_locating(post: PostVerdict, function: AuditedFunction, display: AuditProgress,
                   following: Sequence[str]) -> None:
    """At the first failure under fail-fast: open the post-verdict budget, cut the function off at
    the locating checks' share, and say what follows."""
    post.open()
    function.cut_off_at(post.locating_deadline())
    display.after_verdict(post.announcement(f"the locating checks ({', '.join(following)}) follow, within "
                                            f"{_locating_s(post):.0f} s"))


def _close_locating(post: PostVerdict, function: AuditedFunction, after: Sequence[CheckResult]) -> None:
    """Lift the cutoff and record the locating checks' step: their time and how many ran
    (``after``: the results of the locating checks run after the verdict)."""
    function.cut_off_at(None)
    if not after:
        return
    cut = sum(r.message.startswith(LOCATING_CUT_SKIP) for r in after)
    ran = sum(r.verdict is not Verdict.SKIPPED for r in after)
    share = _locating_s(post)
    outcome = f"{ran} of {len(after)} ran" + (f", {cut} not run: their share of {share:.1f} s was spent" if cut else "")
    post.record("locating checks", sum(r.seconds for r in after), outcome, cut_off=cut > 0)


def _locating_s(post: PostVerdict) -> float:
    """Seconds of the locating checks' share: from the verdict to :meth:`PostVerdict.locating_deadline`."""
    return post.locating_deadline() - (post.started + post.verdict_s)


def _locating_cut(first_failure: str | None, post: PostVerdict | None) -> str:
    share = f" ({_locating_s(post):.1f} s)" if post is not None and post.verdict_at is not None else ""
    return (f"{LOCATING_CUT_SKIP}{share} after {first_failure} failed; run with --no-fail-fast (fail_fast=False) "
            "for every check")


def _verdict(results: Sequence[CheckResult], alpha: float, share: float | None, *, level: str = "sampler",
             shortfall: PowerShortfall | None = None, allow_underpowered: bool = False,
             omitted: Sequence[Omission] = (), epsilon: float | None = None) -> tuple[AuditVerdict, str, float | None]:
    statistical = [r for r in results if r.alpha is not None]
    detectable = max((r.detectable_tv for r in statistical if r.detectable_tv is not None), default=None)
    failed = [r for r in results if r.verdict is Verdict.FAIL]
    errors = [r for r in results if r.verdict is Verdict.ERROR]
    if failed:
        names = ", ".join(r.name for r in failed)
        impossible = [r.name for r in failed if r.fault is FaultKind.IMPOSSIBLE]
        if impossible:
            message = (f"{len(failed)} check(s) failed: {names}; impossible output in "
                       f"{', '.join(impossible)} (tokens no lossless rule can emit)")
            return AuditVerdict.LOSS_DETECTED, message, detectable
        if any(r.kind.detects_loss for r in failed):
            return AuditVerdict.LOSS_DETECTED, f"{len(failed)} check(s) failed: {names}", detectable
        return AuditVerdict.CONTRACT_VIOLATED, f"{len(failed)} check(s) failed: {names}", detectable
    if errors:
        from specverify.auditing.findings import grouped_findings

        findings = grouped_findings(errors)
        reasons = "; ".join(f"{', '.join(f.names) if len(f.names) <= 3 else f'{len(f.names)} checks'}: {f.message}"
                            for f in findings[:3])
        more = f" (and {len(findings) - 3} more)" if len(findings) > 3 else ""
        hint = ""
        if expected_signature(level) and any(is_call_type_error(f.message) for f in findings):
            hint = f" (the audit calls {expected_signature(level)})"
        stopped = sum(r.verdict is Verdict.SKIPPED and r.message.startswith(MALFORMED_SKIP) for r in results)
        if stopped:
            hint += (f"; the audit stopped there: the other {stopped} checks were not run (an output that breaks the "
                     "layout is the adapter's bug and leaves nothing to judge)")
        return AuditVerdict.COULD_NOT_AUDIT, reasons + more + hint, detectable
    if not statistical or any(r.verdict is not Verdict.PASS for r in statistical):
        return AuditVerdict.COULD_NOT_AUDIT, "not every statistical check ran", detectable
    skipped = "".join(f"; not run: {omission.names_text()}" for omission in omitted)
    if shortfall is not None and not allow_underpowered:
        return AuditVerdict.UNDERPOWERED, (f"no check failed, but a pass needs power: {shortfall.sentence()}; "
                                            f"{shortfall.fix()}{skipped}"), detectable
    own = [r for r in statistical if epsilon is not None and r.sized_for_own_tv and r.detectable_tv is not None]
    if own:  # checks sized for their own TV under this budget (production shapes: costly rows)
        at_budget = max((r.detectable_tv for r in statistical if r not in own and r.detectable_tv is not None),
                        default=epsilon)
        against = (f"against TV ≥ {at_budget:.3g} in the cells of {len(statistical) - len(own)} checks and against "
                   f"their own TV in {len(own)} ({', '.join(f'{r.name} {r.detectable_tv:.2g}' for r in own)})")
        coarse = [r for r in own if r.coarse_tv is not None]
        if coarse:
            against += (f", and against TV ≥ {max(r.coarse_tv or 0.0 for r in coarse):.2g} between the laws of their "
                        f"{coarse[0].coarse_views} in {len(coarse)} of them")
    else:
        against = f"against TV ≥ {detectable:.3g} in any check's cells"
    summary = (f"no loss detected at α = {alpha:g} (family-wise; Bonferroni over {len(statistical)} checks, "
               f"{share:.3g} each) with power {POWER:g} {against}")
    if shortfall is not None:
        summary += (f" — underpowered, allowed by allow_underpowered: {shortfall.check} detects "
                    f"{shortfall.detectable_text()}, above {shortfall.bound_text()}")
    return AuditVerdict.NO_LOSS_DETECTED, summary + skipped, detectable


def assert_lossless(fn: Callable[..., Any] | str, **options: Any) -> AuditReport:
    """Audit ``fn`` (same options as :func:`audit`) and raise ``AssertionError`` with
    :meth:`AuditReport.explain` unless no loss was detected; return the report otherwise.  The
    message is the short account (verdict, diagnosis, minimal case, replay); ``$SPECVERIFY_VERBOSE=1``
    (set by the pytest plugin under ``-vv``) adds each finding's inputs, n, p-value and TV.

    Unless ``progress=`` is given, the plan and its expected time are written to stderr first,
    then one line per finished check (a bar on a terminal).  Inside a pytest test whose output is
    captured, only the plan, the measured speed and the end are written (the failure message
    holds the results); the traceback hides this helper's frame (``__tracebackhide__``)."""
    __tracebackhide__ = True
    if "progress" not in options:
        from specverify.auditing.progress import progress_for

        options["progress"] = progress_for(sys.stderr, summary_only=_captured_by_pytest(sys.stderr))
    report = audit(fn, **options)
    if report.exit_code != EXIT_PASS:
        raise AssertionError(report.explain(verbose=os.environ.get(VERBOSE_ENV, "") not in ("", "0")))
    return report


def _captured_by_pytest(stream: Any) -> bool:
    """Whether ``stream`` is pytest's capture of a running test (not a terminal)."""
    isatty = getattr(stream, "isatty", None)
    return "PYTEST_CURRENT_TEST" in os.environ and not (isatty is not None and isatty())
