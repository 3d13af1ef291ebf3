"""JSON rendering of an :class:`~specverify.auditing.audit_report.AuditReport`, schema ``specverify.audit/1``.

Stable and versioned: fields are only ever added within ``/1``.  Everything except the top-level
``timings`` object is a deterministic function of the implementation, the options and the seed,
so two audits with the same seed give identical JSON once ``timings`` is removed
(:func:`deterministic_view`) — unless the post-verdict budget (:mod:`specverify.auditing.post_verdict`)
cut a slow function's locating checks or sized its minimal case (the check's message and
``minimal_case``/``minimal_case_note`` say so).  Non-finite numbers (an infinite statistic) are
written as ``null``.  ``timings``: ``total_s`` (the audit's start to its end, the figure of
"audit finished in"), ``checks_s`` (per check), ``function_s``, ``calls``, ``rows``, ``rows_per_s``
(the call log) and ``post_verdict`` ({``verdict_s``: the start to the verdict, ``budget_s``,
``steps``: [{``step``: ``locating checks`` | ``minimal case`` | ``shutdown``, ``seconds``,
``outcome``, ``cut_off``: whether the budget cut the step short}]}), all on one clock.

Top level: ``schema``, ``specverify_version``, ``target``, ``level``, ``verdict``, ``exit_code``,
``summary``, ``seed``, ``alpha`` (family-wise), ``alpha_share`` (per statistical check),
``correction`` (``bonferroni``), ``power``, ``detectable_tv``, ``budget`` {``name``, ``epsilon``,
``samples``}, ``device``, ``timeout_s``, ``checks`` (list), ``diagnosis`` (where the loss is, one or
two sentences; empty when nothing failed), ``replay`` (the command that repeats the audit),
``warnings`` (what the code under audit warned about), ``not_run`` (checks left out for this
function: [{``names``, ``reason``, ``fix``}]), ``power_shortfall`` (null, or {``level``, ``budget``,
``ceiling``, ``check``, ``detectable``, ``needed``, ``message``}: the plan cannot detect the
level's ceiling TV), ``allow_underpowered``, ``minimal_case`` (null, or the step on which the
function is wrong: {``check``, ``chain``, ``target_probs``, ``draft_probs``, ``draft_tokens``,
``rows``, ``seed``, ``column``, ``token``, ``expected``, ``observed``, ``z``, ``follows`` (the wrong
law its tokens follow, or ""), ``closest`` (the closest catalog entry, or ""), ``test``: the pytest
code}), ``minimal_case_note``, ``interrupted``, ``timings``, ``isolation`` ({``mode``:
``process`` | ``none``, and where present ``note``, ``worker_restarts``, ``stdout``/``stderr``:
{``bytes``, ``first_lines`` (at most 20), ``truncated``}}).
Each check: ``name``, ``description``, ``kind``, ``parameters``, ``verdict``, ``message``,
``fault``, ``n``, ``n_required``, ``num_cells``, ``statistic``, ``pvalue``, ``alpha_share``,
``empirical_tv``, ``detectable_tv``, ``coarse_tv`` and ``coarse_views`` (the TV between coarse
laws a production check detects, and what they are; null elsewhere), ``calls``, ``rows``,
``cells`` ({``labels``, ``observed``, ``expected``} or null), ``acceptance`` ({``observed``,
``expected``} or null).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from specverify import __version__
from specverify.auditing.audit_report import AuditReport
from specverify.auditing.checks import CheckResult
from specverify.auditing.power import PowerShortfall

SCHEMA = "specverify.audit/1"


def _clean(value: Any) -> Any:
    """JSON-safe copy: tuples to lists, non-finite floats to None, mapping keys to strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def check_to_dict(check: CheckResult) -> dict[str, Any]:
    cells = None
    if check.observed is not None:
        cells = {"labels": check.cell_labels, "observed": check.observed, "expected": check.expected}
    return _clean({
        "name": check.name, "description": check.description, "kind": check.kind,
        "parameters": dict(check.parameters), "verdict": check.verdict, "message": check.message,
        "fault": check.fault, "n": check.n, "n_required": check.n_required, "num_cells": check.num_cells,
        "statistic": check.statistic, "pvalue": check.pvalue, "alpha_share": check.alpha,
        "empirical_tv": check.empirical_tv, "detectable_tv": check.detectable_tv,
        "coarse_tv": check.coarse_tv, "coarse_views": check.coarse_views or None,
        "calls": check.calls, "rows": check.rows, "cells": cells,
        "acceptance": dict(check.acceptance) if check.acceptance is not None else None,
        "look": check.look, "num_looks": check.num_looks, "level": check.level,
    })


def report_to_dict(report: AuditReport) -> dict[str, Any]:
    """The report as a JSON-ready dict (schema :data:`SCHEMA`)."""
    settings, plan, budget = report.settings, report.plan, report.settings.budget
    return _clean({
        "schema": SCHEMA, "specverify_version": __version__, "target": settings.target, "level": settings.level,
        "verdict": report.verdict, "exit_code": report.exit_code, "summary": report.summary, "seed": settings.seed,
        "alpha": settings.alpha, "alpha_share": plan.alpha_share, "correction": settings.correction,
        "power": settings.power, "detectable_tv": report.detectable_tv,
        "budget": {"name": budget.name, "epsilon": budget.epsilon, "samples": budget.samples},
        "device": settings.device, "timeout_s": settings.timeout_s,
        "checks": [check_to_dict(c) for c in report.checks],
        "diagnosis": report.diagnosis, "replay": report.replay_command, "warnings": list(report.warnings),
        "timings": report.timings, "isolation": report.isolation, "fail_fast": settings.fail_fast,
        "not_run": [{"names": o.names, "reason": o.reason, "fix": o.fix} for o in plan.omitted],
        "power_shortfall": _shortfall(plan.shortfall), "allow_underpowered": settings.allow_underpowered,
        "minimal_case": _minimal_case(report), "minimal_case_note": report.case_search.note,
        "interrupted": report.interrupted, "preset": settings.preset, "preset_note": settings.preset_note,
    })


def _shortfall(shortfall: PowerShortfall | None) -> dict[str, Any] | None:
    if shortfall is None:
        return None
    return {"level": shortfall.level, "budget": shortfall.budget, "ceiling": shortfall.ceiling,
            "check": shortfall.check, "detectable": shortfall.detectable, "needed": shortfall.needed,
            "message": f"underpowered: {shortfall.sentence()}; {shortfall.fix()}"}


def _minimal_case(report: AuditReport) -> dict[str, Any] | None:
    case = report.case_search.case
    if case is None:
        return None
    fields = {name: getattr(case, name) for name in ("check", "chain", "target_probs", "draft_probs", "draft_tokens",
                                                      "rows", "seed", "column", "token", "expected", "observed", "z")}
    return {**fields, "follows": case.follows, "closest": case.closest, "test": report.minimal_case_code()}


def deterministic_view(document: dict[str, Any]) -> dict[str, Any]:
    """The document without its ``timings`` (the part that must repeat exactly for a given seed)."""
    return {k: v for k, v in document.items() if k != "timings"}


def write_json(report: AuditReport, path: str | Path) -> Path:
    """Write the report to ``path`` (UTF-8, sorted keys, indented) and return the path."""
    path = Path(path)
    path.write_text(json.dumps(report_to_dict(report), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
                    + "\n", encoding="utf-8")
    return path
